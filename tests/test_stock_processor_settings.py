"""A family whose data path is its checkpoint's stock processor (``mpipe_hf/data/stock_processor.py``): the
checkpoint loader states the missing torchvision by name, not ``AutoProcessor``'s generic error, and training
applies the recipe's ``model.tokenizer`` and pixel bounds over the checkpoint's, as for every other family."""

import json

import pytest

from mpipe_hf.data import qwen2_tokenizer
from mpipe_hf.models.tiny_all import TINY_MODELS

STOCK = "gemma4_unified"  # a family whose image processor transformers has with torchvision only


@pytest.fixture
def stock_family(monkeypatch):
    """``STOCK`` needs the stock processor here, whatever torchvision-free processors mpipe_hf gains."""
    from mpipe_hf.data import stock_processor as module
    needed = module.needs_stock_processor
    monkeypatch.setattr(module, "needs_stock_processor", lambda t: t == STOCK or needed(t))


def _checkpoint(path):
    """A checkpoint directory of ``STOCK``: its config, a tokenizer and the stock image processor's file."""
    from mpipe_hf.data.stock_processor import stock_image_backends
    tokenizer = qwen2_tokenizer(5120)
    TINY_MODELS[STOCK](tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    (path / "preprocessor_config.json").write_text(json.dumps(
        {"image_processor_type": stock_image_backends(STOCK)["torchvision"]}))
    return str(path)


def test_the_loader_names_the_missing_torchvision(stock_family, monkeypatch, tmp_path):
    from mpipe_hf.data import load_checkpoint_processor
    from mpipe_hf.data.stock_processor import processor_problem
    monkeypatch.setattr("transformers.utils.is_torchvision_available", lambda: False)
    path = _checkpoint(tmp_path)
    with pytest.raises(ValueError) as err:
        load_checkpoint_processor(path)
    assert str(err.value) == processor_problem(STOCK, path) and "install torchvision" in str(err.value)
