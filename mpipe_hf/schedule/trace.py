"""Timelines as pictures and as Chrome traces: a Gantt chart (PNG, matplotlib) of a simulated or measured
schedule, and the Chrome-trace JSON that ``chrome://tracing`` and Perfetto open.

A timeline is ``{rank: [Event(start, end, action), ...]}`` (:mod:`.simulate`), in seconds for measured runs.
"""

from __future__ import annotations

import json

from .actions import Action, Kind
from .simulate import Event

COLORS = {Kind.F: "#4C78A8", Kind.B: "#54A24B", Kind.W: "#9ACD6E", Kind.TRANSPOSE_FWD: "#F58518", Kind.TRANSPOSE_BWD: "#E45756",
          Kind.DATA_LOAD: "#B279A2"}
LABELS = {Kind.F: "forward", Kind.B: "backward", Kind.W: "weight gradient (W)", Kind.TRANSPOSE_FWD: "preprocess forward",
          Kind.TRANSPOSE_BWD: "preprocess backward", Kind.DATA_LOAD: "data load"}


def chrome_trace(timeline: dict[int, list[Event]], unit_s: float = 1.0) -> dict:
    """The Chrome trace-event JSON object of ``timeline`` (times in ``unit_s`` seconds): one complete event
    (``"ph": "X"``) per action, one row (``tid``) per rank, the action's text as its name, its kind as category."""
    events = []
    for rank, row in sorted(timeline.items()):
        events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": rank, "args": {"name": f"rank {rank}"}})
        for e in row:
            events.append({"name": str(e.action), "cat": e.action.kind.value, "ph": "X", "pid": 0, "tid": rank,
                           "ts": e.start * unit_s * 1e6, "dur": (e.end - e.start) * unit_s * 1e6})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def read_chrome_trace(path: str) -> dict[int, list[Event]]:
    """Inverse of :func:`chrome_trace` (times in seconds, from the earliest event).

    Raises:
        ValueError: the file holds no action events.
    """
    with open(path) as f:
        raw = json.load(f)
    events = [e for e in raw.get("traceEvents", raw if isinstance(raw, list) else []) if e.get("ph") == "X"]
    if not events:
        raise ValueError(f"{path}: no complete ('ph': 'X') events; write one with mpipe-hf train (trace: true)")
    origin = min(e["ts"] for e in events)
    timeline: dict[int, list[Event]] = {}
    for e in sorted(events, key=lambda e: e["ts"]):
        start = (e["ts"] - origin) / 1e6
        timeline.setdefault(int(e["tid"]), []).append(Event(start, start + e["dur"] / 1e6, Action.parse(e["name"])))
    return timeline


def plot_gantt(timeline: dict[int, list[Event]], path: str, title: str = "", unit: str = "time units") -> None:
    """Draw ``timeline`` as a Gantt chart into the PNG ``path``: one row per rank (rank 0 on top), a bar per
    compute action coloured by kind and labelled with its micro-batch, white where the rank idles.

    Raises:
        ModuleNotFoundError: matplotlib is not installed (``pip install matplotlib``).
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ranks = sorted(timeline)
    makespan = max((e.end for row in timeline.values() for e in row), default=1.0) or 1.0
    fig, ax = plt.subplots(figsize=(16, 0.6 * len(ranks) + 1.4))
    for y, rank in enumerate(ranks):
        for e in timeline[rank]:
            if e.action.kind not in COLORS or e.end <= e.start:
                continue
            ax.broken_barh([(e.start, e.end - e.start)], (y - 0.4, 0.8), facecolors=COLORS[e.action.kind],
                           edgecolors="white", linewidth=0.5)
            if (e.end - e.start) / makespan > 0.008:
                ax.text((e.start + e.end) / 2, y, str(e.action.micro), ha="center", va="center", fontsize=7,
                        color="white")
    ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlim(0, makespan)
    ax.set_xlabel(unit)
    ax.set_title(title)
    shown = {e.action.kind for row in timeline.values() for e in row if e.action.kind in LABELS and e.end > e.start}
    ax.legend(handles=[Patch(color=COLORS[k], label=LABELS[k]) for k in LABELS if k in shown],
              loc="upper center", bbox_to_anchor=(0.5, -0.35 if len(ranks) < 4 else -0.2), ncol=len(shown),
              fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
