"""The Qwen-like families (mpipe_hf/families/qwen_like, with GLM-4.6V's kin and the Qwen Omni thinkers that were
declared beside them): each declared family's tiny config, processor and chat template collate a two-turn
conversation with an image (next to a text-only row), and the unsplit HF model trains on it; each refused type has a
reason and no declaration."""

import PIL.Image
import pytest
import skimage
import torch
from transformers import AutoModelForImageTextToText

from mpipe_hf.data import ConversationCollator, build_processor, qwen2_tokenizer
from mpipe_hf.families import registry
from test_family_data import label_runs

_TYPES = [*registry.GROUPS["qwen_like"], "glm46v", "glmga", "glm_ocr", "qwen2_5_omni_thinker",
          "qwen3_omni_moe_thinker"]
FAMILIES = {t: registry.family(t) for t in _TYPES if registry.family(t) is not None}
TINY = {t: registry.tiny_config(t) for t in _TYPES if registry.tiny_config(t) is not None}
REFUSED = {t: registry.refusal(t) for t in _TYPES if registry.refusal(t) is not None}
# the types whose stock image processor needs torchvision (their data path is tested with the torch-operation ones)
NEEDS_TORCHVISION = [t for t in _TYPES if getattr(registry.family_data(t), "no_torchvision_images", None)]
DATA = {t: registry.family_data(t) for t in FAMILIES if registry.family_data(t) and t not in NEEDS_TORCHVISION}

ANSWERS = ["A cup of coffee.", "Yes, on a saucer.", "Hello there!"]
# the types whose stock image processor needs torchvision may have no processor here yet: their split is checked on
# micro-batches built without one (tests/test_families_without_processor.py, the numerics cases)
TYPES = sorted(t for t in FAMILIES if t in DATA)


def rows() -> list[dict]:
    photo = PIL.Image.fromarray(skimage.data.coffee())  # 400 x 600: not square
    image_row = {"messages": [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": ANSWERS[0]}]},
        {"role": "user", "content": [{"type": "text", "text": "On a plate?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": ANSWERS[1]}]}], "images": [photo]}
    text_row = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Say hello."}]},
                             {"role": "assistant", "content": [{"type": "text", "text": ANSWERS[2]}]}], "images": []}
    return [image_row, text_row]


@pytest.fixture(scope="module")
def tokenizer():
    return qwen2_tokenizer(5120)


def answers(ids: torch.Tensor, labels: torch.Tensor, tokenizer) -> list[str]:
    """The labelled runs of one row, decoded without special tokens."""
    return [tokenizer.decode(run, skip_special_tokens=True).strip() for run in label_runs(ids, labels)]


def test_every_type_is_declared_or_refused():
    assert set(FAMILIES) == set(TINY) and set(DATA) <= set(FAMILIES)
    assert set(FAMILIES) - set(DATA) <= set(NEEDS_TORCHVISION)
    assert not set(FAMILIES) & set(REFUSED)
    assert all(len(reason) > 20 for reason in REFUSED.values())


@pytest.mark.parametrize("model_type", TYPES)
def test_conversation_trains(model_type, tokenizer):
    config = TINY[model_type](tokenizer, num_layers=4)  # Qwen3.5's text model needs a full-attention layer
    assert config.model_type == model_type and config.get_text_config().vocab_size == len(tokenizer)
    processor = build_processor(config, tokenizer)
    assert len(processor.tokenizer) == len(tokenizer) and not hasattr(tokenizer, "image_token")
    batch = ConversationCollator(processor, None, model_type=model_type)(rows())
    ids, labels = batch["input_ids"], batch["labels"]
    image = ids == config.image_token_id
    assert image[0].any() and not image[1].any() and (labels[image] == -100).all()
    got = [answers(ids[i], labels[i], processor.tokenizer) for i in range(2)]
    assert got == [ANSWERS[:2], ANSWERS[2:]]
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config)
    out = model(**batch)
    assert torch.isfinite(out.loss)
    out.loss.backward()
    tower = [p for n, p in model.named_parameters() if n.startswith(FAMILIES[model_type].vision[0])]
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in tower)


@pytest.mark.parametrize("model_type", ["qwen2_5_omni_thinker", "qwen3_omni_moe_thinker"])
def test_thinker_refuses_audio_and_video(model_type, tokenizer):
    config = TINY[model_type](tokenizer, num_layers=2)
    validate = FAMILIES[model_type].validate(AutoModelForImageTextToText.from_config(config))
    ids = torch.tensor([[1, 2, 3]])
    validate({"input_ids": ids})  # text alone passes
    with pytest.raises(ValueError, match="audio inputs .*input_features"):
        validate({"input_ids": ids, "input_features": torch.zeros(1, 128, 10)})
    with pytest.raises(ValueError, match="video inputs .*pixel_values_videos"):
        validate({"input_ids": ids, "pixel_values_videos": torch.zeros(4, 8)})
