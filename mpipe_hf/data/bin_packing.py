"""The packer's bins: which items (rows of a step's buffer, each with a token length and a cost) go into which of
a step's bins, under a token budget and optionally a cost budget. Best-fit decreasing chooses the items and packs
them (:func:`best_fit_decreasing`), LPT (longest processing time first) rebalances the chosen items by cost
(:func:`balance_costs`) and a local search evens the costliest and the cheapest bin (:func:`refine_costs`);
:func:`pack_step` is one step of all three. Pure functions of lists of numbers: which dataset rows stream into the
buffer, and when a row counts as stale, is the planner's (:class:`~.packing.PackedPlan`)."""

from __future__ import annotations

import bisect
import heapq
from typing import Sequence


def best_fit_decreasing(lengths: Sequence[int], num_bins: int, budget: int, stale: int = 0,
                        costs: Sequence[float] | None = None,
                        cost_budget: float | None = None) -> tuple[list[list[int]], list[int]]:
    """Best-fit decreasing of items ``0 .. len(lengths) - 1`` into ``num_bins`` bins of ``budget`` tokens: the
    ``stale`` first items (rows that have waited long) in index order, then the others by (length desc, index
    asc), each into the fitting bin with the least room left (ties: lowest bin). Returns ``(bins, left)``: each
    bin's items in placing order, and the items that fit nowhere, ascending. O(items * log bins). With
    ``cost_budget``, a bin also holds at most that much of ``costs`` (:func:`_best_fit_both`)."""
    if cost_budget is not None:
        return _best_fit_both(lengths, costs, num_bins, budget, cost_budget, stale)
    order = list(range(stale)) + sorted(range(stale, len(lengths)), key=lambda i: (-lengths[i], i))
    free = [(budget, b) for b in range(num_bins)]  # (room, bin), ascending
    bins: list[list[int]] = [[] for _ in range(num_bins)]
    left = []
    for at, i in enumerate(order):
        if not free:
            left.extend(order[at:])
            break
        slot = bisect.bisect_left(free, (lengths[i], -1))
        if slot == len(free):
            left.append(i)
            continue
        room, b = free.pop(slot)
        bins[b].append(i)
        if room > lengths[i]:
            bisect.insort(free, (room - lengths[i], b))
    return bins, sorted(left)


def _best_fit_both(lengths, costs, num_bins: int, budget: int, cost_budget: float, stale: int):
    """Best-fit decreasing under two budgets, ``budget`` tokens and ``cost_budget`` of ``costs`` a bin: the
    ``stale`` first items in index order, then the others by their larger share of either budget (desc; index
    asc), each into the bin, of those with room for both, with the least cost room left (ties: least token room,
    lowest bin). O(items * bins)."""
    order = list(range(stale)) + sorted(range(stale, len(lengths)),
                                        key=lambda i: (-max(lengths[i] / budget, costs[i] / cost_budget), i))
    bins: list[list[int]] = [[] for _ in range(num_bins)]
    tokens, cost, left = [0] * num_bins, [0.0] * num_bins, []
    for i in order:
        fits = [b for b in range(num_bins) if tokens[b] + lengths[i] <= budget and cost[b] + costs[i] <= cost_budget]
        if not fits:
            left.append(i)
            continue
        b = min(fits, key=lambda b: (cost_budget - cost[b], budget - tokens[b], b))
        bins[b].append(i)
        tokens[b], cost[b] = tokens[b] + lengths[i], cost[b] + costs[i]
    return bins, sorted(left)


def balance_costs(lengths: Sequence[int], costs: Sequence[float], items: Sequence[int], num_bins: int,
                  budget: int, cost_budget: float | None = None) -> list[list[int]] | None:
    """LPT rebalancing (Graham 1969): ``items`` sorted by (cost desc, index asc), each into the bin with the
    smallest cost so far that still has room for its tokens, and within ``cost_budget`` (ties: fewest tokens, then
    lowest bin). ``None`` when some item fits in no bin (the caller keeps its best-fit bins)."""
    heap = [(0.0, 0, b) for b in range(num_bins)]  # (cost, tokens, bin)
    bins: list[list[int]] = [[] for _ in range(num_bins)]
    for i in sorted(items, key=lambda i: (-costs[i], i)):
        skipped = []
        while heap and (budget - heap[0][1] < lengths[i] or (
                cost_budget is not None and heap[0][0] + costs[i] > cost_budget + 1e-9)):
            skipped.append(heapq.heappop(heap))
        if not heap:
            return None
        cost, tokens, b = heapq.heappop(heap)
        bins[b].append(i)
        heapq.heappush(heap, (cost + costs[i], tokens + lengths[i], b))
        for entry in skipped:
            heapq.heappush(heap, entry)
    return bins


def _fill_empty(bins: list[list[int]]) -> list[list[int]]:
    """Give each empty bin the last item of the bin with the most items (ties: lowest bin), while one holds 2 or
    more: every micro-batch then has a row (moving a row into an empty bin keeps both within budget)."""
    for b, items in enumerate(bins):
        if items:
            continue
        donor = max(range(len(bins)), key=lambda d: (len(bins[d]), -d))
        if len(bins[donor]) < 2:
            break
        items.append(bins[donor].pop(max(range(len(bins[donor])), key=lambda j: bins[donor][j])))
    return bins


def pack_step(lengths: Sequence[int], costs: Sequence[float], num_bins: int, budget: int,
              stale: int = 0, cost_budget: float | None = None) -> tuple[list[list[int]], list[int]]:
    """One step's bins from a buffer of items (in stream order, the first ``stale`` of them rows that have waited long):
    (b) :func:`best_fit_decreasing` chooses the items and packs them; (c) :func:`balance_costs` redistributes the chosen
    items by cost, kept when every item fits and its most costly bin costs no more than best-fit's; an empty bin takes a
    row from the fullest (:func:`_fill_empty`); :func:`refine_costs` then moves and swaps items between the costliest
    and the cheapest bin; (d) each bin's items ascending (stream order). Returns ``(bins, left)``, ``left`` the items
    for a later step, ascending. With at least ``num_bins`` items, every bin gets at least one. With ``cost_budget``,
    (b) and (c) keep each bin within that much cost too (the moves of (c) never raise the costliest bin)."""
    bins, left = best_fit_decreasing(lengths, num_bins, budget, stale, costs, cost_budget)
    chosen = sorted(i for items in bins for i in items)
    balanced = balance_costs(lengths, costs, chosen, num_bins, budget, cost_budget)
    if balanced is not None and _max_cost(balanced, costs) <= _max_cost(bins, costs):
        bins = balanced
    bins = refine_costs(_fill_empty(bins), lengths, costs, budget)
    return [sorted(items) for items in bins], left


def refine_costs(bins: list[list[int]], lengths: Sequence[int], costs: Sequence[float], budget: int,
                 rounds: int | None = None) -> list[list[int]]:
    """Local search on the costliest and the cheapest bin (after best-fit or LPT, whose tight token budgets leave
    costs uneven): move one item from the costliest to the cheapest, or swap one item of each, whichever lowers the
    larger of their two costs the most while both stay within ``budget`` tokens and the costliest keeps an item;
    repeat until no move helps, at most ``rounds`` times (default ``4 * len(bins)``). The step's most costly bin
    never gets costlier. Deterministic (ties: lowest item indices)."""
    for _ in range(4 * len(bins) if rounds is None else rounds):
        cost = [sum(costs[i] for i in b) for b in bins]
        tokens = [sum(lengths[i] for i in b) for b in bins]
        hi = max(range(len(bins)), key=lambda b: (cost[b], -b))
        lo = min(range(len(bins)), key=lambda b: (cost[b], b))
        best, move = max(cost[hi], cost[lo]), None
        for i in sorted(bins[hi]):
            for j in [None] + sorted(bins[lo]):
                if j is None and len(bins[hi]) < 2:
                    continue
                dc = costs[i] - (costs[j] if j is not None else 0.0)
                dt = lengths[i] - (lengths[j] if j is not None else 0)
                if tokens[lo] + dt > budget or tokens[hi] - dt > budget:
                    continue
                worst = max(cost[hi] - dc, cost[lo] + dc)
                if worst < best - 1e-9:
                    best, move = worst, (i, j)
        if move is None:
            break
        i, j = move
        bins[hi].remove(i)
        bins[lo].append(i)
        if j is not None:
            bins[lo].remove(j)
            bins[hi].append(j)
    return bins


def _max_cost(bins: list[list[int]], costs: Sequence[float]) -> float:
    return max(sum(costs[i] for i in items) for items in bins)
