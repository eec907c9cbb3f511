"""The rows that measure the runtime on a decoder-only model: bf16 saved bytes, swap overlap, step
timing, ``max_memory_allocated`` against the plan, and host syncs per step and per action. A real
``Qwen2ForCausalLM`` (random weights, ``--hidden``/``--layers``/``--vocab``) split into ``V = 2`` virtual stages on
the one pipeline rank, ``--micro`` micro-batches of ``--tokens`` random tokens; each row builds its own executor and
runs ``--steps`` steps, the first a warm-up."""

from __future__ import annotations

import math
import os
import statistics
import warnings

import torch

from .common import NA, SYNC, Row, Setup, closing, drop_grads, executor_for, mib, pinned, sync_debug_step

_BENCH: dict = {}
# max_memory_allocated over the plan's total: the plan leaves out cuBLAS's workspace (CUBLAS_WORKSPACE_CONFIG
# :4096:8, 32 MiB), the allocator's rounding (to 512 B blocks, 2 MiB segments) and the backward's temporaries
# (a layer's largest: its MLP's 2 x hidden x tokens), a few percent and some 40 MiB on the default model of some
# 330 MiB planned; it counts nothing the step does not hold. Below 0.9 the plan counts something twice; above 1.25
# it misses a tensor the size of the gradients or the activations.
PLAN_MARGIN = (0.9, 1.25)


class Bench:
    """The model split for ``R = 1, V = 2``, its micro-batches, and executors over them."""

    def __init__(self, args, device: torch.device):
        from transformers import Qwen2Config, Qwen2ForCausalLM
        from mpipe_hf.models import split
        from mpipe_hf.schedule import ScheduleConfig
        heads = max(1, args.hidden // 64)
        self.config = Qwen2Config(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                                  num_hidden_layers=args.layers, num_attention_heads=heads,
                                  num_key_value_heads=1 if heads == 1 else 2, tie_word_embeddings=False)
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(self.config).to(device)
        self.device, self.steps, self.tokens = device, args.steps, args.tokens
        self.cfg = ScheduleConfig(1, 2, args.micro, "identity")
        self.split = split(model, self.cfg, 0)
        self.params = self.split.trainable_parameters(self.cfg, 0)
        self.weight_bytes = sum(p.numel() * p.element_size() for p in self.params.values())
        ids = torch.randint(0, args.vocab, (args.micro, 1, args.tokens), generator=torch.Generator().manual_seed(1))
        self.micros = [pinned({"input_ids": i, "attention_mask": torch.ones_like(i), "labels": i.clone()}, device)
                       for i in ids]

    def executor(self, bf16: bool = False, swap=None, measure: bool = False):
        """A fresh executor over the split, closed on the way out (a context manager)."""
        return closing(executor_for(self.split, self.cfg, self.device, bf16, measure_memory=measure, swap=swap)[0])

    def step(self, ex, fresh: bool = True):
        """One step over the micro-batches; its gradients are dropped afterwards unless ``fresh`` is false."""
        stats = ex.step(self.micros.__getitem__)
        if fresh:
            drop_grads(self.params)
        return stats

    def run(self, ex) -> list:
        """``steps`` steps; the stats of all but the first (a warm-up: lazy kernels, allocator, handles)."""
        return [self.step(ex) for _ in range(self.steps)][1:] or [self.step(ex)]

    def device_peak_above_start(self, ex) -> int:
        """A step's ``max_memory_allocated`` over what was allocated when it began (CUDA)."""
        torch.cuda.synchronize(self.device)
        start = torch.cuda.memory_allocated(self.device)
        return self.step(ex).rank_device_bytes[0] - start


def bench(setup: Setup) -> Bench:
    """The one :class:`Bench` of this run (built at first use; a failure fails each row that needs it)."""
    if "bench" not in _BENCH:
        _BENCH["bench"] = Bench(setup.args, setup.device)
    return _BENCH["bench"]


def bf16_row(setup: Setup) -> Row:
    """The most bytes autograd holds for the backwards (``measure_memory``: weights and their casts left out) per
    micro-batch in flight, bf16 autocast against fp32. On CUDA also each step's device peak above its start:
    bf16's may exceed fp32's by one bf16 copy of the trained weights (one cast per step), no more."""
    b, per_micro, peaks = bench(setup), {}, {}
    for bf16 in (False, True):
        with b.executor(bf16=bf16, measure=True) as ex:
            stats = b.run(ex)
            in_flight = max(1, math.ceil(stats[-1].peak_activations / b.cfg.vpp))  # micros at the peak
            per_micro[bf16] = max(s.rank_activation_bytes[0] for s in stats) / in_flight
            if setup.cuda:
                peaks[bf16] = b.device_peak_above_start(ex)
    if setup.broken("bf16 saved bytes per micro"):
        per_micro[True] = 2 * per_micro[False] + 1
    ok = per_micro[True] <= per_micro[False]
    figures = (f"fp32 {mib(per_micro[False])}, bf16 {mib(per_micro[True])} "
               f"({per_micro[True] / max(1, per_micro[False]):.2f}x); weights {mib(b.weight_bytes)} fp32")
    if peaks:  # one bf16 copy of each trained weight per step: at most half the fp32 weights over fp32's peak
        ok = ok and peaks[True] <= peaks[False] + b.weight_bytes // 2
        figures += f"; device peak above start fp32 {mib(peaks[False])}, bf16 {mib(peaks[True])}"
    else:
        figures += f"; device peak {NA}"
    values = {"fp32_saved_per_micro": per_micro[False], "bf16_saved_per_micro": per_micro[True],
              "weight_bytes": b.weight_bytes, "device_peak_above_start": {str(k): v for k, v in peaks.items()}}
    return Row("bf16 saved bytes per micro", "PASS" if ok else "FAIL", figures, values)


def _wall(stats) -> float:
    """Median step seconds: the event-timed wall on CUDA (``rank_wall_s``), the host's otherwise."""
    return statistics.median(s.rank_wall_s[0] if s.rank_wall_s else s.wall_s for s in stats)


def copy_seconds(nbytes: int, device: torch.device) -> float:
    """Seconds to copy ``nbytes`` to pinned host memory and back, alone on the device (CUDA events)."""
    buf = torch.empty(nbytes, dtype=torch.uint8, device=device)
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    host.copy_(buf, non_blocking=True)  # warm-up
    begin.record()
    host.copy_(buf, non_blocking=True)
    buf.copy_(host, non_blocking=True)
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / 1e3


def swap_row(setup: Setup) -> Row:
    """The step with activation swap against without (same loss), the bytes offloaded, and on CUDA the share of
    the copies' own time that the step hid (``1 - extra step time / copy time``)."""
    from mpipe_hf.schedule.swap import SwapConfig
    b = bench(setup)
    with b.executor() as ex:
        off = b.run(ex)
    with b.executor(swap=SwapConfig(enabled=True, min_bytes=0)) as ex:
        on = b.run(ex)
        offloaded = ex.swap.offloaded_bytes if ex.swap is not None else 0
    t_off, t_on = _wall(off), _wall(on)
    same = math.isclose(on[-1].loss, off[-1].loss, rel_tol=1e-6)
    figures = (f"step {t_off * 1e3:.2f} ms without, {t_on * 1e3:.2f} ms with swap; {mib(offloaded)} offloaded; "
               f"loss {'equal' if same else 'DIFFERS'}")
    values = {"step_s_without": t_off, "step_s_with": t_on, "offloaded_bytes": offloaded}
    if setup.cuda and offloaded:
        alone = copy_seconds(offloaded, setup.device)
        hidden = 1.0 - max(0.0, t_on - t_off) / alone
        figures += f"; copies alone {alone * 1e3:.2f} ms, {100 * hidden:.0f}% hidden"
        values.update(copy_s=alone, hidden=hidden)
    else:
        figures += f"; overlap {NA}" if not setup.cuda else "; nothing swapped"
    return Row("swap overlap", "PASS" if same and offloaded > 0 else "FAIL", figures, values)


def timing_row(setup: Setup) -> Row:
    """The executor's CUDA-event wall and busy time of a step, and the host's wall clock."""
    if not setup.cuda:
        return Row("step timing (CUDA events)", "n/a", NA)
    b = bench(setup)
    with b.executor() as ex:
        stats = b.run(ex)
    wall = statistics.median(s.rank_wall_s[0] for s in stats)
    busy = statistics.median(s.rank_wall_s[0] * (1 - s.rank_bubble[0]) for s in stats)
    host = statistics.median(s.wall_s for s in stats)
    return Row("step timing (CUDA events)", "INFO", f"event wall {wall * 1e3:.2f} ms, busy {busy * 1e3:.2f} ms, "
               f"host wall {host * 1e3:.2f} ms", {"wall_s": wall, "busy_s": busy, "host_wall_s": host})


def sync_error_row(setup: Setup) -> Row:
    """A step whose every action runs under ``set_sync_debug_mode("error")``: PASS, or the first offending line."""
    check = "host syncs per action"
    if not setup.cuda:
        return Row(check, "n/a", NA)
    b = bench(setup)
    with b.executor() as ex:
        b.step(ex)  # warm-up
        where, _ = sync_debug_step(ex, b.micros.__getitem__)
        drop_grads(b.params)
    if where is not None:
        return Row(check, "FAIL", where, {"error": where})
    return Row(check, "PASS", "every action ran under set_sync_debug_mode('error')")


def sync_count_row(setup: Setup) -> Row:
    """The synchronising calls of one step under ``set_sync_debug_mode("warn")``: in all, and inside actions
    (with the first actions and source lines)."""
    from .common import around_actions
    check = "host syncs per step"
    if not setup.cuda:
        return Row(check, "n/a", NA)
    b, in_actions, where, marks = bench(setup), [], [], []
    with b.executor() as ex:
        b.step(ex)  # warm-up
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")

            def after(action):
                new = [w for w in caught[marks.pop():] if SYNC in str(w.message)]
                if new:
                    in_actions.append(str(action))
                    where.extend(f"{os.path.basename(w.filename)}:{w.lineno}" for w in new)
            torch.cuda.set_sync_debug_mode("warn")
            try:
                with around_actions(lambda a: marks.append(len(caught)), after):
                    b.step(ex)
            finally:
                torch.cuda.set_sync_debug_mode(0)
        total = sum(SYNC in str(w.message) for w in caught)
    inside = len(where)
    figures = f"{total} per step, {inside} inside actions" + (
        f" ({', '.join(in_actions[:3])} at {', '.join(where[:3])})" if inside else "")
    return Row(check, "PASS" if inside == 0 else "FAIL", figures,
               {"per_step": total, "in_actions": inside, "actions": in_actions, "where": where})


def plan_row(setup: Setup) -> Row:
    """A step's ``max_memory_allocated`` (AdamW state allocated) against the plan's total for the rank (the
    plan of ``train/plan.py`` on a profile estimated from the config, for the same layout and micro-batches):
    PASS when their ratio is within :data:`PLAN_MARGIN`."""
    from mpipe_hf.train.plan import plan
    from mpipe_hf.train.plan_estimate import estimate_profile
    check, b = "max_memory_allocated vs plan", bench(setup)
    layers = [sum(fqn.startswith("model.layers.") for fqn in stage) for stage in b.split.layout]
    planned = plan(b.config, b.cfg, estimate_profile(b.config, b.tokens), layers).ranks[0]
    parts = (f"plan {mib(planned.total_bytes)} (params {mib(planned.param_bytes)}, grads {mib(planned.grad_bytes)}, "
             f"optim {mib(planned.optimizer_bytes)}, activ {mib(planned.activation_bytes)})")
    if not setup.cuda:
        return Row(check, "n/a", f"{parts}; measured {NA}", {"plan_bytes": planned.total_bytes})
    optimizer = torch.optim.AdamW(list(b.params.values()), lr=1e-4)
    with b.executor() as ex:
        b.step(ex, fresh=False)
        optimizer.step()  # the AdamW state now exists, as in training
        optimizer.zero_grad(set_to_none=True)
        measured = b.step(ex).rank_device_bytes[0]
    ratio = measured / planned.total_bytes
    ok = PLAN_MARGIN[0] <= ratio <= PLAN_MARGIN[1]
    return Row(check, "PASS" if ok else "FAIL", f"{parts}; measured {mib(measured)}, ratio {ratio:.2f} (PASS "
               f"{PLAN_MARGIN[0]:g} to {PLAN_MARGIN[1]:g})",
               {"plan_bytes": planned.total_bytes, "measured_bytes": measured, "ratio": ratio})


def rows() -> tuple:
    """``(check, measure)`` of this module's rows, in the table's order."""
    return (("bf16 saved bytes per micro", bf16_row), ("max_memory_allocated vs plan", plan_row),
            ("swap overlap", swap_row), ("step timing (CUDA events)", timing_row),
            ("host syncs per step", sync_count_row), ("host syncs per action", sync_error_row))
