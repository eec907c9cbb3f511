"""The micro-batches built without a processor (tests/dist/direct_llava_like.py) for the llava_like families whose
stock image processor needs torchvision: each row's image-token count is what the real tiny tower and projector
give for its vision keys (``get_image_features``), for each of the three image layouts the pools use, and the
load-time check (the family's ``validate``) agrees; a count one off is refused (tests/test_load_checks.py)."""

import os
import sys

import pytest
import torch

from mpipe_hf.data import qwen2_tokenizer
from mpipe_hf.families.registry import family, tiny_config
from mpipe_hf.models.image_features import flat_features
from mpipe_hf.models.materialize import model_class
from mpipe_hf.train.sources import micro_validator

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "dist"))
from common import caption_row  # noqa: E402
from direct_llava_like import TYPES, direct_collator  # noqa: E402

# the families whose stock image processor needs torchvision (the micro-batches built without a processor)
FAMILIES = {t: family(t) for t in ("cohere2_vision", "lfm2_vl", "step3p7", "minimax_m3_vl", "molmo2",
                                   "unlimited_ocr")}


@pytest.fixture(scope="module")
def tokenizer():
    return qwen2_tokenizer(5120)


def test_every_family_of_the_module_has_a_builder():
    assert set(TYPES) == set(FAMILIES)


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_each_layout_gives_the_towers_count(model_type, tokenizer):
    config = tiny_config(model_type)(tokenizer, num_layers=1)
    torch.manual_seed(0)
    model = model_class(config).from_config(config).eval()
    family, collate, validate = FAMILIES[model_type], direct_collator(config, tokenizer), micro_validator(config)
    for side in (56, 84, 112):  # the pools' three photo sizes: each family's three layouts
        batch = collate([caption_row(side // 28 - 2, side, True, 0), caption_row(3, 56, False, 1)])
        keys = {k: batch[k].tolist() if k in family.list_inputs else batch[k]
                for k in family.image_inputs if k in batch}
        with torch.no_grad():
            features = flat_features(model.model.get_image_features(**keys, return_dict=True).pooler_output)
        assert int((batch["input_ids"] == config.image_token_id).sum()) == features.shape[0], side
        validate(batch)
