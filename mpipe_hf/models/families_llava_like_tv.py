"""The llava_like families whose stock image processor exists in transformers only with a torchvision backend
(Cohere2-Vision, LFM2-VL, ...): their model code needs neither torchvision nor timm, so the split reads them as any
other family (:class:`~.family.Family`; gathered into :mod:`.families_llava_like`, tiny configs in
:mod:`.tiny_llava_like`).

Each declaration is read from transformers' own surface: where the model keeps its tower and projector, the keys its
``get_image_features`` takes, and what its ``forward`` adds around the decoder layers. The load-time check counts
each micro-batch's image tokens from its vision keys as the tower and projector size their output.

- Cohere2-Vision: a SigLIP tower per tile, pixel-shuffled by ``downsample_factor``; its conditional model does not
  scale the logits (unlike Aya Vision's).
- LFM2-VL: a SigLIP 2 tower over each image's own patch grid (``spatial_shapes``), pixel-unshuffled by
  ``downsample_factor``; its LFM2 text model mixes short-convolution and full attention layers (one rotary
  embedding for all) and ends in ``embedding_norm``.
"""

from __future__ import annotations

from .families import TOWER, validate_counted_micro
from .family import Family

Tensors = dict


def _shuffled_tiles(model):
    """Cohere2-Vision: per tile (``pixel_values`` ``(tiles, C, H, W)``) the tower's ``(H / patch) x (W / patch)``
    patches pixel-shuffled by ``downsample_factor``."""
    patch, factor = model.config.vision_config.patch_size, model.config.downsample_factor

    def count(raw) -> int:
        tiles, _, height, width = raw["pixel_values"].shape
        return tiles * (height // patch // factor) * (width // patch // factor)
    return count


def _unshuffled_grids(model):
    """LFM2-VL: per image its ``spatial_shapes`` patch grid ``(rows, cols)`` unshuffled by ``downsample_factor``
    to ``(rows / f) * (cols / f)`` tokens."""
    factor = model.config.downsample_factor
    return lambda raw: int((raw["spatial_shapes"] // factor).prod(-1).sum())


FAMILIES: dict[str, Family] = {
    "cohere2_vision": Family(vision=TOWER, validate=validate_counted_micro(_shuffled_tiles)),
    "lfm2_vl": Family(vision=TOWER, image_inputs=("pixel_values", "spatial_shapes", "pixel_attention_mask"),
                      norm="embedding_norm", validate=validate_counted_micro(_unshuffled_grids)),
}
