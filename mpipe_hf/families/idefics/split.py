"""The split declarations of the Idefics group: ``P``'s vision part is ``model.vision_model`` and
``model.connector``, fed ``pixel_values`` ``(B, tiles, C, h, w)`` and ``pixel_attention_mask``; the text model is
``model.text_model``. The load-time check counts the image tokens of the real (not all-zero) tiles:
:func:`pixel_shuffled_tile_tokens` per tile for Idefics3 / SmolVLM, :func:`resampled_tokens` per image for
Idefics2, whose Perceiver resampler gives ``resampler_n_latents`` tokens an image.
"""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from ...models.family import Family
from ...models.image_tokens import real_tiles, validate_counted_micro


def pixel_shuffled_tile_tokens(model: nn.Module):
    """Idefics3, SmolVLM: real tiles (:func:`~mpipe_hf.models.image_tokens.real_tiles`) x the tokens a tile's
    patch grid gives after the connector's pixel shuffle by ``scale_factor`` on each side."""
    config = model.config
    side = config.vision_config.image_size // config.vision_config.patch_size
    per_tile = side * side // config.scale_factor ** 2
    return lambda raw: real_tiles(raw) * per_tile


def resampled_tokens(model: nn.Module):
    """Idefics2: real images (:func:`~mpipe_hf.models.image_tokens.real_tiles`) x the Perceiver's
    ``resampler_n_latents``."""
    latents = model.config.perceiver_config.resampler_n_latents
    return lambda raw: real_tiles(raw) * latents


IDEFICS3 = Family(text="model.text_model", vision=("model.vision_model", "model.connector"),
                  image_inputs=("pixel_values", "pixel_attention_mask"),
                  validate=validate_counted_micro(pixel_shuffled_tile_tokens))

FAMILIES: dict[str, Family] = {
    "idefics3": IDEFICS3,
    "smolvlm": replace(IDEFICS3),
    "idefics2": replace(IDEFICS3, validate=validate_counted_micro(resampled_tokens)),
}

REFUSED: dict[str, str] = {}
