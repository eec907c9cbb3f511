"""The data path of Kimi K2.5, MiniCPM-OCR and Unlimited-OCR (:class:`~.family_data.FamilyData` each), whose stock
image processors exist in ``transformers`` only with a torchvision backend: here their torchvision-free versions
(:mod:`.image_processor_kimi_k25`, :mod:`.image_processor_minicpm_ocr`, :mod:`.image_processor_unlimited_ocr`,
equal to the stock outputs bit for bit) under the stock processor classes.

- ``kimi_k25``: ``Kimi_K25Processor`` without its video processor over :class:`~.image_processor_kimi_k25.
  KimiK25ImageProcessorNoTV` (the tower's patches, at most ``max_pixels`` px of them, never grown); an image is
  ``<|media_begin|>image<|media_content|>`` + ``<|media_pad|>`` x (patches / merge area) + ``<|media_end|>``.
  Turns as Kimi K2.5's: ``<|im_user|>user<|im_middle|>...<|im_end|>``, answers
  ``<|im_assistant|>assistant<|im_middle|><think></think>...<|im_end|>`` (the non-thinking mode: an empty reasoning
  block, part of the prompt), ``<|im_system|>system<|im_middle|>`` for a system turn, no default one. The markers
  other than ``<|im_end|>`` are plain text in the Qwen2 vocabulary; ``<|media_pad|>`` is its ``<|image_pad|>``.
- ``minicpm_ocr``: ``MiniCPMOcrProcessor`` for images alone (MiniCPM-V 4.6's, :func:`~.processors_qwen_like.
  _image_minicpm`; MiniCPM-OCR is its model code under another name) over :class:`~.image_processor_minicpm_ocr.
  MiniCPMOcrImageProcessorNoTV` (a ``vision_config.image_size`` overview in the tower's patches, up to 4 slices,
  the config's downsample mode); ChatML with each image ``<unk>\\n``, as MiniCPM-V 4.6's.
- ``unlimited_ocr``: ``UnlimitedOcrProcessor`` over :class:`~.image_processor_unlimited_ocr.
  UnlimitedOcrImageProcessorNoTV` (a global view of the SAM tower's side padded square and, for an image larger
  than a tile, 2 to ``max_pixels / tile ** 2`` (at most 32) tiles of 3/4 of that side, the hub's 640 px of 1,024
  scaled as the tiny towers are); DeepSeek-OCR-2's turns (``<|User|>: <image>\\n...\\n\\n<|Assistant|>: ...``),
  which Unlimited-OCR's model code derives from; ``num_local_patches`` and ``patches_grid`` come as tensors.
"""

from __future__ import annotations

import torch
from transformers import Kimi_K25Processor, MiniCPMOcrProcessor, UnlimitedOcrProcessor

from .family_data import FamilyData
from ..families.qwen_like.image_processor_kimi_k25 import KimiK25ImageProcessorNoTV
from ..families.qwen_like.image_processor_minicpm_ocr import MiniCPMOcrImageProcessorNoTV
from ..families.ocr.image_processor_unlimited_ocr import UnlimitedOcrImageProcessorNoTV
from .processors_llava_like import _DEEPSEEK_VL2, IMAGE, _roles
from .processors_qwen_like import _MINICPM_IDS, _MINICPM_TOKENS, _image_minicpm, _image_only
from .processors_vlm import _patch, conversation_class, named_tokenizer
from .templates import chatml

# Kimi K2.5 (module docstring): the answer header carries the empty reasoning block of the non-thinking mode.
_KIMI_ANSWER = "'<|im_assistant|>assistant<|im_middle|><think></think>'"
_KIMI = _roles("'<|im_user|>user<|im_middle|>'", _KIMI_ANSWER, "'<|im_system|>system<|im_middle|>'", "'<|im_end|>'",
               "'<|im_end|>'", "'<|media_begin|>image<|media_content|>IMAGE_TOKEN<|media_end|>'", _KIMI_ANSWER)


def _kimi_images(config, min_pixels: int, max_pixels: int):
    """The tower's patches merged by its kernel, at most ``max_pixels`` px of patches (Kimi shrinks a larger image
    and never grows a smaller one)."""
    patch = _patch(config)
    return KimiK25ImageProcessorNoTV(patch_size=patch, merge_size=config.vision_config.merge_kernel_size[0],
                                     max_patches=max(1, max_pixels // patch ** 2))


def _kimi(config, tokenizer, image_processor):
    return conversation_class(Kimi_K25Processor, config.model_type)(
        image_processor=image_processor, tokenizer=named_tokenizer(tokenizer, config), video_processor=None)


def _minicpm_ocr_images(config, min_pixels: int, max_pixels: int):
    """An overview of ``vision_config.image_size`` px in the tower's patches, up to 4 slices (as MiniCPM-V 4.6's),
    in the config's downsample mode."""
    return MiniCPMOcrImageProcessorNoTV(scale_resolution=config.vision_config.image_size, max_slice_nums=4,
                                        patch_size=_patch(config), downsample_mode=config.downsample_mode)


def _ocr_images(config, min_pixels: int, max_pixels: int):
    """The SAM tower's side, tiles of 3/4 of it (2 to ``max_pixels / tile ** 2``, at most 32, the hub's)."""
    side = config.vision_config.sam_config.image_size
    tile = side * 3 // 4
    return UnlimitedOcrImageProcessorNoTV(size={"height": side, "width": side}, tile_size=tile,
                                          max_patches=min(32, max(2, max_pixels // tile ** 2)))


class _TensorGridsOcrProcessor(UnlimitedOcrProcessor):
    """``UnlimitedOcrProcessor`` returning ``num_local_patches`` ``(images,)`` and ``patches_grid`` ``(images, 2)``
    as ``int64`` tensors where tensors are asked for: the stock class keeps them Python lists, which a micro-batch
    cannot carry (the splitter hands them to the model as lists again, ``Family.list_inputs``)."""

    def __call__(self, *args, **kwargs):
        out = super().__call__(*args, **kwargs)
        if kwargs.get("return_tensors") is not None:
            for key in ("num_local_patches", "patches_grid"):
                if key in out and not isinstance(out[key], torch.Tensor):
                    out[key] = torch.tensor(out[key], dtype=torch.long)
        return out


def _ocr(config, tokenizer, image_processor):
    return conversation_class(_TensorGridsOcrProcessor, config.model_type)(
        image_processor, named_tokenizer(tokenizer, config), patch_size=config.vision_config.sam_config.patch_size,
        downsample_ratio=4)  # the tower's two stride-2 convolutions


# the families here whose stock image processor needs torchvision -> ours (what a snapshot loads without it)
TORCH_OP_IMAGES = {"kimi_k25": KimiK25ImageProcessorNoTV, "minicpm_ocr": MiniCPMOcrImageProcessorNoTV,
                   "unlimited_ocr": UnlimitedOcrImageProcessorNoTV}

DATA: dict[str, FamilyData] = {
    "kimi_k25": FamilyData(_kimi_images, _kimi, _KIMI, "<|media_pad|>", tokens={
        "image_token": ("<|media_pad|>", "<|image_pad|>"),
        "video_token": ("<|kimi_k25_video_placeholder|>", "<|video_pad|>")},
        config_ids={"image_token": "image_token_id", "video_token": "video_token_id"}, repeated=True),
    "minicpm_ocr": FamilyData(_minicpm_ocr_images, _image_only(_image_minicpm(MiniCPMOcrProcessor), "minicpm_ocr"),
                              chatml(None, "'IMAGE_TOKEN\\n'"), hub_image_token="<unk>", tokens=_MINICPM_TOKENS,
                              config_ids=_MINICPM_IDS),
    "unlimited_ocr": FamilyData(_ocr_images, _ocr, _DEEPSEEK_VL2, tokens=IMAGE,
                                config_ids={"image_token": "image_token_id"}, repeated=True),
}
