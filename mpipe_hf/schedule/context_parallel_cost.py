"""How a micro-batch's work lies over a context-parallel group, as pure functions of costs every rank knows
(no collective, no torch.distributed).

The tower's items (a micro's images, and a video's groups of temporal patches) go to the CP ranks by the LPT rule
(:func:`~mpipe_hf.schedule.owners.balance_owners`: heaviest first, to the least loaded rank), so every rank
computes the same division from the same per-item costs (patches).
"""

from __future__ import annotations

from typing import Sequence

from .owners import balance_owners


def divide_tower(costs: Sequence[int], cp: int) -> tuple[int, ...]:
    """The CP rank that runs each tower item: ``costs`` one per item (its patches, or any unit of the tower's
    work, each ``>= 0``), ``cp`` the group's size; LPT with deterministic ties (equal costs: the earlier item
    first; equal loads: fewer items, then the lower rank). Raises ValueError for ``cp < 1``."""
    if cp < 1:
        raise ValueError(f"a context-parallel group has at least 1 rank, got {cp}")
    return balance_owners(list(costs), cp) if costs else ()
