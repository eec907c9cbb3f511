"""Side-by-side step times of pipeline schedules on synthetic stages that sleep for set costs (R = 4 ranks on
gloo): ours and MPipe Transpose against the strongest torch.distributed.pipelining schedules, each row beside the
simulator's prediction, the best torch row and a lower bound.

Usage: python scripts/bench_schedules.py [--quick] [--steps 5] [--markdown FILE]
(starts 4 local processes itself; ``--quick`` runs M = 16 and preprocess 0 and 40 ms only).

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

The preprocess ``P`` costs ``Pf`` in {0, 10, 20, 40, 80} ms forward per micro-batch, and ``Pb = 2 Pf`` backward
when trainable. ``P``'s backward is weight work: it ends in ``P``'s weights and ``P``'s input is raw data, so no
stage waits for it. Inside stage 0 it is added to the weight node's sleep; transposed, ``P`` is a sleeping module
of its own whose backward is all weight path. A frozen ``P`` has no backward. Schedules:

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
  ``r`` and ``2R-1-r``, so rank 0 holds the first and the last).

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
  torch's orders with torch's placement of stage 0's backward), and (2) the work a perfect schedule must do
  divided by ``R``: ``M (S (F + B) + Pf + Pb) / R``, without rank 0's recompute of ``P``. A row's step is never
  shorter than its own order run with costs no larger than its own and no overhead (sleeps only oversleep), so
  never shorter than the ideal limit.

After the table, per point (``M``, ``P`` mode, ``Pf``): the best torch row, the best MPipe row ((d) to (h)), the
speed-up (best torch step / best MPipe step: above 1, MPipe is faster) and the best MPipe step / ideal limit.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sleeping import Sleep, print_report, run_ranks  # noqa: E402

R, V, F_MS, B_MS, LAYERS = 4, 2, 10.0, 20.0, 32
TORCH_TIMEOUT = timedelta(seconds=60)  # a torch run's process group: how long a rank waits on a failed one
TORCH_KINDS = {"1f1b": "ScheduleInterleaved1F1B", "zb": "ScheduleInterleavedZeroBubble",
               "zbv": "ScheduleZBVZeroBubble"}
MPIPE_TAGS = ("(d)", "(e)", "(f)", "(g)", "(h)")


class SleepModule(nn.Module):
    """``x -> Sleep(x) * Sleep(w)``: forward sleeps ``fwd_s``; backward sleeps ``bwd_in_s`` on the input path (the
    input gradient) and ``bwd_w_s`` on the weight path (the weight gradient), two nodes that a split backward can
    run apart. An input that needs no gradient (the raw data) is first multiplied by ``w``, so the input path then
    leads to the weight too: the whole backward is weight work, as a first layer's is."""

    def __init__(self, fwd_s, bwd_in_s, bwd_w_s):
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))
        self.fwd_s, self.bwd_in_s, self.bwd_w_s = fwd_s, bwd_in_s, bwd_w_s

    def forward(self, x):
        if not x.requires_grad:
            x = x * self.w
        return Sleep.apply(x, self.fwd_s, self.bwd_in_s) * Sleep.apply(self.w, 0.0, self.bwd_w_s)


class DictStage(nn.Module):
    """Our executor's stage interface over a :class:`SleepModule`: reads ``x`` (stage 0's raw input), ``feat``
    (``P``'s output) or ``hidden_states``; the last stage returns the loss."""

    def __init__(self, fwd_s, bwd_in_s, bwd_w_s, last):
        super().__init__()
        self.body, self.last = SleepModule(fwd_s, bwd_in_s, bwd_w_s), last

    def forward(self, inputs):
        x = inputs.get("hidden_states", inputs.get("feat", inputs.get("x")))
        out = self.body(x)
        if self.last:
            return {"loss": out.sum(), "num_tokens": torch.tensor(1)}
        return {"hidden_states": out}


class DictPreprocess(nn.Module):
    """The transposed ``P``: ``x -> feat``, sleeping ``fwd_s`` forward and ``bwd_s`` backward (weight work)."""

    def __init__(self, fwd_s, bwd_s):
        super().__init__()
        self.body = SleepModule(fwd_s, 0.0, bwd_s)

    def forward(self, inputs):
        return {"feat": self.body(inputs["x"])}


@dataclasses.dataclass(frozen=True)
class StageCosts:
    """Seconds per stage: forward, and the backward's input-gradient and weight-gradient parts."""

    fwd: tuple[float, ...]
    bwd_in: tuple[float, ...]
    bwd_w: tuple[float, ...]

    @property
    def bwd(self) -> tuple[float, ...]:
        """The whole backward of each stage."""
        return tuple(i + w for i, w in zip(self.bwd_in, self.bwd_w))


def stage_costs(pf, pb, layout=None):
    """:class:`StageCosts` with ``P`` inside stage 0 (``pf`` forward, ``pb`` backward, on the weight path);
    ``layout``: layers per stage (even stages when ``None``). The body backward splits in halves."""
    if layout is None:
        fwd, bwd = [F_MS / 1e3] * R * V, [B_MS / 1e3] * R * V
    else:
        per_f, per_b = F_MS * R * V / LAYERS / 1e3, B_MS * R * V / LAYERS / 1e3
        fwd, bwd = [n * per_f for n in layout], [n * per_b for n in layout]
    fwd[0] += pf
    bwd_w = [b / 2 for b in bwd]
    bwd_w[0] += pb
    return StageCosts(tuple(fwd), tuple(b / 2 for b in bwd), tuple(bwd_w))


def zero_bubble_supported():
    """Whether this ``mpipe_hf`` has ``ScheduleConfig.zero_bubble`` and ``Costs.weight``."""
    from mpipe_hf.schedule import Costs, ScheduleConfig
    return ("zero_bubble" in {f.name for f in dataclasses.fields(ScheduleConfig)}
            and "weight" in {f.name for f in dataclasses.fields(Costs)})


def sim_costs(sc, pf=0.0, pb=0.0, **runtime):
    """The simulator's ``Costs`` for stages ``sc`` and a transposed ``P`` (``pf`` forward, ``pb`` backward);
    ``runtime``: ``latency`` and ``dispatch`` (none: no overhead). ``weight`` is ``sc.bwd_w`` where supported."""
    from mpipe_hf.schedule import Costs
    weight = {"weight": sc.bwd_w} if zero_bubble_supported() else {}
    return Costs(sc.fwd, sc.bwd, pf, pb, **runtime, **weight)


def check_split(b_in=0.02, b_w=0.03):
    """Time :class:`SleepModule`'s backward with torch's split (one process): seconds of the input part
    (``stage_backward_input``), of the weight part (``stage_backward_weight``), and of a whole first-stage
    backward (``stage_backward``, input without gradient), the fastest of 3 tries; expected about ``b_in``, ``b_w``
    and ``b_in + b_w``."""
    from torch.distributed.pipelining._backward import stage_backward, stage_backward_input, stage_backward_weight
    module, x, raw = SleepModule(0.0, b_in, b_w), torch.ones(1, 16, requires_grad=True), torch.ones(1, 16)
    parts = []
    for _ in range(3):  # the fastest of 3: the first call also warms autograd up
        out = module(x)
        start = time.perf_counter()
        _, groups = stage_backward_input([out], [torch.ones_like(out)], [x], module.parameters())
        middle = time.perf_counter()
        stage_backward_weight(module.parameters(), groups)
        end = time.perf_counter()
        out = module(raw)
        first = time.perf_counter()
        stage_backward([out], [torch.ones_like(out)], [raw])
        parts.append((middle - start, end - middle, time.perf_counter() - first))
    return tuple(min(p[i] for p in parts) for i in range(3))


def run_ours(cfg, rank, sc, pre, steps, costs=None, cpu=False):
    """Median step seconds of our executor (over ``steps`` steps after 2 warm-up steps) and this rank's action
    count; ``sc``: the stages' :class:`StageCosts`, ``pre``: the transposed ``P``'s (forward, backward)."""
    from mpipe_hf.runtime import PipelineExecutor, Preprocess
    group = dist.group.WORLD
    stages = {s: DictStage(sc.fwd[s], sc.bwd_in[s], sc.bwd_w[s], s == cfg.num_stages - 1)
              for s in range(rank, cfg.num_stages, R)}
    if cfg.transposed:
        module = DictPreprocess(*pre)
        module.requires_grad_(cfg.trains_preprocess)
        preprocess = Preprocess(module, ("x",), ())
    else:
        preprocess = Preprocess(None, (), ("x",))
    params = [p for s in stages.values() for p in s.parameters()]
    if rank == 0 and cfg.trains_preprocess:
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


def run_torch(kind, rank, sc, num_micro, steps, cpu=False):
    """One torch schedule (``kind`` of :data:`TORCH_KINDS`) on torch's runtime over ``sc``'s sleeping stages.

    Returns:
        the median step seconds (with ``cpu``: and the median CPU seconds), this rank's compute-action count, and
        the schedule's compute order of every rank (``pipeline_order``).
    """
    from torch.distributed import pipelining
    group = dist.new_group(list(range(R)), backend="gloo", timeout=TORCH_TIMEOUT)
    try:
        placed = [rank, 2 * R - 1 - rank] if kind == "zbv" else range(rank, R * V, R)
        stages = [pipelining.PipelineStage(SleepModule(sc.fwd[s], sc.bwd_in[s], sc.bwd_w[s]), s, R * V,
                                           torch.device("cpu"), group=group) for s in placed]
        schedule = getattr(pipelining, TORCH_KINDS[kind])(stages, num_micro, loss_fn=lambda out, target: out.sum())
        x, target = torch.ones(num_micro, 16), torch.ones(num_micro, 16)
        first, last = any(s.is_first for s in stages), any(s.is_last for s in stages)

        def step():
            schedule.step(*([x] if first else []), target=target if last else None)
        actions = sum(1 for a in schedule.pipeline_order[rank] if a is not None)
        return timed(step, group, steps, cpu), actions, schedule.pipeline_order
    finally:
        dist.destroy_process_group(group)  # a peer still waiting on this rank then fails at once


def torch_makespan(orders, sc):
    """Step seconds of torch's compute order ``orders`` (``{rank: [_Action or None]}``) over ``sc`` with no
    overhead: each action starts when its rank is free and its input has been computed. Torch's costs: ``F``,
    ``B`` (whole backward), ``I`` (``B_in``; nothing on stage 0, whose input needs no gradient) and ``W`` (``B_w``;
    stage 0's whole backward)."""
    last = len(sc.fwd) - 1

    def cost(kind, s):
        if kind == "F":
            return sc.fwd[s]
        if kind == "B":
            return sc.bwd[s]
        if kind == "I":
            return 0.0 if s == 0 else sc.bwd_in[s]
        return sc.bwd[s] if s == 0 else sc.bwd_w[s]
    queues = {r: [(a.computation_type.value, a.stage_index, a.microbatch_index) for a in actions if a is not None]
              for r, actions in orders.items()}
    clock, pc, done = {r: 0.0 for r in queues}, {r: 0 for r in queues}, {}
    while any(pc[r] < len(q) for r, q in queues.items()):
        moved = False
        for r, queue in queues.items():
            while pc[r] < len(queue):
                kind, s, m = queue[pc[r]]
                if kind == "F":
                    need = ("F", s - 1, m) if s > 0 else None
                else:
                    need = ("G", s + 1, m) if kind in "BI" and s < last else None
                if need is not None and need not in done:
                    break
                clock[r] = max(clock[r], done.get(need, 0.0)) + cost(kind, s)
                if kind in "FBI":
                    done[("F" if kind == "F" else "G", s, m)] = clock[r]
                pc[r] += 1
                moved = True
        if not moved:
            raise RuntimeError("torch's compute order cannot finish")
    return max(clock.values())


def first_line(error):
    """``Type: first line`` of an exception (and of its cause, when it has one)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = f"{type(error).__name__}: {lines[0] if lines else ''}"
    if error.__cause__ is not None:
        text += f" (from {first_line(error.__cause__)})"
    return text


def lockstep(run):
    """Run ``run()`` on every rank; every rank comes back with ``(its result, None)`` when it succeeded on all of
    them, else ``(None, the earliest failure over the ranks as "Type: first line")``."""
    try:
        result, failure = run(), None
    except Exception as error:  # the row reports it; the ranks must stay in step
        result, failure = None, (time.time(), first_line(error))
    failures = [None] * dist.get_world_size()
    dist.all_gather_object(failures, failure)
    failures = [f for f in failures if f is not None]
    return (None, min(failures)[1]) if failures else (result, None)


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
    """Seconds per transfer of a 4 x 64 fp32 tensor rank 0 -> 1 (a round trip, halved): ``[ours, plain]``, our
    P2P (a 4 KiB first message with the shape header and, when it fits, the payload) and a plain fixed-shape
    send, as ``scripts/bench_runtime.py`` measures them."""
    from bench_runtime import SIZES, transfers
    return list(transfers(group, rank, rounds, repeats=1)[next(iter(SIZES))])


@dataclasses.dataclass
class Row:
    """One schedule at one point: its measured step (``None`` when it failed: ``error``), its prediction, and its
    own order's step with no overhead and no preprocess (``bound``), all in seconds."""

    point: tuple[int, str, float]
    name: str
    family: str  # "torch", "ours" or "mpipe"
    measured: float | None = None
    predicted: float | None = None
    bound: float | None = None
    error: str | None = None


def point_rows(args, rank, num_micro, mode, pf_ms, ours_rt, torch_rt):
    """Run every schedule of one point (``M``, ``P`` mode, ``Pf``) on every rank; returns its :class:`Row` list,
    its our-runtime limit, its ideal limit and notes. The measurements, predictions and limits are rank 0's (the
    rank that reports)."""
    from mpipe_hf.schedule import ScheduleConfig, build_schedule
    from mpipe_hf.schedule.layout import stage0_layers
    from mpipe_hf.schedule.simulate import simulate
    point, steps, notes = (num_micro, mode, pf_ms), args.steps, []
    pf, pb = pf_ms / 1e3, (2 * pf_ms / 1e3 if mode == "trainable" else 0.0)
    body = stage_costs(0.0, 0.0)
    identity = ScheduleConfig(R, V, num_micro, "identity")
    work = num_micro * (R * V * (F_MS + B_MS) / 1e3 + pf + pb) / R
    our_limit = max(simulate(build_schedule(identity), sim_costs(body, 0.0, 0.0, **ours_rt)).makespan, work)
    inside = stage_costs(pf, pb)
    keep = LAYERS // (R * V)
    best = min(range(1, keep + 1), key=lambda k: simulate(build_schedule(identity), sim_costs(
        stage_costs(pf, pb, stage0_layers(LAYERS, R * V, k)), **ours_rt)).makespan)
    layout = stage0_layers(LAYERS, R * V, best)
    rebalanced, rebalanced_body = stage_costs(pf, pb, layout), stage_costs(0.0, 0.0, layout)
    rows = []

    def ours(name, family, fields, sc, bare, pre=None, model=None, executor_costs=None):
        """A row of our executor: ``fields`` its ``ScheduleConfig`` beyond ``R, V, M``, ``sc`` its stages, ``bare``
        them without ``P``, ``model`` the prediction's costs (with ``P``'s), ``executor_costs`` what the executor
        places by."""
        row = Row(point, name, family)
        rows.append(row)
        try:  # validation only: the same on every rank, so all raise alike
            cfg = ScheduleConfig(R, V, num_micro, **fields)
        except ValueError as error:
            row.error = first_line(error)
            return
        row.measured, row.error = lockstep(lambda: run_ours(cfg, rank, sc, pre, steps, executor_costs)[0])
        if rank == 0 and row.measured is not None:  # after the run: building a filled schedule takes seconds
            orders = build_schedule(cfg, model, **(dict(own=False, ahead=True) if cfg.placement == "fill" else {}))
            row.predicted = simulate(orders, model).makespan
            row.bound = simulate(orders, sim_costs(bare)).makespan

    def torch_row(name, kind, sc, bare):
        """A row of torch's runtime: ``sc`` its stages, ``bare`` them without ``P``."""
        row = Row(point, name, "torch")
        rows.append(row)
        result, row.error = lockstep(lambda: run_torch(kind, rank, sc, num_micro, steps))
        if rank == 0 and result is not None:
            row.measured, _, order = result
            row.bound = torch_makespan(order, bare)
            if kind == "1f1b":  # torch's order is ours (mpipe_hf.schedule.interleaved)
                row.predicted = simulate(build_schedule(identity), sim_costs(sc, **torch_rt)).makespan

    torch_row("(a) torch interleaved 1F1B, P in stage 0", "1f1b", inside, body)
    plain = dict(preprocess="identity")
    ours("(b) ours interleaved 1F1B, P in stage 0", "ours", plain, inside, body, model=sim_costs(inside, **ours_rt))
    ours(f"(c) balanced layout, stage 0 keeps {best}/{keep} layers", "ours", plain, rebalanced, rebalanced_body,
         model=sim_costs(rebalanced, **ours_rt))
    variants = [("(d) MPipe full", dict(overflow="full")), ("(e) MPipe min", dict(overflow="min"))]
    variants.append(("(f) MPipe full, bubble filling", dict(placement="fill")) if mode == "frozen" else
                    ("(g) MPipe full, owner-backward", dict(owner_backward=True)))
    zero_bubble = zero_bubble_supported()
    if zero_bubble:
        variants.append((f"(h) {variants[-1][0][4:]} + zero-bubble", dict(variants[-1][1], zero_bubble=True)))
    for name, fields in variants:
        # without owner-backward, rank 0 recomputes P for its backward
        recompute = pf if mode == "trainable" and not fields.get("owner_backward") else 0.0
        model = sim_costs(body, pf, pb + recompute, **ours_rt)
        ours(name, "mpipe", dict(fields, preprocess=mode), body, body, (pf, pb), model, model)
    if zero_bubble:
        model = sim_costs(inside, **ours_rt)
        ours("(i) ours interleaved 1F1B zero-bubble, P in stage 0", "ours", dict(plain, zero_bubble=True), inside,
             body, model=model, executor_costs=model)
    else:
        notes.append("(h) and (i) skipped: this mpipe_hf has no ScheduleConfig.zero_bubble (or no Costs.weight).")
    torch_row(f"(j) torch interleaved 1F1B, stage 0 keeps {best}/{keep} layers", "1f1b", rebalanced,
              rebalanced_body)
    torch_row("(k) torch interleaved zero-bubble, P in stage 0", "zb", inside, body)
    torch_row(f"(l) torch interleaved zero-bubble, stage 0 keeps {best}/{keep} layers", "zb", rebalanced,
              rebalanced_body)
    torch_row("(m) torch ZBV zero-bubble, P in stage 0", "zbv", inside, body)
    bounds = [row.bound for row in rows if row.measured is not None and row.bound is not None]
    ideal = max(min(bounds), work) if bounds else work
    return rows, our_limit, ideal, notes


def worker(args):
    """One rank of the benchmark: measure the overheads, run every point, and (rank 0) report."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from mpipe_hf.schedule import ScheduleConfig, build_schedule
    started = time.perf_counter()
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    rank = dist.get_rank()
    split = check_split() if rank == 0 else None
    # the simulator's link latency: one transfer as each runtime does it (ours: the shape header and the payload)
    ours_latency, plain_latency = header_overhead(dist.group.WORLD, rank)
    # and its dispatch: each runtime's CPU time per action (the busiest rank's), on stages that do nothing
    zero_m = 16
    zero = StageCosts(*[(0.0,) * R * V] * 3)
    sim_actions = len(build_schedule(ScheduleConfig(R, V, zero_m, "identity"))[rank])
    torch_zero = run_torch("1f1b", rank, zero, zero_m, args.steps, cpu=True)[:2]
    ours_zero = run_ours(ScheduleConfig(R, V, zero_m, "identity"), rank, zero, None, args.steps, cpu=True)
    dispatch = torch.tensor([torch_zero[0][1] / sim_actions, ours_zero[0][1] / sim_actions])
    dist.all_reduce(dispatch, op=dist.ReduceOp.MAX)
    torch_dispatch, ours_dispatch = dispatch.tolist()
    ours_rt = dict(latency=ours_latency, dispatch=ours_dispatch)
    torch_rt = dict(latency=plain_latency, dispatch=torch_dispatch)
    pfs = [0.0, 40.0] if args.quick else [0.0, 10.0, 20.0, 40.0, 80.0]
    micros = [16] if args.quick else [8, 16]
    points, notes = [], []
    for num_micro in micros:
        for mode in ("frozen", "trainable"):
            for pf_ms in pfs:
                rows, our_limit, ideal, point_notes = point_rows(args, rank, num_micro, mode, pf_ms, ours_rt,
                                                                 torch_rt)
                points.append((rows, our_limit, ideal))
                notes += [n for n in point_notes if n not in notes]
                if rank == 0:
                    print(f"M={num_micro} {mode} Pf={pf_ms:g} ms done ({time.perf_counter() - started:.0f} s)",
                          flush=True)
    if rank == 0:
        report(args, points, notes, ours_latency, plain_latency, torch_zero, ours_zero,
               (torch_dispatch, ours_dispatch), split, time.perf_counter() - started)
    dist.destroy_process_group()


def cell(value, fmt):
    """``value`` formatted, or ``n/a`` when there is none."""
    return "n/a" if value is None else format(value, fmt)


def report(args, points, notes, ours_hdr, plain, torch_zero, ours_zero, dispatch, split, took):
    """Print (and with ``--markdown``, write) the table, the per-point summary and the runtime overheads."""
    lines = [f"R = {R}, V = {V}, body F = {F_MS:g} ms and B = {B_MS:g} ms per chunk (B_in = B_w = B / 2), gloo on "
             f"CPU, median of {args.steps} steps after 2 warm-up steps. The simulator's costs for each runtime, "
             f"measured in this run: link latency {ours_hdr * 1e3:.3f} ms for ours (shape header and payload) "
             f"and {plain * 1e3:.3f} ms for torch's fixed-shape sends; dispatch (CPU time per action) "
             f"{dispatch[1] * 1e3:.3f} ms for ours and {dispatch[0] * 1e3:.3f} ms for torch. Ratios are this "
             f"row's step / the reference's (below 1: faster).", "",
             "| M | P | Pf ms | schedule | step s | step / (a) | step / best torch | step / ideal | predicted s | "
             "error | our-runtime limit s | ideal limit s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    summary = ["", "Per point: best torch row, best MPipe row ((d) to (h)), speed-up = best torch step / best "
               "MPipe step (above 1: MPipe faster), best MPipe step / ideal limit.", "",
               "| M | P | Pf ms | best torch | step s | best MPipe | step s | speed-up | MPipe / ideal |",
               "|---|---|---|---|---|---|---|---|---|"]
    failures = []
    for rows, our_limit, ideal in points:
        m, mode, pf = rows[0].point
        lead = f"| {m} | {mode} | {pf:g} | "
        ran = [row for row in rows if row.measured is not None]
        base = next((row.measured for row in ran if row.name.startswith("(a)")), None)
        torch_best = min((row for row in ran if row.family == "torch"), key=lambda row: row.measured, default=None)
        mpipe_best = min((row for row in ran if row.family == "mpipe"), key=lambda row: row.measured, default=None)
        for row in rows:
            if row.measured is None:
                error = row.error.replace("|", "\\|")
                failures.append(f"{m} {mode} Pf={pf:g}: {row.name}: {row.error}")
                lines.append(lead + f"{row.name} | failed: {error[:160]} | | | | | | {our_limit:.3f} | "
                             f"{ideal:.3f} |")
                continue
            predicted = row.predicted
            error = None if predicted is None else (predicted - row.measured) / row.measured
            lines.append(lead + f"{row.name} | {row.measured:.3f} | "
                         f"{cell(None if base is None else row.measured / base, '.3f')} | "
                         f"{cell(None if torch_best is None else row.measured / torch_best.measured, '.3f')} | "
                         f"{row.measured / ideal:.3f} | {cell(predicted, '.3f')} | {cell(error, '+.1%')} | "
                         f"{our_limit:.3f} | {ideal:.3f} |")
        if torch_best is not None and mpipe_best is not None:
            summary.append(lead + f"{torch_best.name} | {torch_best.measured:.3f} | {mpipe_best.name} | "
                           f"{mpipe_best.measured:.3f} | {torch_best.measured / mpipe_best.measured:.3f} | "
                           f"{mpipe_best.measured / ideal:.3f} |")
        else:
            summary.append(lead + "n/a | | n/a | | | |")
    (t_torch, c_torch), n_torch = torch_zero
    (t_ours, c_ours), n_ours = ours_zero
    split_in, split_w, split_first = split
    lines += summary + ["", "Runtime overheads:", "",
                        f"- one transfer of a 4 x 64 fp32 tensor, rank 0 -> 1 and back, halved: ours (shape header and "
                        f"payload) {ours_hdr * 1e6:.0f} us, a plain fixed-shape send {plain * 1e6:.0f} us "
                        f"({(ours_hdr - plain) * 1e6:+.0f} us per transfer).",
                        f"- stages that do nothing, M = 16, rank 0: torch {t_torch * 1e3:.1f} ms per step "
                        f"({c_torch * 1e3:.1f} ms CPU) over {n_torch} compute actions; ours {t_ours * 1e3:.1f} ms "
                        f"({c_ours * 1e3:.1f} ms CPU) over {n_ours} actions (compute, send and receive). Per compute "
                        f"action (64): torch {t_torch / 64 * 1e6:.0f} us, ours {t_ours / 64 * 1e6:.0f} us (ratio "
                        f"{t_ours / t_torch:.2f}). Four processes share two cores here, so these steps are bound by "
                        f"CPU, unlike the sleeping ones.",
                        f"- split check, one process, torch's stage_backward_input / stage_backward_weight on the "
                        f"sleeping module (B_in = 20 ms, B_w = 30 ms): the input part took {split_in * 1e3:.1f} ms, "
                        f"the weight part {split_w * 1e3:.1f} ms; a whole first-stage backward (input without "
                        f"gradient) {split_first * 1e3:.1f} ms (50 expected).",
                        f"- the whole run took {took:.0f} s."]
    lines += [f"- {note}" for note in notes]
    if failures:
        lines += ["", "Failed:", ""] + [f"- {failure}" for failure in failures]
    print_report("\n".join(lines), args.markdown)


def main():
    """Parse the arguments; start the 4 ranks (torchrun), or be one of them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="M = 16 and Pf in {0, 40} ms only")
    parser.add_argument("--steps", type=int, default=5, help="measured steps per schedule (median)")
    parser.add_argument("--markdown", help="also write the table to this file")
    args = parser.parse_args()
    run_ranks(__file__, R, worker, args)


if __name__ == "__main__":
    main()
