"""Inkling's split (``mpipe_hf/families/inkling/split.py``) on one process: R = 2, V = 2 chained stage after stage
equals the unsplit model bit for bit (loss and every gradient) with a trainable tower (T = 1), a frozen one (T = 0)
and the identity preprocess. Its text model has no rotary embedding (a relative-position bias from each layer's hidden
states), ``hybrid`` and ``hybrid_sliding`` layers, short convolutions with their own padding mask, and logits over
``logits_mup_width_multiplier``. Rows are 41 tokens, past the 16-token window and the bias's 32-token reach, and one
is padded. Negative controls: the sliding layers given the full mask, and the head without its scale, are not exact.
Audio rows are refused by name at load, packed micro-batches at the stage (and at launch by their layer types)."""

import copy
import os
import sys
from unittest import mock

import pytest
import torch
from transformers import AutoModelForImageTextToText

from mpipe_hf.data import qwen2_tokenizer
from mpipe_hf.families.inkling import split as inkling_split
from mpipe_hf.families.inkling.tiny import TINY
from mpipe_hf.models.registry import split
from mpipe_hf.models.tiny import non_degenerate
from mpipe_hf.schedule import ScheduleConfig

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "dist"))
from common import VOCAB_RANKS, caption_row  # noqa: E402
from pools_without_processor import direct_collator  # noqa: E402
from test_family_gemma import check_exact  # noqa: E402


@pytest.fixture(scope="module")
def model_and_batch():
    tokenizer = qwen2_tokenizer(VOCAB_RANKS)
    torch.manual_seed(0)
    config = TINY["inkling_mm_model"](tokenizer, num_layers=4)
    model = non_degenerate(AutoModelForImageTextToText.from_config(config))
    batch = direct_collator(config, tokenizer)([caption_row(0, 84, True, 0), caption_row(1, 56, True, 1)])
    text = config.get_text_config()
    length = batch["input_ids"].shape[1]
    assert length > text.rel_extent > text.sliding_window_size and not batch["attention_mask"].all()
    return model, batch


@pytest.mark.parametrize("text_layers, preprocess", [(1, "trainable"), (0, "frozen"), (0, "identity")])
def test_inkling_splits_exactly(model_and_batch, text_layers, preprocess):
    model, batch = model_and_batch
    check_exact(model, batch, text_layers, preprocess)


def _full_everywhere(text_config, hidden, padding, text_positions, state, types):
    """The negative control's masks: every layer the causal mask, the sliding layers' window lost."""
    built = inkling_split.layer_type_masks(text_config, hidden, padding, text_positions, state,
                                              {"full_attention"})
    return {t: built["full_attention"] for t in types}


def test_the_sliding_layers_given_the_full_mask_are_not_exact(model_and_batch):
    model, batch = model_and_batch
    with mock.patch.object(inkling_split, "inkling_masks", _full_everywhere):
        with pytest.raises(AssertionError):
            check_exact(model, batch, 1)


def test_the_head_without_its_scale_is_not_exact(model_and_batch):
    model, batch = model_and_batch
    original = inkling_split.InklingStage.__init__

    def unscaled(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if self.head is not None:
            self.head.scale = None
    with mock.patch.object(inkling_split.InklingStage, "__init__", unscaled):
        with pytest.raises(AssertionError):
            check_exact(model, batch, 1)


def test_audio_rows_are_refused_by_name(model_and_batch):
    model, batch = model_and_batch
    validate = split(copy.deepcopy(model), ScheduleConfig(2, 1, 2, "identity"), 0).validate_micro
    validate(batch)
    with pytest.raises(ValueError, match="audio inputs"):
        validate({**batch, "audio_input_ids": torch.zeros(1, 2, 4, dtype=torch.long)})


def test_packed_micro_batches_are_refused(model_and_batch):
    from mpipe_hf.models.decoder import check_packable
    model, batch = model_and_batch
    with pytest.raises(ValueError, match="cannot be packed exactly"):
        check_packable(model.config.get_text_config())
    stage = split(copy.deepcopy(model), ScheduleConfig(2, 1, 2, "identity"), 1).stages[1]  # the last stage
    hidden = torch.zeros(1, 6, model.config.get_text_config().hidden_size)
    with pytest.raises(ValueError, match="cannot run packed micro-batches"):
        stage({"hidden_states": hidden, "position_ids": torch.arange(6)[None], "labels": torch.zeros(1, 6).long(),
               "packed_lengths": torch.tensor([3, 3])})
