"""Load-aware owners against ``m % NT`` on sleeping stages: R = 4 ranks on gloo, V = 2, body
F = 10 ms and B = 20 ms per chunk, a preprocess ``P`` whose cost follows each micro-batch's image tokens.

Usage: python scripts/bench/bench_owners.py [--steps 5] [--micro 8 16] [--pattern ragged interleaved]
[--tower frozen trainable] [--seed 0] [--markdown FILE] [--verbose]
(starts 4 local processes itself through torch.distributed.run).

Each step's micro-batches hold 1 to 16 images each, every image of a size drawn from 224 to 896 px a side (fixed
seed; ``--pattern interleaved``: four sources read round-robin, every fourth micro a multi-image document, the case
where ``m % NT`` puts every heavy micro on one owner); an image takes ``(h / 28) * (w / 28)`` tokens (Qwen2.5-VL: 14
px patches, 2 x 2 merged). ``P`` sleeps for its micro's image tokens times one scale, chosen so that the heaviest
micro of the whole draw costs 40 ms. The owners are ``m % NT`` (``modulo``) or
:func:`~mpipe_hf.schedule.owners.step_owners` ``"balanced"`` (LPT over the step's image tokens), computed on every
rank from the same draw; all run in the same process group, over the same steps, with placement ``prefix`` and with
placement ``fill`` (each step loads and preprocesses the next step's micros in its idle time, the steady state),
where ``balanced+headroom`` also counts each owner's idle end of the step
(:func:`~mpipe_hf.schedule.owners.fill_headroom`) as room for ``P``. A ``trainable`` tower (``--tower``) sleeps
twice its forward in its backward and runs with owner-backward and zero-bubble (placement ``prefix``): each owner
then also runs its micros' ``P`` backward, so the owners' loads weigh three times as much in the step.

The policies of one placement take turns step by step, each with its own executor. Reported: the median step
time over ``--steps`` steps after 2 warm-up steps, the ratio of ``modulo`` to
each policy, the simulator's prediction for the same schedules (the median over the same steps, with each micro's
own ``P`` cost, the link latency of a gloo ping-pong and the runtime's dispatch per action measured here), the
mean over the steps of the largest owner load (sum of ``P`` over an owner's micros), and, simulated only, the
bound no owners can pass: the same schedule with ``P`` free (``P free (bound)``).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sleeping import Sleep, print_report, run_ranks  # noqa: E402

R, V, F_MS, B_MS, P_MAX_MS = 4, 2, 10.0, 20.0, 40.0
SIDES = (224, 336, 448, 560, 672, 784, 896)  # image sides, px
TOKEN_PX = 28  # px per image token a side: 14 px patches, 2 x 2 merged


class SleepStage(nn.Module):
    """A body stage in the executor's interface: reads ``hidden_states`` (or ``P``'s ``feat`` on stage 0),
    sleeps, and on the last stage returns the loss."""

    def __init__(self, last: bool):
        super().__init__()
        self.w, self.last = nn.Parameter(torch.ones(1)), last

    def forward(self, inputs):
        x = inputs.get("hidden_states", inputs.get("feat"))
        out = Sleep.apply(x * self.w, F_MS / 1e3, B_MS / 1e3)
        if self.last:
            return {"loss": out.sum(), "num_tokens": torch.tensor(1)}
        return {"hidden_states": out}


class SleepTower(nn.Module):
    """``P``: sleeps the micro's ``cost_s`` (seconds, a 0-d tensor in its raw inputs) in forward, and twice that
    in backward when its weight trains."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))

    def forward(self, inputs):
        cost = float(inputs["cost_s"])
        return {"feat": Sleep.apply(inputs["x"] * self.w, cost, 2 * cost)}


def draw_tokens(seed: int, steps: int, num_micro: int, pattern: str = "ragged") -> list[list[int]]:
    """Image tokens of every micro of ``steps`` steps. ``ragged``: 1 to 16 images a micro, each side from
    ``SIDES``. ``interleaved``: four sources read round-robin (``datasets.interleave_datasets``' default order),
    one of multi-image documents (12 to 16 images of 448 to 896 px), three of captioned photos (1 or 2 images of
    224 or 336 px), so every fourth micro is heavy."""
    rng = random.Random(seed)

    def micro(m):
        if pattern == "ragged":
            sides, count = SIDES, rng.randint(1, 16)
        elif m % 4 == 0:
            sides, count = SIDES[2:], rng.randint(12, 16)
        else:
            sides, count = SIDES[:2], rng.randint(1, 2)
        return sum((rng.choice(sides) // TOKEN_PX) * (rng.choice(sides) // TOKEN_PX) for _ in range(count))
    return [[micro(m) for m in range(num_micro)] for _ in range(steps)]


def executed_orders(cfg, own, ahead, costs, cache):
    """Every rank's orders as :class:`~mpipe_hf.runtime.PipelineExecutor` runs them for ``cfg``: a relabelled base
    schedule where :func:`~mpipe_hf.schedule.owners.reassign` applies, else a build; bases cached in ``cache``."""
    from mpipe_hf.schedule import build_schedule
    from mpipe_hf.schedule.owners import reassign, relabel
    fast = reassign(cfg, own, ahead)
    key = (fast[0] if fast else cfg, own, ahead)
    if key not in cache:
        cache[key] = build_schedule(key[0], costs, own, ahead)
    return {r: relabel(a, fast[1]) for r, a in cache[key].items()} if fast else cache[key]


def run_policies(cfg, policies, tokens, scale, steps, group, rank, costs, verbose=False):
    """``{name: median step seconds}`` of each owner policy (``policies[name][k]``: step ``k``'s owners) over
    ``steps`` steps after 2 warm-up steps. One executor per policy, all alive at once, stepped in turn (step ``k``
    of each, then step ``k + 1``), so a load that comes and goes on the machine meets every policy alike.
    ``verbose``: rank 0 prints every step's seconds."""
    from mpipe_hf.runtime import PipelineExecutor, Preprocess
    from mpipe_hf.schedule.owners import with_owners
    fill, x = cfg.placement == "fill", torch.ones(1, 16)
    executors = {}
    for name in policies:
        stages = {s: SleepStage(s == cfg.num_stages - 1) for s in range(rank, cfg.num_stages, R)}
        tower = SleepTower().requires_grad_(cfg.trains_preprocess)
        params = [p for s in stages.values() for p in s.parameters()]
        params += list(tower.parameters()) if rank == 0 and cfg.trains_preprocess else []
        executors[name] = PipelineExecutor(cfg, rank, stages, Preprocess(tower, ("x", "cost_s"), ()), group,
                                           torch.device("cpu"), params, timedelta(seconds=300), costs=costs)

    def loader(k):
        return lambda m: {"x": x, "cost_s": torch.tensor(tokens[k][m] * scale)}
    if cfg.owner_backward:  # built before the timed steps: owner-backward relabels no schedule (reassign), so
        for name, owners in policies.items():  # every new owners' schedule is a build (0.5 s at M = 16)
            for k in range(steps + 2):
                executors[name]._order(cfg=with_owners(cfg, owners[k]))
    times = {name: [] for name in policies}
    try:
        for k in range(steps + 2):
            for name, owners in policies.items():
                dist.barrier(group=group)
                start = time.perf_counter()
                executors[name].step(loader(k), loader(k + 1) if fill else None, owners=owners[k],
                                     next_owners=owners[k + 1] if fill else None)
                dist.barrier(group=group)
                if k >= 2:
                    times[name].append(time.perf_counter() - start)
                if verbose and rank == 0:
                    print(f"  {cfg.placement} {name} step {k}: {time.perf_counter() - start:.3f} s", flush=True)
    finally:
        for executor in executors.values():
            executor.close()
    return {name: statistics.median(t) for name, t in times.items()}


def calibrate(group, rank, steps):
    """``(latency s, dispatch s per action)``: half a gloo ping-pong of a small tensor rank 0 <-> 1, and our
    runtime's CPU time per action on stages that do nothing (the busiest rank's), as bench_schedules.py does."""
    from mpipe_hf.runtime import PipelineExecutor, Preprocess
    from mpipe_hf.schedule import ScheduleConfig
    buf, rounds = torch.ones(16), 200
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(rounds):
        if rank == 0:
            dist.send(buf, 1, group=group)
            dist.recv(buf, 1, group=group)
        elif rank == 1:
            dist.recv(buf, 0, group=group)
            dist.send(buf, 0, group=group)
    latency = torch.tensor([(time.perf_counter() - start) / rounds / 2])
    dist.broadcast(latency, 0, group=group)

    class Nothing(nn.Module):
        def __init__(self, last):
            super().__init__()
            self.w, self.last = nn.Parameter(torch.ones(1)), last

        def forward(self, inputs):
            out = inputs.get("hidden_states", inputs.get("x")) * self.w
            return {"loss": out.sum(), "num_tokens": torch.tensor(1)} if self.last else {"hidden_states": out}
    cfg = ScheduleConfig(R, V, 16, "identity")
    stages = {s: Nothing(s == cfg.num_stages - 1) for s in range(rank, cfg.num_stages, R)}
    executor = PipelineExecutor(cfg, rank, stages, Preprocess(None, (), ("x",)), group, torch.device("cpu"),
                                [p for s in stages.values() for p in s.parameters()], timedelta(seconds=120))
    x, cpus = torch.ones(1, 16), []
    try:
        for k in range(steps + 2):
            dist.barrier(group=group)
            begin = time.process_time()
            executor.step(lambda m: {"x": x})
            if k >= 2:
                cpus.append(time.process_time() - begin)
        actions = len(executor.order)
    finally:
        executor.close()
    dispatch = torch.tensor([statistics.median(cpus) / actions])
    dist.all_reduce(dispatch, op=dist.ReduceOp.MAX, group=group)
    return float(latency), float(dispatch)


def worker(args):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from mpipe_hf.schedule import ScheduleConfig, simulate
    from mpipe_hf.schedule.owners import MicroCosts, fill_headroom, owner_loads, step_owners, with_owners
    from mpipe_hf.schedule.simulate import Costs
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    rank, group = dist.get_rank(), dist.group.WORLD
    latency, dispatch = calibrate(group, rank, args.steps)
    rows = []
    for tower, pattern, num_micro in [(t, p, m) for t in args.tower for p in args.pattern for m in args.micro]:
        tokens = draw_tokens(args.seed + num_micro, args.steps + 3, num_micro, pattern)
        scale = P_MAX_MS / 1e3 / max(max(t) for t in tokens)  # seconds per image token
        mean_p = scale * sum(map(sum, tokens)) / sum(map(len, tokens))
        back = 2.0 if tower == "trainable" else 0.0  # P's backward over its forward
        # what fill and the weight placement place by
        body = Costs(F_MS / 1e3, B_MS / 1e3, mean_p, back * mean_p, latency=latency, dispatch=dispatch)
        for placement in (("prefix", "fill") if tower == "frozen" else ("prefix",)):
            trained = dict(owner_backward=True, zero_bubble=True) if tower == "trainable" else {}
            cfg = ScheduleConfig(R, V, num_micro, tower, placement=placement, **trained)
            fill, cache, measured = placement == "fill", {}, {}
            policies = {"modulo": [None] * len(tokens),
                        "balanced": [step_owners("balanced", t, cfg) for t in tokens]}
            if fill:  # each owner's idle end of the step, in image tokens
                room = [h / scale for h in fill_headroom(cfg, body)]
                policies["balanced+headroom"] = [step_owners("balanced", t, cfg, room) for t in tokens]
            steps_s = run_policies(cfg, policies, tokens, scale, args.steps, group, rank, body, args.verbose)
            for policy, owners in policies.items():
                step_s, predicted, largest = steps_s[policy], [], []
                for k in range(2, args.steps + 2):
                    step_cfg = with_owners(cfg, owners[k], owners[k + 1] if fill else None)
                    p = [c * scale for c in tokens[k] + (tokens[k + 1] if fill else [])]
                    if rank == 0:  # only rank 0 reports: the others do not rebuild the schedules
                        orders = executed_orders(step_cfg, not fill, fill, body, cache)
                        predicted.append(simulate(orders, MicroCosts.of(body, p, [back * c for c in p])).makespan)
                    else:
                        predicted.append(step_s)
                    # the P work of the step: this step's micros (prefix) or the next step's (fill)
                    j = k + 1 if fill else k
                    mine = owners[j] if owners[j] is not None else tuple(m % cfg.num_owners
                                                                          for m in range(num_micro))
                    largest.append(max(owner_loads(tokens[j], mine, cfg.num_owners)) * scale)
                measured[policy] = (step_s, statistics.median(predicted), statistics.mean(largest))
            for policy, (step_s, pred, load) in measured.items():
                rows.append((tower, pattern, num_micro, placement, policy, step_s, measured["modulo"][0] / step_s,
                             pred, (pred - step_s) / step_s, measured["modulo"][1] / pred, load * (1 + back)))
            if rank == 0:  # the bound of any owners: P free, the same schedule
                free = MicroCosts.of(body, [0.0] * 2 * num_micro, [0.0] * 2 * num_micro)
                pred = simulate(executed_orders(cfg, not fill, fill, body, cache), free).makespan
                rows.append((tower, pattern, num_micro, placement, "P free (bound)", None, None, pred, None,
                             measured["modulo"][1] / pred, 0.0))
            if rank == 0:
                print(f"{tower} {pattern} M={num_micro} {placement} done", flush=True)
    if rank == 0:
        report(args, rows, latency, dispatch)
    dist.destroy_process_group()


def report(args, rows, latency, dispatch):
    lines = [f"R = {R}, V = {V}, body F = {F_MS:g} ms and B = {B_MS:g} ms per chunk, P proportional to each "
             f"micro's image tokens (1 to 16 images a micro, sides {SIDES[0]}-{SIDES[-1]} px, seed {args.seed} + M; "
             f"heaviest micro {P_MAX_MS:g} ms forward; a trainable P twice that backward, with owner-backward and "
             f"zero-bubble), gloo on CPU, median of {args.steps} steps after 2 warm-up steps. Simulator: latency "
             f"{latency * 1e3:.3f} ms (gloo ping-pong), dispatch {dispatch * 1e3:.3f} ms per action (measured here). "
             f"\"largest owner P ms\": the busiest owner's P work of the step, forward and backward.", "",
             "| P | data | M | placement | owners | step s | modulo / this | predicted s | error | predicted "
             "modulo / this | largest owner P ms |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for tower, pattern, m, placement, policy, step_s, ratio, pred, err, pred_ratio, load in rows:
        head = f"| {tower} | {pattern} | {m} | {placement} | {policy} |"
        if step_s is None:  # simulated only
            lines.append(f"{head} - | - | {pred:.3f} | - | {pred_ratio:.3f} | - |")
            continue
        lines.append(f"{head} {step_s:.3f} | {ratio:.3f} | {pred:.3f} | {err:+.1%} | {pred_ratio:.3f} | "
                     f"{load * 1e3:.1f} |")
    print_report("\n".join(lines), args.markdown)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="measured steps per run (median)")
    parser.add_argument("--micro", type=int, nargs="+", default=[8, 16], help="micro-batches per step")
    parser.add_argument("--seed", type=int, default=0, help="the draw's seed (plus M)")
    parser.add_argument("--pattern", nargs="+", default=["ragged", "interleaved"], choices=["ragged", "interleaved"],
                        help="the image-count distributions (see draw_tokens)")
    parser.add_argument("--tower", nargs="+", default=["frozen", "trainable"], choices=["frozen", "trainable"],
                        help="P frozen, or trainable (with owner-backward and zero-bubble)")
    parser.add_argument("--markdown", help="also write the table to this file")
    parser.add_argument("--verbose", action="store_true", help="print every step's time")
    args = parser.parse_args()
    run_ranks(__file__, R, worker, args)


if __name__ == "__main__":
    main()
