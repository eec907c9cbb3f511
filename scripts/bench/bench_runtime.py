"""The runtime's own overheads, against torch.distributed.pipelining's, in one run.

Usage: python scripts/bench/bench_runtime.py [--steps 8] [--repeats 3] [--rounds 100] [--profile FILE]
(starts R = 4 local gloo processes itself).

1. CPU time on stages that do nothing (``R = 4``, ``V = 2``, ``M = 16``): ``ScheduleInterleaved1F1B`` against our
   :class:`~mpipe_hf.runtime.PipelineExecutor` (preprocess ``identity``), the two runs interleaved ``--repeats``
   times. Every stage is ``x * w`` (one parameter, so that the backward runs); the last stage's loss is the
   output's sum. Each rank's CPU seconds per step (``time.process_time``: all its threads, the helper threads
   included) are divided by the rank's compute actions (``2 V M = 64``: torch's whole list) and by the actions of
   our list on that rank (compute, sends, receives, MPipe's data transfers). Reported: rank 0 and the busiest
   rank, each the median over the measured steps.
2. One transfer, rank 0 -> 1 and back, halved (the other ranks wait in a barrier): our :class:`~mpipe_hf.runtime.P2P`
   (shape header and payload, every wait bounded and abortable) against a plain ``dist.send``/``dist.recv`` of
   the same fixed-shape tensor, for a small (4 x 64 fp32, 1 KiB: one message in ours) and a large (256 x 1024
   fp32, 1 MiB: two) tensor; the median of ``--repeats + 2`` alternations of ``--rounds`` round trips.

With ``--profile FILE`` rank 0 also runs a few of our steps under ``cProfile`` (timing the main thread's CPU time,
``time.thread_time``) and writes the 40 functions with the most own time to ``FILE`` (and the raw ``pstats`` data
to ``FILE.prof``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sleeping import run_ranks  # noqa: E402

R, V, M = 4, 2, 16
SIZES = {"small 4x64 fp32": (4, 64), "large 256x1024 fp32": (256, 1024)}


class Scale(nn.Module):
    """``x -> x * w``: a stage that does (almost) nothing but still has a backward."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))

    def forward(self, x):
        return x * self.w


class DictScale(nn.Module):
    """Our executor's stage interface over :class:`Scale`: reads ``x`` (stage 0) or ``hidden_states``; the last
    stage returns the summed loss and its token count."""

    def __init__(self, last: bool):
        super().__init__()
        self.body, self.last = Scale(), last

    def forward(self, inputs):
        out = self.body(inputs.get("hidden_states", inputs.get("x")))
        if self.last:
            return {"loss": out.sum(), "num_tokens": torch.tensor(1)}
        return {"hidden_states": out}


def measure(step, group, steps: int) -> list[tuple[float, float]]:
    """``(wall s, CPU s)`` of ``step`` on this rank for each of ``steps`` steps after 2 warm-up steps; the ranks
    start each step together."""
    out = []
    for i in range(steps + 2):
        dist.barrier(group=group)
        wall, cpu = time.perf_counter(), time.process_time()
        step()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        if i >= 2:
            out.append((wall, cpu))
    dist.barrier(group=group)
    return out


def torch_runner(group, rank):
    """A step function of torch's ``ScheduleInterleaved1F1B`` on this rank's stages, and its action count."""
    from torch.distributed.pipelining import PipelineStage, ScheduleInterleaved1F1B
    stages = [PipelineStage(Scale(), s, R * V, torch.device("cpu"), group=group) for s in range(rank, R * V, R)]
    schedule = ScheduleInterleaved1F1B(stages, M, loss_fn=lambda out, target: out.sum())
    x, target = torch.ones(M, 16), torch.ones(M, 16)

    def step():
        if rank == 0:
            schedule.step(x)
        elif rank == R - 1:
            schedule.step(target=target)
        else:
            schedule.step()
    return step, sum(1 for a in schedule.pipeline_order[rank] if a is not None)


def ours_runner(group, rank):
    """A step function of our executor on this rank's stages, its action count, and the executor."""
    from mpipe_hf.runtime import PipelineExecutor, Preprocess
    from mpipe_hf.schedule import ScheduleConfig
    cfg = ScheduleConfig(R, V, M, "identity")
    stages = {s: DictScale(s == R * V - 1) for s in range(rank, R * V, R)}
    params = [p for s in stages.values() for p in s.parameters()]
    executor = PipelineExecutor(cfg, rank, stages, Preprocess(None, (), ("x",)), group, torch.device("cpu"),
                                params, timedelta(seconds=120))
    x = torch.ones(1, 16)

    def step():
        executor.step(lambda m: {"x": x})
        for p in params:
            p.grad = None
    return step, len(executor.order), executor


def transfers(group, rank, rounds: int, repeats: int) -> dict[str, tuple[float, float]]:
    """``{size name: (ours s, plain s)}`` per transfer, rank 0 -> 1 and back, halved: the median of ``repeats``
    alternations of ``rounds`` round trips each (the ranks share the cores with each other and with whatever
    else runs, so one pass alone is noisy)."""
    from mpipe_hf.runtime.p2p import P2P
    from mpipe_hf.runtime.watchdog import Watchdog
    store = dist.distributed_c10d._get_default_store()
    from mpipe_hf.runtime.groups import pair_groups
    pairs = pair_groups(list(range(R)), timedelta(seconds=60), rank)
    watchdog = Watchdog(store, "bench_runtime", timedelta(seconds=60), threaded=True, groups=list(pairs.values()))
    watchdog.start_step()
    p2p = P2P(rank, pairs, torch.device("cpu"), watchdog)
    out = {}
    for name, shape in SIZES.items():
        buf = torch.ones(shape)
        payload = {"hidden_states": buf}
        figures = {"ours": [], "plain": []}
        for i in range(repeats + 1):  # the first alternation warms up
            for kind in ("ours", "plain"):
                dist.barrier(group=group)
                start = time.perf_counter()
                for _ in range(rounds):
                    if kind == "ours" and rank == 0:
                        p2p.send(payload, 1, "bench")
                        p2p.recv(1, "bench")
                    elif kind == "ours" and rank == 1:
                        p2p.recv(0, "bench")
                        p2p.send(payload, 0, "bench")
                    elif rank == 0:
                        dist.send(buf, 1, group=group)
                        dist.recv(buf, 1, group=group)
                    elif rank == 1:
                        dist.recv(buf, 0, group=group)
                        dist.send(buf, 0, group=group)
                p2p.drain()
                if i:
                    figures[kind].append((time.perf_counter() - start) / rounds / 2)
        value = torch.tensor([statistics.median(figures["ours"]), statistics.median(figures["plain"])])
        dist.broadcast(value, 0, group=group)
        out[name] = tuple(value.tolist())
    # The pair groups stay: they are locally synchronised, so torch names them by their ranks and the count of live
    # groups, and destroying them would give the executor's groups made next the same names; gloo's set-up would
    # then read the destroyed groups' addresses from the store (connectFullMesh: "Connection refused").
    watchdog.close()
    return out


def gather(values: list[float], group) -> list[list[float]]:
    """Every rank's ``values`` (same length on all), on every rank."""
    mine = torch.tensor(values, dtype=torch.float64)
    every = [torch.empty_like(mine) for _ in range(R)]
    dist.all_gather(every, mine, group=group)
    return [t.tolist() for t in every]


def profile_ours(step, path: str, steps: int) -> None:
    """Run ``steps`` of ``step`` under cProfile (this rank only) and write the top functions by own CPU time."""
    import cProfile
    import io
    import pstats
    prof = cProfile.Profile(time.thread_time)  # this thread's CPU time, not the wall clock
    prof.enable()
    for _ in range(steps):
        step()
    prof.disable()
    prof.dump_stats(path + ".prof")
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(40)
    with open(path, "w") as f:
        f.write(text.getvalue())


def worker(args) -> None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    rank, group = dist.get_rank(), dist.group.WORLD
    moved = transfers(group, rank, args.rounds, args.repeats + 2)
    torch_step, torch_actions = torch_runner(group, rank)
    ours_step, ours_actions, executor = ours_runner(group, rank)
    samples = {"torch": [], "ours": []}
    for _ in range(args.repeats):
        samples["torch"] += measure(torch_step, group, args.steps)
        samples["ours"] += measure(ours_step, group, args.steps)
    if args.profile:
        dist.barrier(group=group)
        if rank == 0:
            profile_ours(ours_step, args.profile, args.steps)
        else:
            for _ in range(args.steps):
                ours_step()
        dist.barrier(group=group)
    executor.close()
    compute = 2 * V * M
    row = []
    for name in ("torch", "ours"):
        row += [statistics.median(w for w, _ in samples[name]), statistics.median(c for _, c in samples[name])]
    per_rank = gather(row + [torch_actions, ours_actions], group)
    if rank == 0:
        report(per_rank, moved, compute, args)
    dist.destroy_process_group()


def report(per_rank, moved, compute, args) -> None:
    lines = [f"R = {R}, V = {V}, M = {M}, gloo, {os.cpu_count()} CPU cores; median of {args.repeats} x "
             f"{args.steps} steps (2 warm-up steps each); stages x * w.", "",
             "| rank | torch step ms | torch CPU ms | ours step ms | ours CPU ms | our actions | torch CPU us / compute "
             "action | ours CPU us / compute action | torch CPU us / our action | ours CPU us / our action | "
             "CPU ours / torch |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r, (tw, tc, ow, oc, _, n) in enumerate(per_rank):
        lines.append(f"| {r} | {tw * 1e3:.1f} | {tc * 1e3:.1f} | {ow * 1e3:.1f} | {oc * 1e3:.1f} | {n:.0f} | "
                     f"{tc / compute * 1e6:.0f} | {oc / compute * 1e6:.0f} | {tc / n * 1e6:.0f} | "
                     f"{oc / n * 1e6:.0f} | {oc / tc:.2f} |")
    busiest_t = max(tc for _, tc, *_ in per_rank)
    busiest_o = max(oc for _, _, _, oc, *_ in per_rank)
    n0 = per_rank[0][5]
    lines += ["", f"Busiest rank: torch {busiest_t * 1e3:.1f} ms CPU per step, ours {busiest_o * 1e3:.1f} ms "
              f"(ratio {busiest_o / busiest_t:.2f}); per action of rank 0's list ({n0:.0f}): torch "
              f"{busiest_t / n0 * 1e3:.3f} ms, ours {busiest_o / n0 * 1e3:.3f} ms.", "",
              "| transfer | ours us | plain dist.send us | ratio |", "|---|---|---|---|"]
    for name, (ours, plain) in moved.items():
        lines.append(f"| {name} | {ours * 1e6:.0f} | {plain * 1e6:.0f} | {ours / plain:.2f} |")
    print("\n".join(lines), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8, help="measured steps per repeat")
    parser.add_argument("--repeats", type=int, default=3, help="alternations of torch's and our runs")
    parser.add_argument("--rounds", type=int, default=100, help="round trips per transfer measurement (each "
                        "is repeated --repeats + 2 times, alternating ours and plain; the median is reported)")
    parser.add_argument("--profile", help="rank 0 writes a cProfile summary of our steps to this file")
    args = parser.parse_args()
    run_ranks(__file__, R, worker, args)


if __name__ == "__main__":
    main()
