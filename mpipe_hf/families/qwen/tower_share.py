"""The Qwen-VL towers' work divided over a context-parallel group (:mod:`mpipe_hf.models.tower_division`): each
image is one item, and each temporal patch of a video is one.

Why a video can be cut between temporal patches exactly: in transformers' Qwen2-VL, Qwen2.5-VL, Qwen3-VL and
Qwen3.5 vision towers (``modeling_qwen2_vl.py`` etc., read in the installed version),

- the patch embedding (a 3-D convolution whose stride is its kernel), the MLPs and norms act per patch row;
- attention runs within ``cu_seqlens`` of ``get_vision_cu_seqlens(grid)`` without ``merge_temporal``: one
  segment of ``h * w`` patches per temporal patch;
- Qwen2.5-VL's windowed layers attend within windows that ``get_vision_window_index`` lays out per temporal
  patch (its index is ``(t, h, w)``-shaped, padded and windowed over ``h`` and ``w`` only), frame after frame;
- the rotary positions (``get_vision_position_ids``) and Qwen3-VL's interpolated position embedding depend on
  ``(h, w)`` only, repeated over ``t``; the merger joins ``merge x merge`` patches of one frame.

So the rows of a grid ``(t, h, w)`` are the rows of ``(t1, h, w)`` followed by those of ``(t - t1, h, w)``.
A rank's consecutive temporal patches of one video run as one grid ``(t', h, w)``.
"""

from __future__ import annotations

import torch
from torch import nn

from ...models.host_metadata import PREFIX, VIDEO_PREFIX, vision_metadata
from ...models.tower_division import TowerItem

Tensors = dict[str, torch.Tensor]
# kind -> (its grid key, its pixel key, its metadata prefix)
KEYS = {"image": ("image_grid_thw", "pixel_values", PREFIX),
        "video": ("video_grid_thw", "pixel_values_videos", VIDEO_PREFIX)}


class QwenTowerShare:
    """``tower_division`` of the Qwen-VL families (the protocol of :mod:`mpipe_hf.models.tower_division`):
    ``model.model.visual``'s items, images whole and videos by temporal patch, each costing its patches."""

    def __init__(self, model: nn.Module):
        self.visual = model.model.visual
        self.unit = self.visual.spatial_merge_size ** 2  # patches per feature row

    def items(self, inputs: Tensors) -> list[TowerItem]:
        """The micro-batch's items from its grids (on the host): each image, then each video's temporal
        patches."""
        out = []
        for kind, (grid_key, _, _) in KEYS.items():
            grid = inputs.get(grid_key)
            for g, (t, h, w) in enumerate(grid.tolist() if grid is not None else []):
                spans = [(0, t)] if kind == "image" else [(f, f + 1) for f in range(t)]
                out += [TowerItem(kind, g, span, (span[1] - span[0]) * h * w,
                                  (span[1] - span[0]) * h * w // self.unit) for span in spans]
        return out

    @staticmethod
    def runs(mine: tuple[TowerItem, ...], kind: str) -> list[tuple[int, int, int]]:
        """``mine``'s items of ``kind`` as ``(grid row, t0, t1)``, a video's consecutive temporal patches
        joined."""
        out = []
        for item in mine:
            if item.kind != kind:
                continue
            if out and out[-1][0] == item.grid and out[-1][2] == item.frames[0]:
                out[-1] = (item.grid, out[-1][1], item.frames[1])
            else:
                out.append((item.grid, *item.frames))
        return out

    def local_grid(self, grid: torch.Tensor, mine: tuple[TowerItem, ...], kind: str) -> torch.Tensor:
        """The grid ``(runs, 3)`` of ``mine``'s items of ``kind``, from the micro-batch's ``grid``."""
        rows = grid.tolist()
        return torch.tensor([[t1 - t0, *rows[g][1:]] for g, t0, t1 in self.runs(mine, kind)], dtype=grid.dtype)

    def call_inputs(self, inputs: Tensors, mine: tuple[TowerItem, ...]) -> Tensors:
        """The grids of ``mine`` under the grid keys the tower calls read. Raises ValueError when the pixels are not
        ``mine``'s (a micro-batch that did not go through the host's :meth:`host_inputs`)."""
        out = {}
        for kind, (grid_key, pixel_key, _) in KEYS.items():
            patches = sum(item.cost for item in mine if item.kind == kind)
            if not patches:
                continue
            if inputs[pixel_key].shape[0] != patches:
                raise ValueError(f"{pixel_key} holds {inputs[pixel_key].shape[0]} patches, this CP rank's share of the "
                                 f"tower {patches}: run raw micro-batches through preprocess.with_host, as DATA_LOAD "
                                 f"does")
            out[grid_key] = self.local_grid(inputs[grid_key], mine, kind)
        return out

    def host_inputs(self, raw: Tensors, mine: tuple[TowerItem, ...]) -> Tensors:
        """On the host: the pixel rows of ``mine`` (zero rows for a kind the micro-batch has and ``mine`` lacks)
        and the tower's metadata of their grids (:func:`~mpipe_hf.models.host_metadata.vision_metadata`),
        replacing the whole micro-batch's."""
        out = {}
        for kind, (grid_key, pixel_key, prefix) in KEYS.items():
            if raw.get(grid_key) is None:
                continue
            grid, pixels = raw[grid_key], raw[pixel_key]
            sizes = grid.prod(-1).tolist()
            starts = [sum(sizes[:g]) for g in range(len(sizes))]
            frame = [h * w for _, h, w in grid.tolist()]
            runs = self.runs(mine, kind)
            out[pixel_key] = torch.cat([pixels[starts[g] + t0 * frame[g]:starts[g] + t1 * frame[g]]
                                        for g, t0, t1 in runs]) if runs else pixels[:0]
            if runs:
                out.update(vision_metadata(self.visual, self.local_grid(grid, mine, kind), prefix))
        return out
