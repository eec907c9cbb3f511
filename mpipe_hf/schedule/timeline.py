"""A cost-model run of a schedule, and its Gantt chart as text.

Each compute action takes a set number of time units, transfers take none, a receive waits for its send, and a
collective waits for every rank. The chart shows one row per rank and one column per time unit: a forward of
micro ``m`` prints ``m`` (base 36), a backward prints ``m`` followed by ``=``, ``P``/``p`` mark the transposed
preprocess's forward/backward, and ``.`` is idle time (the bubble).
"""

from __future__ import annotations

import string
from collections import defaultdict

from .actions import COLLECTIVE_KINDS, RECV_KINDS, SEND_TO_RECV, Action, Kind
from .config import ScheduleConfig

DEFAULT_COSTS = {Kind.F: 1.0, Kind.B: 2.0, Kind.TRANSPOSE_FWD: 1.0, Kind.TRANSPOSE_BWD: 2.0, Kind.GRAD_RECV_BWD: 2.0}
_DIGITS = string.digits + string.ascii_lowercase


def run_timeline(cfg: ScheduleConfig, orders: dict[int, list[Action]],
                 costs: dict[Kind, float] | None = None) -> dict[int, list[tuple[float, float, Action]]]:
    """Start and end time of every action, per rank, under ``costs`` (time units per compute kind).

    The schedule must be valid (see :func:`validate`); this function assumes it can finish.
    """
    costs = {**DEFAULT_COSTS, **(costs or {})}
    clock = {r: 0.0 for r in orders}
    pc = {r: 0 for r in orders}
    posted: dict[tuple[int, int], list[tuple[tuple, float]]] = defaultdict(list)
    taken: dict[tuple[int, int], int] = defaultdict(int)
    out = {r: [] for r in orders}
    remaining = sum(len(a) for a in orders.values())
    while remaining:
        moved = False
        for rank, actions in orders.items():
            while pc[rank] < len(actions) and actions[pc[rank]].kind not in COLLECTIVE_KINDS:
                a = actions[pc[rank]]
                start = clock[rank]
                if a.kind in RECV_KINDS:
                    queue, i = posted[(a.peer, rank)], taken[(a.peer, rank)]
                    if i >= len(queue):
                        break
                    start = max(start, queue[i][1])
                    taken[(a.peer, rank)] += 1
                end = start + costs.get(a.kind, 0.0)
                if a.kind in SEND_TO_RECV:
                    posted[(rank, a.peer)].append((a.message(), end))
                out[rank].append((start, end, a))
                clock[rank] = end
                pc[rank] += 1
                remaining -= 1
                moved = True
        heads = [orders[r][pc[r]] if pc[r] < len(orders[r]) else None for r in orders]
        if heads and all(h is not None and h.kind in COLLECTIVE_KINDS for h in heads):
            start = max(clock.values())
            for rank in orders:
                out[rank].append((start, start, heads[rank]))
                clock[rank] = start
                pc[rank] += 1
                remaining -= 1
            moved = True
        if not moved:
            raise ValueError("schedule cannot finish; run validate() for the reason")
    return out


def bubble(timeline: dict[int, list[tuple[float, float, Action]]]) -> float:
    """Share of ``ranks * makespan`` in which no compute runs."""
    makespan = max((end for events in timeline.values() for _, end, _ in events), default=0.0)
    busy = sum(end - start for events in timeline.values() for start, end, _ in events)
    return 1.0 - busy / (makespan * len(timeline)) if makespan else 0.0


def gantt(timeline: dict[int, list[tuple[float, float, Action]]]) -> str:
    """Text chart: one row per rank, one column per time unit. Forward of micro ``m``: ``m`` in base 36;
    backward: ``m`` then ``=``; preprocess forward/backward: ``P``/``p``; idle: ``.``."""
    makespan = int(round(max((end for events in timeline.values() for _, end, _ in events), default=0.0)))
    lines = []
    for rank, events in sorted(timeline.items()):
        row = ["."] * makespan
        for start, end, a in events:
            width = int(round(end - start))
            if not width:
                continue
            if a.kind is Kind.F:
                cells = _DIGITS[a.micro % 36] * width
            elif a.kind is Kind.B:
                cells = _DIGITS[a.micro % 36] + "=" * (width - 1)
            else:
                cells = ("P" if a.kind is Kind.TRANSPOSE_FWD else "p") * width
            begin = int(round(start))
            row[begin:begin + width] = cells
        lines.append(f"rank {rank} |{''.join(row)}|")
    return "\n".join(lines)
