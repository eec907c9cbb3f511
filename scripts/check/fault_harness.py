"""Running a fault-suite case and comparing it with the uninterrupted run (``fault_suite.py``): the launch
with its hang limit, killing one worker or signalling the launcher on cue, and the steps a run lost, bit for bit."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.path.dirname(sys.executable)
LIMIT_S = 240  # a case's process still running after this long is a hang
PP, STEPS, SAVE = 2, 6, 2
PREEMPT_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"  # as mpipe-hf train starts torchrun (docs/failures.md)


def worker(fault: str, recipe: str) -> None:
    """Apply ``fault`` in this process, then run ``mpipe_hf.train.trainer.main([recipe])``.

    Faults: ``kill-in-save:STEP`` (rank 0 kills itself with SIGKILL while it writes ``checkpoint-STEP``, after
    every shard is on disk and before the directory is renamed into place); ``nan:STEP`` (the last stage's loss
    is NaN at step STEP, 1-based; ``nan:all`` at every step); ``enospc:RANK:STEP`` (rank RANK's shard write of
    ``checkpoint-STEP`` fails with ``ENOSPC``); ``signal-in-save:STEP`` (rank 0 sends SIGTERM to the torchrun
    agent while it writes ``checkpoint-STEP``, as a scheduler does at a job's time limit, and the save goes on);
    ``nccl-blind:STEP`` (from step STEP on every rank blocks as NCCL leaves it on a lost peer: :func:`blind_from`).
    """
    from mpipe_hf.train import checkpoint, job, trainer
    from mpipe_hf.runtime import executor
    kind, *args = fault.split(":")
    rank = int(os.environ.get("RANK", 0))
    if kind == "kill-in-save":
        hub_files = job.save_hub_files  # the recipe job's hub files, written last into checkpoint-STEP.tmp

        def dying(directory, *a, **k):
            if directory.endswith(f"checkpoint-{args[0]}.tmp"):
                os.kill(os.getpid(), signal.SIGKILL)
            return hub_files(directory, *a, **k)
        job.save_hub_files = dying
    elif kind == "signal-in-save":
        hub_files = job.save_hub_files

        def signalling(directory, *a, **k):  # rank 0, inside checkpoint-STEP's write: SIGTERM to the agent
            if directory.endswith(f"checkpoint-{args[0]}.tmp"):
                os.kill(os.getppid(), signal.SIGTERM)
                time.sleep(1.0)  # the agent forwards it to every worker while this save is still going on
            return hub_files(directory, *a, **k)
        job.save_hub_files = signalling
    elif kind == "nan":
        step = executor.PipelineExecutor.step

        def poisoned(self, *a, **k):
            last = self.cfg.num_stages - 1
            if last in self.stages and (args[0] == "all" or self.step_index + 1 == int(args[0])):
                module = self.stages[last]
                hook = module.register_forward_hook(lambda m, i, out: {**out, "loss": out["loss"] * float("nan")})
                try:
                    return step(self, *a, **k)
                finally:
                    hook.remove()
            return step(self, *a, **k)
        executor.PipelineExecutor.step = poisoned
    elif kind == "enospc":
        save_file = checkpoint.save_file

        def full(tensors, path, *a, **k):
            if rank == int(args[0]) and f"checkpoint-{args[1]}.tmp" in path:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
            return save_file(tensors, path, *a, **k)
        checkpoint.save_file = full
    elif kind == "nccl-blind":
        blind_from(int(args[0]))
    elif kind != "none":
        raise SystemExit(f"unknown fault {fault!r}")
    trainer.main([recipe])



def blind_from(step_number: int) -> None:
    """NCCL's answer to a lost peer on gloo's run: from step ``step_number`` on (1-based) every rank blocks in the
    step as in a host read of a tensor an NCCL collective writes, which only the communicators' abort ends (gloo
    would notice a killed peer's closed sockets). The abort is the liveness thread's
    (:mod:`mpipe_hf.runtime.liveness`, on under ``MPIPE_HF_LIVENESS=1``): here it releases the wait."""
    import threading
    from mpipe_hf.runtime import executor, liveness
    released, step = threading.Event(), executor.PipelineExecutor.step
    liveness._abort_world = released.set

    def blind(self, *a, **k):
        if self.step_index + 1 >= step_number:
            released.wait()
            raise RuntimeError("NCCL communicator was aborted")
        return step(self, *a, **k)
    executor.PipelineExecutor.step = blind

# ---- runninses ----------------------------------------------------------------------------------------------

@dataclass
class Run:
    """A finished (or killed) run: exit status, combined output, seconds, whether it hung."""

    rc: int
    out: str
    seconds: float
    hung: bool


def workers(root: int) -> dict[int, int]:
    """``{rank: pid}`` of the torchrun workers below process ``root`` (read from ``/proc``)."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
        except OSError:
            continue
        if b"TORCHELASTIC_RUN_ID" not in env or b"RANK" not in env:
            continue
        parent = int(pid)
        while parent > 1:
            try:
                with open(f"/proc/{parent}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                break
            if parent == root:
                found[int(env[b"RANK"])] = int(pid)
                break
    return found


def launch(recipe: str, fault: str | None = None, restarts: int = 0,
           kill: Callable[[subprocess.Popen], None] | None = None, accelerate: bool = False) -> Run:
    """Run the recipe (``mpipe-hf train``, or the fault worker under torchrun), optionally calling ``kill(proc)``
    while it runs; a run still alive after ``LIMIT_S`` is killed and counts as a hang."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if accelerate:  # accelerate hands torchrun's PET_* settings to its launcher (docs/failures.md, "Preemption")
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(PP),
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "mpipe_hf.train",
               recipe]
        env.update(ACCELERATE_USE_CPU="1", PET_SIGNALS_TO_HANDLE=PREEMPT_SIGNALS, PET_SHUTDOWN_TIMEOUT="120")
    elif fault is None:
        cmd = [os.path.join(BIN, "mpipe-hf"), "train", recipe] + ([f"--max-restarts={restarts}"] if restarts else [])
    else:
        cmd = [os.path.join(BIN, "torchrun"), "--standalone", f"--nproc_per_node={PP}",
               f"--signals-to-handle={PREEMPT_SIGNALS}", "--shutdown-timeout=120", os.path.join(HERE, "fault_suite.py"),
               "worker", fault, recipe]
    log = tempfile.TemporaryFile(mode="w+")
    start = time.time()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    if kill is not None:
        kill(proc)
    try:
        proc.wait(timeout=max(1.0, LIMIT_S - (time.time() - start)))
        hung = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        hung = True
    log.seek(0)
    return Run(proc.returncode, log.read(), time.time() - start, hung)


def once(when: Callable[[], bool], act: Callable[[subprocess.Popen], None],
         delay_s: float = 0.0) -> Callable[[subprocess.Popen], None]:
    """A ``kill`` for :func:`launch`: ``act(proc)`` ``delay_s`` seconds after ``when()`` holds (nothing when the
    run ended before)."""
    def kill(proc):
        while not when():
            if proc.poll() is not None:
                return
            time.sleep(0.02)
        time.sleep(delay_s)
        act(proc)
    return kill


def kill_rank(rank: int, when: Callable[[], bool], delay_s: float = 0.0) -> Callable[[subprocess.Popen], None]:
    """SIGKILL worker ``rank`` ``delay_s`` seconds after ``when()`` holds (:func:`once`)."""
    def act(proc):
        pids = workers(proc.pid)
        if rank in pids:
            os.kill(pids[rank], signal.SIGKILL)
    return once(when, act, delay_s)


def rows(output_dir: str) -> list[dict]:
    path = os.path.join(output_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def weights(directory: str) -> dict:
    from safetensors.torch import load_file
    out = {}
    for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
        if name.endswith(".safetensors"):
            out.update(load_file(os.path.join(directory, name), device="cpu"))
    return out


def step_metrics(output_dir: str) -> dict[int, tuple[float, float]]:
    """``{step: (loss, grad_norm)}`` of the steps a run's ``metrics.jsonl`` logged as trained."""
    return {r["step"]: (r["loss"], r["grad_norm"]) for r in rows(output_dir) if "loss" in r}


def lost(reference: str, output_dir: str) -> tuple[int, str]:
    """``(steps lost, detail)``: the steps whose loss or gradient norm differ from the reference's, or are
    missing, bit for bit; the final weights must be equal too (else every step counts as lost)."""
    ref, got = step_metrics(reference), step_metrics(output_dir)
    bad = [s for s in ref if got.get(s) != ref[s]]
    a, b = weights(os.path.join(reference, "checkpoint")), weights(os.path.join(output_dir, "checkpoint"))
    same = bool(a) and sorted(a) == sorted(b) and all(a[k].equal(b[k]) for k in a)
    if not same:
        return len(ref), "final weights differ"
    return len(bad), ("every step's loss and grad norm and the final weights equal the uninterrupted run's" if not bad
                      else f"steps {bad} differ")
