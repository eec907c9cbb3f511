"""A schedule's Gantt chart as text, from a :func:`~.simulate.simulate` timeline.

One row per rank and one column per time unit: a forward of micro ``m`` prints ``m`` (base 36), a backward prints
``m`` followed by ``=``, a weight gradient (zero bubble's ``W``) ``m`` followed by ``w``, ``P``/``p`` mark the transposed preprocess's forward/backward, and ``.`` is idle time
(the bubble). Costs should be whole time units (the default :class:`~.simulate.Costs` are).
"""

from __future__ import annotations

import string

from .actions import Kind
from .simulate import Event

_DIGITS = string.digits + string.ascii_lowercase


def gantt(timeline: dict[int, list[Event]]) -> str:
    """Text chart of ``timeline``: one row per rank, one column per time unit."""
    makespan = int(round(max((e.end for events in timeline.values() for e in events), default=0.0)))
    lines = []
    for rank, events in sorted(timeline.items()):
        row = ["."] * makespan
        for e in events:
            width = int(round(e.end - e.start))
            if not width or not e.busy or e.action.kind is Kind.DATA_LOAD:
                continue
            if e.action.kind is Kind.F:
                cells = _DIGITS[e.action.micro % 36] * width
            elif e.action.kind in (Kind.B, Kind.W):
                cells = _DIGITS[e.action.micro % 36] + ("=" if e.action.kind is Kind.B else "w") * (width - 1)
            else:
                cells = ("P" if e.action.kind is Kind.TRANSPOSE_FWD else "p") * width
            begin = int(round(e.start))
            row[begin:begin + width] = cells
        lines.append(f"rank {rank} |{''.join(row)}|")
    return "\n".join(lines)
