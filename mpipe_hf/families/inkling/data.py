"""The data path of Inkling (``inkling_mm_model``, :class:`~mpipe_hf.data.family_data.FamilyData`), whose stock image
processor exists in ``transformers`` only with a torchvision backend: here its torchvision-free version
(:mod:`.image_processor`, equal to the stock outputs bit for bit) under the stock
``InklingProcessor``.

- Images: the tower's ``patch_size`` px squares of the image resized with Lanczos by the released checkpoints'
  ``rescale_image_frac`` (2, for 40-px patches) and ``rescale_image_max_upscaled_long_edge`` (2,048 px), both
  scaled with the patch side, so that a tower of other patches cuts a photo into the squares the released one
  does (a tiny tower's 4-px patches: the photo shrunk to 0.2, the cap 205 px); one image token a square.
- The processor: ``InklingProcessor`` with its default (untouched) audio feature extractor; the image, image-start,
  audio and audio-start markers are the config's ids (``image_token_id``, ``image_bos_token_id``, ...), as the
  released tokenizer's ``<|unused_200054|>``, ``<|content_image|>``, ``<|unused_200053|>`` and
  ``<|content_audio_input|>`` are. An image is ``<|content_image|>`` + ``<|unused_200054|>`` x squares (the
  processor expands the placeholder; the template writes the start marker before it).
- Turns as Inkling's renderer writes them: ``<|message_user|>`` / ``<|message_system|>`` then each part behind its
  content marker (``<|content_text|>`` text, ``<|content_image|>`` an image), closed by ``<|end_message|>``;
  answers ``<|message_model|><|content_text|>...<|end_message|>``, the text marker part of the prompt (the
  non-thinking answer, as Kimi K2.5's empty reasoning block). In the Qwen2 vocabulary of the tests the markers are
  plain text but for ``<|end_message|>`` and ``<|content_image|>``, written as ``<|im_end|>`` and
  ``<|vision_start|>`` (:data:`~mpipe_hf.data.templates.STAND_INS`).
"""

from __future__ import annotations

from transformers import InklingFeatureExtractor, InklingProcessor

from ...data.family_data import FamilyData
from ...data.markers import named_tokenizer
from ...data.stock_classes import conversation_class, tower_patch
from .image_processor import InklingImageProcessorNoTV

HUB_PATCH, HUB_FRAC, HUB_LONG_EDGE = 40, 2.0, 2048  # the released checkpoints' image settings

_TEXT = "'<|content_text|>'"
_INKLING = (
    "{%- for message in messages -%}"
    "{%- set assistant = message['role'] == 'assistant' -%}"
    "{%- if assistant -%}{{- '<|message_model|>' + " + _TEXT + " -}}"
    "{%- elif message['role'] == 'system' -%}{{- '<|message_system|>' -}}"
    "{%- else -%}{{- '<|message_user|>' -}}{%- endif -%}"
    "{%- if message['content'] is string -%}"
    "{%- if not assistant -%}{{- " + _TEXT + " -}}{%- endif -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' or (part['type'] is not defined and 'image' in part) -%}"
    "{{- '<|content_image|>IMAGE_TOKEN' -}}"
    "{%- elif part['type'] == 'text' -%}"
    "{%- if not assistant -%}{{- " + _TEXT + " -}}{%- endif -%}{{- part['text'] -}}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{- '<|end_message|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|message_model|>' + " + _TEXT + " -}}{%- endif -%}")


def _inkling_images(config, min_pixels: int, max_pixels: int):
    """The tower's patch side, the hub's resize factor and growth cap scaled by it (module docstring);
    ``min_pixels`` / ``max_pixels`` do not apply (the checkpoints bound no area)."""
    patch = tower_patch(config)
    return InklingImageProcessorNoTV(size={"height": patch, "width": patch},
                                     rescale_image_frac=HUB_FRAC * patch / HUB_PATCH,
                                     rescale_image_max_upscaled_long_edge=round(HUB_LONG_EDGE * patch / HUB_PATCH))


def _inkling(config, tokenizer, image_processor):
    named = named_tokenizer(tokenizer, config)
    marker = named.convert_ids_to_tokens
    return conversation_class(InklingProcessor, config.model_type)(
        InklingFeatureExtractor(), image_processor, named, image_bos_token=marker(config.image_bos_token_id),
        audio_bos_token=marker(config.audio_bos_token_id))


DATA: dict[str, FamilyData] = {
    "inkling_mm_model": FamilyData(_inkling_images, _inkling, _INKLING, "<|unused_200054|>", tokens={
        "image_token": ("<|unused_200054|>", "<|image_pad|>"), "audio_token": ("<|unused_200053|>", "<|quad_start|>")},
        config_ids={"image_token": "image_token_id", "audio_token": "audio_token_id"}, repeated=True,
        no_torchvision_images=InklingImageProcessorNoTV),
}
