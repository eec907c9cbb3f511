"""Draw the README's picture: MPipe Transpose against interleaved 1F1B, simulated, one Gantt chart above the other.

Both run the demo's shape (``R = 4`` ranks, ``V = 2`` chunks each, ``M = 8`` micro-batches) under the same costs:
a body chunk's forward 1 and backward 2 time units, and a frozen visual tower (``P``) of 4 units per micro-batch,
the ratio of the heavy frozen point of ``scripts/bench/bench_schedules.py`` (40 ms against 10 ms; BENCHMARKS.md).
Interleaved 1F1B runs the tower inside stage 0's forward, as ``torch.distributed.pipelining`` does (our
``preprocess: identity``); MPipe Transpose runs it on the micro-batch's owner during the warm-up. Each chart is
drawn by ``mpipe_hf.schedule.trace.plot_gantt`` (what ``mpipe-hf plot`` draws); the two are then stacked, on one time axis.

Usage: python scripts/report/demo_gantt.py [OUT.png]   (default: gantt.png in the working directory; needs matplotlib)
       python scripts/report/demo_gantt.py docs/gantt.png   (redraw the README's picture)
"""

import argparse
import os
import tempfile

from PIL import Image

from mpipe_hf.schedule import Costs, ScheduleConfig, build_schedule
from mpipe_hf.schedule.simulate import Event, simulate
from mpipe_hf.schedule.trace import plot_gantt

R, V, M = 4, 2, 8
TOWER = 4.0  # the frozen tower's forward per micro-batch, in body-chunk forwards


def charts() -> list[tuple[str, dict, float]]:
    """``(title, timeline, step)`` of interleaved 1F1B (the tower inside stage 0) and of MPipe Transpose."""
    inside = [1.0] * (R * V)
    inside[0] += TOWER
    rows = [("interleaved 1F1B, tower inside stage 0", ScheduleConfig(R, V, M, "identity"),
             Costs(forward=tuple(inside), backward=2.0, preprocess_forward=0.0, preprocess_backward=0.0)),
            ("MPipe Transpose, tower on every rank in its warm-up", ScheduleConfig(R, V, M, "frozen"),
             Costs(forward=1.0, backward=2.0, preprocess_forward=TOWER, preprocess_backward=0.0))]
    out = []
    for name, cfg, costs in rows:
        sim = simulate(build_schedule(cfg, costs), costs)
        out.append((f"{name}: step {sim.makespan:g} time units, bubble {sim.mean_bubble:.2f}", sim.timeline,
                    sim.makespan))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default="gantt.png",
                        help="the PNG to write (default: gantt.png here; docs/gantt.png is the README's, tracked)")
    out = parser.parse_args(argv).out
    drawn = charts()
    longest = max(step for _, _, step in drawn)
    for _, timeline, _ in drawn:  # one time axis for both: an empty event (not drawn) at the longer step's end
        timeline[0].append(Event(longest, longest, timeline[0][-1].action))
    with tempfile.TemporaryDirectory() as tmp:
        images = []
        for i, (title, timeline, _) in enumerate(drawn):
            path = os.path.join(tmp, f"{i}.png")
            plot_gantt(timeline, path, title)
            images.append(Image.open(path).convert("RGB"))
        width = max(im.width for im in images)
        sheet = Image.new("RGB", (width, sum(im.height for im in images)), "white")
        y = 0
        for im in images:
            sheet.paste(im, (0, y))
            y += im.height
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        sheet.save(out, optimize=True)
    print(f"wrote {out}: interleaved 1F1B {drawn[0][2]:g}, MPipe Transpose {drawn[1][2]:g} time units "
          f"({drawn[0][2] / drawn[1][2]:.2f}x)")


if __name__ == "__main__":
    main()
