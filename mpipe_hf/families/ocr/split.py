"""The split declarations of the OCR group (:class:`~mpipe_hf.models.family.Family`), read from transformers' own
surface: where the model keeps its tower and projector, the keys its ``get_image_features`` takes, and what its
``forward`` adds around the decoder layers. The load-time check counts each micro-batch's image tokens from its vision
keys as the tower and projector size their output.

- GOT-OCR2, PP-Chart2Table: each tile's SAM patch grid halved twice by the projector's convolutions
  (:func:`sam_conv_tokens`).
- Unlimited-OCR: the learned ``model.view_separator`` after each image and ``model.image_newline`` after each row of
  queries are parts of the vision side; its ``get_image_features`` takes ``num_local_patches`` and ``patches_grid`` as
  lists (``Family.list_inputs``). Its reference sliding-window layers keep the whole prompt visible and slide only
  over decoded tokens: the model's own builder (``create_reference_sliding_window_causal_mask``) without a cache, as
  its ``forward`` calls it in training (:func:`reference_sliding_masks`).
"""

from __future__ import annotations

from ...models.decoder import layer_type_masks
from ...models.family import Family
from ...models.image_tokens import patch_grid, validate_counted_micro
from ...models.packed import ROW_BLIND

TOWER = ("model.vision_tower", "model.multi_modal_projector")
REFERENCE = "reference_sliding_attention"  # Unlimited-OCR's layer type with the model's own mask builder


def sam_conv_tokens(model):
    """GOT-OCR2, PP-Chart2Table: each tile's SAM patch grid (:func:`~mpipe_hf.models.image_tokens.patch_grid`)
    halved, rounding up, on each side by each of the projector's two stride-2 convolutions (kernel 3, padding 1),
    over the tiles of ``pixel_values`` ``(tiles, C, H, W)``."""
    patch = model.config.vision_config.patch_size

    def count(raw) -> int:
        rows, cols = (-(-(-(-side // 2)) // 2) for side in patch_grid(raw["pixel_values"], patch))
        return raw["pixel_values"].shape[0] * rows * cols
    return count


def ocr_views(model):
    """Unlimited-OCR, as ``UnlimitedOcrProcessor._get_num_image_tokens`` counts: per image its global view's
    ``q * (q + 1) + 1`` (``q x q`` queries, a newline a row, the view separator) and, with tiles, its
    ``(columns, rows)`` canvas' ``(rows * t) * (columns * t + 1)``; a view of side ``s`` has ``q = ceil(s / patch
    / 4)`` queries a side (two stride-2 convolutions after the SAM patches)."""
    patch = model.config.vision_config.sam_config.patch_size

    def side(pixels) -> int:
        return -(-(pixels.shape[-1] // patch) // 4)

    def count(raw) -> int:
        glob = side(raw["pixel_values"])
        total = raw["pixel_values"].shape[0] * (glob * (glob + 1) + 1)
        if "pixel_values_local" in raw:
            tile = side(raw["pixel_values_local"])
            grids = zip(raw["num_local_patches"].tolist(), raw["patches_grid"].tolist())
            total += sum((rows * tile) * (columns * tile + 1) for n, (columns, rows) in grids if n)
        return total
    return count


def reference_sliding_masks(model):
    """``Family.masks``: Unlimited-OCR's masks as ``UnlimitedOcrTextModel.forward`` builds them: transformers'
    causal mask for the full layers, the model's own ``create_reference_sliding_window_causal_mask`` (no cache:
    every earlier token of the row visible) for the reference sliding-window layers."""
    from transformers.models.unlimited_ocr.modeling_unlimited_ocr import create_reference_sliding_window_causal_mask

    def masks(text_config, hidden, padding, text_row, state, types) -> dict:
        out = layer_type_masks(text_config, hidden, padding, text_row, state, set(types) - {REFERENCE})
        if REFERENCE in types:
            out[REFERENCE] = create_reference_sliding_window_causal_mask(
                config=text_config, inputs_embeds=hidden, attention_mask=padding, cache=None, position_ids=text_row)
        return out
    setattr(masks, ROW_BLIND, True)  # a packed micro runs row by row (the builder searches no packed rows)
    return masks


_SAM = validate_counted_micro(sam_conv_tokens)
FAMILIES: dict[str, Family] = {
    "got_ocr2": Family(vision=TOWER, validate=_SAM),
    "pp_chart2table": Family(vision=TOWER, validate=_SAM),
    "unlimited_ocr": Family(vision=TOWER + ("model.view_separator", "model.image_newline"),
                            image_inputs=("pixel_values", "pixel_values_local", "num_local_patches", "patches_grid"),
                            list_inputs=("num_local_patches", "patches_grid"), masks=reference_sliding_masks,
                            validate=validate_counted_micro(ocr_views)),
}
REFUSED: dict[str, str] = {}
