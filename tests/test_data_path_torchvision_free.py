"""The torchvision-free data path of the image families whose stock image processor exists only with a torchvision
backend: their torch-operation image processors (``mpipe_hf/data/image_processor_*.py``, equal to the stock classes
bit for bit: ``tests/test_stock_recorded.py``) under the stock processor classes and the families' chat templates
(their groups' ``mpipe_hf/families/<group>/data.py``) collate a conversation with an image that the unsplit tiny model trains on,
whose image-token count is what the image processor's outputs give and what the load-time check takes, and one
image token less or more is refused. A saved snapshot loads back without torchvision as the processor that saved
it; ``mpipe-hf train`` on this data path equals one process (``MPIPE_HF_FULL=1``). The split of these families is
exact in CI on vision inputs built directly (``tests/dist/pools_without_processor.py``,
``tests/dist/direct_llava_like.py``) and in ``tests/test_numerics.py``.

``FAMILIES`` holds what differs between the families (the image-token count the processor's outputs give, the
photo's size, each family's own checks); the tests below run over every family of the table."""

import json
import math
import os
from dataclasses import dataclass, field
from typing import Callable

import PIL.Image
import pytest
import skimage
import torch
from transformers import AutoModelForImageTextToText
from transformers.utils import is_torchvision_available

from mpipe_hf.data import ConversationCollator, build_processor, load_checkpoint_processor, qwen2_tokenizer
from mpipe_hf.models import split
from mpipe_hf.families.registry import tiny_config
from mpipe_hf.schedule import ScheduleConfig
from mpipe_hf.train.sources import micro_validator

ANSWERS = ["A cup of coffee.", "Hello there!"]


def llama4_tokens(batch: dict, config) -> int:
    """Llama 4: 4 tokens a tile; the 120 x 80 photo is a 2 x 2 canvas (the least shrink), 4 tiles and the global
    one, in ``bfloat16`` as the stock processor gives them."""
    tiles = batch["pixel_values"].shape[0]
    assert batch["pixel_values"].dtype == torch.bfloat16 and tiles == 5
    return tiles * 4


def gemma4_unified_tokens(batch: dict, config) -> int:
    """Gemma 4 Unified: its merged patches, the rows of ``image_position_ids`` that are not padding."""
    return int((batch["image_position_ids"][..., 0] >= 0).sum())


def muse_tokens(batch: dict, config) -> int:
    """Muse Glimmer and Spark: the patch grid over the merge area."""
    return int(batch["image_grid_thw"].prod(-1).sum()) // config.vision_config.merge_size ** 2


def kimi_k25_tokens(batch: dict, config) -> int:
    """Kimi K2.5: its patch grid over the merge kernel's area."""
    kernel = config.vision_config.merge_kernel_size
    return int(batch["image_grid_thw"].prod(-1).sum()) // (kernel[0] * kernel[1])


def minicpm_ocr_tokens(batch: dict, config) -> int:
    """MiniCPM-OCR (the 120 x 80 photo is cut into slices): each view's patches over 4 (the ``4x`` merge)."""
    return int(batch["target_sizes"].prod(-1).sum()) // 4


def unlimited_ocr_tokens(batch: dict, config) -> int:
    """Unlimited-OCR (the 120 x 80 photo is cut into tiles): per view side ``q = ceil(side / patch / 4)`` queries,
    a newline after each row of them, one separator, its tiles' canvas likewise."""
    patch = config.vision_config.sam_config.patch_size
    glob, tile = (math.ceil(batch[k].shape[-1] // patch / 4) for k in ("pixel_values", "pixel_values_local"))
    columns, rows_ = batch["patches_grid"][0].tolist()
    return glob * (glob + 1) + 1 + (rows_ * tile) * (columns * tile + 1)


def nemotron_h_omni_tokens(batch: dict, config) -> int:
    """Nemotron-H Omni: its patch grid over the pixel shuffle's area (the 120 x 80 photo: 6 x 8 patches, 12
    tokens)."""
    return int(batch["image_grid_hw"].prod(-1).sum()) * round(1 / config.downsample_ratio) ** -2


def stock_count(count: int) -> Callable:
    """A count the stock processor writes for the 120 x 80 photo (worked out below, per family)."""
    return lambda batch, config: count


def in_vision_markers(c: dict) -> None:
    """One run of image tokens between the Qwen2 vocabulary's vision start and end (Gemma 4 Unified's and Muse's
    begin and end markers; Nemotron-H Omni's ``<img>`` ... ``</img>``)."""
    ids, first, last = c["ids"], c["first"], c["last"]
    assert last - first + 1 == c["count"]
    start, end = c["tokenizer"].convert_tokens_to_ids(["<|vision_start|>", "<|vision_end|>"])
    assert ids[0, first - 1] == start and ids[0, last + 1] == end


def no_hub_markers(*markers: str) -> Callable:
    """The hub's markers, which the Qwen2 vocabulary lacks (written as text they would be split into pieces),
    appear nowhere in the row."""
    def check(c: dict) -> None:
        assert not any(marker in c["processor"].tokenizer.decode(c["ids"][0]) for marker in markers)
    return check


def molmo2_checks(c: dict) -> None:
    """Molmo2's hub markers, and its bidirectional image block: every image token and marker, nothing else."""
    no_hub_markers("<im_", "<low_res")(c)
    ids, batch = c["ids"], c["batch"]
    markers = set(c["processor"].image_token_ids)
    assert batch["mm_token_type_ids"].tolist() == [[int(t in markers) for t in row] for row in ids.tolist()]
    assert int(batch["mm_token_type_ids"][0].sum()) > c["count"]


def inkling_checks(c: dict) -> None:
    """Inkling: the photo to 0.2 is 40 x 24 px, ``ceil(24 / 4)`` rows of ``40 // 4 + 1`` squares (one token a
    square), after the image-start marker; the processor's class is ours by name."""
    assert type(c["processor"].image_processor).__name__ == "InklingImageProcessorNoTV"
    assert c["batch"]["pixel_values"].shape == (6 * 11, 2, 4, 4, 3) and c["count"] == 66
    assert c["ids"][0, c["first"] - 1] == c["config"].image_bos_token_id


def nemotron_h_omni_checks(c: dict) -> None:
    """Nemotron-H Omni: its image in the vision markers; the answers alone are labelled, after the empty reasoning
    block of the non-thinking mode."""
    in_vision_markers(c)
    ids, labels = c["ids"], c["labels"]
    prompt = c["processor"].tokenizer.decode(ids[1][:int((labels[1] != -100).nonzero()[0, 0])])
    assert prompt.startswith("<|im_start|>system\n<|im_end|>\n") and prompt.endswith("assistant\n<think></think>")


@dataclass(frozen=True)
class Family:
    """What differs between the families' data paths. ``tokens(batch, config)``: the image tokens the image
    processor's outputs give (``None``: the conversation is another module's, LFM2-VL's and Cohere2-Vision's in
    ``tests/test_families_llava_like.py``); ``photo``: the test photo's size (px, width x height); ``layers``: the
    tiny model's; ``split_check``: the load check taken from the split model (``validate_micro``) rather than
    ``micro_validator``; ``end_markers``: tokens right after the image's last token that "one token more" passes
    over; ``checks(context)``: the family's own assertions; ``saved``: settings the snapshot must hold;
    ``trains``: in the ``mpipe-hf train`` comparison, with ``logits_tol`` and the key ``micro`` must hold."""

    tokens: Callable | None
    photo: tuple = (120, 80)
    layers: int = 2
    split_check: bool = False
    end_markers: int = 0
    checks: Callable | None = None
    saved: dict = field(default_factory=dict)
    trains: bool = True
    logits_tol: float = 1e-4
    micro_key: str = "pixel_values"


# The tiny Gemma 4 Unified's first gradient norm is 1.6e3 (its raw-patch embedder at random weights), so the clip
# scales the gradients by 6e-4, and AdamW's eps (1e-6) meets gradient elements of its size, where float32 reduction
# order shows in the update: its one-process reference alone, on 1 thread and on 2, ends 2.3e-4 apart in the
# checkpoint's logits; the split ends 1.5e-3 apart (losses and gradient norms within 1e-4). Measured: the last
# AdamW step skipped moves them by 0.79, so the bound of 1e-2 keeps its teeth.
FAMILIES = {
    # Llama 4 does not train here: its processor gives bfloat16 pixels, as the stock one does, which the split
    # casts to the model's dtype but the one-process reference (the HF model as called) refuses in a float32 model
    "llama4": Family(llama4_tokens, split_check=True, end_markers=1, trains=False),
    "lfm2_vl": Family(None),
    "cohere2_vision": Family(None, trains=False),
    "gemma4_unified": Family(gemma4_unified_tokens, end_markers=1, checks=in_vision_markers, logits_tol=1e-2),
    "muse_glimmer": Family(muse_tokens, end_markers=1, checks=in_vision_markers),
    "muse_spark": Family(muse_tokens, end_markers=1, checks=in_vision_markers),
    # MiniCPM-OCR: 4 layers put a full-attention layer among them
    "kimi_k25": Family(kimi_k25_tokens, layers=4),
    "minicpm_ocr": Family(minicpm_ocr_tokens, layers=4),
    "unlimited_ocr": Family(unlimited_ocr_tokens, layers=4),
    # as each stock processor writes them: Molmo2's low-resolution view (2 x 2 pooled patches) and its 2 x 2
    # canvas of crops (3 x 5); Step3p7's 96-px global view (3 x 3) and 4 windows of 64 px (2 x 2 each);
    # MiniMax-M3-VL's 32 x 48 px at 16 px a token
    "molmo2": Family(stock_count(4 + 15), split_check=True, checks=molmo2_checks),
    "step3p7": Family(stock_count(9 + 4 * 4), split_check=True, end_markers=1,
                      checks=no_hub_markers("<patch_", "<im_")),
    "minimax_m3_vl": Family(stock_count(40), split_check=True, end_markers=1, checks=no_hub_markers("]<]")),
    # Inkling: the tiny tower's 4-px patches scale a photo to 0.2 (the released checkpoints' factor with the patch)
    "inkling_mm_model": Family(stock_count(66), photo=(200, 120), layers=4, checks=inkling_checks,
                               saved={"image_processor_type": "InklingImageProcessor", "rescale_image_frac": 0.2}),
    "nemotron_h_omni": Family(nemotron_h_omni_tokens, layers=6, end_markers=1, checks=nemotron_h_omni_checks,
                              micro_key="image_grid_hw"),
}
CONVERSING = [t for t, f in FAMILIES.items() if f.tokens is not None]
TRAINING = [t for t, f in FAMILIES.items() if f.trains]


def rows(model_type: str) -> list[dict]:
    """A conversation with the family's photo, and one of text alone."""
    photo = PIL.Image.fromarray(skimage.data.coffee()).resize(FAMILIES[model_type].photo)
    image = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]},
                          {"role": "assistant", "content": [{"type": "text", "text": ANSWERS[0]}]}], "images": [photo]}
    text = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Say hello."}]},
                         {"role": "assistant", "content": [{"type": "text", "text": ANSWERS[1]}]}], "images": []}
    return [image, text]


@pytest.fixture(scope="module")
def tokenizer():
    return qwen2_tokenizer(5120)


@pytest.mark.parametrize("model_type", CONVERSING)
def test_a_conversation_trains_and_passes_the_load_check(model_type, tokenizer):
    """The image's tokens are what the image processor's outputs give (counted by the model's own rule at load),
    no token is added to the vocabulary (the stock Gemma 4 classes add ``<|video|>``), only the answers are
    labelled, the model trains on it, and one image token less or more is refused at load."""
    family = FAMILIES[model_type]
    torch.manual_seed(0)
    config = tiny_config(model_type)(tokenizer, num_layers=family.layers)
    processor = build_processor(config, tokenizer)
    assert len(processor.tokenizer) == len(tokenizer)  # no token added
    assert type(processor.image_processor).__name__.endswith("NoTV")
    batch = ConversationCollator(processor, None, model_type=model_type)(rows(model_type))
    ids, labels = batch["input_ids"], batch["labels"]
    image = ids == config.image_token_id
    count = family.tokens(batch, config)
    assert count > 1 and int(image[0].sum()) == count and not image[1].any() and (labels[image] == -100).all()
    first, last = image[0].nonzero()[[0, -1], 0].tolist()
    if family.checks is not None:
        family.checks({"batch": batch, "ids": ids, "labels": labels, "count": count, "first": first, "last": last,
                       "processor": processor, "config": config, "tokenizer": tokenizer})
    answered = [processor.tokenizer.decode(ids[i][labels[i] != -100], skip_special_tokens=True).strip()
                for i in range(2)]
    assert answered == ANSWERS
    model = AutoModelForImageTextToText.from_config(config)
    floats = {k: v.float() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in batch.items()}
    assert torch.isfinite(model(**floats).loss)  # float32 pixels: Llama 4's are bfloat16
    if family.split_check:
        validate = split(model, ScheduleConfig(1, 2, 1, "identity"), 0).validate_micro
    else:
        validate = micro_validator(config)
    validate(batch)
    text = (~image[0] & (labels[0] == -100) & batch["attention_mask"][0].bool()).nonzero()[:, 0]
    less, more = ids.clone(), ids.clone()
    less[0, first] = ids[0, text[0]]  # one image token less
    # one more: the prompt's first text token after the image (past its end marker)
    more[0, text[text > last + family.end_markers][0]] = config.image_token_id
    for broken in (less, more):
        with pytest.raises(ValueError, match="image-token count"):
            validate({**batch, "input_ids": broken})


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_a_saved_snapshot_loads_back_without_torchvision(model_type, tokenizer, tmp_path):
    """``save_pretrained`` names the stock classes (``AutoProcessor`` builds them where torchvision is installed;
    with the stock classes under torch 2.14.1 + torchvision 0.29.1, LFM2-VL's snapshot gave the same tensors);
    without torchvision ``load_checkpoint_processor`` builds ours over the snapshot's settings, which processes a
    conversation as the processor that saved it."""
    config = tiny_config(model_type)(tokenizer)
    processor = build_processor(config, tokenizer)
    config.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "preprocessor_config.json").read_text())
    assert saved["image_processor_type"] == processor.image_processor.stock_class_name
    assert {k: saved[k] for k in FAMILIES[model_type].saved} == FAMILIES[model_type].saved
    if is_torchvision_available():
        pytest.skip("with torchvision the snapshot loads as the stock classes")
    loaded = load_checkpoint_processor(str(tmp_path))
    assert type(loaded.image_processor) is type(processor.image_processor)
    row = rows(model_type)[0]
    text = loaded.apply_chat_template(row["messages"][:1], tokenize=False, add_generation_prompt=True)
    got, want = (p(text=[text], images=row["images"], return_tensors="pt") for p in (loaded, processor))
    assert sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want)


@pytest.mark.skipif(os.environ.get("MPIPE_HF_FULL") != "1",
                    reason="the full suite (MPIPE_HF_FULL=1): a torchrun launch each; CI checks these families' data "
                           "path above and their split in test_numerics.py")
@pytest.mark.parametrize("model_type", TRAINING)
def test_mpipe_hf_train_through_the_torchvision_free_data_path(demo, tmp_path, model_type):
    """``mpipe-hf train`` on the tiny model over the demo's conversations, micro-batches built by the data path
    (the torch-operation image processor under the stock processor class), equals the unsplit model on one
    process (losses, gradient norms, the reloaded checkpoint's logits: ``train_like_one_process``)."""
    from train_common import train_tiny_family_like_one_process
    family = FAMILIES[model_type]
    processor, _, micro = train_tiny_family_like_one_process(demo, tmp_path, model_type, tiny_config(model_type),
                                                             family.logits_tol)
    assert type(processor.image_processor).__name__.endswith("NoTV") and family.micro_key in micro


def test_minicpm_ocr_adaptive_upsize_needs_opencv_as_the_stock_class():
    """``small_image_upsize="adaptive"`` (a checkpoint may set it) takes the stock glyph classifier, which needs
    OpenCV: without it the call raises the stock ``ImportError`` naming OpenCV, never a silent other resize. (With
    OpenCV, the stock class and ours gave equal outputs on 50 calls, slices replaced at their adaptive size
    included: torch 2.14.1, torchvision 0.29.1, opencv-python-headless 5.0.)"""
    import importlib.util

    from mpipe_hf.families.qwen_like.image_processor_minicpm_ocr import MiniCPMOcrImageProcessorNoTV
    if importlib.util.find_spec("cv2") is not None:
        pytest.skip("OpenCV is installed")
    processor = MiniCPMOcrImageProcessorNoTV(scale_resolution=56, patch_size=14, small_image_upsize="adaptive")
    with pytest.raises(ImportError, match="OpenCV"):
        processor(images=[PIL.Image.new("RGB", (30, 20))], return_tensors="pt")
    with pytest.raises(ValueError, match="small_image_upsize"):
        MiniCPMOcrImageProcessorNoTV(small_image_upsize="sometimes")(images=[PIL.Image.new("RGB", (30, 20))])


def test_a_nemotron_h_config_file_with_an_infinite_float_loads(tokenizer, tmp_path):
    """A recipe's ``model.config`` file as ``save_pretrained`` writes it: Nemotron-H's ``time_step_limit`` of
    ``(0, inf)`` is saved tagged (``{"__float__": "Infinity"}``) and read back as ``inf`` (untagged, the config
    class refuses the tag: the tiny recipe stopped there)."""
    from mpipe_hf.train.recipe_model import ModelSource
    from mpipe_hf.train.sources import load_config
    tiny_config("nemotron_h_omni")(tokenizer).to_json_file(str(tmp_path / "config.json"))
    assert '"__float__": "Infinity"' in (tmp_path / "config.json").read_text()
    config = load_config(ModelSource(config=str(tmp_path / "config.json")))
    assert list(config.text_config.time_step_limit) == [0.0, float("inf")]
