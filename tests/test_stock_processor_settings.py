"""A family whose data path is its checkpoint's stock processor (``mpipe_hf/data/stock_processor.py``): the
checkpoint loader states the missing torchvision by name, not ``AutoProcessor``'s generic error, and training
applies the recipe's ``model.tokenizer`` and pixel bounds over the checkpoint's, as for every other family."""

import json

import pytest

from mpipe_hf.data import qwen2_tokenizer
from mpipe_hf.families.registry import tiny_config

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
    tiny_config(STOCK)(tokenizer).save_pretrained(path)
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


def test_training_applies_the_recipes_tokenizer_and_pixel_bounds(stock_family, monkeypatch, tmp_path):
    """``load_processor`` hands the stock processor the recipe's ``model.tokenizer`` (its chat template wins) and,
    for a family resized between ``min_pixels`` and ``max_pixels``, those bounds over the checkpoint's, as it does
    for every other family's image processor. ``AutoProcessor`` stands in here (no torchvision): it records what it
    is given."""
    from types import SimpleNamespace
    from transformers import AutoConfig, AutoProcessor
    from mpipe_hf.train import sources
    from mpipe_hf.train.recipe import DataSection, ModelSource
    monkeypatch.setattr("transformers.utils.is_torchvision_available", lambda: True)
    given = []
    monkeypatch.setattr(AutoProcessor, "from_pretrained", lambda path, **kw: given.append((path, kw)) or
                        SimpleNamespace(chat_template="the checkpoint's", **kw))
    path = _checkpoint(tmp_path / "model")
    (tmp_path / "model" / "model.safetensors").touch()  # ModelSource asks for weights; nothing reads them here
    own = qwen2_tokenizer(5120)
    own.chat_template = "{{ 'the recipe tokenizer' }}"
    own.save_pretrained(tmp_path / "tokenizer")
    config = AutoConfig.from_pretrained(path)
    recipe = SimpleNamespace(model=ModelSource(name_or_path=path, tokenizer=str(tmp_path / "tokenizer")),
                             data=DataSection(path="x.jsonl", min_pixels=1000, max_pixels=20000))
    monkeypatch.setattr(sources, "PIXEL_BOUNDED_TYPES", frozenset([STOCK]))  # as a Qwen-like stock family would be
    processor = sources.load_processor(recipe, config)
    assert [p for p, _ in given] == [path] and processor.chat_template == "{{ 'the recipe tokenizer' }}"
    assert processor.tokenizer.chat_template == own.chat_template
    assert processor.size == {"shortest_edge": 1000, "longest_edge": 20000} and processor.max_pixels == 20000
    monkeypatch.setattr(sources, "PIXEL_BOUNDED_TYPES", frozenset())
    recipe.model = ModelSource(name_or_path=path)
    processor = sources.load_processor(recipe, config)  # no model.tokenizer, no pixel bounds: the checkpoint's own
    assert given[-1] == (path, {}) and processor.chat_template == "the checkpoint's"
