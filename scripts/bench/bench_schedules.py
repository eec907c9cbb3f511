"""Side-by-side step times of pipeline schedules on synthetic stages that sleep for set costs (R = 4 ranks on
gloo): ours and MPipe Transpose against the strongest torch.distributed.pipelining schedules, each row beside the
simulator's prediction, the best torch row and a lower bound.

Usage: python scripts/bench/bench_schedules.py [--quick | --video | --varying | --cp] [--micros 8 16]
[--pfs 0 10 20 40 80] [--steps 5] [--markdown FILE] (starts 4 local processes itself; ``--micros`` and ``--pfs``
pick part of the full grid; ``--quick`` runs M = 16 and preprocess 0 and 40 ms only; ``--video`` the video-heavy
profile: M = 16, a tower of ``Pf = 60 ms`` (6 body chunks' forward), frozen, trainable and ``freeze_vit``; ``--varying`` the varying
points only). The full grid (M = 16 in it, no ``--pfs``) and ``--quick`` end with the varying points: M = 16, frozen and trainable, a tower whose cost varies per micro-batch, ``Pf w[m]`` (and
``Pb w[m]``) for micro ``m``, ``Pf`` = 40 ms, the weights ``w`` the packed demo data's own visual-token counts
scaled to a coefficient of variation of 0.5 (``scripts/bench/sim_mimo.py``'s ``demo_weights``), the same
weights for every row; there MPipe's overflow ``full`` rows take load-aware owners over them, as
``parallel.owners: balanced`` does (``bench_schedules_varying.py``).

``--cp``: the context-parallel rows alone (``bench_schedules_cp.py``): pp 2 at cp 1 and cp 2 on the 4 ranks, cp 2
halving each stage's sleep and adding Ulysses' all-to-alls over gloo, each beside the simulator's prediction, with
the ratios cp 2 / cp 1 measured and predicted.

The code is in six files: this one (the launch and the overheads), ``bench_schedules_stages.py`` (the stages
and the runners, shared with ``bench_compute.py``), ``bench_schedules_profiles.py`` (the points and the report),
``bench_schedules_mimo.py`` (the MIMO-style rows), ``bench_schedules_varying.py`` (the varying points' stages
and the MPipe against MIMO-style summary) and ``bench_schedules_cp.py`` (the context-parallel rows).

Stages. Each stage is a module whose forward and backward sleep (``time.sleep`` frees the core, so 4 ranks share
2 CPU cores honestly): body F = 10 ms and B = 20 ms per chunk, V = 2. Its backward is two autograd nodes, as a
real layer's is: one on the input path that sleeps ``B_in`` (the input gradient, which the stage before waits
for) and one on the weight path that sleeps ``B_w`` (the weight gradient, which nobody waits for), with
``B_in = B_w = B / 2``: Zero Bubble PP's ``F = B = W`` (Qi et al., ICLR 2024). A schedule that does not split the
backward pays ``B_in + B_w = B``; torch's zero-bubble schedules (``stage_backward_input`` and
``stage_backward_weight``) and ours run the two apart. On the first stage, whose input needs no gradient, the input
path starts at the stage's weight, as a first layer's does: its whole backward is weight work, and both runtimes
run it in one piece, as its ``W``. Before anything else, rank 0 times the split once with torch's two functions
(the line "split check" under the table).

The preprocess ``P`` costs ``Pf`` in {0, 10, 20, 40, 80} ms forward per micro-batch (60 ms with ``--video``), and
``Pb = 2 Pf`` backward when trainable (``freeze_vit``: the merger's backward alone, 0.033 Pf; see
``bench_schedules_profiles.py``). ``P``'s backward is weight work: it ends in ``P``'s weights and ``P``'s input is
raw data, so no stage waits for it. Inside stage 0 it is added to the weight node's sleep; transposed, ``P`` is a
sleeping module of its own whose backward is all weight path. A frozen ``P`` has no backward. Schedules:

- (a) torch ``ScheduleInterleaved1F1B``, ``P`` inside stage 0;
- (b) our interleaved 1F1B (preprocess ``identity``), ``P`` inside stage 0;
- (c) (b) with a balanced layout: the body as 32 layers of 2.5 / 5 ms, stage 0 keeping the number of layers the
  simulator finds fastest (what Megatron-LM users do by hand);
- (d) MPipe Transpose, overflow ``full``; (e) overflow ``min``; (f) frozen ``P`` only: ``full`` with bubble
  filling (placement ``fill``): each transposed forward where the simulator finds its owner idle, the next
  step's computed in this step's idle time (the median step is the steady state); (g) trainable ``P`` only:
  ``full`` with owner-backward (the owners keep ``P``'s graph and run its backward; no recompute on rank 0);
- (h) MPipe zero-bubble: (f) (frozen) or (g) (trainable) with ``zero_bubble``: each body backward split into
  ``B`` (input gradient) and ``W`` (weight gradient), each ``W`` run where its rank would otherwise wait;
- (i) (b) with ``zero_bubble``;
- (j) (a) with (c)'s layout (stage 0 keeps the same number of layers);
- (k) torch ``ScheduleInterleavedZeroBubble`` (ZB-1P), ``P`` inside stage 0; (l) (k) with (c)'s layout;
- (m) torch ``ScheduleZBVZeroBubble``, ``P`` inside stage 0, the stages placed V-shape (rank ``r`` holds stages
  ``r`` and ``2R-1-r``, so rank 0 holds the first and the last);
- (n), (o) MIMO-style (``bench_schedules_mimo.py``), ``K`` = 1 and 2 ranks of their own for ``P`` (Megatron's
  MIMO), the body's 32 layers over the other ``R - K`` ranks' ``(R - K) V`` stages under the torch schedule the
  simulator finds faster for them (interleaved 1F1B or zero-bubble), each feature sent to text stage 0 and its
  gradient back; a frozen ``P`` runs a step ahead (as (f) does). ``K = 3`` leaves one text rank: slower than
  ``K = 2`` at every point in ``scripts/bench/sim_mimo.py``'s map, so not run.

(h) and (i) need ``ScheduleConfig.zero_bubble`` and ``Costs.weight``; without them they are skipped, with a note.
Our rows run on our executor, the torch rows on torch's runtime, each over the same sleeping stages. Every run is
caught on every rank: a schedule that raises anywhere (construction or step) gets a row with the earliest error's
type and first line instead of numbers. The torch rows run over a process group of their own with a short
timeout, so the other ranks give up on a failed rank instead of hanging.

First the runtimes' overheads, measured in the same run: one transfer (ours, with its shape header, against a
fixed-shape send), and each runtime's step and CPU time on stages that do nothing. They give the simulator its
per-runtime costs: the link latency (one transfer) and the dispatch (CPU time per action of the schedule). Then,
for each schedule, the columns:

- step s: the median step time over ``--steps`` steps after 2 warm-up steps;
- step / (a), step / best torch, step / ideal: every ratio is this row's step time divided by the reference's
  (below 1: faster than it). "best torch" is the fastest torch row, (a) or (j) to (m), of the same ``M``, ``P``
  mode and ``Pf``;
- predicted s and error: the simulator (``mpipe_hf.schedule.simulate``) on the row's schedule with its runtime's
  measured latency and dispatch, and ``Costs.weight`` = ``B_w`` per stage for the split ones. The simulator runs
  our action orders, which for torch's interleaved 1F1B are torch's own; for torch's zero-bubble rows it says n/a;
- our-runtime limit s: the larger of the body's own step time on our runtime (the interleaved 1F1B body, no
  ``P``, simulated with our measured latency and dispatch) and all the work divided by ``R``;
- ideal limit s: a true lower bound for every row of its point, with no runtime overhead at all: the larger of
  (1) the smallest, over the point's rows that ran, of the row's own order of actions run with zero latency,
  zero dispatch and no preprocess (its body: the interleaved 1F1B body, the zero-bubble one, a rebalanced one,
  torch's orders with torch's placement of stage 0's backward; the MIMO-style rows' torch text order over
  their text stages), and (2) the work a perfect schedule must do divided by ``R``: ``M (S (F + B) + Pf + Pb) /
  R`` (varying: ``sum_m w[m] (Pf + Pb)`` for ``M (Pf + Pb)``), without rank 0's recompute of ``P``. A row's
  step is never shorter than its own order run with costs no larger than its own and no overhead (sleeps only
  oversleep), so never shorter than the ideal limit.

After the table, per point (``M``, ``P`` mode, ``Pf``): the best torch row, the best MPipe row ((d) to (h)), the
speed-up (best torch step / best MPipe step: above 1, MPipe is faster) and the best MPipe step / ideal limit;
then the best MIMO-style row against the best MPipe row, MIMO step / MPipe step against the goal (1.10 where the
tower's cost varies, 0.97 at fixed cost), and where a goal is missed, where both rows' steps went: all the work
over R, the order's own bubble and imbalance (simulated with no overhead), transfer and dispatch (the simulator
with this run's measured latency and dispatch) and the rest (measured less predicted: unmodelled overhead).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_schedules_profiles import VARYING_PF_MS, VIDEO_PF_MS, point_rows, report  # noqa: E402
from bench_schedules_stages import (R, V, SleepingStages, StageCosts, check_split, header_overhead,  # noqa: E402
                                    run_ours, run_torch)
from bench_schedules_cp import cp_rows  # noqa: E402
from sleeping import print_report, run_ranks  # noqa: E402


def grid(args):
    """The points ``(M, P mode, Pf ms)`` to run: every one, ``--quick``'s, ``--video``'s, ``--varying``'s or
    ``--smoke``'s (a mode ending in ``varying``: the tower's cost varies per micro-batch)."""
    varying = [(16, f"{mode} varying", VARYING_PF_MS) for mode in ("frozen", "trainable")]
    if args.smoke:
        return [(8, "frozen", 0.0)]
    if args.varying:
        return varying
    if args.video:
        return [(16, mode, VIDEO_PF_MS) for mode in ("frozen", "trainable", "freeze_vit")]
    pfs = [0.0, 40.0] if args.quick else args.pfs or [0.0, 10.0, 20.0, 40.0, 80.0]
    micros = [16] if args.quick else args.micros or [8, 16]
    return [(m, mode, pf) for m in micros for mode in ("frozen", "trainable") for pf in pfs] + (
        varying if 16 in micros and not args.pfs else [])


def worker(args):
    """One rank of the benchmark: measure the overheads, run every point, and (rank 0) report."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from mpipe_hf.schedule import ScheduleConfig, build_schedule
    started = time.perf_counter()
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    rank = dist.get_rank()
    split = check_split() if rank == 0 else None
    # the simulator's dispatch: each runtime's CPU time per action (the busiest rank's), on stages that do nothing.
    # Ours first: its executor makes the locally synchronised groups every later executor reuses; made after the
    # transfer test's groups, they hang (the ranks name them differently).
    zero_m = 16
    zero = SleepingStages(StageCosts(*[(0.0,) * R * V] * 3))
    sim_actions = len(build_schedule(ScheduleConfig(R, V, zero_m, "identity"))[rank])
    ours_zero = run_ours(ScheduleConfig(R, V, zero_m, "identity"), rank, zero, args.steps, cpu=True)
    torch_zero = run_torch("1f1b", rank, zero, zero_m, args.steps, cpu=True)[:2]
    # and its link latency: one transfer as each runtime does it (ours: the shape header and the payload)
    ours_latency, plain_latency = header_overhead(dist.group.WORLD, rank)
    dispatch = torch.tensor([torch_zero[0][1] / sim_actions, ours_zero[0][1] / sim_actions])
    dist.all_reduce(dispatch, op=dist.ReduceOp.MAX)
    torch_dispatch, ours_dispatch = dispatch.tolist()
    ours_rt = dict(latency=ours_latency, dispatch=ours_dispatch)
    torch_rt = dict(latency=plain_latency, dispatch=torch_dispatch)
    if args.cp:  # the context-parallel rows alone (bench_schedules_cp.py)
        lines = cp_rows(rank, args.steps, ours_rt)
        if rank == 0:
            print_report("\n".join(lines + [f"took {time.perf_counter() - started:.0f} s"]), args.markdown)
        dist.destroy_process_group()
        return
    points, notes = [], []
    for num_micro, mode, pf_ms in grid(args):
        rows, our_limit, ideal, point_notes = point_rows(args, rank, num_micro, mode, pf_ms, ours_rt, torch_rt)
        points.append((rows, our_limit, ideal))
        notes += [n for n in point_notes if n not in notes]
        if rank == 0:
            print(f"M={num_micro} {mode} Pf={pf_ms:g} ms done ({time.perf_counter() - started:.0f} s)", flush=True)
    if rank == 0:
        report(args, points, notes, ours_latency, plain_latency, torch_zero, ours_zero,
               (torch_dispatch, ours_dispatch), split, time.perf_counter() - started)
    dist.destroy_process_group()


def main():
    """Parse the arguments; start the 4 ranks (torchrun), or be one of them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    points = parser.add_mutually_exclusive_group()
    points.add_argument("--quick", action="store_true", help="M = 16 and Pf in {0, 40} ms only")
    points.add_argument("--video", action="store_true",
                        help=f"the video-heavy profile: M = 16, Pf = {VIDEO_PF_MS:g} ms, frozen, trainable, freeze_vit")
    points.add_argument("--varying", action="store_true", help=f"the points whose tower cost varies per "
                        f"micro-batch only: M = 16, Pf = {VARYING_PF_MS:g} ms on average, frozen and trainable")
    points.add_argument("--smoke", action="store_true", help="one point (M = 8, frozen, Pf = 0 ms): every "
                        "schedule runs, in about a minute (the full suite's check; no figure to quote)")
    points.add_argument("--cp", action="store_true", help="the context-parallel rows alone: pp 2 at cp 1 and 2 on "
                        "the 4 ranks, Ulysses' all-to-alls on gloo, beside the simulator (bench_schedules_cp.py)")
    parser.add_argument("--micros", type=int, nargs="+", help="the full grid's M (default 8 16; the varying "
                        "points run where 16 is one and --pfs is not given)")
    parser.add_argument("--pfs", type=float, nargs="+", help="the full grid's Pf in ms (default 0 10 20 40 80)")
    parser.add_argument("--steps", type=int, default=5, help="measured steps per schedule (median)")
    parser.add_argument("--markdown", help="also write the table to this file")
    args = parser.parse_args()
    run_ranks(__file__, R, worker, args)


if __name__ == "__main__":
    main()
