"""Metadata that transformers' Qwen-VL code reads on the host, computed on the host when a micro-batch is loaded
(no host synchronisation per action).

Qwen2-VL, Qwen2.5-VL and Qwen3-VL derive from ``image_grid_thw`` (images x 3 ints) the vision tower's rotary
positions, its packed-attention boundaries (``cu_seqlens``), Qwen2.5-VL's window order and Qwen3-VL's position
interpolation, and from ``input_ids`` the 3-D M-RoPE positions (``get_rope_index``): loops over ``.tolist()``
and ``.item()``, about 25 reads per micro-batch, each a device-to-host synchronisation when the inputs live on the
GPU. transformers' vision helpers (``transformers.vision_utils``) take these values precomputed from the forward's
keyword arguments, so the owner computes them with the same helpers from the host copy of the inputs, in its
``DATA_LOAD``, and hands the device only what kernels consume:

- to the device: the M-RoPE ``position_ids`` (stage 0's rotary), the tower's rotary positions, window order and
  interpolation indices and weights;
- kept on the host: ``image_grid_thw`` (read by ``get_image_features`` to split the features) and the attention
  boundaries, which the SDPA and eager paths read back as Python lists; with FlashAttention, whose varlen kernel
  reads them, they go to the device (:func:`host_keys`).

Videos (Qwen2-VL, Qwen2.5-VL) take the same path: the tower's second call, on ``video_grid_thw``, gets its own
metadata under :data:`VIDEO_PREFIX`, and ``get_rope_index`` reads the video grids and Qwen2.5-VL's
``second_per_grid_ts`` (seconds per temporal patch, which space the videos' temporal positions).

The values are the ones the model would compute, from the same functions on the same integers, so the step is
unchanged bit for bit.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.utils.generic import get_max_seqlen, is_flash_attention_requested
from transformers.vision_utils import (get_vision_cu_seqlens, get_vision_interpolation_indices_and_weights,
                                       get_vision_position_ids, get_vision_window_index)

from .packed import GRID_KEYS, is_packed, mrope_positions

Tensors = dict[str, torch.Tensor]
PREFIX = "vision_meta."  # raw keys of the tower's precomputed keyword arguments
VIDEO_PREFIX = "video_meta."  # the same for the tower's video call
_META = ("position_ids", "cu_seqlens", "max_seqlen", "window_index", "cu_window_seqlens", "max_window_seqlen",
         "interp_indices", "interp_weights")
VISION_META_KEYS = tuple(PREFIX + k for k in _META)
VIDEO_META_KEYS = tuple(VIDEO_PREFIX + k for k in _META)
_BOUNDARIES = ("cu_seqlens", "max_seqlen", "cu_window_seqlens", "max_window_seqlen")


def host_keys(visual: nn.Module) -> frozenset[str]:
    """Raw keys a ``DATA_LOAD`` keeps on the host for ``visual``: the image and video grids, and the attention
    boundaries unless the tower runs FlashAttention (its kernel reads them on the device)."""
    keys = {"image_grid_thw", "video_grid_thw"}
    for prefix in (PREFIX, VIDEO_PREFIX):
        if not is_flash_attention_requested(visual.config):
            keys |= {prefix + k for k in _BOUNDARIES}
        else:
            keys |= {prefix + "max_seqlen", prefix + "max_window_seqlen"}
    return frozenset(keys)


def vision_metadata(visual: nn.Module, grid: torch.Tensor, prefix: str = PREFIX) -> Tensors:
    """The keyword arguments ``visual.forward`` would compute from ``grid`` (``(images, 3)`` int64, on the host;
    or the videos' grid, with ``prefix`` :data:`VIDEO_PREFIX`), computed by transformers' own helpers, under
    ``prefix``; ``max_seqlen`` as a 0-d int64 (absent without FlashAttention, as the helper gives ``None``)."""
    config, merge = visual.config, visual.spatial_merge_size
    meta = {"position_ids": get_vision_position_ids(grid, merge)}
    cu_seqlens = get_vision_cu_seqlens(grid)
    meta["cu_seqlens"], meta["max_seqlen"] = cu_seqlens, get_max_seqlen(cu_seqlens, config)
    if hasattr(visual, "window_size"):  # Qwen2.5-VL's windowed attention
        meta["window_index"], meta["cu_window_seqlens"] = get_vision_window_index(
            grid, merge, visual.window_size, visual.patch_size)
        meta["max_window_seqlen"] = get_max_seqlen(meta["cu_window_seqlens"], config, kwarg_name="max_window_seqlen")
    if hasattr(visual, "num_grid_per_side"):  # Qwen3-VL's interpolated position embedding
        meta["interp_indices"], meta["interp_weights"] = get_vision_interpolation_indices_and_weights(
            grid, num_grid_per_side=visual.num_grid_per_side, mode=visual.interpolation_mode,
            align_corners=visual.interpolation_align_corners, spatial_merge_size=config.spatial_merge_size)
    return {prefix + k: torch.tensor(v) if isinstance(v, int) else v for k, v in meta.items() if v is not None}


def vision_kwargs(inputs: Tensors, prefix: str = PREFIX) -> dict:
    """The tower's keyword arguments from a micro's raw inputs (:func:`vision_metadata`'s keys under ``prefix``)."""
    out = {}
    for key, value in inputs.items():
        if key.startswith(prefix):
            name = key[len(prefix):]
            out[name] = int(value) if name.startswith("max_") else value  # a host 0-d tensor: no device read
    return out


def video_kwargs(inputs: Tensors) -> dict:
    """The tower's keyword arguments for the video call (:func:`vision_kwargs` under :data:`VIDEO_PREFIX`)."""
    return vision_kwargs(inputs, VIDEO_PREFIX)


def grids(raw: Tensors) -> dict:
    """``get_rope_index``'s grid arguments from a host micro ``raw``: ``image_grid_thw``, ``video_grid_thw`` and
    ``second_per_grid_ts`` where the micro has them (Qwen2-VL's ``get_rope_index`` takes the last in its
    ``**kwargs`` and leaves it; its processor writes none)."""
    return {k: raw[k] for k in GRID_KEYS if raw.get(k) is not None}


def tower_metadata(visual: nn.Module, raw: Tensors) -> Tensors:
    """:func:`vision_metadata` of the micro's image grid and, under :data:`VIDEO_PREFIX`, of its video grid (each
    where it has one)."""
    out = {}
    if raw.get("image_grid_thw") is not None:
        out.update(vision_metadata(visual, raw["image_grid_thw"]))
    if raw.get("video_grid_thw") is not None:
        out.update(vision_metadata(visual, raw["video_grid_thw"], VIDEO_PREFIX))
    return out


def qwen_host_inputs(model: nn.Module):
    """``host(raw) -> extra raw inputs`` for a Qwen-VL ``model``: the M-RoPE ``position_ids`` ``(3, B, L)`` of
    ``get_rope_index`` over the micro's images and videos (:func:`grids`; ``arange`` on all three axes for a micro
    with neither, as the text model does) and :func:`tower_metadata`; a packed micro's ``(4, 1, N)`` per-row
    positions (:func:`~.packed.mrope_positions`). ``raw`` is on the host."""
    rope_index, visual = model.model.get_rope_index, model.model.visual

    def host(raw: Tensors) -> Tensors:
        ids, given = raw["input_ids"], grids(raw)
        if is_packed(raw):  # each row's own positions, and the text-position row
            return {"position_ids": mrope_positions(rope_index, raw), **tower_metadata(visual, raw)}
        if not given:
            return {"position_ids": torch.arange(ids.shape[1]).view(1, 1, -1).expand(3, ids.shape[0], -1)}
        positions, _ = rope_index(ids, mm_token_type_ids=raw["mm_token_type_ids"],
                                  attention_mask=raw.get("attention_mask"), **given)
        return {"position_ids": positions, **tower_metadata(visual, raw)}
    return host
