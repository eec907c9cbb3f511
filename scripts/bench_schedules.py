"""Side-by-side step times of pipeline schedules on synthetic stages that sleep for set costs (R = 4 ranks on
gloo), against torch.distributed.pipelining's ScheduleInterleaved1F1B, with the simulator's predictions.

Usage: python scripts/bench_schedules.py [--quick] [--steps 5] [--markdown FILE]
(starts 4 local processes itself; ``--quick`` runs M = 16 and preprocess 0 and 40 ms only).

Each stage is a module whose forward and backward sleep (``time.sleep`` frees the core, so 4 ranks share 2 CPU
cores honestly): body F = 10 ms and B = 20 ms per chunk, V = 2. The preprocess ``P`` costs ``Pf`` in {0, 10, 20,
40, 80} ms forward per micro-batch, and ``2 Pf`` backward when trainable. Schedules:

- (a) torch ``ScheduleInterleaved1F1B``, ``P`` inside stage 0;
- (b) our interleaved 1F1B (preprocess ``identity``), ``P`` inside stage 0;
- (c) (b) with a balanced layout: the body as 32 layers of 2.5 / 5 ms, stage 0 keeping the number of layers the
  simulator finds fastest (what Megatron-LM users do by hand);
- (d) MPipe Transpose, overflow ``full``; (e) overflow ``min``; (f) frozen ``P`` only: ``full`` with bubble
  filling (placement ``fill``): each transposed forward where the simulator finds its owner idle, the next
  step's computed in this step's idle time (the median step is the steady state); (g) trainable ``P`` only:
  ``full`` with owner-backward (the owners keep ``P``'s graph and run its backward; no recompute on rank 0).

First the runtimes' overheads, measured in the same run: one transfer (ours, with its shape header, against a
fixed-shape send), and each runtime's step and CPU time on stages that do nothing. They give the simulator its
per-runtime costs: the link latency (one transfer) and the dispatch (CPU time per action of the schedule).
Then, for each schedule: the median step time over ``--steps`` steps after 2 warm-up steps, its ratio to (a),
the simulator's prediction and its error, and the limit: the larger of the body's own step time on our runtime
(its fill and drain, no preprocess) and all the work divided by ``R``.
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

R, V, F_MS, B_MS, LAYERS = 4, 2, 10.0, 20.0, 32


class Sleep(torch.autograd.Function):
    """Identity that sleeps ``fwd_s`` in forward and ``bwd_s`` in backward."""

    @staticmethod
    def forward(ctx, x, fwd_s, bwd_s):
        ctx.bwd_s = bwd_s
        if fwd_s:
            time.sleep(fwd_s)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        if ctx.bwd_s:
            time.sleep(ctx.bwd_s)
        return grad, None, None


class SleepModule(nn.Module):
    """``x -> Sleep(x * w)``; a parameter so that the backward runs."""

    def __init__(self, fwd_s, bwd_s):
        super().__init__()
        self.w, self.fwd_s, self.bwd_s = nn.Parameter(torch.ones(1)), fwd_s, bwd_s

    def forward(self, x):
        return Sleep.apply(x * self.w, self.fwd_s, self.bwd_s)


class DictStage(nn.Module):
    """Our executor's stage interface over a :class:`SleepModule`: reads ``x`` (stage 0's raw input), ``feat``
    (``P``'s output) or ``hidden_states``; the last stage returns the loss."""

    def __init__(self, fwd_s, bwd_s, last):
        super().__init__()
        self.body, self.last = SleepModule(fwd_s, bwd_s), last

    def forward(self, inputs):
        x = inputs.get("hidden_states", inputs.get("feat", inputs.get("x")))
        out = self.body(x)
        if self.last:
            return {"loss": out.sum(), "num_tokens": torch.tensor(1)}
        return {"hidden_states": out}


class DictPreprocess(nn.Module):
    def __init__(self, fwd_s, bwd_s):
        super().__init__()
        self.body = SleepModule(fwd_s, bwd_s)

    def forward(self, inputs):
        return {"feat": self.body(inputs["x"])}


def stage_costs(pf, pb, layout=None):
    """Per-stage (forward, backward) seconds with ``P`` inside stage 0; ``layout``: layers per stage."""
    if layout is None:
        fwd, bwd = [F_MS / 1e3] * R * V, [B_MS / 1e3] * R * V
    else:
        per_f, per_b = F_MS * R * V / LAYERS / 1e3, B_MS * R * V / LAYERS / 1e3
        fwd, bwd = [n * per_f for n in layout], [n * per_b for n in layout]
    fwd[0] += pf
    bwd[0] += pb
    return fwd, bwd


def run_ours(cfg, group, rank, fwd, bwd, pre, steps, costs=None, cpu=False):
    """Median step seconds of our executor over ``steps`` steps after 2 warm-up steps."""
    from mpipe_hf.runtime import PipelineExecutor, Preprocess
    stages = {s: DictStage(fwd[s], bwd[s], s == cfg.num_stages - 1) for s in range(rank, cfg.num_stages, R)}
    if cfg.transposed:
        module = DictPreprocess(*pre)
        module.requires_grad_(cfg.trainable)
        preprocess = Preprocess(module, ("x",), ())
    else:
        preprocess = Preprocess(None, (), ("x",))
    params = [p for s in stages.values() for p in s.parameters()]
    if rank == 0 and cfg.trainable:
        params += list(preprocess.module.parameters())
    executor = PipelineExecutor(cfg, rank, stages, preprocess, group, torch.device("cpu"), params,
                                timedelta(seconds=120), costs=costs)
    x = torch.ones(1, 16)

    def load(m):
        return {"x": x}
    # every step also loads the next one's micros (used by placement fill): the median is the steady state
    try:
        return timed(lambda: executor.step(load, load), group, steps, cpu), len(executor.order)
    finally:
        executor.close()  # its groups and threads would otherwise pile up and slow the later runs


def run_torch(group, rank, fwd, bwd, num_micro, steps, cpu=False):
    from torch.distributed.pipelining import PipelineStage, ScheduleInterleaved1F1B
    stages = [PipelineStage(SleepModule(fwd[s], bwd[s]), s, R * V, torch.device("cpu"),
                            group=group)
              for s in range(rank, R * V, R)]
    schedule = ScheduleInterleaved1F1B(stages, num_micro, loss_fn=lambda out, target: out.sum())
    x, target = torch.ones(num_micro, 16), torch.ones(num_micro, 16)

    def step():
        if rank == 0:
            schedule.step(x)
        elif rank == R - 1:
            schedule.step(target=target)
        else:
            schedule.step()
    actions = sum(1 for a in schedule.pipeline_order[rank] if a is not None)
    return timed(step, group, steps, cpu), actions


def timed(step, group, steps, cpu=False):
    """Median wall seconds of ``step`` over ``steps`` steps after 2 warm-up steps; with ``cpu``, also the median
    CPU seconds this process (all its threads) spent in it."""
    times, cpus = [], []
    for i in range(steps + 2):
        dist.barrier(group=group)
        start, start_cpu = time.perf_counter(), time.process_time()
        step()
        used = time.process_time() - start_cpu
        dist.barrier(group=group)
        if i >= 2:
            times.append(time.perf_counter() - start)
            cpus.append(used)
    return (statistics.median(times), statistics.median(cpus)) if cpu else statistics.median(times)


def header_overhead(group, rank, rounds=200):
    """Seconds per transfer rank 0 -> 1: our P2P (length, header, payload) and a plain fixed-shape send."""
    from mpipe_hf.runtime.p2p import P2P
    from mpipe_hf.runtime.watchdog import Watchdog
    store = dist.distributed_c10d._get_default_store()
    watchdog = Watchdog(store, "bench", timedelta(seconds=60), threaded=True)
    watchdog.start_step()
    up = dist.new_group(list(range(R)), backend="gloo")
    down = dist.new_group(list(range(R)), backend="gloo")
    p2p = P2P(up, down, torch.device("cpu"), watchdog)
    payload = {"hidden_states": torch.ones(4, 64)}
    out = []
    for kind in ("ours", "plain"):
        dist.barrier(group=group)
        start = time.perf_counter()
        for _ in range(rounds):
            if kind == "ours":
                if rank == 0:
                    p2p.send(payload, 1, "bench")
                    p2p.recv(1, "bench")
                elif rank == 1:
                    p2p.recv(0, "bench")
                    p2p.send(payload, 0, "bench")
            else:
                buf = payload["hidden_states"]
                if rank == 0:
                    dist.send(buf, 1, group=group)
                    dist.recv(buf, 1, group=group)
                elif rank == 1:
                    dist.recv(buf, 0, group=group)
                    dist.send(buf, 0, group=group)
        p2p.drain()
        value = torch.tensor([(time.perf_counter() - start) / rounds / 2])
        dist.broadcast(value, 0, group=group)
        out.append(float(value))
    watchdog.close()
    for g in (up, down):
        dist.destroy_process_group(g)
    return out


def worker(args):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from mpipe_hf.schedule import ScheduleConfig, build_schedule
    from mpipe_hf.schedule.layout import stage0_layers
    from mpipe_hf.schedule.simulate import Costs, simulate
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    rank, group = dist.get_rank(), dist.group.WORLD
    # the simulator's link latency: one transfer as each runtime does it (ours: shape header, then payload)
    ours_latency, plain_latency = header_overhead(group, rank)
    # and its dispatch: each runtime's CPU time per action (the busiest rank's), on stages that do nothing
    zero, zero_m = [0.0] * R * V, 16
    sim_actions = len(build_schedule(ScheduleConfig(R, V, zero_m, "identity"))[rank])
    torch_zero = run_torch(group, rank, zero, zero, zero_m, args.steps, cpu=True)
    ours_zero = run_ours(ScheduleConfig(R, V, zero_m, "identity"), group, rank, zero, zero, None, args.steps,
                         cpu=True)
    dispatch = torch.tensor([torch_zero[0][1] / sim_actions, ours_zero[0][1] / sim_actions])
    dist.all_reduce(dispatch, op=dist.ReduceOp.MAX, group=group)
    torch_dispatch, ours_dispatch = dispatch.tolist()
    pfs = [0.0, 40.0] if args.quick else [0.0, 10.0, 20.0, 40.0, 80.0]
    micros = [16] if args.quick else [8, 16]
    rows = []
    for num_micro in micros:
        for mode in ("frozen", "trainable"):
            for pf_ms in pfs:
                pf, pb = pf_ms / 1e3, (2 * pf_ms / 1e3 if mode == "trainable" else 0.0)
                costs = dict(latency=ours_latency, dispatch=ours_dispatch)
                torch_costs = dict(latency=plain_latency, dispatch=torch_dispatch)
                body_f, body_b = stage_costs(0.0, 0.0)
                limit_body = simulate(build_schedule(ScheduleConfig(R, V, num_micro, "identity")),
                                      Costs(tuple(body_f), tuple(body_b), **costs)).makespan
                limit = max(limit_body, num_micro * (R * V * (F_MS + B_MS) / 1e3 + pf + pb) / R)
                fwd, bwd = stage_costs(pf, pb)
                identity = ScheduleConfig(R, V, num_micro, "identity")
                results = {}
                measured, _ = run_torch(group, rank, fwd, bwd, num_micro, args.steps)
                results["(a) torch interleaved 1F1B, P in stage 0"] = (measured, simulate(
                    build_schedule(identity), Costs(tuple(fwd), tuple(bwd), **torch_costs)).makespan)
                measured, _ = run_ours(identity, group, rank, fwd, bwd, None, args.steps)
                results["(b) ours interleaved 1F1B, P in stage 0"] = (measured, simulate(
                    build_schedule(identity), Costs(tuple(fwd), tuple(bwd), **costs)).makespan)
                best = min(range(1, LAYERS // (R * V) + 1), key=lambda k: simulate(
                    build_schedule(identity), Costs(*map(tuple, stage_costs(pf, pb, stage0_layers(LAYERS, R * V, k))),
                                                    **costs)).makespan)
                lf, lb = stage_costs(pf, pb, stage0_layers(LAYERS, R * V, best))
                measured, _ = run_ours(identity, group, rank, lf, lb, None, args.steps)
                results[f"(c) balanced layout, stage 0 keeps {best}/{LAYERS // (R * V)} layers"] = (
                    measured, simulate(build_schedule(identity), Costs(tuple(lf), tuple(lb), **costs)).makespan)
                variants = [("(d) MPipe full", "full", "prefix", False), ("(e) MPipe min", "min", "prefix", False)]
                if mode == "frozen":
                    variants.append(("(f) MPipe full, bubble filling", "full", "fill", False))
                else:
                    variants.append(("(g) MPipe full, owner-backward", "full", "prefix", True))
                for tag, overflow, placement, owner_backward in variants:
                    cfg = ScheduleConfig(R, V, num_micro, mode, overflow, owner_backward=owner_backward,
                                         placement=placement)
                    # without owner-backward, rank 0 recomputes P for its backward
                    recompute = pf if mode == "trainable" and not owner_backward else 0.0
                    model = Costs(tuple(body_f), tuple(body_b), pf, pb + recompute, **costs)
                    measured, _ = run_ours(cfg, group, rank, body_f, body_b, (pf, pb), args.steps, model)
                    steady = dict(own=False, ahead=True) if placement == "fill" else {}
                    results[tag] = (measured, simulate(build_schedule(cfg, model, **steady), model).makespan)
                base = results["(a) torch interleaved 1F1B, P in stage 0"][0]
                for name, (measured, predicted) in results.items():
                    rows.append((num_micro, mode, pf_ms, name, measured, measured / base, predicted,
                                 (predicted - measured) / measured, limit, measured / limit))
                if rank == 0:
                    print(f"M={num_micro} {mode} Pf={pf_ms:g} ms done", flush=True)
    if rank == 0:
        report(args, rows, ours_latency, plain_latency, torch_zero, ours_zero, (torch_dispatch, ours_dispatch))
    dist.destroy_process_group()


def report(args, rows, ours_hdr, plain, torch_zero, ours_zero, dispatch):
    lines = [f"R = {R}, V = {V}, body F = {F_MS:g} ms and B = {B_MS:g} ms per chunk, gloo on CPU, median of "
             f"{args.steps} steps after 2 warm-up steps. The simulator's costs for each runtime, measured in this "
             f"run: link latency {ours_hdr * 1e3:.3f} ms for ours (shape header, then payload) and "
             f"{plain * 1e3:.3f} ms for torch's fixed-shape sends; dispatch (CPU time per action) "
             f"{dispatch[1] * 1e3:.3f} ms for ours and {dispatch[0] * 1e3:.3f} ms for torch.", "",
             "| M | P | Pf ms | schedule | step s | vs (a) | predicted s | error | limit s | vs limit |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for m, mode, pf, name, meas, ratio, pred, err, limit, vs_limit in rows:
        lines.append(f"| {m} | {mode} | {pf:g} | {name} | {meas:.3f} | {ratio:.3f} | {pred:.3f} | {err:+.1%} | "
                     f"{limit:.3f} | {vs_limit:.3f} |")
    (t_torch, c_torch), n_torch = torch_zero
    (t_ours, c_ours), n_ours = ours_zero
    lines += ["", "Runtime overheads:", "",
              f"- one transfer of a 4 x 64 fp32 tensor, rank 0 -> 1 and back, halved: ours (shape header, payload) "
              f"{ours_hdr * 1e6:.0f} us, a plain fixed-shape send {plain * 1e6:.0f} us "
              f"(+{(ours_hdr - plain) * 1e6:.0f} us per transfer).",
              f"- stages that do nothing, M = 16, rank 0: torch {t_torch * 1e3:.1f} ms per step ({c_torch * 1e3:.1f} "
              f"ms CPU) over {n_torch} compute actions; ours {t_ours * 1e3:.1f} ms ({c_ours * 1e3:.1f} ms CPU) over "
              f"{n_ours} actions (compute, send and receive). Per compute action (64): torch "
              f"{t_torch / 64 * 1e6:.0f} us, ours {t_ours / 64 * 1e6:.0f} us (ratio {t_ours / t_torch:.2f}). "
              f"Four processes share two cores here, so these steps are bound by CPU, unlike the sleeping ones."]
    text = "\n".join(lines)
    print(text, flush=True)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="M = 16 and Pf in {0, 40} ms only")
    parser.add_argument("--steps", type=int, default=5, help="measured steps per schedule (median)")
    parser.add_argument("--markdown", help="also write the table to this file")
    args = parser.parse_args()
    if "RANK" in os.environ:
        worker(args)
        return
    from torch.distributed.run import main as torchrun
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torchrun(["--standalone", f"--nproc_per_node={R}", os.path.abspath(__file__), *sys.argv[1:]])


if __name__ == "__main__":
    main()
