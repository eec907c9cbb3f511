"""The NCCL set-up row: whether NCCL initialises a group's communicator when the group is created (eager) or at
its first operation (lazy), read from NCCL's own log (``NCCL_DEBUG=INFO``, ``NCCL_DEBUG_SUBSYS=INIT``) of a child
process (:mod:`.nccl_child`) that joins through ``mpipe_hf.runtime.mesh.init_distributed`` and makes its groups
with ``dist.new_group``. A world of one rank: a communicator of one rank, no transport, but the same set-up
calls."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys

from .common import NA, Row, Setup
from .nccl_child import MARK

CHECK = "nccl eager init"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
INIT_DONE = re.compile(r"Init COMPLETE|ncclCommInitRank.*(?:comm|init)", re.IGNORECASE)
COMM = re.compile(r"comm (0x[0-9a-f]+)", re.IGNORECASE)


def free_port() -> int:
    """A TCP port free on this host now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def phases(log: str) -> dict[str, set]:
    """``{phase: communicator addresses whose initialisation NCCL logged in it}``: each marker line opens a phase
    (``start``, ``after init_distributed``, ``after new_group``, ``after first collectives``, ``end``)."""
    out, phase, known = {}, "before start", set()
    for line in log.splitlines():
        if line.startswith(MARK):
            phase = line[len(MARK):].strip()
            out.setdefault(phase, set())
        elif "NCCL INFO" in line and INIT_DONE.search(line):
            found = COMM.search(line)
            comm = found.group(1) if found else line.strip()[-40:]
            if comm not in known:  # a communicator counts where NCCL first logged its set-up
                known.add(comm)
                out.setdefault(phase, set()).add(comm)
    return out


def finding(seen: dict[str, set]) -> tuple[str, str]:
    """``(eager or lazy, the phases' counts)``: eager when every communicator NCCL initialised was initialised
    before the first collective (at ``init_distributed`` or at ``new_group``), lazy when one was at it."""
    counts = {p: len(c) for p, c in seen.items() if p != "before start"}
    at_use = counts.get("after new_group", 0)
    kind = "lazy" if at_use else "eager"
    text = (f"{counts.get('start', 0)} comm(s) initialised in init_distributed, "
            f"{counts.get('after init_distributed', 0)} at dist.new_group, {at_use} at the first collective")
    return kind, text


def nccl_row(setup: Setup) -> Row:
    """Run the child with NCCL's INIT log and say where the communicators were initialised. PASS when the log was
    read and had NCCL's set-up lines (the figure says eager or lazy); FAIL when the child failed or NCCL logged
    no set-up."""
    if not setup.cuda:
        return Row(CHECK, "n/a", NA)
    env = {**os.environ, "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT", "RANK": "0", "LOCAL_RANK": "0",
           "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "GPU_CHECK_ROOT": ROOT, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", str(setup.device.index or 0))}
    env.pop("NCCL_DEBUG_FILE", None)
    child = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nccl_child.py")
    done = subprocess.run([sys.executable, "-u", child], env=env, capture_output=True, text=True, timeout=180)
    log = done.stdout + done.stderr
    if done.returncode != 0:
        last = [line for line in log.splitlines() if line.strip()][-1:] or ["no output"]
        return Row(CHECK, "FAIL", f"the child exited {done.returncode}: {last[0][:200]}", {"log_tail": log[-4000:]})
    seen = phases(done.stdout)
    if not any(seen.get(p) for p in seen if p != "before start"):
        return Row(CHECK, "FAIL", "NCCL logged no communicator set-up (NCCL_DEBUG=INFO ignored?)",
                   {"log_tail": log[-4000:]})
    kind, text = finding(seen)
    if setup.broken(CHECK):
        return Row(CHECK, "FAIL", f"broken on purpose ({kind}: {text})")
    return Row(CHECK, "PASS", f"{kind}: {text}", {"finding": kind, "phases": {p: sorted(c) for p, c in seen.items()},
                                                   "log_tail": log[-4000:]})


def rows() -> tuple:
    """``(check, measure)`` of this module's rows."""
    return ((CHECK, nccl_row),)
