"""Metadata that transformers' Qwen-VL code reads on the host, computed on the host when a micro-batch is loaded
(issue 27: no host synchronisation per action).

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

The values are the ones the model would compute, from the same functions on the same integers, so the step is
unchanged bit for bit.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.utils.generic import get_max_seqlen, is_flash_attention_requested
from transformers.vision_utils import (get_vision_cu_seqlens, get_vision_interpolation_indices_and_weights,
                                       get_vision_position_ids, get_vision_window_index)

from .packed import is_packed, mrope_positions

Tensors = dict[str, torch.Tensor]
PREFIX = "vision_meta."  # raw keys of the tower's precomputed keyword arguments
VISION_META_KEYS = tuple(PREFIX + k for k in ("position_ids", "cu_seqlens", "max_seqlen", "window_index",
                                               "cu_window_seqlens", "max_window_seqlen", "interp_indices",
                                               "interp_weights"))
_BOUNDARIES = ("cu_seqlens", "max_seqlen", "cu_window_seqlens", "max_window_seqlen")


def host_keys(visual: nn.Module) -> frozenset[str]:
    """Raw keys a ``DATA_LOAD`` keeps on the host for ``visual``: the grid, and the attention boundaries unless
    the tower runs FlashAttention (its kernel reads them on the device)."""
    keys = {"image_grid_thw"}
    if not is_flash_attention_requested(visual.config):
        keys |= {PREFIX + k for k in _BOUNDARIES}
    else:
        keys |= {PREFIX + "max_seqlen", PREFIX + "max_window_seqlen"}
    return frozenset(keys)


def vision_metadata(visual: nn.Module, grid: torch.Tensor) -> Tensors:
    """The keyword arguments ``visual.forward`` would compute from ``grid`` (``(images, 3)`` int64, on the host),
    computed by transformers' own helpers, under :data:`PREFIX`; ``max_seqlen`` as a 0-d int64 (absent without
    FlashAttention, as the helper gives ``None``)."""
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
    return {PREFIX + k: torch.tensor(v) if isinstance(v, int) else v for k, v in meta.items() if v is not None}


def vision_kwargs(inputs: Tensors) -> dict:
    """The tower's keyword arguments from a micro's raw inputs (:func:`vision_metadata`'s keys)."""
    out = {}
    for key, value in inputs.items():
        if key.startswith(PREFIX):
            name = key[len(PREFIX):]
            out[name] = int(value) if name.startswith("max_") else value  # a host 0-d tensor: no device read
    return out


def qwen_host_inputs(model: nn.Module):
    """``host(raw) -> extra raw inputs`` for a Qwen-VL ``model``: the M-RoPE ``position_ids`` ``(3, B, L)`` of
    ``get_rope_index`` (``arange`` on all three axes for a micro without an image, as the text model does) and,
    with images, :func:`vision_metadata`; a packed micro's ``(4, 1, N)`` per-row positions
    (:func:`~.packed.mrope_positions`). ``raw`` is on the host."""
    rope_index, visual = model.model.get_rope_index, model.model.visual

    def host(raw: Tensors) -> Tensors:
        ids, grid = raw["input_ids"], raw.get("image_grid_thw")
        if is_packed(raw):  # each row's own positions, and the text-position row (issue 30)
            positions = mrope_positions(rope_index, raw)
            return {"position_ids": positions, **(vision_metadata(visual, grid) if grid is not None else {})}
        if grid is None:
            return {"position_ids": torch.arange(ids.shape[1]).view(1, 1, -1).expand(3, ids.shape[0], -1)}
        positions, _ = rope_index(ids, mm_token_type_ids=raw["mm_token_type_ids"], image_grid_thw=grid,
                                  attention_mask=raw.get("attention_mask"))
        return {"position_ids": positions, **vision_metadata(visual, grid)}
    return host
