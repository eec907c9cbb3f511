"""Kimi K2.5, MiniCPM-OCR and Unlimited-OCR through the real data path: their torchvision-free image processors
(``mpipe_hf/data/image_processor_kimi_k25.py``, ``image_processor_minicpm_ocr.py``,
``image_processor_unlimited_ocr.py``, equal to the stock classes bit for bit: ``tests/test_stock_recorded.py``)
under the stock processor classes and the families' chat templates (``mpipe_hf/data/processors_kimi_ocr.py``)
collate a conversation with an image that the unsplit tiny model trains on, whose image-token count is what the
image processor's outputs give and what the load-time check takes, and one image token off is refused. A saved
snapshot loads back without torchvision as the processor that saved it; ``mpipe-hf train`` on this data path
equals one process (``MPIPE_HF_FULL=1``). The split of these families is exact in CI on vision inputs built
directly (``tests/dist/pools_without_processor.py``, ``tests/dist/direct_llava_like.py``)."""

import json
import math
import os

import PIL.Image
import pytest
import skimage
import torch
from transformers import AutoModelForImageTextToText
from transformers.utils import is_torchvision_available

from mpipe_hf.data import ConversationCollator, build_processor, load_checkpoint_processor, qwen2_tokenizer
from mpipe_hf.models.tiny_all import TINY_MODELS
from mpipe_hf.train.sources import micro_validator

FAMILIES = ["kimi_k25", "minicpm_ocr", "unlimited_ocr"]
ANSWERS = ["A cup of coffee.", "Hello there!"]


def rows() -> list[dict]:
    photo = PIL.Image.fromarray(skimage.data.coffee()).resize((120, 80))  # MiniCPM-OCR: slices; Unlimited: tiles
    image = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]},
                          {"role": "assistant", "content": [{"type": "text", "text": ANSWERS[0]}]}], "images": [photo]}
    text = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Say hello."}]},
                         {"role": "assistant", "content": [{"type": "text", "text": ANSWERS[1]}]}], "images": []}
    return [image, text]


@pytest.fixture(scope="module")
def tokenizer():
    return qwen2_tokenizer(5120)


def processor_tokens(model_type: str, batch: dict, config) -> int:
    """The image tokens the image processor's outputs give: Kimi K2.5 its patch grid over the merge kernel's area;
    MiniCPM-OCR each view's patches over 4 (the ``4x`` merge); Unlimited-OCR per view side ``q = ceil(side / patch
    / 4)`` queries, a newline after each row of them, one separator, its tiles' canvas likewise."""
    if model_type == "kimi_k25":
        kernel = config.vision_config.merge_kernel_size
        return int(batch["image_grid_thw"].prod(-1).sum()) // (kernel[0] * kernel[1])
    if model_type == "minicpm_ocr":
        return int(batch["target_sizes"].prod(-1).sum()) // 4
    patch = config.vision_config.sam_config.patch_size
    glob, tile = (math.ceil(batch[k].shape[-1] // patch / 4) for k in ("pixel_values", "pixel_values_local"))
    columns, rows_ = batch["patches_grid"][0].tolist()
    return glob * (glob + 1) + 1 + (rows_ * tile) * (columns * tile + 1)


@pytest.mark.parametrize("model_type", FAMILIES)
def test_a_conversation_trains_and_passes_the_load_check(model_type, tokenizer):
    torch.manual_seed(0)
    config = TINY_MODELS[model_type](tokenizer, num_layers=4)  # MiniCPM-OCR: a full-attention layer among them
    processor = build_processor(config, tokenizer)
    assert len(processor.tokenizer) == len(tokenizer)  # no token added
    assert type(processor.image_processor).__name__.endswith("NoTV")
    batch = ConversationCollator(processor, None, model_type=model_type)(rows())
    ids, labels = batch["input_ids"], batch["labels"]
    image = ids == config.image_token_id
    count = processor_tokens(model_type, batch, config)
    assert count > 1 and int(image[0].sum()) == count and not image[1].any() and (labels[image] == -100).all()
    answered = [processor.tokenizer.decode(ids[i][labels[i] != -100], skip_special_tokens=True).strip()
                for i in range(2)]
    assert answered == ANSWERS
    model = AutoModelForImageTextToText.from_config(config)
    assert torch.isfinite(model(**batch).loss)
    validate = micro_validator(config)
    validate(batch)
    first, last = image[0].nonzero()[[0, -1], 0].tolist()
    text = (~image[0] & (labels[0] == -100) & batch["attention_mask"][0].bool()).nonzero()[:, 0]
    less, more = ids.clone(), ids.clone()
    less[0, first] = ids[0, text[0]]  # one image token less
    more[0, text[text > last][0]] = config.image_token_id  # one more: the prompt's first text token after it
    for broken in (less, more):
        with pytest.raises(ValueError, match="image-token count"):
            validate({**batch, "input_ids": broken})


@pytest.mark.parametrize("model_type", FAMILIES)
def test_a_saved_snapshot_loads_back_without_torchvision(model_type, tokenizer, tmp_path):
    """``save_pretrained`` names the stock classes (``AutoProcessor`` builds them where torchvision is installed);
    without torchvision ``load_checkpoint_processor`` builds ours over the snapshot's settings, which processes a
    conversation as the processor that saved it."""
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
                    reason="the full suite (MPIPE_HF_FULL=1): a torchrun launch each; CI checks these families' data "
                           "path above and their split in test_numerics.py")
@pytest.mark.parametrize("model_type", FAMILIES)
def test_mpipe_hf_train_through_the_torchvision_free_data_path(demo, tmp_path, model_type):
    """``mpipe-hf train`` on the tiny model over the demo's conversations, micro-batches built by the data path
    (the torch-operation image processor under the stock processor class), equals the unsplit model on one
    process (losses, gradient norms, the reloaded checkpoint's logits: ``train_like_one_process``)."""
    from train_common import train_tiny_family_like_one_process
    processor, _, micro = train_tiny_family_like_one_process(demo, tmp_path, model_type, TINY_MODELS[model_type])
    assert type(processor.image_processor).__name__.endswith("NoTV") and "pixel_values" in micro


def test_minicpm_ocr_adaptive_upsize_needs_opencv_as_the_stock_class():
    """``small_image_upsize="adaptive"`` (a checkpoint may set it) takes the stock glyph classifier, which needs
    OpenCV: without it the call raises the stock ``ImportError`` naming OpenCV, never a silent other resize. (With
    OpenCV, the stock class and ours gave equal outputs on 50 calls, slices replaced at their adaptive size
    included: torch 2.14.1, torchvision 0.29.1, opencv-python-headless 5.0.)"""
    import importlib.util

    from mpipe_hf.data.image_processor_minicpm_ocr import MiniCPMOcrImageProcessorNoTV
    if importlib.util.find_spec("cv2") is not None:
        pytest.skip("OpenCV is installed")
    processor = MiniCPMOcrImageProcessorNoTV(scale_resolution=56, patch_size=14, small_image_upsize="adaptive")
    with pytest.raises(ImportError, match="OpenCV"):
        processor(images=[PIL.Image.new("RGB", (30, 20))], return_tensors="pt")
    with pytest.raises(ValueError, match="small_image_upsize"):
        MiniCPMOcrImageProcessorNoTV(small_image_upsize="sometimes")(images=[PIL.Image.new("RGB", (30, 20))])
