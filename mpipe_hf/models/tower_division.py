"""The vision tower's work divided over a context-parallel group, by images and frames.

Without it every CP rank's preprocess ``P`` runs the whole tower on the CP group's identical micro-batch, the
tower's work repeated ``cp`` times. With it (:func:`divide_towers`), each CP rank's ``P`` runs only its share of
the micro-batch's tower items, and the features are gathered back over the CP group in the micro-batch's order
(:func:`~mpipe_hf.runtime.tower_gather.gather_rows`), so the first stage injects the whole sequence's features as
before. When the tower trains, the gather's backward hands each feature row's gradient (summed over the CP ranks)
to the rank that computed it, and the tower's weight gradients are summed over cp by the dp x cp reduction.

A *tower item* (:class:`TowerItem`) is a unit the tower runs independently of the others: an image, or one
temporal patch of a video where the tower attends within a frame (Qwen-VL: :mod:`mpipe_hf.families.qwen.tower_share`).
The items go to the CP ranks by the LPT rule over their patches
(:func:`~mpipe_hf.schedule.context_parallel_cost.divide_tower`), which every rank computes alike from the
micro-batch's grids, on the host: no collective decides the division.

A family opts in with ``Family.tower_division``: ``tower_division(model)`` returns an object with

- ``items(inputs) -> list[TowerItem]``: the micro-batch's items, the images first, then the videos, each in order;
- ``host_inputs(raw, mine) -> raw keys``: on the host at load, the tower's inputs (pixels and precomputed
  metadata) for this rank's items ``mine`` only, replacing the whole micro-batch's;
- ``call_inputs(inputs, mine) -> keys``: what the tower calls read in place of the whole micro-batch's (the grids
  of ``mine``).

A family without it keeps running its tower whole on every CP rank, as does a preprocess ``identity`` (the tower
runs in stage 0). Dropout inside the tower draws over each rank's share: the same in distribution as one process,
not the same draws.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..runtime.tower_gather import gather_rows
from ..schedule.context_parallel_cost import divide_tower
from .image_features import ImageFeatures

Tensors = dict[str, torch.Tensor]
KINDS = ("image", "video")  # the tower's calls, in the order a rank's rows are laid out


@dataclass(frozen=True)
class TowerItem:
    """One unit of the tower's work: item ``grid`` of the micro-batch's ``kind`` (``"image"`` or ``"video"``),
    its temporal patches ``frames`` (``[t0, t1)``), ``cost`` patches run through the tower, ``rows`` feature rows
    out."""

    kind: str
    grid: int
    frames: tuple[int, int]
    cost: int
    rows: int


@dataclass(frozen=True)
class TowerShare:
    """One CP rank's share of a micro-batch's tower items, and where every item's rows lie once gathered.

    Attributes:
        mine: this rank's items, its images then its videos, each in the micro-batch's order (the order of its
            rows).
        counts: every rank's feature rows (the gather's counts).
        pieces: per kind present, for each of its items in the micro-batch's order, ``(first row, rows)`` in the
            gathered rows (rank order).
    """

    mine: tuple[TowerItem, ...]
    counts: tuple[int, ...]
    pieces: dict[str, tuple[tuple[int, int], ...]]


def share_of(items: list[TowerItem], cp: int, rank: int) -> TowerShare:
    """CP rank ``rank``'s share of ``items`` (the micro-batch's, in its order) over ``cp`` ranks, by
    :func:`~mpipe_hf.schedule.context_parallel_cost.divide_tower` over the items' costs. Raises ValueError for
    ``cp < 1``."""
    owners = divide_tower([item.cost for item in items], cp)
    local = [[item for kind in KINDS for item, owner in zip(items, owners) if owner == r and item.kind == kind]
             for r in range(cp)]
    counts = tuple(sum(item.rows for item in share) for share in local)
    where, first = {}, 0
    for share in local:
        for item in share:
            where[item] = first
            first += item.rows
    pieces = {kind: tuple((where[item], item.rows) for item in items if item.kind == kind)
              for kind in KINDS if any(item.kind == kind for item in items)}
    return TowerShare(tuple(local[rank]), counts, pieces)


class DividedTower:
    """An :class:`~.image_features.ImageFeatures` run over its share of each micro-batch, its features gathered
    over CP ``group`` (module docstring); ``division`` is the family's ``tower_division(model)``."""

    def __init__(self, division, group):
        self.division, self.group = division, group

    def share(self, inputs: Tensors) -> tuple[list[TowerItem], TowerShare | None]:
        """The micro-batch's items and this rank's share (``None`` without an item: nothing to divide)."""
        items = self.division.items(inputs)
        if not items:
            return items, None
        return items, share_of(items, dist.get_world_size(self.group), dist.get_rank(self.group))

    def host(self, raw: Tensors) -> Tensors:
        """The tower's inputs of this rank's share, computed on the host at load (``division.host_inputs``)."""
        _, share = self.share(raw)
        return {} if share is None else self.division.host_inputs(raw, share.mine)

    def run(self, features: ImageFeatures, inputs: Tensors) -> Tensors:
        """``features``' outputs for the whole micro-batch from its share of ``inputs`` (the host's
        :meth:`host` applied), gathered over the CP group; every rank calls it for the same micro-batches."""
        items, share = self.share(inputs)
        if share is None:
            return features.join(features.empty_part(), None, inputs)
        local_inputs = {**inputs, **self.division.call_inputs(inputs, share.mine)}
        mine = {item.kind for item in share.mine}
        runs = {"image": features.images, "video": features.videos}
        width = features.hidden_size * (1 + features.deepstack)
        dtype = _gather_dtype(features)
        local = [_columns(runs[kind](local_inputs)) if kind in mine
                 else torch.zeros(0, width, dtype=dtype, device=features.device) for kind in share.pieces]
        local = torch.cat([part.to(dtype) for part in local])
        if torch.is_grad_enabled() and not local.requires_grad and any(p.requires_grad for p in features.parameters()):
            local.requires_grad_()  # a rank without a row of its own still joins the gather's backward
        whole = gather_rows(local, share.counts, self.group)
        parts = {kind: _split_columns(torch.cat([whole.narrow(0, first, rows) for first, rows in pieces]),
                                      features.hidden_size, features.deepstack)
                 for kind, pieces in share.pieces.items()}
        return features.join(parts.get("image", features.empty_part()), parts.get("video"), inputs)


def _gather_dtype(features: ImageFeatures) -> torch.dtype:
    """The dtype every CP rank gathers in (the same on each, whatever its share): the autocast dtype where the
    tower runs under autocast, else its parameters'."""
    device = features.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else features.dtype


def _columns(part: tuple[torch.Tensor, torch.Tensor | None]) -> torch.Tensor:
    """``(features (n, H), DeepStack (K, n, H) or None)`` as one ``(n, (1 + K) H)`` tensor, for one gather."""
    feats, deep = part
    return feats if deep is None else torch.cat([feats, *deep.to(feats.dtype).unbind(0)], dim=-1)


def _split_columns(rows: torch.Tensor, hidden: int, deepstack: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The inverse of :func:`_columns`."""
    if not deepstack:
        return rows, None
    return rows[:, :hidden], torch.stack([rows[:, hidden * (k + 1):hidden * (k + 2)] for k in range(deepstack)])


def divide_towers(preprocess, group) -> str:
    """Divide ``preprocess``'s tower (a :class:`~mpipe_hf.runtime.Preprocess`: its vision part, whether alone or
    in front of decoder layers) over CP ``group``: its runs go through :class:`DividedTower`, and its ``host``
    also computes, at load, the tower inputs of this rank's share. Call it once, before the executor is built.

    Returns:
        ``"divided"``, or why the tower runs whole on every CP rank: no ``P`` module (preprocess ``identity``:
        the tower runs in stage 0), no tower, or a family that declares no ``tower_division`` (named).
    """
    if preprocess.module is None:
        return "whole: preprocess identity runs the tower in stage 0"
    towers = [m for m in preprocess.module.modules() if isinstance(m, ImageFeatures)]
    if not towers:
        return "whole: no vision tower"
    tower = towers[0]
    if tower.division is None:
        return f"whole: {tower.model_type} declares no tower_division"
    tower.tower = DividedTower(tower.division, group)
    own = preprocess.host

    def host(raw: Tensors) -> Tensors:
        out = own(raw) if own is not None else {}
        return {**out, **tower.tower.host({**raw, **out})}
    preprocess.host = host
    return "divided"
