"""What the CUDA and NCCL paths do on one GPU, checked and measured, in one table (docs/gpus.md
explains each row).

Usage:
    python scripts/check/gpu_check.py [--device cuda] [--json OUT] [--only TEXT] [--break CHECK]
    torchrun --standalone --nproc_per_node 1 scripts/check/gpu_check.py

A world of one process (NCCL cannot run two ranks on one GPU), ``R = 1`` with ``V = 2`` virtual stages, strict
device mode on. The rows (``scripts/check/gpu_check_rows/``): sync-debug mode ``"error"`` around every action over tiny
Qwen2.5-VL (``P`` identity, frozen, trainable), Qwen3-VL, Qwen3.5 unpadded, a packed micro-batch and FlashAttention
2 where ``flash_attn`` imports; a micro-batch through the sender and wire code onto the device and run by stage 0;
the split against the unsplit model under deterministic algorithms; FSDP2 on a one-rank mesh in bf16 with LoRA
against one process; bf16 memory and ``max_memory_allocated`` against the plan; swap overlap; step timing; host
syncs per step and per action; MoE experts per token on the bf16 grouped GEMM against transformers' fp32 path and a
dense MLP of the same active width; eager or lazy NCCL set-up from NCCL's own log.

Each row says PASS, FAIL, INFO or n/a with its figures. A row that raises is a FAIL with its error's first line,
and the rows after it still run; so is a row that runs past ``--row-timeout`` seconds (one stuck where no signal
reaches it ends the run a minute later, printing the rows so far). The exit status is 1 when any row failed (n/a
is not a failure). With ``--device cpu`` the rows that can run on a CPU run and the CUDA-only ones say n/a
(tests/test_gpu_check.py). ``--break CHECK`` breaks that row on purpose (a perturbed gradient, loss or payload,
or a host read in a stage forward), to show that a broken row fails the run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from datetime import timedelta

# before CUDA starts: cuBLAS is deterministic only with a fixed workspace (the split-vs-unsplit row)
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_check_rows import all_rows  # noqa: E402
from gpu_check_rows.common import Row, Setup, first_line  # noqa: E402


def table(rows: list[Row]) -> str:
    """The rows as one fixed-width table."""
    width = max(len(r.check) for r in rows)
    lines = [f"{'check':<{width}}  {'result':<6}  figures", f"{'-' * width}  ------  -------"]
    lines += [f"{r.check:<{width}}  {r.result:<6}  {r.figures}" for r in rows]
    return "\n".join(lines)


def init(device_name: str) -> torch.device:
    """This process's device, and a world of one process (torchrun's environment, or a file store)."""
    device = torch.device(device_name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"gpu_check: CUDA is not available here (torch {torch.__version__}): install a CUDA build "
                         f"of torch on the GPU machine, or pass --device cpu for the CPU rows")
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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "),
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    parser.add_argument("--steps", type=int, default=3, help="steps per measuring row, the first a warm-up")
    parser.add_argument("--json", default=None, metavar="OUT", help="also write the rows to this JSON file")
    parser.add_argument("--hidden", type=int, default=512, help="the decoder-only model's hidden size")
    parser.add_argument("--layers", type=int, default=4, help="the decoder-only model's layers")
    parser.add_argument("--vocab", type=int, default=8192, help="the decoder-only model's vocabulary")
    parser.add_argument("--tokens", type=int, default=128, help="tokens per micro-batch (batch 1)")
    parser.add_argument("--micro", type=int, default=4, help="micro-batches per step")
    parser.add_argument("--row-timeout", type=float, default=300.0, metavar="S",
                        help="seconds a row may take before it fails (a row stuck in NCCL ends the run 60 s later)")
    parser.add_argument("--only", action="append", default=[], metavar="TEXT",
                        help="run only the rows whose name contains TEXT (repeatable); the others say skipped")
    parser.add_argument("--break", dest="breaks", action="append", default=[], metavar="CHECK",
                        help="break this row on purpose (its exact name; repeatable)")
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


@contextlib.contextmanager
def time_limit(check: str, limit: float, rows: list[Row], grace: float = 60.0):
    """Bound the row ``check`` to ``limit`` seconds. Past it, ``SIGALRM`` raises ``TimeoutError`` in the row: a
    wait in Python gives way, the row FAILs and the rows after it run. A row stuck where no signal reaches it (a
    collective that never completes, inside NCCL) is ended with the process ``grace`` seconds later: the table of
    ``rows`` so far and this row's FAIL are printed, and the exit status is 1."""
    def soft(signum, frame):
        raise TimeoutError(f"ran past its limit of {limit:g} s (--row-timeout)")

    done = threading.Event()

    def hard():
        if not done.wait(limit + grace):
            print(table(rows + [Row(check, "FAIL", f"stuck past {limit + grace:g} s (--row-timeout and "
                                                   f"{grace:g} s more): the process ends")]), flush=True)
            os._exit(1)

    previous = signal.signal(signal.SIGALRM, soft)
    signal.setitimer(signal.ITIMER_REAL, limit)
    threading.Thread(target=hard, daemon=True).start()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        done.set()


def run_rows(setup: Setup, only: list[str]) -> list[Row]:
    """Every row in order, each timed (``values["row_s"]``) and bounded (:func:`time_limit`,
    ``--row-timeout``); one that raises is a FAIL with its error's first line; a row ``--only`` leaves out says so
    (n/a)."""
    rows = []
    for check, measure in all_rows():
        if only and not any(text in check for text in only):
            rows.append(Row(check, "n/a", "skipped (--only)"))
            continue
        start = time.perf_counter()
        try:
            with time_limit(check, setup.args.row_timeout, rows):
                row = measure(setup)
        except Exception as err:  # noqa: BLE001 - one failing row must not hide the others
            row = Row(check, "FAIL", first_line(err))
        finally:
            if setup.cuda:
                torch.cuda.set_sync_debug_mode(0)
        row.values["row_s"] = round(time.perf_counter() - start, 3)
        rows.append(row)
    return rows


def main(argv=None) -> int:
    """Run every row, print the table (and write ``--json``); returns the exit status: 1 when a row failed."""
    args = parse(argv)
    names = [check for check, _ in all_rows()]
    unknown = [b for b in args.breaks if b not in names]
    if unknown:
        raise SystemExit(f"--break {unknown[0]!r}: not a row; the rows are {names}")
    start = time.perf_counter()
    device = init(args.device)
    rows = run_rows(Setup(device, args, frozenset(args.breaks)), args.only)
    dist.destroy_process_group()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    failed = [r.check for r in rows if r.result == "FAIL"]
    header = (f"gpu_check at {commit()} on {device} ({name}), torch {torch.__version__}: R = 1, V = 2; decoder-only "
              f"rows: hidden {args.hidden}, {args.layers} layers, {args.tokens} tokens x {args.micro} micros; "
              f"{time.perf_counter() - start:.1f} s")
    print(header)
    print(table(rows))
    print(f"FAILED: {', '.join(failed)}" if failed else "every row passed or is n/a")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"header": header, "args": vars(args), "failed": failed, "rows": [asdict(r) for r in rows]},
                      f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
