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
- Step3p7: the tower (``model.vision_model``) runs the global views and, separately, the local crops
  (``pixel_values_local``, ``num_local_patches`` per image); each image's features are its crops' then its global
  view's. Its text model's rotary embedding is per layer type (full, sliding), as the shared loop reads it.
- MiniMax-M3-VL: a Qwen2-VL-style tower over ``image_grid_thw``; every layer of its text model, dense or
  block-sparse (``minimax_m3_sparse``: a lightning indexer picks key blocks inside the layer), takes the one causal
  mask ``MiniMaxM3VLTextModel.forward`` builds (:func:`causal_for_all`).
- Molmo2: the adapter pools each token's patches (``image_token_pooling``); the features are ADDED to the image
  tokens' embeddings (``Molmo2Model.forward``), every image-related token (``mm_token_type_ids`` 1) attends to the
  others of its row (the model class's ``create_masks_for_generate``), and each layer takes the scaled or the
  unscaled rotary embedding (``rope_scaling_layers``): :class:`Molmo2Stage`.
- Unlimited-OCR: DeepSeek-OCR-2's layout (a SAM tower and an encoder over its features, global views and local
  tiles, the learned ``model.view_separator``) with a learned ``model.image_newline`` after each row of queries;
  its ``get_image_features`` takes ``num_local_patches`` and ``patches_grid`` as lists (``Family.list_inputs``).
  Its reference sliding-window layers keep the whole prompt visible and slide only over decoded tokens: the model's
  own builder (``create_reference_sliding_window_causal_mask``) without a cache, as its ``forward`` calls it in
  training (:func:`reference_sliding_masks`).
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from .decoder import DecoderStage, layer_type_masks
from .families import TOWER, _qwen_tokens, model_class_masks, validate_counted_micro
from .family import Family
from .packed import ROW_BLIND

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


def _downsampled(side: int, patch: int) -> int:
    """A view's token grid side in Step3p7's tower: ``side / patch`` patches, then two stride-2, padding-1
    convolutions (each ``ceil(n / 2)``)."""
    return -(-(-(-(side // patch) // 2)) // 2)


def _step3p7_tokens(model):
    """Step3p7: per image its global view's tokens (``pixel_values`` ``(images, C, S, S)``) and its crops'
    (``pixel_values_local`` ``(crops, C, s, s)``), each view ``_downsampled(side) ** 2``."""
    patch = model.config.vision_config.patch_size

    def count(raw) -> int:
        views = [raw["pixel_values"]] + ([raw["pixel_values_local"]] if "pixel_values_local" in raw else [])
        return sum(v.shape[0] * _downsampled(v.shape[-2], patch) * _downsampled(v.shape[-1], patch) for v in views)
    return count


def _pooled_tokens(model):
    """Molmo2: one token per row of ``image_token_pooling`` ``(tokens, pool)`` with a patch to pool (the adapter
    drops a row of -1 only)."""
    return lambda raw: int((raw["image_token_pooling"] >= 0).any(-1).sum())


def causal_for_all(model):
    """Masks for a text model whose every layer type takes the one causal mask (MiniMax-M3's dense and
    block-sparse layers): transformers' full-attention builder (:func:`~.decoder.layer_type_masks`), by type."""
    def masks(text_config, hidden, padding, text_row, state, types) -> dict:
        full = layer_type_masks(text_config, hidden, padding, text_row, state, {"full_attention"})["full_attention"]
        return {t: full for t in types}
    return masks


def _molmo2_masks(model):
    """Molmo2's one mask (its image tokens a bidirectional block, the model class's ``create_masks_for_generate``
    over ``mm_token_type_ids``) for both of :class:`Molmo2Stage`'s rotary kinds."""
    build = model_class_masks(model, "mm_token_type_ids")

    def masks(text_config, hidden, padding, text_row, state, types) -> dict:
        out = build(text_config, hidden, padding, text_row, state, {"full_attention"})
        return {t: out["full_attention"] for t in types}
    setattr(masks, ROW_BLIND, True)  # the token-type block is looked up by position: a packed micro row by row
    return masks


class _ScaledOrNot(nn.Module):
    """Molmo2's two rotary embeddings as one ``rotary(x, position_ids, kind)``, ``kind`` ``"scaled"`` or
    ``"unscaled"`` (``Molmo2TextModel.rope_types``). Holds no parameter or persistent buffer."""

    def __init__(self, text_model: nn.Module):
        super().__init__()
        self.scaled, self.unscaled = text_model.rotary_emb, text_model.rotary_emb_unscaled

    def forward(self, x, position_ids, kind):
        return (self.scaled if kind == "scaled" else self.unscaled)(x, position_ids)


class Molmo2Stage(DecoderStage):
    """A :class:`~.decoder.DecoderStage` for Molmo2: each layer's "layer type" is its rotary kind (one mask serves
    both, :func:`_molmo2_masks`), and the front adds the token embeddings back at the image tokens, whose rows it
    replaced by the features (``Molmo2Model.forward`` adds the features to them)."""

    def __init__(self, front, layers, layer_ids, layer_types, rotary_emb, *args, text_model=None, **kwargs):
        kinds = [text_model.rope_types[i] for i in layer_ids]
        super().__init__(front, layers, layer_ids, kinds, _ScaledOrNot(text_model), *args, **kwargs)
        self.per_type_rotary = True
        if front is not None:
            front.register_forward_hook(self._add_embeddings)

    @staticmethod
    def _add_embeddings(front, args, out: dict) -> dict:
        ids = args[0]["input_ids"]
        image = (ids == front.image_token_id).unsqueeze(-1)
        added = torch.where(image, front.embed_tokens(ids), 0.0)
        return {**out, "hidden_states": out["hidden_states"] + added}


def _ocr_views(model):
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
    """Unlimited-OCR's masks as ``UnlimitedOcrTextModel.forward`` builds them: transformers' causal mask for the
    full layers, the model's own ``create_reference_sliding_window_causal_mask`` (no cache: every earlier token of
    the row visible) for the reference sliding-window layers."""
    from transformers.models.unlimited_ocr.modeling_unlimited_ocr import create_reference_sliding_window_causal_mask

    def masks(text_config, hidden, padding, text_row, state, types) -> dict:
        out = layer_type_masks(text_config, hidden, padding, text_row, state, set(types) - {REFERENCE})
        if REFERENCE in types:
            out[REFERENCE] = create_reference_sliding_window_causal_mask(
                config=text_config, inputs_embeds=hidden, attention_mask=padding, cache=None, position_ids=text_row)
        return out
    setattr(masks, ROW_BLIND, True)  # a packed micro runs row by row (the builder searches no packed rows)
    return masks


REFERENCE = "reference_sliding_attention"
FAMILIES: dict[str, Family] = {
    "cohere2_vision": Family(vision=TOWER, validate=validate_counted_micro(_shuffled_tiles)),
    "lfm2_vl": Family(vision=TOWER, image_inputs=("pixel_values", "spatial_shapes", "pixel_attention_mask"),
                      norm="embedding_norm", validate=validate_counted_micro(_unshuffled_grids)),
    "step3p7": Family(vision=("model.vision_model", "model.multi_modal_projector"),
                      image_inputs=("pixel_values", "pixel_values_local", "num_local_patches"),
                      validate=validate_counted_micro(_step3p7_tokens)),
    "minimax_m3_vl": Family(vision=TOWER, image_inputs=("pixel_values", "image_grid_thw"), masks=causal_for_all,
                            validate=validate_counted_micro(_qwen_tokens)),
    "molmo2": Family(vision=TOWER, image_inputs=("pixel_values", "image_token_pooling", "image_grids",
                                                 "image_num_crops"),
                     mask_inputs=("mm_token_type_ids",), masks=_molmo2_masks,
                     stage=lambda model: partial(Molmo2Stage, text_model=model.model.language_model),
                     validate=validate_counted_micro(_pooled_tokens)),
    "unlimited_ocr": Family(vision=TOWER + ("model.view_separator", "model.image_newline"),
                            image_inputs=("pixel_values", "pixel_values_local", "num_local_patches", "patches_grid"),
                            list_inputs=("num_local_patches", "patches_grid"), masks=reference_sliding_masks,
                            validate=validate_counted_micro(_ocr_views)),
}
