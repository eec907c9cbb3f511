"""The load-time image-token check of the families whose stock image processor needs torchvision (Llama 4, Kimi
K2.5, MiniCPM-OCR, Gemma 4 Unified, Muse Glimmer and Spark), on micro-batches built in the processor's layout without it
(``tests/dist/pools_without_processor.py``, the numerics cases' pools): the count it expects is what the real tiny
tower outputs for the micro-batch's images, a row one image token off is refused, and so is a wrong image grid.
"""

import os
import sys

import pytest
import torch

from mpipe_hf.data import qwen2_tokenizer
from mpipe_hf.models.image_features import flat_features
from mpipe_hf.models.materialize import model_class
from mpipe_hf.models.registry import FAMILIES
from mpipe_hf.families.registry import tiny_config
from mpipe_hf.train.sources import micro_validator

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "dist"))
from common import VOCAB_RANKS, caption_row  # noqa: E402
from pools_without_processor import BUILDERS, direct_collator  # noqa: E402

REFUSED = "image-token count"


@pytest.fixture(scope="module")
def tokenizer():
    return qwen2_tokenizer(VOCAB_RANKS)


def micro(model_type: str, tokenizer):
    """``(config, micro-batch)``: two rows, of a wide and a square photo (Llama 4: 3 tiles and 1)."""
    config = tiny_config(model_type)(tokenizer, num_layers=1)
    return config, direct_collator(config, tokenizer)([caption_row(0, 84, True, 0), caption_row(1, 56, True, 1)])


def tower_count(config, batch) -> int:
    """The features the real tiny model's ``get_image_features`` gives for ``batch``'s images."""
    torch.manual_seed(0)
    model = model_class(config).from_config(config).eval()
    keys = FAMILIES[config.model_type].image_inputs
    with torch.no_grad():
        out = model.get_image_features(**{k: batch[k] for k in keys}, return_dict=True)
    return flat_features(out.pooler_output).shape[0]


def set_token(batch: dict, image_token_id: int, more: bool) -> dict:
    """``batch`` with one image token more (the last prompt token of row 0) or less (its first image token)."""
    ids = batch["input_ids"].clone()
    image = ids[0] == image_token_id
    prompt = (batch["labels"][0] == -100) & batch["attention_mask"][0].bool() & ~image
    where = prompt.nonzero()[-1].item() if more else image.nonzero()[0].item()
    ids[0, where] = image_token_id if more else ids[0, prompt.nonzero()[-1].item()]
    return {**batch, "input_ids": ids}


@pytest.mark.parametrize("model_type", sorted(BUILDERS))
def test_the_count_is_the_towers_and_a_row_one_token_off_is_refused(model_type, tokenizer):
    config, batch = micro(model_type, tokenizer)
    n_tokens = int((batch["input_ids"] == config.image_token_id).sum())
    assert n_tokens == tower_count(config, batch)  # the pools give the tower's real output size
    validate = micro_validator(config)
    validate(batch)
    for more in (True, False):
        with pytest.raises(ValueError, match=REFUSED):
            validate(set_token(batch, config.image_token_id, more))


# a grid or view that gives the tower other features than the tokens say (what a processor bug would write)
WRONG_GRID = {
    "llama4": lambda b: {**b, "pixel_values": b["pixel_values"][:-1]},  # one tile fewer
    "kimi_k25": lambda b: {**b, "image_grid_thw": b["image_grid_thw"] * torch.tensor([1, 2, 1])},
    "minicpm_ocr": lambda b: {**b, "target_sizes": b["target_sizes"] * torch.tensor([2, 1], dtype=torch.int32)},
    "gemma4_unified": lambda b: {**b, "image_position_ids": b["image_position_ids"].clamp(min=0)},  # no padding
    "muse_glimmer": lambda b: {**b, "image_grid_thw": b["image_grid_thw"] * torch.tensor([1, 2, 1])},
    "muse_spark": lambda b: {**b, "image_grid_thw": b["image_grid_thw"] * torch.tensor([1, 1, 2])},
    "inkling_mm_model": lambda b: {**b, "pixel_values": b["pixel_values"][:-1]},  # one patch fewer
    "nemotron_h_omni": lambda b: {**b, "image_grid_hw": b["image_grid_hw"] * torch.tensor([1, 2])},
}


@pytest.mark.parametrize("model_type", sorted(WRONG_GRID))
def test_a_wrong_grid_is_refused(model_type, tokenizer):
    config, batch = micro(model_type, tokenizer)
    with pytest.raises(ValueError, match=REFUSED):
        micro_validator(config)(WRONG_GRID[model_type](batch))


@pytest.mark.parametrize("model_type, audio", [("gemma4_unified", "input_features"), ("muse_spark", "input_values"),
                                               ("nemotron_h_omni", "input_features")])
def test_video_and_audio_are_refused_by_name(model_type, audio, tokenizer):
    config, batch = micro(model_type, tokenizer)
    validate = micro_validator(config)
    for key, modality in (("pixel_values_videos", "video"), (audio, "audio")):
        with pytest.raises(ValueError, match=f"{modality} inputs"):
            validate({**batch, key: torch.zeros(1)})
