"""What the CUDA paths do on one GPU, measured, in one table (issue 27; docs/gpus.md explains each row).

Usage:
    python scripts/gpu_check.py [--device cuda] [--steps 3] [--json OUT]
    torchrun --standalone --nproc_per_node 1 scripts/gpu_check.py

A world of one process (NCCL cannot run two ranks on one GPU): a real ``Qwen2ForCausalLM`` (random weights,
``--hidden``/``--layers``/``--vocab``) split into ``V = 2`` virtual stages on the one pipeline rank (``R = 1``,
preprocess ``identity``), ``--micro`` micro-batches of ``--tokens`` random tokens per step, strict device mode
on (every tensor handed to a transfer or collective must be on the device). Each row builds its
own executor, runs ``--steps`` steps (the first a warm-up) and is measured on its own: a row that fails says
FAIL and its error's first line, and the rows after it still run.

The rows (each function's docstring; docs/gpus.md says how to read them): bf16 saved bytes per micro, swap
overlap, step timing (CUDA events), max_memory_allocated vs plan, host syncs per step, host syncs per action.
With ``--device cpu`` the CUDA-only figures read "n/a on cpu"; tests/test_gpu_check.py runs it that way.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import traceback
import warnings
from dataclasses import asdict, dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

MIB = 2 ** 20
NA = "n/a on cpu"
SYNC = "synchroniz"  # the text of torch's warning: "called a synchronizing CUDA operation"


@dataclass
class Row:
    """One line of the table: ``result`` is PASS, FAIL, INFO or n/a; ``values`` the raw figures (bytes, s)."""

    check: str
    result: str
    figures: str
    values: dict = field(default_factory=dict)


def mib(n: float) -> str:
    """``n`` bytes in MiB, two decimals."""
    return f"{n / MIB:.2f} MiB"


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
        pin = device.type == "cuda"  # as a DataLoader with pin_memory=True hands them over
        self.micros = [{"input_ids": i, "attention_mask": torch.ones_like(i), "labels": i.clone()} for i in ids]
        self.micros = [{k: v.pin_memory() if pin else v for k, v in mb.items()} for mb in self.micros]

    @contextlib.contextmanager
    def executor(self, bf16: bool = False, swap=None, measure: bool = False):
        """A fresh :class:`~mpipe_hf.runtime.PipelineExecutor` over the split, closed on the way out."""
        from mpipe_hf.runtime import PipelineExecutor
        from mpipe_hf.train.precision import autocast_modules
        stages, pre = self.split.stages, self.split.preprocess
        if bf16:
            stages, pre = autocast_modules(stages, pre, self.device)
        ex = PipelineExecutor(self.cfg, 0, stages, pre, dist.group.WORLD, self.device, self.params.values(),
                              timedelta(seconds=120), self.split.tied_parameters(self.cfg, 0), seed=0,
                              measure_memory=measure, swap=swap, strict=True)
        try:
            yield ex
        finally:
            with contextlib.suppress(Exception):
                ex.close()

    def step(self, ex, fresh: bool = True):
        """One step over the micro-batches; its gradients are dropped afterwards unless ``fresh`` is false."""
        stats = ex.step(self.micros.__getitem__)
        if fresh:
            for p in self.params.values():
                p.grad = None
        return stats

    def run(self, ex) -> list:
        """``steps`` steps; the stats of all but the first (a warm-up: lazy kernels, allocator, handles)."""
        return [self.step(ex) for _ in range(self.steps)][1:] or [self.step(ex)]

    def device_peak_above_start(self, ex) -> int:
        """A step's ``max_memory_allocated`` over what was allocated when it began (CUDA)."""
        torch.cuda.synchronize(self.device)
        start = torch.cuda.memory_allocated(self.device)
        return self.step(ex).rank_device_bytes[0] - start


def bf16_row(bench: Bench) -> Row:
    """The most bytes autograd holds for the backwards (``measure_memory``: weights and their casts left out) per
    micro-batch in flight, bf16 autocast against fp32. On CUDA also each step's device peak above its start:
    bf16's may exceed fp32's by one bf16 copy of the trained weights (one cast per step), no more."""
    per_micro, peaks = {}, {}
    for bf16 in (False, True):
        with bench.executor(bf16=bf16, measure=True) as ex:
            stats = bench.run(ex)
            in_flight = max(1, math.ceil(stats[-1].peak_activations / bench.cfg.vpp))  # micros at the peak
            per_micro[bf16] = max(s.rank_activation_bytes[0] for s in stats) / in_flight
            if bench.device.type == "cuda":
                peaks[bf16] = bench.device_peak_above_start(ex)
    ok = per_micro[True] <= per_micro[False]
    figures = (f"fp32 {mib(per_micro[False])}, bf16 {mib(per_micro[True])} "
               f"({per_micro[True] / max(1, per_micro[False]):.2f}x); weights {mib(bench.weight_bytes)} fp32")
    if peaks:  # one bf16 copy of each trained weight per step: at most half the fp32 weights over fp32's peak
        ok = ok and peaks[True] <= peaks[False] + bench.weight_bytes // 2
        figures += f"; device peak above start fp32 {mib(peaks[False])}, bf16 {mib(peaks[True])}"
    else:
        figures += f"; device peak {NA}"
    values = {"fp32_saved_per_micro": per_micro[False], "bf16_saved_per_micro": per_micro[True],
              "weight_bytes": bench.weight_bytes, "device_peak_above_start": {str(k): v for k, v in peaks.items()}}
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


def swap_row(bench: Bench) -> Row:
    """The step with activation swap against without (same loss), the bytes offloaded, and on CUDA the share of
    the copies' own time that the step hid (``1 - extra step time / copy time``)."""
    from mpipe_hf.schedule.swap import SwapConfig
    with bench.executor() as ex:
        off = bench.run(ex)
    with bench.executor(swap=SwapConfig(enabled=True, min_bytes=0)) as ex:
        on = bench.run(ex)
        offloaded = ex.swap.offloaded_bytes if ex.swap is not None else 0
    t_off, t_on = _wall(off), _wall(on)
    same = math.isclose(on[-1].loss, off[-1].loss, rel_tol=1e-6)
    figures = (f"step {t_off * 1e3:.2f} ms without, {t_on * 1e3:.2f} ms with swap; {mib(offloaded)} offloaded; "
               f"loss {'equal' if same else 'DIFFERS'}")
    values = {"step_s_without": t_off, "step_s_with": t_on, "offloaded_bytes": offloaded}
    if bench.device.type == "cuda" and offloaded:
        alone = copy_seconds(offloaded, bench.device)
        hidden = 1.0 - max(0.0, t_on - t_off) / alone
        figures += f"; copies alone {alone * 1e3:.2f} ms, {100 * hidden:.0f}% hidden"
        values.update(copy_s=alone, hidden=hidden)
    else:
        figures += f"; overlap {NA}" if bench.device.type != "cuda" else "; nothing swapped"
    return Row("swap overlap", "PASS" if same and offloaded > 0 else "FAIL", figures, values)


def timing_row(bench: Bench) -> Row:
    """The executor's CUDA-event wall and busy time of a step, and the host's wall clock."""
    if bench.device.type != "cuda":
        return Row("step timing (CUDA events)", "n/a", NA)
    with bench.executor() as ex:
        stats = bench.run(ex)
    wall = statistics.median(s.rank_wall_s[0] for s in stats)
    busy = statistics.median(s.rank_wall_s[0] * (1 - s.rank_bubble[0]) for s in stats)
    host = statistics.median(s.wall_s for s in stats)
    return Row("step timing (CUDA events)", "INFO", f"event wall {wall * 1e3:.2f} ms, busy {busy * 1e3:.2f} ms, "
               f"host wall {host * 1e3:.2f} ms", {"wall_s": wall, "busy_s": busy, "host_wall_s": host})


@contextlib.contextmanager
def around_actions(before, after):
    """Call ``before(action)`` and ``after(action)`` around every action an executor runs (the handler table's
    ``run_action``, wherever the runtime imported it)."""
    from mpipe_hf.runtime import handlers
    original = handlers.run_action

    def wrapped(ctx, action):
        before(action)
        try:
            return original(ctx, action)
        finally:
            after(action)
    users = [m for name, m in list(sys.modules.items())
             if name.startswith("mpipe_hf.runtime") and getattr(m, "run_action", None) is original]
    for module in users:
        module.run_action = wrapped
    try:
        yield
    finally:
        for module in users:
            module.run_action = original


def first_line(err: BaseException) -> str:
    """``type: message``'s first line of ``err``."""
    text = f"{type(err).__name__}: {err}".strip()
    return text.splitlines()[0] if text else type(err).__name__


def offending_frame(err: BaseException) -> str:
    """``file:line in function`` of the innermost frame outside torch itself in the deepest cause of ``err``
    (the code that made the synchronising call)."""
    while err.__cause__ is not None or err.__context__ is not None:
        err = err.__cause__ or err.__context__
    frames = traceback.extract_tb(err.__traceback__)
    torch_dir = os.path.dirname(torch.__file__)
    outside = [f for f in frames if not f.filename.startswith(torch_dir)] or frames
    if not outside:
        return first_line(err)
    f = outside[-1]
    return f"{os.path.relpath(f.filename)}:{f.lineno} in {f.name}: {first_line(err)}"


def sync_error_row(bench: Bench) -> Row:
    """A step whose every action runs under ``set_sync_debug_mode("error")``: PASS, or the first offending line.
    Run last: on NCCL the failed step ends its executor."""
    check = "host syncs per action"
    if bench.device.type != "cuda":
        return Row(check, "n/a", NA)
    with bench.executor() as ex:
        bench.step(ex)  # warm-up
        with around_actions(lambda a: torch.cuda.set_sync_debug_mode("error"),
                            lambda a: torch.cuda.set_sync_debug_mode(0)):
            try:
                bench.step(ex)
            except Exception as err:  # noqa: BLE001 - the failure is the result
                return Row(check, "FAIL", offending_frame(err), {"error": first_line(err)})
    return Row(check, "PASS", "every action ran under set_sync_debug_mode('error')")


def sync_count_row(bench: Bench) -> Row:
    """The synchronising calls of one step under ``set_sync_debug_mode("warn")``: in all, and inside actions
    (with the first actions and source lines)."""
    check = "host syncs per step"
    if bench.device.type != "cuda":
        return Row(check, "n/a", NA)
    in_actions, where = [], []
    with bench.executor() as ex:
        bench.step(ex)  # warm-up
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            marks = []

            def after(action):
                new = [w for w in caught[marks.pop():] if SYNC in str(w.message)]
                if new:
                    in_actions.append(str(action))
                    where.extend(f"{os.path.basename(w.filename)}:{w.lineno}" for w in new)
            torch.cuda.set_sync_debug_mode("warn")
            try:
                with around_actions(lambda a: marks.append(len(caught)), after):
                    bench.step(ex)
            finally:
                torch.cuda.set_sync_debug_mode(0)
        total = sum(SYNC in str(w.message) for w in caught)
    inside = len(where)
    figures = f"{total} per step, {inside} inside actions" + (
        f" ({', '.join(in_actions[:3])} at {', '.join(where[:3])})" if inside else "")
    return Row(check, "PASS" if inside == 0 else "FAIL", figures,
               {"per_step": total, "in_actions": inside, "actions": in_actions, "where": where})


def plan_row(bench: Bench) -> Row:
    """A step's ``max_memory_allocated`` (AdamW state allocated) against the plan's total for the rank (the
    plan of ``train/plan.py`` on a profile estimated from the config, for the same layout and micro-batches)."""
    from mpipe_hf.train.plan import estimate_profile, plan
    check = "max_memory_allocated vs plan"
    layers = [sum(fqn.startswith("model.layers.") for fqn in stage) for stage in bench.split.layout]
    planned = plan(bench.config, bench.cfg, estimate_profile(bench.config, bench.tokens), layers).ranks[0]
    parts = (f"plan {mib(planned.total_bytes)} (params {mib(planned.param_bytes)}, grads {mib(planned.grad_bytes)}, "
             f"optim {mib(planned.optimizer_bytes)}, activ {mib(planned.activation_bytes)})")
    if bench.device.type != "cuda":
        return Row(check, "n/a", f"{parts}; measured {NA}", {"plan_bytes": planned.total_bytes})
    optimizer = torch.optim.AdamW(list(bench.params.values()), lr=1e-4)
    with bench.executor() as ex:
        bench.step(ex, fresh=False)
        optimizer.step()  # the AdamW state now exists, as in training
        optimizer.zero_grad(set_to_none=True)
        measured = bench.step(ex).rank_device_bytes[0]
    ratio = measured / planned.total_bytes
    return Row(check, "INFO", f"{parts}; measured {mib(measured)}, ratio {ratio:.2f}",
               {"plan_bytes": planned.total_bytes, "measured_bytes": measured, "ratio": ratio})


ROWS = (("bf16 saved bytes per micro", bf16_row), ("swap overlap", swap_row),
        ("step timing (CUDA events)", timing_row), ("max_memory_allocated vs plan", plan_row),
        ("host syncs per step", sync_count_row), ("host syncs per action", sync_error_row))


def table(rows: list[Row]) -> str:
    """The rows as one fixed-width table."""
    width = max(len(r.check) for r in rows)
    lines = [f"{'check':<{width}}  {'result':<6}  figures", f"{'-' * width}  ------  -------"]
    lines += [f"{r.check:<{width}}  {r.result:<6}  {r.figures}" for r in rows]
    return "\n".join(lines)


def init(device_name: str) -> torch.device:
    """This process's device, and a world of one process (torchrun's environment, or a file store)."""
    device = torch.device(device_name)
    if device.type == "cuda":
        index = device.index if device.index is not None else int(os.environ.get("LOCAL_RANK", 0))
        device = torch.device("cuda", index)
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    extra = {"device_id": device} if device.type == "cuda" else {}
    if "MASTER_ADDR" in os.environ and "RANK" in os.environ:
        dist.init_process_group(backend, timeout=timedelta(minutes=5), **extra)
    else:
        store = os.path.join(tempfile.mkdtemp(prefix="gpu_check"), "store")
        dist.init_process_group(backend, init_method=f"file://{store}", rank=0, world_size=1,
                                timeout=timedelta(minutes=5), **extra)
    if dist.get_world_size() != 1:
        raise SystemExit(f"gpu_check runs one process on one device; this world has {dist.get_world_size()}")
    return device


def parse(argv=None) -> argparse.Namespace:
    """The command line (module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    parser.add_argument("--steps", type=int, default=3, help="steps per row, the first a warm-up")
    parser.add_argument("--json", default=None, metavar="OUT", help="also write the rows to this JSON file")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--tokens", type=int, default=128, help="tokens per micro-batch (batch 1)")
    parser.add_argument("--micro", type=int, default=4, help="micro-batches per step")
    return parser.parse_args(argv)


def commit() -> str:
    """The checkout's short commit (with ``+`` when the tree has changes), or ``unknown``."""
    def git(*cmd):
        return subprocess.run(["git", *cmd], cwd=os.path.dirname(os.path.abspath(__file__)), capture_output=True,
                              text=True, timeout=10).stdout.strip()
    try:
        head = git("rev-parse", "--short", "HEAD")
        return (head + ("+" if git("status", "--porcelain", "--untracked-files=no") else "")) or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def main(argv=None) -> list[Row]:
    """Run every row, print the table (and write ``--json``); returns the rows."""
    args = parse(argv)
    device = init(args.device)
    rows = []
    try:
        bench = Bench(args, device)
    except Exception as err:  # noqa: BLE001 - no model, no row: each says why
        rows = [Row(check, "FAIL", f"setting up the model: {first_line(err)}") for check, _ in ROWS]
    for check, measure in ROWS if not rows else ():
        try:
            rows.append(measure(bench))
        except Exception as err:  # noqa: BLE001 - one failing row must not hide the others
            rows.append(Row(check, "FAIL", first_line(err)))
    dist.destroy_process_group()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    header = (f"gpu_check at {commit()} on {device} ({name}), torch {torch.__version__}: hidden {args.hidden}, "
              f"{args.layers} layers, {args.tokens} tokens x {args.micro} micros, R = 1, V = 2")
    print(header)
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"header": header, "args": vars(args), "rows": [asdict(r) for r in rows]}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
