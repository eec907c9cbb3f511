"""Every declared family checks each micro-batch at load against its tower's real output size.

A row whose image-token count differs from the features its images give would reach stage 0, whose count check on
a GPU is a device-side assert that ends the run. The load-time check (``SplitModel.validate_micro``, built here on
the meta device as ``mpipe-hf check-data`` builds it) refuses it first with a ``ValueError`` naming the counts, and
the owner's :class:`~mpipe_hf.data.MicroBatchPlan` then drops that row alone.

For each family of the registry: one conversation row with a non-square photo, collated as the family's CI pool is
(its own processor, or its vision inputs built directly where the stock processor needs torchvision), passes; the
same row with one image token more, or one less, is refused. A family with neither is skipped by name (none today).
Decoder-only families take no images, so they have nothing to count (:data:`NO_IMAGES`). The count is the tower's:
a config field stating it (``image_seq_length`` ...) that disagrees with the tower changes nothing.
"""

import os
import sys

import pytest
import torch
from transformers import AutoModelForImageTextToText

from mpipe_hf.data import MicroBatchPlan, qwen2_tokenizer
from mpipe_hf.families.registry import all_tiny
from mpipe_hf.models.registry import FAMILIES
from mpipe_hf.train.sources import micro_validator

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "dist"))
from common import caption_row, family_collator  # noqa: E402

# the types whose vision tower is a timm model (TimmWrapperModel): building their model needs timm
TIMM_FAMILIES = ("fast_vlm", "perception_lm", "gemma3n")
# every declared family's tiny config, the timm-tower families' too (no processor here: skipped below by name;
# scripts/check/check_timm_families.py checks them)
BUILDERS = all_tiny()
# decoder-only language models: no tower, no image token, nothing to count
NO_IMAGES = sorted(t for t, family in FAMILIES.items() if not getattr(family, "vision", ()))
VISION = sorted(t for t in FAMILIES if t not in NO_IMAGES)
REFUSED = "image-token count"


@pytest.fixture(scope="module")
def tokenizer():
    return qwen2_tokenizer(5120)


def image_row(i: int = 1) -> dict:
    """A caption row (``common.caption_row``) of photo ``i``, 84 px on its longer side (1: the coffee photo, 84 x
    56, wide: anyres grids unpad to it)."""
    return caption_row(i, 84, True, 0)


def one_token_off(batch: dict, image_token_id: int, more: bool) -> dict:
    """``batch`` (one row) with one image token more (a text token of the prompt made one) or one less (the first
    image token made a text token); ``mm_token_type_ids``, where the family has them, follow as its processor
    writes them."""
    ids, real = batch["input_ids"].clone(), batch["attention_mask"].bool()
    image = ids == image_token_id
    text = real & ~image & (batch["labels"] == -100)
    where = (text if more else image)[0].nonzero()[-1 if more else 0].item()
    plain = ids[0][text[0]][0].item()  # a text token of the same row
    ids[0, where] = image_token_id if more else plain
    out = {**batch, "input_ids": ids}
    if "mm_token_type_ids" in batch:
        types = batch["mm_token_type_ids"].clone()
        types[0, where] = 1 if more else 0
        out["mm_token_type_ids"] = types
    return out


def family_row(model_type: str, tokenizer):
    """``(config, collate)``: the tiny config and its ragged pool's collator (the family's processor, or, where
    the stock processor needs torchvision, the vision inputs built directly: ``common.family_collator``)."""
    config = BUILDERS[model_type](tokenizer, num_layers=1)
    try:
        return config, family_collator(config, tokenizer)
    except ValueError as err:
        if "has no image processor" not in str(err):
            raise
        pytest.skip(f"{model_type}: no processor in the project and no direct builder of its vision inputs in "
                    f"tests/dist (its images take {FAMILIES[model_type].image_inputs}): no row to count")


def one_row(model_type: str, tokenizer):
    """``(config, batch)``: one row with one photo, collated by :func:`family_row`'s collator."""
    config, collate = family_row(model_type, tokenizer)
    return config, collate([image_row()])


def test_every_declared_family_is_covered():
    """Every family of the registry is checked here (a tiny config) or takes no images."""
    assert set(FAMILIES) == set(VISION) | set(NO_IMAGES)
    assert not set(VISION) - set(BUILDERS), "a vision family without a tiny config: add it to BUILDERS"
    assert {"llama", "qwen2", "qwen3", "mistral4"} <= set(NO_IMAGES)


@pytest.mark.parametrize("model_type", VISION)
def test_a_row_one_image_token_off_is_refused_at_load(model_type, tokenizer):
    config, batch = one_row(model_type, tokenizer)
    validate = micro_validator(config)
    assert validate is not None, f"{model_type} declares no load-time check"
    image_token_id = config.image_token_id
    assert (batch["input_ids"] == image_token_id).any()
    validate(batch)  # the processor's own row passes
    for more in (True, False):
        with pytest.raises(ValueError, match=REFUSED):
            validate(one_token_off(batch, image_token_id, more))


# the config fields that state an image's token count beside the tower: the check reads the tower's real output
# (its positions, patch grid, pooling), so a field that disagrees with it changes nothing
COUNT_FIELDS = {"vipllava": "image_seq_length", "video_llava": "image_seq_length", "internvl": "image_seq_length",
                "qianfan_ocr": "image_seq_length", "got_ocr2": "image_seq_length", "pp_chart2table": "image_seq_length",
                "janus": "vision_config.num_image_tokens", "paligemma": "text_config.num_image_tokens",
                "llava_next": "image_seq_length", "llava_next_video": "image_seq_length",
                "gemma3": "mm_tokens_per_image", "shieldgemma2": "mm_tokens_per_image"}


@pytest.mark.parametrize("model_type", sorted(COUNT_FIELDS))
def test_the_count_is_the_towers_not_a_config_field(model_type, tokenizer):
    config, batch = one_row(model_type, tokenizer)
    *path, field = COUNT_FIELDS[model_type].split(".")
    owner = config
    for name in path:
        owner = getattr(owner, name)
    setattr(owner, field, getattr(owner, field) + 1)  # one token more than the tower gives
    validate = micro_validator(config)
    validate(batch)
    with pytest.raises(ValueError, match=REFUSED):
        validate(one_token_off(batch, config.image_token_id, True))


@pytest.mark.parametrize("model_type", NO_IMAGES)
def test_a_decoder_only_family_has_nothing_to_count(model_type):
    family = FAMILIES[model_type]
    assert not family.vision and family.validate is None


class BreakRows:
    """The family's collator, with each row marked ``"extra_image_token"`` given one image token too many."""

    def __init__(self, collate, image_token_id: int):
        self.collate, self.image_token_id = collate, image_token_id
        self.null_batch = collate.null_batch

    def __call__(self, rows):
        batch = self.collate(rows)
        for i, row in enumerate(rows):
            if row.get("extra_image_token"):
                text = batch["attention_mask"][i].bool() & (batch["input_ids"][i] != self.image_token_id)
                batch["input_ids"][i, text.nonzero()[-1].item()] = self.image_token_id
        return batch


@pytest.mark.parametrize("model_type", ["aria", "llava_next"])
def test_a_bad_row_costs_that_row(model_type, tokenizer):
    config, collate = family_row(model_type, tokenizer)
    rows = [dict(image_row(0), where="rows.jsonl:1"), dict(image_row(1), where="rows.jsonl:2", extra_image_token=True),
            dict(image_row(2), where="rows.jsonl:3")]
    plan = MicroBatchPlan(rows, BreakRows(collate, config.image_token_id), 1, 3, micro_validator(config))
    batch = plan.load_rows([0, 1, 2])
    assert batch["input_ids"].shape[0] == 2  # the step trains on the other two
    assert torch.equal(batch["input_ids"], collate([rows[0], rows[2]])["input_ids"])
    dropped = plan.take_dropped()
    assert len(dropped) == 1 and "rows.jsonl:2" in dropped[0] and REFUSED in dropped[0]


@pytest.mark.parametrize("model_type", ["hunyuan_vl", "paddleocr_vl"])
def test_tiny_heads_tie_as_the_real_models(model_type, tokenizer):
    """HunyuanOCR and PaddleOCR-VL tie their LM head to the embeddings (their config classes' default, as the
    checkpoints): the tiny configs the numerics cases train do too, so the split's tied head is what is checked."""
    config = BUILDERS[model_type](tokenizer, num_layers=1)
    assert config.tie_word_embeddings and type(config)().tie_word_embeddings
    model = AutoModelForImageTextToText.from_config(config)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight


@pytest.mark.parametrize("model_type", sorted(TIMM_FAMILIES))
def test_a_timm_tower_type_without_timm_fails_at_load_naming_timm_and_torchvision(model_type, tokenizer):
    """The timm-tower types are declared, not refused: where timm does not import, building the model (as every
    load does, ``meta_model``) raises ``ImportError`` naming timm and torchvision, not transformers' bare one."""
    import importlib.util

    from mpipe_hf.models.materialize import meta_model
    if importlib.util.find_spec("timm") is not None:
        pytest.skip("timm is installed: scripts/check/check_timm_families.py checks these types")
    with pytest.raises(ImportError, match=f"{model_type}.*timm and torchvision"):
        meta_model(BUILDERS[model_type](tokenizer, num_layers=1))


def _stand_in_gemma3n(config, grid: tuple[int, int]):
    """What Gemma 3n's load-time check reads of the model: its config and its timm tower's multi-scale fusion
    adapter's output grid (the real tower needs timm to build: scripts/check/check_timm_families.py checks it there)."""
    from types import SimpleNamespace
    msfa = SimpleNamespace(output_resolution=grid)
    return SimpleNamespace(config=config, model=SimpleNamespace(
        vision_tower=SimpleNamespace(timm_model=SimpleNamespace(msfa=msfa))))


def test_gemma3n_counts_its_towers_grid_and_refuses_audio(tokenizer):
    """Gemma 3n's check counts an image's tokens as its tower's output grid (the adapter resizes any image to it),
    so a row one token off is refused; a config whose ``vision_soft_tokens_per_image`` disagrees with the grid is
    refused (``get_image_features`` could not reshape the features), and so are audio inputs, by name."""
    config = BUILDERS["gemma3n"](tokenizer, num_layers=1)
    grid = (2, 2)
    image = [config.boi_token_id] + [config.image_token_id] * 4 + [config.eoi_token_id]
    ids = torch.tensor([tokenizer.encode("user:") + image + tokenizer.encode("a photo")])
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pixel_values": torch.zeros(1, 3, 64, 64),
             "labels": torch.cat([torch.full((1, ids.shape[1] - 2), -100), ids[:, -2:]], 1)}
    validate = FAMILIES["gemma3n"].validate(_stand_in_gemma3n(config, grid))
    validate(batch)
    for more in (True, False):
        with pytest.raises(ValueError, match=REFUSED):
            validate(one_token_off(batch, config.image_token_id, more))
    with pytest.raises(ValueError, match="audio"):
        validate({**batch, "input_features": torch.zeros(1, 8, 16)})
    config.vision_soft_tokens_per_image = 9  # a 3 x 3 tower would give these: this one gives 2 x 2
    with pytest.raises(ValueError, match="2 x 2 tokens an image, but vision_soft_tokens_per_image is 9"):
        FAMILIES["gemma3n"].validate(_stand_in_gemma3n(config, grid))(batch)
    config.vision_soft_tokens_per_image = 9  # the tower's grid decides: 3 x 3 makes the 4-token row wrong
    with pytest.raises(ValueError, match=REFUSED):
        FAMILIES["gemma3n"].validate(_stand_in_gemma3n(config, (3, 3)))(batch)
