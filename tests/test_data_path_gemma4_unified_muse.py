"""Gemma 4 Unified, Muse Glimmer and Muse Spark through the real data path: their torchvision-free image processors
(``mpipe_hf/data/image_processor_gemma4_unified.py``, ``image_processor_muse_glimmer.py``, equal to the stock
classes bit for bit: ``tests/test_stock_recorded.py``) under the stock processor classes and the families' chat
templates (``mpipe_hf/data/processors_gemma4_unified_muse.py``) collate a conversation with an image that the
unsplit tiny model trains on, whose image-token count is the processor's own and that the load-time check takes,
and refuses one image token off. The split of these families is exact in CI on vision inputs built directly
(``tests/dist/pools_without_processor.py``); a saved snapshot loading back without torchvision and ``mpipe-hf
train`` on this data path are ``tests/test_data_path_torch_op_images.py``'s."""

import PIL.Image
import pytest
import skimage
import torch
from transformers import AutoModelForImageTextToText

from mpipe_hf.data import ConversationCollator, build_processor, qwen2_tokenizer
from mpipe_hf.models.tiny_all import TINY_MODELS
from mpipe_hf.train.sources import micro_validator

FAMILIES = ["gemma4_unified", "muse_glimmer", "muse_spark"]
ANSWERS = ["A cup of coffee.", "Hello there!"]


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


def processor_tokens(model_type: str, batch: dict, config) -> int:
    """The image tokens the image processor's outputs give (Gemma 4 Unified: its merged patches, the rows of
    ``image_position_ids`` that are not padding; Muse: the patch grid over the merge area)."""
    if model_type == "gemma4_unified":
        return int((batch["image_position_ids"][..., 0] >= 0).sum())
    return int(batch["image_grid_thw"].prod(-1).sum()) // config.vision_config.merge_size ** 2


@pytest.mark.parametrize("model_type", FAMILIES)
def test_a_conversation_trains_and_passes_the_load_check(model_type, tokenizer):
    torch.manual_seed(0)
    config = TINY_MODELS[model_type](tokenizer, num_layers=2)
    processor = build_processor(config, tokenizer)
    assert len(processor.tokenizer) == len(tokenizer)  # no token added (the stock Gemma 4 classes add <|video|>)
    assert type(processor.image_processor).__name__.endswith("NoTV")
    batch = ConversationCollator(processor, None, model_type=model_type)(rows())
    ids, labels = batch["input_ids"], batch["labels"]
    image = ids == config.image_token_id
    count = processor_tokens(model_type, batch, config)
    assert count > 1 and int(image[0].sum()) == count and not image[1].any() and (labels[image] == -100).all()
    first, last = image[0].nonzero()[[0, -1], 0].tolist()  # one run, between the begin and end markers
    assert last - first + 1 == count
    assert (ids[0, first - 1].item(), ids[0, last + 1].item()) == tuple(tokenizer.convert_tokens_to_ids(
        ["<|vision_start|>", "<|vision_end|>"]))
    answered = [processor.tokenizer.decode(ids[i][labels[i] != -100], skip_special_tokens=True).strip()
                for i in range(2)]
    assert answered == ANSWERS
    model = AutoModelForImageTextToText.from_config(config)
    assert torch.isfinite(model(**batch).loss)
    validate = micro_validator(config)
    validate(batch)
    less, more = ids.clone(), ids.clone()
    less[0, first] = 0  # one image token less
    more[0, last + 2] = config.image_token_id  # one more: the prompt's first text token after the image
    for broken in (less, more):
        with pytest.raises(ValueError, match="image-token count"):
            validate({**batch, "input_ids": broken})
