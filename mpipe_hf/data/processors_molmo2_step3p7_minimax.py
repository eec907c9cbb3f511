"""The data path of Molmo2, Step3p7 and MiniMax-M3-VL (:class:`~.family_data.FamilyData` each), whose stock image
processors exist in ``transformers`` only with a torchvision backend: here their torchvision-free versions
(:mod:`.image_processor_molmo2`, :mod:`.image_processor_step3p7`, :mod:`.image_processor_minimax_m3_vl`, equal to
the stock outputs bit for bit) under the stock processor classes, which write the hub's literal markers; the thin
subclasses here write the markers the tokenizer names instead (a vocabulary without them would split them into
text), and count their ids as the stock classes count the literal ones.

- ``molmo2``: ``Molmo2Processor`` without its video processor over :class:`~.image_processor_molmo2.
  Molmo2ImageProcessorNoTV` (the tower's crops, neighbours sharing 4/27 of a crop's patches a side as the hub's 4
  of 27, at most ``max_pixels`` px of crops, 1 to 8); an image is ``<low_res_im_start>``, the low-resolution
  view's pooled patches (``<im_patch>``) row by row each followed by ``<im_col>``, ``<im_end>``, then the same for
  the crops' canvas after ``<im_start>``; ``mm_token_type_ids`` 1 on all of them. The Molmo2 hub template:
  the bos (``<|im_end|>`` in the hub tokenizer; the eos where there is no bos, as the stock processor prepends),
  every image of the conversation first (``<|image|>``, or ``Image 1<|image|>Image 2<|image|>...``), then
  ChatML turns, text parts joined by a space; here each answer closes with ``<|im_end|>\\n`` (the hub writes it
  before the next user turn, which renders a multi-turn conversation the same, and leaves the last answer open).
  As the images come first, a row with an image after its first answer renders its earlier turns differently
  once that image counts, so its answers cannot be found and the loader refuses the row, naming the reason.
- ``step3p7``: ``Step3p7Processor`` over :class:`~.image_processor_step3p7.Step3p7ImageProcessorNoTV` (global
  views of the tower's ``image_size``, windows of 504/728 of it in whole downsampled tokens, images capped at
  3024/728 of it, as the hub's); an image is, per window, ``<patch_start>`` + ``<im_patch>`` x its tokens +
  ``<patch_end>`` (``<patch_newline>`` after each row but the last), then ``<im_start>`` + the global view's
  ``<im_patch>`` tokens + ``<im_end>``. Turns as Step3's (``<|BOT|>role\\n...<|EOT|>`` after the bos), here with
  ChatML's ``<|im_start|>`` / ``<|im_end|>`` as the turn markers the Qwen2 vocabulary has.
- ``minimax_m3_vl``: ``MiniMaxM3VLProcessor`` without its video processor over :class:`~.image_processor_
  minimax_m3_vl.MiniMaxM3VLImageProcessorNoTV` (between ``min_pixels`` and ``max_pixels`` in multiples of
  ``patch * merge`` px); an image is ``]<]start of image[>[`` + ``]<]image[>[`` x (patches / merge area) +
  ``]<]end of image[>[``. Turns as MiniMax's (``]~b]user\\n...[e~[\\n``, the answer's header ``]~b]ai\\n``), here
  with ``<|im_start|>`` / ``<|im_end|>`` for ``]~b]`` / ``[e~[``.
"""

from __future__ import annotations

import re

from transformers import MiniMaxM3VLProcessor, Molmo2Processor, Step3p7Processor

from .family_data import FamilyData
from ..families.llava.image_processor_minimax_m3_vl import MiniMaxM3VLImageProcessorNoTV
from ..families.llava.image_processor_molmo2 import Molmo2ImageProcessorNoTV
from ..families.llava.image_processor_step3p7 import Step3p7ImageProcessorNoTV
from .processors_llava_like import _roles
from .processors_vlm import _patch, _side, conversation_class, named_tokenizer
from .templates import BOS, GENERATION

# the hub markers each processor writes -> the tokenizer attribute naming the token written in their place
_MOLMO2_MARKERS = {"<im_patch>": "patch_token", "<im_col>": "col_token", "<im_start>": "start_token",
                   "<low_res_im_start>": "low_res_start_token", "<frame_start>": "frame_start_token",
                   "<im_end>": "end_token", "<frame_end>": "frame_end_token", "<im_low>": "low_token"}
_STEP3P7_MARKERS = {"<im_patch>": "image_token", "<patch_start>": "patch_start_token",
                    "<patch_end>": "patch_end_token", "<patch_newline>": "patch_newline_token",
                    "<im_start>": "im_start_token", "<im_end>": "im_end_token"}


def _renamed(text: str, markers: dict, tokenizer) -> str:
    """``text`` with each hub marker of ``markers`` replaced by the token the tokenizer names for it."""
    names = {hub: str(getattr(tokenizer, attr)) for hub, attr in markers.items()}
    return re.sub("|".join(map(re.escape, names)), lambda m: names[m.group(0)], text)


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


class _NamedStep3p7Processor(Step3p7Processor):
    """``Step3p7Processor`` with the placeholder and markers the tokenizer names."""

    def __init__(self, image_processor, tokenizer=None, chat_template=None, **kwargs):
        super().__init__(image_processor, tokenizer, chat_template, **kwargs)
        self.image_token = str(tokenizer.image_token)
        self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
        self.image_feature_placeholder = self.image_token * self.num_image_feature_size
        self.patch_feature_placeholder = self.image_token * self.num_patch_feature_size

    def replace_image_token(self, image_inputs: dict, image_idx: int, **kwargs) -> str:
        text = super().replace_image_token(image_inputs, image_idx, **kwargs)
        return _renamed(text, {k: v for k, v in _STEP3P7_MARKERS.items() if k != "<im_patch>"}, self.tokenizer)


def _named_minimax_class(tokenizer) -> type:
    """``MiniMaxM3VLProcessor`` with its marker constants the tokenizer's names."""
    markers = {"IMAGE_TOKEN": "image_token", "VIDEO_TOKEN": "video_token", "VISION_START_TOKEN": "vision_start_token",
               "VISION_END_TOKEN": "vision_end_token"}
    return type("MiniMaxM3VLProcessor", (MiniMaxM3VLProcessor,),
                {const: str(getattr(tokenizer, attr)) for const, attr in markers.items()})


def _molmo2_images(config, min_pixels: int, max_pixels: int):
    """The tower's square crops in its patches, at most ``max_pixels`` px of them (1 to 8, the hub's), sharing
    4/27 of a crop's patches a side (the hub's 4 of 27; at least 1, leaving a window), 2 x 2 pooling."""
    crop, patch = _side(config), _patch(config)
    per_crop = crop // patch
    margin = min(max(1, round(per_crop * 4 / 27)), (per_crop - 1) // 2)
    return Molmo2ImageProcessorNoTV(size={"height": crop, "width": crop}, patch_size=patch,
                                    overlap_margins=[margin, margin], pooling_size=[2, 2],
                                    max_crops=min(8, max(1, max_pixels // crop ** 2)))


def _molmo2(config, tokenizer, image_processor):
    return conversation_class(_NamedMolmo2Processor, config.model_type)(
        image_processor=image_processor, video_processor=None, tokenizer=named_tokenizer(tokenizer, config))


def _step3p7_images(config, min_pixels: int, max_pixels: int):
    """Global views of the tower's ``image_size``; windows of 504/728 of it and images capped at 3024/728 of it
    (the hub's), each window side a whole number of tokens (patch x 4 px, the two stride-2 convolutions)."""
    side, patch = _side(config), _patch(config)
    stride = patch * 4
    return Step3p7ImageProcessorNoTV(size={"height": side, "width": side},
                                     patch_size=max(stride, round(side * 504 / 728 / stride) * stride),
                                     max_image_size=side * 3024 // 728, vision_patch_size=patch)


def _step3p7(config, tokenizer, image_processor):
    return conversation_class(_NamedStep3p7Processor, config.model_type)(image_processor,
                                                                         named_tokenizer(tokenizer, config))


def _minimax_images(config, min_pixels: int, max_pixels: int):
    """Between ``min_pixels`` and ``max_pixels`` px in multiples of ``patch * merge``, ``temporal_patch_size``
    frames deep (the tower's)."""
    vision = config.vision_config
    return MiniMaxM3VLImageProcessorNoTV(patch_size=_patch(config), merge_size=vision.spatial_merge_size,
                                         temporal_patch_size=vision.temporal_patch_size, min_pixels=min_pixels,
                                         max_pixels=max_pixels)


def _minimax(config, tokenizer, image_processor):
    tok = named_tokenizer(tokenizer, config)
    return conversation_class(_named_minimax_class(tok), config.model_type)(
        image_processor=image_processor, tokenizer=tok, video_processor=None)


# Molmo2 (module docstring): every image of the conversation first, then ChatML turns with text parts joined by
# a space (images left out of the turns); the bos, else the eos, first.
_MOLMO2_TEXT = ("{%- set m = namespace(text='') -%}"
                "{%- if message['content'] is string -%}{%- set m.text = message['content'] -%}{%- else -%}"
                "{%- for part in message['content'] if part['type'] == 'text' -%}"
                "{%- set m.text = m.text ~ ('' if not m.text else ' ') ~ part['text'] -%}{%- endfor -%}"
                "{%- endif -%}{{- m.text -}}")
_MOLMO2 = ("{{- bos_token or eos_token -}}"
           "{%- set count = namespace(images=0) -%}"
           "{%- for message in messages if message['content'] is not string -%}"
           "{%- for part in message['content'] if part['type'] == 'image' -%}"
           "{%- set count.images = count.images + 1 -%}{%- endfor -%}{%- endfor -%}"
           "{%- if count.images == 1 -%}{{- 'IMAGE_TOKEN' -}}"
           "{%- else -%}{%- for i in range(count.images) -%}{{- 'Image ' ~ (i + 1) ~ 'IMAGE_TOKEN' -}}{%- endfor -%}"
           "{%- endif -%}"
           "{%- for message in messages -%}"
           "{{- '<|im_start|>' + message['role'] + '\\n' -}}" + _MOLMO2_TEXT + "{{- '<|im_end|>\\n' -}}"
           "{%- endfor -%}" + GENERATION.replace("PROMPT", "'<|im_start|>assistant\\n'"))
# Step3 (module docstring): "<|BOT|>role\n...<|EOT|>" after the bos, the turn markers ChatML's.
_STEP3P7 = _roles("'<|im_start|>user\\n'", "'<|im_start|>assistant\\n'", "'<|im_start|>system\\n'", "'<|im_end|>'",
                  "'<|im_end|>'", "'IMAGE_TOKEN'", "'<|im_start|>assistant\\n'", BOS)
# MiniMax (module docstring): "]~b]role\n...[e~[\n", the answer's role "ai", the markers ChatML's.
_MINIMAX = _roles("'<|im_start|>user\\n'", "'<|im_start|>ai\\n'", "'<|im_start|>system\\n'", "'<|im_end|>\\n'",
                  "'<|im_end|>\\n'", "'IMAGE_TOKEN'", "'<|im_start|>ai\\n'", BOS)

# the families here whose stock image processor needs torchvision -> ours (what a snapshot loads without it)
TORCH_OP_IMAGES = {"molmo2": Molmo2ImageProcessorNoTV, "step3p7": Step3p7ImageProcessorNoTV,
                   "minimax_m3_vl": MiniMaxM3VLImageProcessorNoTV}

DATA: dict[str, FamilyData] = {
    "molmo2": FamilyData(_molmo2_images, _molmo2, _MOLMO2, "<|image|>", tokens={
        "image_token": ("<|image|>", "<|vision_pad|>"), "video_token": ("<|video|>", "<|video_pad|>"),
        "patch_token": ("<im_patch>", "<|image_pad|>"), "col_token": ("<im_col>", "<|quad_end|>"),
        "start_token": ("<im_start>", "<|vision_start|>"), "low_res_start_token": ("<low_res_im_start>",
                                                                                  "<|quad_start|>"),
        "end_token": ("<im_end>", "<|vision_end|>"), "frame_start_token": ("<frame_start>", "<|box_start|>"),
        "frame_end_token": ("<frame_end>", "<|box_end|>"), "low_token": ("<im_low>", "<|object_ref_start|>")},
        config_ids={"patch_token": "image_patch_id", "start_token": "image_start_token_id",
                    "low_res_start_token": "low_res_image_start_token_id", "end_token": "image_end_token_id",
                    "frame_start_token": "frame_start_token_id", "frame_end_token": "frame_end_token_id"}),
    "step3p7": FamilyData(_step3p7_images, _step3p7, _STEP3P7, "<im_patch>", tokens={
        "image_token": ("<im_patch>", "<|image_pad|>"), "patch_start_token": ("<patch_start>", "<|quad_start|>"),
        "patch_end_token": ("<patch_end>", "<|quad_end|>"), "patch_newline_token": ("<patch_newline>",
                                                                                   "<|vision_pad|>"),
        "im_start_token": ("<im_start>", "<|vision_start|>"), "im_end_token": ("<im_end>", "<|vision_end|>")},
        config_ids={"image_token": "image_token_id"}),
    "minimax_m3_vl": FamilyData(_minimax_images, _minimax, _MINIMAX, "]<]image[>[", tokens={
        "image_token": ("]<]image[>[", "<|image_pad|>"), "video_token": ("]<]video[>[", "<|video_pad|>"),
        "vision_start_token": ("]<]start of image[>[", "<|vision_start|>"),
        "vision_end_token": ("]<]end of image[>[", "<|vision_end|>")},
        config_ids={"image_token": "image_token_index", "video_token": "video_token_index"}, pixel_bounded=True),
}
