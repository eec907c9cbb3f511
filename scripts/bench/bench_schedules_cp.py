"""The context-parallel rows of ``scripts/bench/bench_schedules.py`` (``--cp``): the same sleeping pipeline at
``cp_size`` 1 and 2 on the R = 4 processes, measured beside the simulator's prediction, the ratio cp 2 / cp 1 of both
in the same run.

Two pipelines of pp 2 (V = 2, M = 8, our interleaved 1F1B: ranks ``{0, 1}`` and ``{2, 3}``, the mesh's
``pp_inner`` order) run the same micro-batches. At cp 1 they are two replicas: every stage sleeps the whole body
cost (F = 10 ms, B = 20 ms a chunk). At cp 2 ranks ``{0, 2}`` and ``{1, 3}`` are CP groups: every stage sleeps half
of it (a rank's half of the sequence, :mod:`mpipe_hf.train.plan_context_parallel`) and its
:data:`ATTENTION_LAYERS` attention layers each run Ulysses' four all-to-alls forward and four backward over the CP
group (real ``all_to_all_single`` on gloo, of a query slice of :data:`QUERY_BYTES` and a key slice of
:data:`KV_BYTES` at cp 2, the sizes of :mod:`mpipe_hf.runtime.context_parallel`). The simulator's prediction charges
each stage those all-to-alls (``Costs.all_to_all``), timed in the same run on the same groups (the median of 20),
with the run's measured latency and dispatch.
"""

from __future__ import annotations

import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from bench_schedules_stages import B_MS, F_MS, DictStage, SleepingStages, StageCosts, timed

PP, CP_V, CP_M, ATTENTION_LAYERS = 2, 2, 8, 2
QUERY_BYTES, KV_BYTES = 2**20, 2**19  # a rank's query (and output) slice, its keys (and values), at cp 2


def _exchange(x: torch.Tensor, group) -> torch.Tensor:
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x.contiguous(), group=group)
    return out


def ulysses_round(group) -> None:
    """One attention layer's four all-to-alls (query, key, value, output) over ``group``."""
    cp = dist.get_world_size(group)
    for nbytes in (QUERY_BYTES, KV_BYTES, KV_BYTES, QUERY_BYTES):
        _exchange(torch.zeros(cp, nbytes // 4 // cp), group)


class _Ulysses(torch.autograd.Function):
    """Identity on ``x`` whose forward and backward each run :data:`ATTENTION_LAYERS` layers' all-to-alls."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        for _ in range(ATTENTION_LAYERS):
            ulysses_round(group)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        for _ in range(ATTENTION_LAYERS):
            ulysses_round(ctx.group)
        return grad, None


class CPStage(DictStage):
    """A sleeping stage (:class:`~bench_schedules_stages.DictStage`) whose forward output passes through
    :class:`_Ulysses` over CP ``group`` (none at cp 1)."""

    def __init__(self, fwd_s, bwd_in_s, bwd_w_s, last, group):
        super().__init__(fwd_s, bwd_in_s, bwd_w_s, last)
        self.group = group

    def forward(self, inputs):
        if self.group is not None:
            key = "hidden_states" if "hidden_states" in inputs else "x"
            x = inputs[key]
            inputs = {**inputs, key: _Ulysses.apply(x if x.requires_grad else x * self.body.w, self.group)}
        return super().forward(inputs)


def _groups(rank: int):
    """``(this rank's pipeline group, its CP group)``; every rank makes every group, in the same order."""
    pipes = [dist.new_group([c * PP + p for p in range(PP)], backend="gloo") for c in range(2)]
    cps = [dist.new_group([c * PP + p for c in range(2)], backend="gloo") for p in range(PP)]
    return pipes[rank // PP], cps[rank % PP]


def _run(cp: int, rank: int, pipe, cp_group, steps: int) -> float:
    from mpipe_hf.runtime import PipelineExecutor, Preprocess
    from mpipe_hf.schedule import ScheduleConfig
    cfg = ScheduleConfig(PP, CP_V, CP_M, "identity")
    pp_rank = rank % PP
    half = 1.0 / cp
    modules = {s: CPStage(F_MS / 1e3 * half, B_MS / 2e3 * half, B_MS / 2e3 * half, s == cfg.num_stages - 1,
                          cp_group if cp > 1 else None) for s in range(pp_rank, cfg.num_stages, PP)}
    params = [p for m in modules.values() for p in m.parameters()]
    executor = PipelineExecutor(cfg, pp_rank, modules, Preprocess(None, (), ("x",)), pipe, torch.device("cpu"),
                                params, timedelta(seconds=300))
    loader = SleepingStages(None).load
    try:
        return timed(lambda: executor.step(loader, loader), dist.group.WORLD, steps)
    finally:
        executor.close()


def exchange_seconds(cp_group, rounds: int = 20) -> float:
    """The median seconds of one attention layer's four all-to-alls over ``cp_group`` (every CP group at once)."""
    times = []
    for _ in range(rounds):
        dist.barrier()
        start = time.perf_counter()
        ulysses_round(cp_group)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def cp_rows(rank: int, steps: int, runtime: dict) -> list[str]:
    """The measured and simulated steps at cp 1 and 2 (module docstring); report lines on rank 0 (``runtime``:
    our measured ``latency`` and ``dispatch``)."""
    from mpipe_hf.schedule import ScheduleConfig, build_schedule
    from mpipe_hf.schedule.simulate import Costs, simulate
    pipe, cp_group = _groups(rank)
    layer_s = exchange_seconds(cp_group)
    measured, predicted = {}, {}
    for cp in (1, 2):
        measured[cp] = _run(cp, rank, pipe, cp_group, steps)
        stages = PP * CP_V
        sc = StageCosts((F_MS / 1e3 / cp,) * stages, (B_MS / 2e3 / cp,) * stages, (B_MS / 2e3 / cp,) * stages)
        a2a = ATTENTION_LAYERS * layer_s if cp > 1 else 0.0
        costs = Costs(sc.fwd, sc.bwd, 0.0, 0.0, all_to_all=a2a, **runtime)
        predicted[cp] = simulate(build_schedule(ScheduleConfig(PP, CP_V, CP_M, "identity"), costs), costs).makespan
    if rank != 0:
        return []
    lines = [f"Context parallelism (pp {PP}, V {CP_V}, M {CP_M}; cp 2: half of each stage's sleep, "
             f"{ATTENTION_LAYERS} attention layers a stage, each 4 all-to-alls of {QUERY_BYTES >> 10}, "
             f"{KV_BYTES >> 10}, {KV_BYTES >> 10}, {QUERY_BYTES >> 10} KiB a rank each way; measured "
             f"{1e3 * layer_s:.2f} ms a layer on gloo):",
             "| cp | step s | predicted s | error | step / cp 1 | predicted / cp 1 |", "|---|---|---|---|---|---|"]
    for cp in (1, 2):
        lines.append(f"| {cp} | {measured[cp]:.3f} | {predicted[cp]:.3f} | "
                     f"{100 * (predicted[cp] / measured[cp] - 1):+.1f}% | {measured[cp] / measured[1]:.3f} | "
                     f"{predicted[cp] / predicted[1]:.3f} |")
    return lines
