"""The stages and runners of ``scripts/bench/bench_schedules.py`` (and of ``scripts/bench/bench_compute.py``, which runs the same
schedules over real Qwen2.5-VL layers): synthetic stages that sleep for set costs, one step of our executor or of a
``torch.distributed.pipelining`` schedule over any set of stages, the makespan of torch's order with no overhead,
and the helpers that keep the ranks in step.

A set of stages is an object with ``pp`` and ``vpp`` (ranks and chunks per rank) and:

- ``stage(s, last)``: our executor's stage ``s`` (a dict in, a dict out; the last returns ``loss``);
- ``preprocess()``: the transposed ``P`` (a dict in, a dict out); ``p_keys``, ``stage0_keys`` (the raw keys ``P``
  and, with ``P`` transposed, stage 0 read) and ``raw_keys`` (all the raw keys, stage 0's with ``P`` inside it);
- ``load(m)``: micro-batch ``m``'s raw inputs;
- ``torch_stage(s)``: torch's stage ``s`` (tensors in, a tensor out); ``torch_inputs(M)``: the first stage's
  arguments and the loss target for ``M`` micro-batches; ``loss(out, target)``.

:class:`SleepingStages` is the sleeping set.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from sleeping import Sleep

R, V, F_MS, B_MS, LAYERS = 4, 2, 10.0, 20.0, 32
TORCH_TIMEOUT = timedelta(seconds=60)  # a torch run's process group: how long a rank waits on a failed one
TORCH_KINDS = {"1f1b": "ScheduleInterleaved1F1B", "zb": "ScheduleInterleavedZeroBubble",
               "zbv": "ScheduleZBVZeroBubble"}


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


class SleepingStages:
    """The sleeping stages of ``sc`` (:class:`StageCosts`, R = 4, V = 2) and a transposed ``P`` sleeping ``pre``
    (forward, backward seconds), as the module docstring's set of stages."""

    pp, vpp = R, V
    p_keys, stage0_keys, raw_keys = ("x",), (), ("x",)

    def __init__(self, sc, pre=None):
        self.sc, self.pre = sc, pre

    def stage(self, s, last):
        return DictStage(self.sc.fwd[s], self.sc.bwd_in[s], self.sc.bwd_w[s], last)

    def preprocess(self):
        return DictPreprocess(*self.pre)

    def load(self, m):
        return {"x": torch.ones(1, 16)}

    def torch_stage(self, s):
        return SleepModule(self.sc.fwd[s], self.sc.bwd_in[s], self.sc.bwd_w[s])

    def torch_inputs(self, num_micro):
        return [torch.ones(num_micro, 16)], torch.ones(num_micro, 16)

    @staticmethod
    def loss(out, target):
        return out.sum()


def run_ours(cfg, rank, stages, steps, costs=None, cpu=False):
    """Median step seconds of our executor over ``stages`` (the module docstring's set; over ``steps`` steps after
    2 warm-up steps) and this rank's action count. ``costs``: what a filled or zero-bubble schedule places by."""
    from mpipe_hf.runtime import PipelineExecutor, Preprocess
    group = dist.group.WORLD
    modules = {s: stages.stage(s, s == cfg.num_stages - 1) for s in range(rank, cfg.num_stages, stages.pp)}
    if cfg.transposed:
        module = stages.preprocess()
        if not cfg.trains_preprocess:
            module.requires_grad_(False)
        preprocess = Preprocess(module, stages.p_keys, stages.stage0_keys)
    else:
        preprocess = Preprocess(None, (), stages.raw_keys)
    params = [p for s in modules.values() for p in s.parameters() if p.requires_grad]
    if rank == 0 and cfg.trains_preprocess:
        params += [p for p in preprocess.module.parameters() if p.requires_grad]
    executor = PipelineExecutor(cfg, rank, modules, preprocess, group, torch.device("cpu"), params,
                                timedelta(seconds=300), costs=costs)
    # every step also loads the next one's micros (used by placement fill): the median is the steady state
    try:
        return timed(lambda: executor.step(stages.load, stages.load), group, steps, cpu), len(executor.order)
    finally:
        executor.close()  # its groups and threads would otherwise pile up and slow the later runs


def run_torch(kind, rank, stages, num_micro, steps, cpu=False):
    """One torch schedule (``kind`` of :data:`TORCH_KINDS`) on torch's runtime over ``stages`` (the module
    docstring's set).

    Returns:
        the median step seconds (with ``cpu``: and the median CPU seconds), this rank's compute-action count, and
        the schedule's compute order of every rank (``pipeline_order``).
    """
    from torch.distributed import pipelining
    pp, num_stages = stages.pp, stages.pp * stages.vpp
    group = dist.new_group(list(range(pp)), backend="gloo", timeout=TORCH_TIMEOUT)
    try:
        placed = [rank, 2 * pp - 1 - rank] if kind == "zbv" else range(rank, num_stages, pp)
        built = [pipelining.PipelineStage(stages.torch_stage(s), s, num_stages, torch.device("cpu"), group=group)
                 for s in placed]
        schedule = getattr(pipelining, TORCH_KINDS[kind])(built, num_micro, loss_fn=stages.loss)
        args, target = stages.torch_inputs(num_micro)
        first, last = any(s.is_first for s in built), any(s.is_last for s in built)

        def step():
            schedule.step(*(args if first else []), target=target if last else None)
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
    send, as ``scripts/bench/bench_runtime.py`` measures them."""
    from bench_runtime import SIZES, transfers
    return list(transfers(group, rank, rounds, repeats=1)[next(iter(SIZES))])

