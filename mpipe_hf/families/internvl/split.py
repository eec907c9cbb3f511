"""The split declarations of the InternVL group: the tower and its projector are ``P``'s vision part, fed
``pixel_values`` ``(tiles, C, H, W)``; the load-time check counts each tile's patch grid pixel-shuffled by
``downsample_ratio`` (:func:`~mpipe_hf.models.image_tokens.pixel_shuffled_tokens`)."""

from __future__ import annotations

from ...models.family import Family
from ...models.image_tokens import pixel_shuffled_tokens, validate_counted_micro

TOWER = ("model.vision_tower", "model.multi_modal_projector")

FAMILIES: dict[str, Family] = {
    "internvl": Family(vision=TOWER, validate=validate_counted_micro(pixel_shuffled_tokens)),
    "qianfan_ocr": Family(vision=TOWER, validate=validate_counted_micro(pixel_shuffled_tokens)),
}

REFUSED: dict[str, str] = {}
