"""What the schedule benchmarks share (``bench_schedules.py``, ``bench_owners.py``, ``bench_runtime.py``): an
autograd node that sleeps for a set cost, the launch of a script's own ranks, and the printing of its report.

``time.sleep`` frees the core, so 4 ranks on 2 CPU cores keep their set costs; only the runtimes' own work
competes for the cores.
"""

from __future__ import annotations

import os
import sys
import time

import torch


class Sleep(torch.autograd.Function):
    """Identity that sleeps ``fwd_s`` seconds in forward and ``bwd_s`` in backward: one node of the autograd
    graph."""

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


def print_report(text: str, markdown: str | None) -> None:
    """Print a benchmark's report and, with ``--markdown FILE``, also write it to ``markdown``."""
    print(text, flush=True)
    if markdown:
        with open(markdown, "w") as f:
            f.write(text + "\n")


def run_ranks(script: str, nproc: int, worker, args) -> None:
    """Be one rank (``worker(args)``) when torchrun started this process, else start ``nproc`` local ranks of
    ``script`` with the same command line (one thread each)."""
    if "RANK" in os.environ:
        worker(args)
        return
    from torch.distributed.run import main as torchrun
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torchrun(["--standalone", f"--nproc_per_node={nproc}", os.path.abspath(script), *sys.argv[1:]])
