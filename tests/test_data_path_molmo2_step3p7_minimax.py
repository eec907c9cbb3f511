"""Molmo2, Step3p7 and MiniMax-M3-VL through the real data path without torchvision: their torch-operation image
processors (equal to the stock classes bit for bit, ``tests/test_stock_recorded.py``) under the stock processor
classes with the markers the tokenizer names (``mpipe_hf/data/processors_molmo2_step3p7_minimax.py``) collate a
conversation with an image that the unsplit tiny model trains on and the split's load-time check takes, and a
saved snapshot loads back as the same processor."""

import json
import os

import PIL.Image
import pytest
import skimage
import torch
from transformers import AutoModelForImageTextToText
from transformers.utils import is_torchvision_available

from mpipe_hf.data import ConversationCollator, build_processor, load_checkpoint_processor, qwen2_tokenizer
from mpipe_hf.models import split
from mpipe_hf.models.tiny_all import TINY_MODELS
from mpipe_hf.schedule import ScheduleConfig

ANSWERS = ["A cup of coffee.", "Hello there!"]
TYPES = ["molmo2", "step3p7", "minimax_m3_vl"]
# image tokens of the 120 x 80 photo, as each stock processor writes them: Molmo2's low-resolution view (2 x 2
# pooled patches) and its 2 x 2 canvas of crops (3 x 5); Step3p7's 96-px global view (3 x 3) and 4 windows of 64
# px (2 x 2 each); MiniMax-M3-VL's 32 x 48 px at 16 px a token
IMAGE_TOKENS = {"molmo2": 4 + 15, "step3p7": 9 + 4 * 4, "minimax_m3_vl": 40}
# the hub's markers, which the Qwen2 vocabulary lacks (written as text they would be split into pieces)
HUB_MARKERS = {"molmo2": ("<im_", "<low_res"), "step3p7": ("<patch_", "<im_"), "minimax_m3_vl": ("]<]",)}


def rows() -> list[dict]:
    photo = PIL.Image.fromarray(skimage.data.coffee()).resize((120, 80))
    image = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]},
                          {"role": "assistant", "content": [{"type": "text", "text": ANSWERS[0]}]}], "images": [photo]}
    text = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Say hello."}]},
                         {"role": "assistant", "content": [{"type": "text", "text": ANSWERS[1]}]}], "images": []}
    return [image, text]


@pytest.fixture(scope="module")
def tokenizer():
    return qwen2_tokenizer(5120)


@pytest.mark.parametrize("model_type", TYPES)
def test_a_conversation_trains_and_loads(model_type, tokenizer):
    """The image's tokens are the stock processor's (counted by the model's own rule at load: a wrong count is
    refused), no token is added to the vocabulary, only the answers are labelled, and the model trains on it."""
    torch.manual_seed(0)
    config = TINY_MODELS[model_type](tokenizer, num_layers=2)
    processor = build_processor(config, tokenizer)
    assert type(processor.image_processor).__name__.endswith("NoTV") and len(processor.tokenizer) == len(tokenizer)
    batch = ConversationCollator(processor, None, model_type=model_type)(rows())
    ids, labels = batch["input_ids"], batch["labels"]
    image = ids == config.image_token_id
    assert int(image[0].sum()) == IMAGE_TOKENS[model_type] and not image[1].any()
    assert (labels[image] == -100).all()
    assert not any(marker in processor.tokenizer.decode(ids[0]) for marker in HUB_MARKERS[model_type])
    answered = [processor.tokenizer.decode(ids[i][labels[i] != -100], skip_special_tokens=True).strip()
                for i in range(2)]
    assert answered == ANSWERS
    if model_type == "molmo2":  # the bidirectional image block: every image token and marker, nothing else
        markers = set(processor.image_token_ids)
        assert batch["mm_token_type_ids"].tolist() == [[int(t in markers) for t in row] for row in ids.tolist()]
        assert int(batch["mm_token_type_ids"][0].sum()) > IMAGE_TOKENS[model_type]
    model = AutoModelForImageTextToText.from_config(config)
    assert torch.isfinite(model(**batch).loss)
    validate = split(model, ScheduleConfig(1, 2, 1, "identity"), 0).validate_micro
    validate(batch)
    broken = ids.clone()
    broken[tuple(image.nonzero()[0])] = 0
    with pytest.raises(ValueError, match="image-token count"):
        validate({**batch, "input_ids": broken})


@pytest.mark.parametrize("model_type", TYPES)
def test_a_saved_snapshot_loads_back_without_torchvision(model_type, tokenizer, tmp_path):
    """``save_pretrained`` names the stock image processor class; without torchvision
    ``load_checkpoint_processor`` builds ours over the snapshot's settings, which processes a conversation as the
    processor that saved it."""
    config = TINY_MODELS[model_type](tokenizer)
    processor = build_processor(config, tokenizer)
    config.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "preprocessor_config.json").read_text())
    assert saved["image_processor_type"] == processor.image_processor.stock_class_name
    if is_torchvision_available():
        pytest.skip("with torchvision the snapshot loads as the stock classes")
    loaded = load_checkpoint_processor(str(tmp_path))
    assert type(loaded.image_processor) is type(processor.image_processor)
    text = loaded.apply_chat_template(rows()[0]["messages"][:1], tokenize=False, add_generation_prompt=True)
    got, want = (p(text=[text], images=rows()[0]["images"], return_tensors="pt") for p in (loaded, processor))
    assert sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want)


@pytest.mark.skipif(os.environ.get("MPIPE_HF_FULL") != "1",
                    reason="the full suite (MPIPE_HF_FULL=1): a torchrun launch of its own; CI checks these "
                           "families' data path above and their split in test_numerics.py")
@pytest.mark.parametrize("model_type", TYPES)
def test_mpipe_hf_train_through_the_torchvision_free_data_path(demo, tmp_path, model_type):
    """``mpipe-hf train`` on the tiny model over the demo's conversations, micro-batches built by the data path
    above, equals the unsplit model on one process (losses, gradient norms, the reloaded checkpoint's logits:
    ``train_like_one_process``)."""
    from train_common import train_tiny_family_like_one_process
    processor, _, micro = train_tiny_family_like_one_process(demo, tmp_path, model_type, TINY_MODELS[model_type])
    assert type(processor.image_processor).__name__.endswith("NoTV") and "pixel_values" in micro
