"""The processors of the LLaVA group's families whose stock image processor exists in ``transformers`` only with a
torchvision backend (Llama 4, LFM2-VL, Cohere2-Vision, Molmo2, Step3p7, MiniMax-M3-VL): the stock processor class
over our torchvision-free image processor (``image_processor_<type>``, equal to the stock outputs bit for bit) and
over :func:`~mpipe_hf.data.markers.named_tokenizer`'s copy of the tokenizer. Where the stock class writes the hub's
literal markers, a thin subclass writes the markers the tokenizer names instead (a vocabulary without them would
split them into text), and counts their ids as the stock class counts the literal ones.

- ``llama4``: tiles of the tower's ``image_size``, at most ``max_pixels / image_size ** 2`` of them (1 to 16); an
  image is ``<|image_start|>``, each tile's ``<|patch|>`` tokens with ``<|tile_x_separator|>`` between the tiles
  of a row and ``<|tile_y_separator|>`` after each row, ``<|image|>`` and the global tile's patches,
  ``<|image_end|>``.
- ``lfm2_vl``: between ``min_pixels`` and ``max_pixels`` of image tokens, tiles of that budget's side.
- ``cohere2_vision``: tiles of the tower's ``image_size``, at most ``max_pixels`` px of them (1 to 12); an image
  is ``<|START_OF_IMG|>``, per tile its tokens and ``<|IMG_LINE_BREAK|>``, ``<|END_OF_IMG|>``.
- ``molmo2``: ``Molmo2Processor`` without its video processor: the tower's crops, neighbours sharing 4/27 of a
  crop's patches a side as the hub's 4 of 27, at most ``max_pixels`` px of crops (1 to 8); an image is
  ``<low_res_im_start>``, the low-resolution view's pooled patches (``<im_patch>``) row by row each followed by
  ``<im_col>``, ``<im_end>``, then the same for the crops' canvas after ``<im_start>``; ``mm_token_type_ids`` 1
  on all of them.
- ``step3p7``: global views of the tower's ``image_size``, windows of 504/728 of it in whole downsampled tokens,
  images capped at 3024/728 of it (the hub's); an image is, per window, ``<patch_start>`` + ``<im_patch>`` x its
  tokens + ``<patch_end>`` (``<patch_newline>`` after each row but the last), then ``<im_start>`` + the global
  view's ``<im_patch>`` tokens + ``<im_end>``.
- ``minimax_m3_vl``: ``MiniMaxM3VLProcessor`` without its video processor: between ``min_pixels`` and
  ``max_pixels`` in multiples of ``patch * merge`` px; an image is ``]<]start of image[>[`` + ``]<]image[>[`` x
  (patches / merge area) + ``]<]end of image[>[``.
"""

from __future__ import annotations

import math
import re

from transformers import (Cohere2VisionProcessor, Lfm2VlProcessor, Llama4Processor, MiniMaxM3VLProcessor,
                          Molmo2Processor, Step3p7Processor)

from ...data.markers import named_tokenizer
from ...data.stock_classes import conversation_class, tower_patch, tower_side
from .image_processor_cohere2_vision import Cohere2VisionImageProcessorNoTV
from .image_processor_lfm2_vl import Lfm2VlImageProcessorNoTV
from .image_processor_llama4 import Llama4ImageProcessorNoTV
from .image_processor_minimax_m3_vl import MiniMaxM3VLImageProcessorNoTV
from .image_processor_molmo2 import Molmo2ImageProcessorNoTV
from .image_processor_step3p7 import Step3p7ImageProcessorNoTV

# the hub markers each processor writes -> the tokenizer attribute naming the token written in their place
_MOLMO2_MARKERS = {"<im_patch>": "patch_token", "<im_col>": "col_token", "<im_start>": "start_token",
                   "<low_res_im_start>": "low_res_start_token", "<frame_start>": "frame_start_token",
                   "<im_end>": "end_token", "<frame_end>": "frame_end_token", "<im_low>": "low_token"}
_STEP3P7_MARKERS = {"<patch_start>": "patch_start_token", "<patch_end>": "patch_end_token",
                    "<patch_newline>": "patch_newline_token", "<im_start>": "im_start_token",
                    "<im_end>": "im_end_token"}


def _renamed(text: str, markers: dict, tokenizer) -> str:
    """``text`` with each hub marker of ``markers`` replaced by the token the tokenizer names for it."""
    names = {hub: str(getattr(tokenizer, attr)) for hub, attr in markers.items()}
    return re.sub("|".join(map(re.escape, names)), lambda m: names[m.group(0)], text)


class _NamedLlama4Processor(Llama4Processor):
    """``Llama4Processor`` writing each image with the markers it was given (the stock ``_prompt_split_image``
    writes the hub's literal strings)."""

    def _prompt_split_image(self, aspect_ratio, num_patches_per_chunk):
        rows, cols = (int(v) for v in aspect_ratio)
        text = self.start_of_img_token
        if rows * cols > 1:
            for _ in range(rows):
                text += self.tile_token.join([self.img_patch_token * num_patches_per_chunk] * cols)
                text += self.tile_global_token
        return text + self.image_token + self.img_patch_token * num_patches_per_chunk + self.end_of_img_token


def llama4_images(config, min_pixels: int, max_pixels: int):
    """Tiles of the tower's ``image_size``, at most ``max_pixels`` px of them (1 to 16, the hub's)."""
    side = tower_side(config)
    return Llama4ImageProcessorNoTV(size={"height": side, "width": side},
                                    max_patches=min(16, max(1, max_pixels // side ** 2)))


def llama4(config, tokenizer, image_processor):
    """Llama 4's processor over the markers the tokenizer names (module docstring)."""
    tok = named_tokenizer(tokenizer, config)
    return conversation_class(_NamedLlama4Processor, config.model_type)(
        image_processor, tok, patch_size=tower_patch(config),
        pixel_shuffle_ratio=config.vision_config.pixel_shuffle_ratio, fake_image_token=tok.image_token,
        image_token=tok.image_token, start_of_image_token=tok.start_of_image_token,
        end_of_image_token=tok.end_of_image_token, patch_token=tok.patch_token,
        tile_x_separator_token=tok.tile_x_separator_token, tile_y_separator_token=tok.tile_y_separator_token,
        chat_template=None)  # the class's default is the hub's, with the hub's markers: the family's (.templates)


def lfm2_images(config, min_pixels: int, max_pixels: int):
    """Between ``min_pixels`` and ``max_pixels`` of image tokens (each ``(patch * downsample) ** 2`` px), tiles
    of the largest square side in whole tokens within ``max_pixels`` (the hub's 512 px is 256 tokens, its
    maximum)."""
    patch, down = tower_patch(config), config.downsample_factor
    per_token = (patch * down) ** 2
    most = max(1, max_pixels // per_token)
    return Lfm2VlImageProcessorNoTV(encoder_patch_size=patch, downsample_factor=down,
                                    min_image_tokens=min(most, max(1, min_pixels // per_token)),
                                    max_image_tokens=most, tile_size=math.isqrt(most) * patch * down)


def lfm2_vl(config, tokenizer, image_processor):
    """LFM2-VL's stock ``Lfm2VlProcessor`` over the named tokenizer."""
    return conversation_class(Lfm2VlProcessor, config.model_type)(image_processor, named_tokenizer(tokenizer, config))


def cohere2_images(config, min_pixels: int, max_pixels: int):
    """Tiles of the tower's ``image_size``, at most ``max_pixels`` px of them (1 to 12, the hub's); ``patch_size``:
    the tokens a tile side gives after the pixel shuffle (the processor writes its square per tile)."""
    side = tower_side(config)
    return Cohere2VisionImageProcessorNoTV(size={"height": side, "width": side},
                                           max_patches=min(12, max(1, max_pixels // side ** 2)),
                                           patch_size=side // tower_patch(config) // config.downsample_factor)


def cohere2_vision(config, tokenizer, image_processor):
    """Cohere2-Vision's stock ``Cohere2VisionProcessor`` over the named tokenizer."""
    return conversation_class(Cohere2VisionProcessor, config.model_type)(image_processor,
                                                                         named_tokenizer(tokenizer, config))


class _NamedMolmo2Processor(Molmo2Processor):
    """``Molmo2Processor`` writing the image markers the tokenizer names, and marking their ids in
    ``mm_token_type_ids`` (the stock class looks the literal markers up)."""

    def __init__(self, image_processor=None, video_processor=None, tokenizer=None, **kwargs):
        super().__init__(image_processor, video_processor, tokenizer, **kwargs)
        self.image_token_ids = tokenizer.convert_tokens_to_ids([str(getattr(tokenizer, attr))
                                                                for attr in _MOLMO2_MARKERS.values()])

    def replace_image_token(self, image_inputs: dict, image_idx: int, **kwargs) -> str:
        return _renamed(super().replace_image_token(image_inputs, image_idx, **kwargs), _MOLMO2_MARKERS,
                        self.tokenizer)


def molmo2_images(config, min_pixels: int, max_pixels: int):
    """The tower's square crops in its patches, at most ``max_pixels`` px of them (1 to 8, the hub's), sharing
    4/27 of a crop's patches a side (the hub's 4 of 27; at least 1, leaving a window), 2 x 2 pooling."""
    crop, patch = tower_side(config), tower_patch(config)
    per_crop = crop // patch
    margin = min(max(1, round(per_crop * 4 / 27)), (per_crop - 1) // 2)
    return Molmo2ImageProcessorNoTV(size={"height": crop, "width": crop}, patch_size=patch,
                                    overlap_margins=[margin, margin], pooling_size=[2, 2],
                                    max_crops=min(8, max(1, max_pixels // crop ** 2)))


def molmo2(config, tokenizer, image_processor):
    """Molmo2's processor, without its video processor, over the markers the tokenizer names."""
    return conversation_class(_NamedMolmo2Processor, config.model_type)(
        image_processor=image_processor, video_processor=None, tokenizer=named_tokenizer(tokenizer, config))


class _NamedStep3p7Processor(Step3p7Processor):
    """``Step3p7Processor`` with the placeholder and markers the tokenizer names."""

    def __init__(self, image_processor, tokenizer=None, chat_template=None, **kwargs):
        super().__init__(image_processor, tokenizer, chat_template, **kwargs)
        self.image_token = str(tokenizer.image_token)
        self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
        self.image_feature_placeholder = self.image_token * self.num_image_feature_size
        self.patch_feature_placeholder = self.image_token * self.num_patch_feature_size

    def replace_image_token(self, image_inputs: dict, image_idx: int, **kwargs) -> str:
        return _renamed(super().replace_image_token(image_inputs, image_idx, **kwargs), _STEP3P7_MARKERS,
                        self.tokenizer)


def step3p7_images(config, min_pixels: int, max_pixels: int):
    """Global views of the tower's ``image_size``; windows of 504/728 of it and images capped at 3024/728 of it
    (the hub's), each window side a whole number of tokens (patch x 4 px, the two stride-2 convolutions)."""
    side, patch = tower_side(config), tower_patch(config)
    stride = patch * 4
    return Step3p7ImageProcessorNoTV(size={"height": side, "width": side},
                                     patch_size=max(stride, round(side * 504 / 728 / stride) * stride),
                                     max_image_size=side * 3024 // 728, vision_patch_size=patch)


def step3p7(config, tokenizer, image_processor):
    """Step3p7's processor over the placeholder and markers the tokenizer names."""
    return conversation_class(_NamedStep3p7Processor, config.model_type)(image_processor,
                                                                         named_tokenizer(tokenizer, config))


def _named_minimax_class(tokenizer) -> type:
    """``MiniMaxM3VLProcessor`` with its marker constants the tokenizer's names."""
    markers = {"IMAGE_TOKEN": "image_token", "VIDEO_TOKEN": "video_token", "VISION_START_TOKEN": "vision_start_token",
               "VISION_END_TOKEN": "vision_end_token"}
    return type("MiniMaxM3VLProcessor", (MiniMaxM3VLProcessor,),
                {const: str(getattr(tokenizer, attr)) for const, attr in markers.items()})


def minimax_images(config, min_pixels: int, max_pixels: int):
    """Between ``min_pixels`` and ``max_pixels`` px in multiples of ``patch * merge``, ``temporal_patch_size``
    frames deep (the tower's)."""
    vision = config.vision_config
    return MiniMaxM3VLImageProcessorNoTV(patch_size=tower_patch(config), merge_size=vision.spatial_merge_size,
                                         temporal_patch_size=vision.temporal_patch_size, min_pixels=min_pixels,
                                         max_pixels=max_pixels)


def minimax_m3_vl(config, tokenizer, image_processor):
    """MiniMax-M3-VL's processor, without its video processor, over the markers the tokenizer names."""
    tok = named_tokenizer(tokenizer, config)
    return conversation_class(_named_minimax_class(tok), config.model_type)(
        image_processor=image_processor, tokenizer=tok, video_processor=None)
