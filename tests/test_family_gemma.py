"""Gemma 4's data path (its processor without token additions, its chat template, a two-turn conversation with an
image) through the unsplit model, its split chained on one process equal to the unsplit model bit for bit (per-layer
inputs and shared key/value states crossing stages), audio and video refused by name; Gemma 3n's language model (its
AltUp streams crossing stages) and Mistral 4 (a decoder-only LM in the image-text-to-text map) split the same way;
every refusal says why."""

import copy

import PIL.Image
import pytest
import skimage
import torch
from transformers import AutoModelForImageTextToText

from mpipe_hf.data import ConversationCollator, build_processor, qwen2_tokenizer
from mpipe_hf.families.registry import all_refused, tiny_config
from mpipe_hf.models.coverage import refusal
from mpipe_hf.models.registry import split
from mpipe_hf.schedule import ScheduleConfig

TINY = {t: tiny_config(t) for t in ("gemma4", "gemma3n_text", "mistral4")}
REFUSED = all_refused()

ANSWERS = ["A cup of coffee.", "Yes, on a saucer.", "Hello there!"]


@pytest.fixture(scope="module")
def tokenizer():
    return qwen2_tokenizer(5120)


def rows():
    photo = PIL.Image.fromarray(skimage.data.coffee())
    return [{"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]},
                          {"role": "assistant", "content": [{"type": "text", "text": ANSWERS[0]}]},
                          {"role": "user", "content": [{"type": "text", "text": "On a plate?"}]},
                          {"role": "assistant", "content": [{"type": "text", "text": ANSWERS[1]}]}],
             "images": [photo]},
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "Say hello."}]},
                          {"role": "assistant", "content": [{"type": "text", "text": ANSWERS[2]}]}], "images": []}]


def chained(model, batch, text_layers=1, preprocess="trainable"):
    """The loss of ``model``'s split (R = 2, V = 2) run stage after stage on one process, and the splits."""
    cfg = ScheduleConfig(2, 2, 3, preprocess)
    splits = [split(copy.deepcopy(model), cfg, r, None, text_layers) for r in range(2)]
    raw = splits[0].preprocess.with_host(batch)
    splits[0].validate_micro(raw)
    x = splits[0].preprocess.stage0_inputs(raw)
    if splits[0].preprocess.module is not None:
        x = {**x, **splits[0].preprocess.module(splits[0].preprocess.inputs(raw))}
    for s in range(4):
        x = splits[s % 2].stages[s](x)
    return x["loss"], splits, cfg


def check_exact(model, batch, text_layers, preprocess="trainable"):
    ref = copy.deepcopy(model)
    loss, splits, cfg = chained(model, batch, text_layers, preprocess)
    out = ref(**{k: v for k, v in batch.items() if k != "labels"})
    ref_loss = ref.loss_function(logits=out.logits, labels=batch["labels"],
                                 vocab_size=ref.config.get_text_config().vocab_size, num_items_in_batch=1)
    loss.backward()
    ref_loss.backward()
    assert torch.equal(loss, ref_loss)
    params = dict(ref.named_parameters())
    for r in range(2):
        for name, p in splits[r].trainable_parameters(cfg, r).items():
            assert p.grad is not None and torch.equal(p.grad, params[name].grad), name


def test_gemma4_conversation_trains_and_splits_exactly(tokenizer):
    torch.manual_seed(0)
    config = TINY["gemma4"](tokenizer, num_layers=6)
    assert config.get_text_config().kv_sharing_modes.count("reuse") == 2  # layers 4, 5 reuse 2's and 3's K/V
    processor = build_processor(config, tokenizer)
    assert len(processor.tokenizer) == len(tokenizer) and not hasattr(tokenizer, "image_token")
    batch = ConversationCollator(processor, None, model_type="gemma4")(rows())
    assert set(batch) == {"input_ids", "attention_mask", "labels", "mm_token_type_ids", "pixel_values",
                          "image_position_ids"}
    image = batch["input_ids"] == config.image_token_id
    assert image[0].any() and not image[1].any() and (batch["labels"][image] == -100).all()
    assert (batch["mm_token_type_ids"].bool() == image).all()
    model = AutoModelForImageTextToText.from_config(config)
    model(**batch).loss.backward()
    model.zero_grad()
    # 4 stages of 1-2 layers: the K/V of layers 2-3 reach layers 4-5 on other stages, PLE from the front everywhere
    for text_layers, preprocess in ((0, "identity"), (1, "trainable"), (0, "frozen")):
        check_exact(model, batch, text_layers, preprocess)


def test_gemma4_refuses_audio_and_video_by_name(tokenizer):
    config = TINY["gemma4"](tokenizer, num_layers=4)
    model = AutoModelForImageTextToText.from_config(config)
    validate = split(model, ScheduleConfig(2, 1, 2, "identity"), 0).validate_micro
    ids = torch.tensor([[1, 2, 3]])
    for key, modality in (("input_features", "audio"), ("pixel_values_videos", "video")):
        with pytest.raises(ValueError, match=modality):
            validate({"input_ids": ids, key: torch.zeros(1, 4)})


def test_mistral4_splits_exactly(tokenizer):
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(TINY["mistral4"](tokenizer, num_layers=6))
    assert type(model).__name__ == "Mistral4ForCausalLM"
    batch = tokenizer(["The pipeline splits the model.", "Each rank loads its own micro-batches here."],
                      padding=True, return_tensors="pt")
    batch["labels"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    check_exact(model, dict(batch), 1)


def test_refusals_say_why(tokenizer):
    for model_type in REFUSED:
        assert refusal(model_type) == REFUSED[model_type]
    assert refusal("gemma4") is None and refusal("mistral4") is None


def _gemma3n_text(tokenizer):
    from transformers import AutoModelForCausalLM

    from mpipe_hf.models.tiny import non_degenerate
    torch.manual_seed(0)
    config = TINY["gemma3n_text"](tokenizer, num_layers=6)
    config.tie_word_embeddings = False  # the two copies of a tied head are summed by the executor, not here
    model = non_degenerate(AutoModelForCausalLM.from_config(config))  # AltUp's output scale starts at zero
    batch = tokenizer(["The pipeline splits the model.", "Each rank loads its own micro-batches here."],
                      padding=True, return_tensors="pt")
    batch["labels"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    return model, dict(batch)


def test_gemma3n_text_splits_exactly(tokenizer):
    """Gemma 3n's language model: the AltUp streams (4, B, L, H), per-layer inputs and shared key/value states
    cross stage boundaries (6 layers over 4 stages: the last two reuse earlier layers' keys and values) and the
    split equals the unsplit model bit for bit."""
    model, batch = _gemma3n_text(tokenizer)
    assert type(model).__name__ == "Gemma3nForCausalLM"
    check_exact(model, batch, 1)


def test_gemma3n_text_with_its_streams_swapped_at_a_boundary_is_not_exact(tokenizer):
    """The negative control of the test above: AltUp streams 1 and 2 swapped where each stage hands them on."""
    from unittest import mock

    from mpipe_hf.families.gemma import altup as gemma3n_altup

    def swapped(self, inputs):
        out = gemma3n_altup.SharedKVStage.forward(self, inputs)
        return {**out, "hidden_states": out["hidden_states"][[0, 2, 1, 3]]} if "hidden_states" in out else out
    model, batch = _gemma3n_text(tokenizer)
    with mock.patch.object(gemma3n_altup.AltUpStage, "forward", swapped):
        with pytest.raises(AssertionError):
            check_exact(model, batch, 1)
