"""Positions the Qwen-like families compute on the host, as each model's ``forward`` computes them from its
``get_rope_index``: M-RoPE over Qwen's three axes (:func:`rope_host_inputs`), MiniCPM-V 4.7's canvas M-RoPE
(:func:`canvas_host_inputs`), and HunYuan-VL's XD-RoPE over ``len(mrope_section)`` axes (:func:`xdrope_host_inputs`,
its stages :func:`xdrope_stage`)."""

from __future__ import annotations

import torch

from ...models.decoder import DecoderStage
from ...models.packed import gather_rows, is_packed, mrope_positions, row_positions, unpad_rows


def _positions(rope_index, raw: dict, sizes: str, axes: int = 3) -> torch.Tensor:
    """``get_rope_index``'s ``(axes, B, L)`` positions of an unpacked micro ``raw`` over its ``mm_token_type_ids``
    and the images' sizes under the key ``sizes`` (``image_grid_thw``, MiniCPM-V's ``target_sizes``); without images,
    ``arange`` on all ``axes`` axes, as the text models compute theirs."""
    ids = raw["input_ids"]
    if raw.get(sizes) is None:
        return torch.arange(ids.shape[1]).view(1, 1, -1).expand(axes, ids.shape[0], -1)
    positions, _ = rope_index(ids, mm_token_type_ids=raw["mm_token_type_ids"], attention_mask=raw.get("attention_mask"),
                              **{sizes: raw[sizes]})
    return positions


def rope_host_inputs(model):
    """``host(raw) -> {"position_ids": ...}`` for an M-RoPE family whose tower is not Qwen-VL's (it computes its
    own metadata on the device): ``get_rope_index``'s ``(3, B, L)`` positions, ``arange`` on all three axes for a
    micro without an image (as the text model does), a packed micro's ``(4, 1, N)``
    (:func:`~mpipe_hf.models.packed.mrope_positions`). ``raw`` is on the host."""
    rope_index = model.model.get_rope_index

    def host(raw):
        if is_packed(raw):
            return {"position_ids": mrope_positions(rope_index, raw)}
        return {"position_ids": _positions(rope_index, raw, "image_grid_thw")}
    return host


def canvas_host_inputs(model):
    """``host(raw) -> {"position_ids": (3, B, L)}`` for MiniCPM-V 4.7: its canvas M-RoPE (``get_rope_index`` over
    ``mm_token_type_ids`` and ``target_sizes``) for a micro with images; ``arange`` on all three axes without, as
    its text model does. Packed micro-batches are refused.

    Raises:
        ValueError: a packed micro-batch (its rows' canvases are not computed here).
    """
    rope_index = model.model.get_rope_index

    def host(raw):
        if is_packed(raw):
            raise ValueError("minicpmv4_7: packed micro-batches are not supported (set data.packing: false)")
        return {"position_ids": _positions(rope_index, raw, "target_sizes")}
    return host


def xdrope_axes(model) -> int:
    """HunYuan-VL's position axes ``A = len(rope_parameters["mrope_section"])`` (4 in the hub checkpoints: the
    sequence, then the image's width, height and index)."""
    return len(model.config.text_config.rope_parameters.get("mrope_section") or [])


def xdrope_host_inputs(model):
    """``host(raw) -> {"position_ids": ...}`` for HunYuan-VL, as ``HunYuanVLModel.forward`` computes them:
    ``get_rope_index``'s ``(A, B, L)`` with images (:func:`xdrope_axes`); ``arange`` on all ``A`` axes without
    (the text model's own, as ``compute_3d_position_ids`` returns ``None`` then); a packed micro's
    ``(A + 1, 1, N)``: the text-position row, then its rows' own positions, unpacked to a padded batch with its
    mask."""
    rope_index, axes = model.model.get_rope_index, xdrope_axes(model)

    def host(raw):
        if is_packed(raw):
            lengths = raw["packed_lengths"].tolist()
            rows, mask = unpad_rows(raw["input_ids"], lengths)
            types, _ = unpad_rows(raw["mm_token_type_ids"], lengths)
            found, _ = rope_index(rows, mm_token_type_ids=types, image_grid_thw=raw.get("image_grid_thw"),
                                  attention_mask=mask)
            return {"position_ids": torch.cat([row_positions(lengths).unsqueeze(0), gather_rows(found, mask)])}
        return {"position_ids": _positions(rope_index, raw, "image_grid_thw", axes)}
    return host


def xdrope_stage(model) -> type:
    """A :class:`~mpipe_hf.models.decoder.DecoderStage` subclass whose ``rope_axes`` is the model's ``A``
    (:func:`xdrope_axes`): its stages split position ids by ``A`` rather than Qwen's 3."""
    return type("XdRopeStage", (DecoderStage,), {"rope_axes": xdrope_axes(model)})
