"""The data path of Llama 4, LFM2-VL and Cohere2-Vision (:class:`~.family_data.FamilyData` each), whose stock
image processors exist in ``transformers`` only with a torchvision backend: here their torchvision-free versions
(:mod:`.image_processor_llama4`, :mod:`.image_processor_lfm2_vl`, :mod:`.image_processor_cohere2_vision`, equal
to the stock outputs bit for bit) under the stock processor classes.

- ``llama4``: ``Llama4Processor`` over :class:`~.image_processor_llama4.Llama4ImageProcessorNoTV` (tiles of the
  tower's ``image_size``, at most ``max_pixels / image_size ** 2`` of them, 1 to 16); an image is written
  ``<|image_start|>``, each tile's ``<|patch|>`` tokens with ``<|tile_x_separator|>`` between the tiles of a row
  and ``<|tile_y_separator|>`` after each row, ``<|image|>`` and the global tile's patches, ``<|image_end|>``, as
  the stock processor writes it but with the markers the tokenizer names (:class:`_NamedLlama4Processor`). Chat
  format (Llama-4-*-Instruct): ``<|begin_of_text|><|header_start|>role<|header_end|>\\n\\n...<|eot|>``.
- ``lfm2_vl``: ``Lfm2VlProcessor`` over :class:`~.image_processor_lfm2_vl.Lfm2VlImageProcessorNoTV` (between
  ``min_pixels`` and ``max_pixels`` of image tokens, tiles of that budget's side); ChatML after the bos
  (LFM2-VL-*'s template), images ``<image>``.
- ``cohere2_vision``: ``Cohere2VisionProcessor`` over :class:`~.image_processor_cohere2_vision.
  Cohere2VisionImageProcessorNoTV` (tiles of the tower's ``image_size``, at most ``max_pixels`` px of them, 1 to
  12); an image is ``<|START_OF_IMG|>``, per tile its tokens and ``<|IMG_LINE_BREAK|>``, ``<|END_OF_IMG|>``. The
  turn format is Aya Vision's (``<|START_OF_TURN_TOKEN|><|USER_TOKEN|>...<|END_OF_TURN_TOKEN|>``); the
  Command-A-Vision hub template adds a default system preamble and response markers, and a checkpoint's own
  template is used where it has one (:func:`~.templates.chat_template_for`).
"""

from __future__ import annotations

import math

from transformers import Cohere2VisionProcessor, Lfm2VlProcessor, Llama4Processor

from .family_data import FamilyData
from ..families.llava.image_processor_cohere2_vision import Cohere2VisionImageProcessorNoTV
from ..families.llava.image_processor_lfm2_vl import Lfm2VlImageProcessorNoTV
from ..families.llava.image_processor_llama4 import Llama4ImageProcessorNoTV
from ..families.inkling.image_processor import InklingImageProcessorNoTV
from ..families.nemotron.image_processor import NemotronHOmniImageProcessorNoTV
from .processors_kimi_ocr import TORCH_OP_IMAGES as _KIMI_OCR_IMAGES
from .processors_molmo2_step3p7_minimax import TORCH_OP_IMAGES as _MOLMO2_STEP3P7_MINIMAX_IMAGES
from .processors_vlm import _patch, _side, conversation_class, named_tokenizer
from .processors_llava_like import _AYA
from .templates import BOS, CONTENT, GENERATION, chatml

# Llama 4 Instruct: <|begin_of_text|>, turns <|header_start|>role<|header_end|>\n\n ... <|eot|>, images <|image|>;
# the prompt <|header_start|>assistant<|header_end|>\n\n. <|header_start|> and <|eot|> are written as <|im_start|>
# and <|im_end|> where the vocabulary lacks them (templates.STAND_INS).
_LLAMA4 = (BOS + "{%- for message in messages -%}"
           "{{- '<|header_start|>' + message['role'] + '<|header_end|>\\n\\n' -}}"
           + CONTENT.replace("IMAGE", "'IMAGE_TOKEN'") +
           "{{- '<|eot|>' -}}"
           "{%- endfor -%}" + GENERATION.replace("PROMPT", "'<|header_start|>assistant<|header_end|>\\n\\n'"))
# LFM2-VL: <|startoftext|> (the bos) then ChatML, images <image>.
_LFM2_VL = BOS + chatml(None, "'IMAGE_TOKEN'")


class _NamedLlama4Processor(Llama4Processor):
    """``Llama4Processor`` writing each image with the markers it was given (the stock ``_prompt_split_image``
    writes the hub's literal strings, which a vocabulary without them would split into text)."""

    def _prompt_split_image(self, aspect_ratio, num_patches_per_chunk):
        rows, cols = (int(v) for v in aspect_ratio)
        text = self.start_of_img_token
        if rows * cols > 1:
            for _ in range(rows):
                text += self.tile_token.join([self.img_patch_token * num_patches_per_chunk] * cols)
                text += self.tile_global_token
        return text + self.image_token + self.img_patch_token * num_patches_per_chunk + self.end_of_img_token


def _llama4_images(config, min_pixels: int, max_pixels: int):
    """Tiles of the tower's ``image_size``, at most ``max_pixels`` px of them (1 to 16, the hub's)."""
    side = _side(config)
    return Llama4ImageProcessorNoTV(size={"height": side, "width": side},
                                    max_patches=min(16, max(1, max_pixels // side ** 2)))


def _llama4(config, tokenizer, image_processor):
    tok = named_tokenizer(tokenizer, config)
    return conversation_class(_NamedLlama4Processor, config.model_type)(
        image_processor, tok, patch_size=_patch(config), pixel_shuffle_ratio=config.vision_config.pixel_shuffle_ratio,
        fake_image_token=tok.image_token, image_token=tok.image_token, start_of_image_token=tok.start_of_image_token,
        end_of_image_token=tok.end_of_image_token, patch_token=tok.patch_token,
        tile_x_separator_token=tok.tile_x_separator_token, tile_y_separator_token=tok.tile_y_separator_token,
        chat_template=None)  # the class's default is the hub's, with the hub's markers: the family's (templates)


def _lfm2_images(config, min_pixels: int, max_pixels: int):
    """Between ``min_pixels`` and ``max_pixels`` of image tokens (each ``(patch * downsample) ** 2`` px), tiles
    of the largest square side in whole tokens within ``max_pixels`` (the hub's 512 px is 256 tokens, its
    maximum)."""
    patch, down = _patch(config), config.downsample_factor
    per_token = (patch * down) ** 2
    most = max(1, max_pixels // per_token)
    return Lfm2VlImageProcessorNoTV(encoder_patch_size=patch, downsample_factor=down,
                                    min_image_tokens=min(most, max(1, min_pixels // per_token)),
                                    max_image_tokens=most, tile_size=math.isqrt(most) * patch * down)


def _lfm2(config, tokenizer, image_processor):
    return conversation_class(Lfm2VlProcessor, config.model_type)(image_processor, named_tokenizer(tokenizer, config))


def _cohere2_images(config, min_pixels: int, max_pixels: int):
    """Tiles of the tower's ``image_size``, at most ``max_pixels`` px of them (1 to 12, the hub's); ``patch_size``:
    the tokens a tile side gives after the pixel shuffle (the processor writes its square per tile)."""
    side = _side(config)
    return Cohere2VisionImageProcessorNoTV(size={"height": side, "width": side},
                                           max_patches=min(12, max(1, max_pixels // side ** 2)),
                                           patch_size=side // _patch(config) // config.downsample_factor)


def _cohere2(config, tokenizer, image_processor):
    return conversation_class(Cohere2VisionProcessor, config.model_type)(image_processor,
                                                                         named_tokenizer(tokenizer, config))


# the families whose stock image processor needs torchvision -> ours (what a snapshot loads without torchvision)
TORCH_OP_IMAGES = {"llama4": Llama4ImageProcessorNoTV, "lfm2_vl": Lfm2VlImageProcessorNoTV,
                   "cohere2_vision": Cohere2VisionImageProcessorNoTV}
TORCH_OP_IMAGES.update(_KIMI_OCR_IMAGES)  # Kimi K2.5, MiniCPM-OCR and Unlimited-OCR (.processors_kimi_ocr)
TORCH_OP_IMAGES.update(_MOLMO2_STEP3P7_MINIMAX_IMAGES)  # Molmo2, Step3p7, MiniMax-M3-VL
TORCH_OP_IMAGES["inkling_mm_model"] = InklingImageProcessorNoTV  # Inkling (families/inkling)
TORCH_OP_IMAGES["nemotron_h_omni"] = NemotronHOmniImageProcessorNoTV  # Nemotron-H Omni (families/nemotron)

def checkpoint_image_processor(model_type: str, directory: str, **settings):
    """A checkpoint's image processor, ``settings`` over its own: ``AutoImageProcessor``'s, except for the
    families of :data:`TORCH_OP_IMAGES` where torchvision does not import (ours over the same settings)."""
    from transformers import AutoImageProcessor
    from transformers.utils import is_torchvision_available
    own = None if is_torchvision_available() else TORCH_OP_IMAGES.get(model_type)
    return (own or AutoImageProcessor).from_pretrained(directory, **settings)


DATA: dict[str, FamilyData] = {
    "llama4": FamilyData(_llama4_images, _llama4, _LLAMA4, "<|image|>", tokens={
        "image_token": ("<|image|>", "<|vision_pad|>"), "patch_token": ("<|patch|>", "<|image_pad|>"),
        "start_of_image_token": ("<|image_start|>", "<|vision_start|>"),
        "end_of_image_token": ("<|image_end|>", "<|vision_end|>"),
        "tile_x_separator_token": ("<|tile_x_separator|>", "<|box_start|>"),
        "tile_y_separator_token": ("<|tile_y_separator|>", "<|box_end|>")},
        config_ids={"patch_token": "image_token_index", "start_of_image_token": "boi_token_index",
                    "end_of_image_token": "eoi_token_index"}),
    "lfm2_vl": FamilyData(_lfm2_images, _lfm2, _LFM2_VL, "<image>", tokens={
        "image_token": ("<image>", "<|image_pad|>"), "image_start_token": ("<|image_start|>", "<|vision_start|>"),
        "image_end_token": ("<|image_end|>", "<|vision_end|>"),
        "image_thumbnail_token": ("<|img_thumbnail|>", "<|vision_pad|>")},
        config_ids={"image_token": "image_token_id"}),
    "cohere2_vision": FamilyData(_cohere2_images, _cohere2, _AYA, "<|IMG_PATCH|>", tokens={
        "image_token": ("<|IMG_PATCH|>", "<|image_pad|>"), "boi_token": ("<|START_OF_IMG|>", "<|vision_start|>"),
        "eoi_token": ("<|END_OF_IMG|>", "<|vision_end|>"),
        "img_line_break_token": ("<|IMG_LINE_BREAK|>", "<|vision_pad|>")},
        config_ids={"image_token": "image_token_id"}),
}
