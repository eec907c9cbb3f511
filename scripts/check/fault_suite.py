"""The fault suite of ``mpipe-hf train``: each case breaks a real run and checks that nothing hangs and nothing is
lost (README, "Failures and restarts").

    python scripts/check/fault_suite.py [--cases kill,restart,...] [--demo DIR] [--keep DIR]

Every case runs the demo model (``scripts/make/make_demo.py``) on 2 pipeline ranks (``V = 2``, ``M = 4``, 6 steps,
``save_steps: 2``) as ``mpipe-hf train`` or under ``torchrun``, and compares with an uninterrupted run of the same
recipe: every step's loss and gradient norm and the final weights, bit for bit (``disk-full``: the failed run's own
steps before its failed save). It prints one table row per case:
what happened, whether a process outlived the case's time limit (a hang), and how many steps or rows were lost.

The faults a real run cannot be made to hit on cue (a kill in the middle of a checkpoint write, a NaN in one
rank's loss, a full disk on one rank) are injected by this file's ``worker`` mode, which patches one function
in the worker process and then runs the trainer's own ``main``: ``torchrun ... scripts/check/fault_suite.py worker
FAULT RECIPE``.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fault_harness import (LIMIT_S, PP, SAVE, STEPS, Run, kill_rank, launch, lost, once, rows,  # noqa: E402
                           step_metrics, weights, worker, workers)


# ---- the cases ----------------------------------------------------------------------------------------------

@dataclass
class Outcome:
    happened: str
    hung: int
    lost: int
    passed: bool


class Suite:
    """The recipes and the uninterrupted reference runs the cases compare with (built once)."""

    def __init__(self, demo: str, work: str):
        self.demo, self.work, self.references = os.path.abspath(demo), os.path.abspath(work), {}

    def recipe(self, name: str, placement: str = "prefix", data: dict | None = None, **train) -> tuple[str, str]:
        """``(recipe path, output_dir)`` of a small run of the demo model."""
        import yaml
        out = os.path.join(self.work, name)
        raw = {"model": os.path.join(self.demo, "model"),
               "data": {"path": os.path.join(self.demo, "data", "train.jsonl"), **(data or {})},
               "parallel": {"pp_size": PP, "vpp": 2, "num_micro": 4, "preprocess": "frozen", "placement": placement,
                            "timeout_s": 60},
               "train": {"max_steps": STEPS, "learning_rate": 2e-3, "save_steps": SAVE, "output_dir": out, **train}}
        path = os.path.join(self.work, f"{name}.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(raw, f)
        return path, out

    def reference(self, placement: str) -> str:
        if placement not in self.references:
            path, out = self.recipe(f"reference-{placement}", placement)
            run = launch(path)
            if run.rc != 0:
                raise RuntimeError(f"the reference run failed:\n{run.out[-3000:]}")
            self.references[placement] = out
        return self.references[placement]


def case_kill(suite: Suite) -> Outcome:
    """SIGKILL rank 1 in the middle of step 4 (after ``checkpoint-2``); then ``resume: auto``."""
    path, out = suite.recipe("kill")
    first = launch(path, kill=kill_rank(1, lambda: any(r.get("step") == 3 for r in rows(out)), 0.3))
    named = "rank 1 was lost (SIGKILL" in first.out or "lost pipeline rank 1" in first.out
    path, _ = suite.recipe("kill", resume="auto")
    second = launch(path)
    n, detail = lost(suite.reference("prefix"), out)
    return Outcome(f"killed run exited {first.rc} after {first.seconds:.0f}s"
                   f"{', naming the lost rank' if named else ', WITHOUT naming the lost rank'}; resume: auto exited "
                   f"{second.rc}: {detail}", first.hung + second.hung, n,
                   first.rc == 1 and named and second.rc == 0 and n == 0)


def ended(pid: int) -> bool:
    """Whether process ``pid`` has ended (gone, or a zombie its parent has not reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def nccl_blind(suite: Suite, name: str, signal_name: str) -> Outcome:
    """Every rank blocked in step 4 as NCCL leaves it when a peer is lost (``nccl-blind:4``: only the abort ends
    the wait), then ``signal_name`` (``SIGKILL``: a dead rank; ``SIGSTOP``: a hung one) to rank 1: the liveness
    thread (``MPIPE_HF_LIVENESS=1``) must end every rank, within 30 s of a kill and ``timeout_s`` + 10 s of a
    stop, with one line naming rank 1."""
    path, out = suite.recipe(name)
    took = []

    def act(proc):  # signal rank 1, time rank 0's end, then let torchrun end (a stopped rank ignores its SIGTERM)
        pids = workers(proc.pid)
        if 1 not in pids or 0 not in pids:
            return
        os.kill(pids[1], getattr(signal, signal_name))
        start = time.time()
        while not ended(pids[0]) and time.time() - start < LIMIT_S / 2:
            time.sleep(0.1)
        took.append(time.time() - start)
        if signal_name == "SIGSTOP":
            os.kill(pids[1], signal.SIGKILL)
    os.environ["MPIPE_HF_LIVENESS"] = "1"
    try:
        run = launch(path, fault="nccl-blind:4", kill=once(lambda: any(r.get("step") == 3 for r in rows(out)), act,
                                                             1.0))
    finally:
        del os.environ["MPIPE_HF_LIVENESS"]
    took = took[0] if took else float("nan")
    lines = [line for line in run.out.splitlines() if "rank 1 is lost" in line]
    bound = 30.0 if signal_name == "SIGKILL" else 60 + 10.0
    return Outcome(f"{signal_name} of rank 1 in step 4: rank 0 ended {took:.1f}s later (bound {bound:.0f}s), the run "
                   f"exited {run.rc}; "
                   f"{len(lines)} line(s) naming rank 1: {lines[:1]}", int(run.hung), 0,
                   run.rc != 0 and not run.hung and took <= bound and len(lines) >= 1)


def case_restart(suite: Suite) -> Outcome:
    """SIGKILL rank 1 in the middle of step 4 under ``--max-restarts 1``, placement ``fill``."""
    path, out = suite.recipe("restart", "fill")
    run = launch(path, restarts=1, kill=kill_rank(1, lambda: any(r.get("step") == 3 for r in rows(out)), 0.3))
    resumed = "restart 1 of the worker group after a failure: resumed from" in run.out
    n, detail = lost(suite.reference("fill"), out)
    return Outcome(f"exited {run.rc} after {run.seconds:.0f}s, "
                   f"{'restarted and resumed by itself' if resumed else 'did NOT resume'}: {detail}", int(run.hung), n,
                   run.rc == 0 and resumed and n == 0)


def case_kill_in_save(suite: Suite) -> Outcome:
    """Rank 0 killed while it writes ``checkpoint-4``; ``resume: auto`` must take ``checkpoint-2``."""
    from mpipe_hf.train.state import checkpoints
    path, out = suite.recipe("kill-in-save")
    first = launch(path, fault="kill-in-save:4")
    found = [step for step, _ in checkpoints(out)]
    left = sorted(n for n in os.listdir(out) if n.endswith(".tmp"))
    path, _ = suite.recipe("kill-in-save", resume="auto")
    second = launch(path)
    took = "checkpoint-2 at step 2" in second.out
    n, detail = lost(suite.reference("prefix"), out)
    return Outcome(f"killed mid-save (exit {first.rc}); complete checkpoints {found}, partial {left} ignored; resume "
                   f"took checkpoint-2: {took}; {detail}", first.hung + second.hung, n,
                   first.rc != 0 and found == [2] and took and second.rc == 0 and n == 0)


def signal_launcher(name: str, when: Callable[[], bool], delay_s: float = 0.0) -> Callable[[subprocess.Popen], None]:
    """Signal ``name`` to the launcher (``mpipe-hf train``) ``delay_s`` seconds after ``when()`` holds, as a
    cluster's scheduler does at a job's time limit (:func:`once`)."""
    def act(proc):
        if proc.poll() is None:
            os.kill(proc.pid, getattr(signal, name))
    return once(when, act, delay_s)


@dataclass
class Preempted:
    """A preempted run and its resume: the first run, its one preemption line ("" when none), the complete
    checkpoints it left, whether a worker failed, the resumed run, and the steps lost against the reference."""

    first: Run
    line: str
    found: list[int]
    failed: bool
    second: Run
    lost: int
    detail: str

    def outcome(self, ok: bool, said: str) -> Outcome:
        return Outcome(f"{said}{self.line[:90] or 'NO preemption line'}; checkpoints {self.found}; resume: "
                       f"{self.detail}", self.first.hung + self.second.hung, self.lost, ok)


def preempt_and_resume(suite: Suite, name: str, signal_name: str, **how) -> Preempted:
    """Run recipe ``name`` as ``launch(**how)`` sends ``signal_name``, then ``resume: auto``; compare with the
    uninterrupted run. A worker failure is a ``ChildFailedError``, an ``exitcode`` line or an ``mpipe-hf: error``
    (a signalled torchrun agent then ends with its own SignalException: torchrun's behaviour, not the run's)."""
    from mpipe_hf.train.state import checkpoints
    path, out = suite.recipe(name)
    if "kill" in how:
        how["kill"] = how["kill"](out)
    first = launch(path, **how)
    line = next((ln for ln in first.out.splitlines() if f"preempted by {signal_name}" in ln), "")
    found = [step for step, _ in checkpoints(out)]
    failed = any(words in first.out for words in ("ChildFailedError", "exitcode", "mpipe-hf: error"))
    path, _ = suite.recipe(name, resume="auto")
    second = launch(path)
    n, detail = lost(suite.reference("prefix"), out)
    return Preempted(first, line, found, failed, second, n, detail)


def mid_step_four(name: str):
    """``kill`` for :func:`preempt_and_resume`: signal ``name`` to the launcher in the middle of step 4."""
    return lambda out: signal_launcher(name, lambda: any(r.get("step") == 3 for r in rows(out)), 0.3)


def case_preempt(suite: Suite) -> Outcome:
    """SIGTERM to ``mpipe-hf train`` in the middle of step 4: every rank finishes its step, a checkpoint is
    saved, the run exits 0 with one line naming it; ``resume: auto`` then ends exactly as the uninterrupted run."""
    p = preempt_and_resume(suite, "preempt", "SIGTERM", kill=mid_step_four("SIGTERM"))
    # the step the signal lands in depends on the load (on 2 busy cores: step 6): any from 4 on, saved and named
    ok = p.first.rc == 0 and bool(p.line) and p.found and p.found[-1] >= 4 and p.second.rc == 0 and p.lost == 0
    return p.outcome(ok, f"exited {p.first.rc} after {p.first.seconds:.0f}s: ")


def case_preempt_in_save(suite: Suite) -> Outcome:
    """SIGTERM to the agent of a plain ``torchrun`` while rank 0 writes ``checkpoint-4``: the write finishes, the
    run stops there (no second save), every worker exits 0; the resume is exact."""
    p = preempt_and_resume(suite, "preempt-in-save", "SIGTERM", fault="signal-in-save:4")
    ok = bool(p.line) and p.found == [2, 4] and not p.failed and p.second.rc == 0 and p.lost == 0
    return p.outcome(ok, "")


def case_preempt_accelerate(suite: Suite) -> Outcome:
    """SIGUSR1 (SLURM's ``--signal=USR1@N``) to ``accelerate launch -m mpipe_hf.train`` in the middle of step 4:
    the workers finish the step, save ``checkpoint-4`` and exit 0; the resume is exact."""
    p = preempt_and_resume(suite, "preempt-accelerate", "SIGUSR1", accelerate=True, kill=mid_step_four("SIGUSR1"))
    ok = bool(p.line) and not p.failed and p.found and p.found[-1] in (4, 5) and p.second.rc == 0 and p.lost == 0
    return p.outcome(ok, "")


def case_nan(suite: Suite) -> Outcome:
    """The last stage's loss is NaN at step 3: skipped on every rank, no optimizer step, reported."""
    path, out = suite.recipe("nan", save_steps=1)
    run = launch(path, fault="nan:3")
    row = next((r for r in rows(out) if r.get("step") == 3), {})
    a, b = weights(os.path.join(out, "checkpoint-2")), weights(os.path.join(out, "checkpoint-3"))
    unchanged = bool(a) and all(a[k].equal(b[k]) for k in a)
    ran = [r["step"] for r in rows(out) if "loss" in r]
    ok = run.rc == 0 and row.get("skipped") is True and unchanged and ran == [1, 2, 4, 5, 6]
    return Outcome(f"exited {run.rc}; step 3 {'skipped' if row.get('skipped') else 'NOT skipped'} "
                   f"({row.get('error', '')[:60]}); weights after step 3 {'unchanged' if unchanged else 'CHANGED'}; "
                   f"steps that ran {ran}", int(run.hung), 0 if ok else 1, ok)


def case_nan_always(suite: Suite) -> Outcome:
    """Every step's loss is NaN: the run stops after ``max_bad_rows`` (2) skipped steps in a row with a clear
    message."""
    path, out = suite.recipe("nan-always", data={"max_bad_rows": 2})
    run = launch(path, fault="nan:all")
    line = next((ln for ln in run.out.splitlines() if ln.startswith("mpipe-hf: error:")), "")
    ok = run.rc == 1 and "not finite" in line and "max_bad_rows" in line
    return Outcome(f"exited {run.rc}: {line[:110]}", int(run.hung), 0, ok)


def case_disk_full(suite: Suite) -> Outcome:
    """Rank 1's shard write of ``checkpoint-4`` fails with ENOSPC: every rank stops with that error, and
    ``checkpoint-2`` stays complete. A resume from it repeats steps 3 and 4 bit for bit: the failed run's own,
    logged before the save (the run was uninterrupted until then), so this case needs no reference run."""
    from mpipe_hf.train.state import checkpoints
    path, out = suite.recipe("disk-full", max_steps=4)
    first = launch(path, fault="enospc:1:4")
    line = next((ln for ln in first.out.splitlines() if ln.startswith("mpipe-hf: error:")), "")
    found = [step for step, _ in checkpoints(out)]
    left = sorted(n for n in os.listdir(out) if n.endswith(".tmp"))
    before = step_metrics(out)
    path, _ = suite.recipe("disk-full", max_steps=4, resume="auto")
    second = launch(path)
    after = step_metrics(out)
    bad = [step for step in (3, 4) if after.get(step) is None or after[step] != before.get(step)]
    ok = (first.rc == 1 and "No space left on device" in line and found == [2] and not left and second.rc == 0
          and sorted(before) == [1, 2, 3, 4] and not bad)
    detail = "steps 3 and 4 equal the failed run's, bit for bit" if not bad else f"steps {bad} differ"
    return Outcome(f"exited {first.rc} after {first.seconds:.0f}s: {line[16:100]}...; checkpoints {found}, "
                   f"partial {left}; resume (exit {second.rc}): {detail}", first.hung + second.hung, len(bad), ok)


def case_not_writable(suite: Suite) -> Outcome:
    """``output_dir`` below a regular file: a ValueError naming ``train.output_dir`` before any process."""
    blocker = os.path.join(suite.work, "a-file")
    open(blocker, "w").close()
    path, _ = suite.recipe("not-writable", output_dir=os.path.join(blocker, "run"))
    run = launch(path)
    line = next((ln for ln in run.out.splitlines() if ln.startswith("mpipe-hf: error:")), "")
    ok = run.rc != 0 and "train.output_dir" in line and "Traceback" not in run.out
    return Outcome(f"exited {run.rc} after {run.seconds:.0f}s: {line[:110]}", int(run.hung), 0, ok)


def bad_rows(demo: str, work: str) -> dict[str, dict]:
    """One bad row of each kind, with the images it needs written into ``work``."""
    from PIL import Image
    images = os.path.join(demo, "data", "images")
    good = sorted(os.listdir(images))[0]
    corrupt = os.path.join(work, "corrupt.png")
    with open(os.path.join(images, good), "rb") as f:
        data = f.read()
    with open(corrupt, "wb") as f:
        f.write(data[: len(data) // 3])  # a truncated file: the header reads, the pixels do not
    huge = os.path.join(work, "huge.png")
    Image.new("RGB", (40000, 8), "white").save(huge)  # an aspect ratio the processor refuses
    user = lambda text: {"role": "user", "content": text}  # noqa: E731
    reply = {"role": "assistant", "content": "A photo."}
    return {
        "corrupt image": {"messages": [user("<image>Describe it."), reply], "images": [corrupt]},
        "missing image": {"messages": [user("<image>Describe it."), reply], "images": [os.path.join(work, "no.png")]},
        "image over the processor's limit": {"messages": [user("<image>Describe it."), reply], "images": [huge]},
        "empty text": {"messages": [user("   "), {"role": "assistant", "content": ""}]},
        "no assistant turn": {"messages": [user("Hello?")]},
        "row over max_length": {"messages": [user("word " * 400), reply]},
    }


def case_bad_rows(suite: Suite) -> list[tuple[str, Outcome]]:
    """Each bad row, appended to the demo's data: a clear outcome (an error naming the line before training,
    or the row dropped with a warning, before training or from its step, which trains on the rest), never a hang
    or a traceback."""
    results = []
    source = os.path.join(suite.demo, "data", "train.jsonl")
    with open(source) as f:
        lines = [line for line in f if line.strip()]
    for name, row in bad_rows(suite.demo, suite.work).items():
        data = os.path.join(suite.demo, "data", f"fault-{name.replace(' ', '_')}.jsonl")
        with open(data, "w") as f:
            f.writelines(lines[:7] + [json.dumps(row) + "\n"])  # the bad row is line 8: step 2's last micro
        path, out = suite.recipe(f"row-{name.replace(' ', '_')}", data={"path": data, "max_length": 256,
                                                                         "shuffle": False}, max_steps=2,
                                 save_steps=0)
        run = launch(path)
        said = [ln for ln in run.out.splitlines() if ln.startswith(("mpipe-hf: error:", "mpipe_hf: warning:"))]
        skipped = [r["step"] for r in rows(out) if r.get("skipped")]
        ran = [r["step"] for r in rows(out) if "loss" in r]
        clear = bool(said) and "Traceback" not in run.out
        named = any(":8" in ln or "line 8" in ln or "row" in ln for ln in said)
        happened = (f"exited {run.rc}; steps ran {ran}, skipped {skipped}; " + (said[0][:100] if said else "SILENT"))
        # nothing lost: the good rows of every step either trained, or the run stopped before any step
        ok = clear and named and not run.hung and (ran == [1, 2] or ran == [1] and skipped == [2] or run.rc == 1
                                                     and not ran)
        results.append((name, Outcome(happened, int(run.hung), 0 if ok else 1, ok)))
        os.remove(data)
    return results


def case_recipe_keys(suite: Suite) -> Outcome:
    """The recipe schema table (``tests/test_recipe_schema.py``): every key with a wrong type or value."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           os.path.join(ROOT, "tests", "test_recipe_schema.py")], capture_output=True, text=True,
                          timeout=LIMIT_S, cwd=ROOT)
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-200:]
    return Outcome(f"table test: {last}", 0, 0, proc.returncode == 0)


CASES = {"kill": case_kill, "restart": case_restart, "kill-in-save": case_kill_in_save, "preempt": case_preempt,
         "preempt-in-save": case_preempt_in_save, "preempt-accelerate": case_preempt_accelerate, "nan": case_nan,
         "nan-always": case_nan_always, "disk-full": case_disk_full, "not-writable": case_not_writable,
         "bad-rows": case_bad_rows, "recipe-keys": case_recipe_keys,
         "nccl-kill": lambda suite: nccl_blind(suite, "nccl-kill", "SIGKILL"),
         "nccl-stop": lambda suite: nccl_blind(suite, "nccl-stop", "SIGSTOP")}


def run_cases(names: list[str], demo: str | None = None, work: str | None = None) -> list[tuple[str, Outcome]]:
    """Run the named cases (every case when empty); return ``[(case, outcome)]``."""
    work = work or tempfile.mkdtemp(prefix="mpipe_faults_")
    if demo is None:
        demo = os.path.join(work, "demo")
        if not os.path.isdir(os.path.join(demo, "model")):
            runpy.run_path(os.path.join(ROOT, "scripts", "make", "make_demo.py"))["main"]([demo])
    suite = Suite(demo, work)
    results = []
    for name in names or list(CASES):
        outcome = CASES[name](suite)
        for item in outcome if isinstance(outcome, list) else [(name, outcome)]:
            results.append(item if isinstance(outcome, list) else (name, outcome))
            print(f"{results[-1][0]:>34}: {'PASS' if results[-1][1].passed else 'FAIL'}  {results[-1][1].happened}",
                  flush=True)
    return results


def table(results: list[tuple[str, Outcome]]) -> str:
    lines = ["| case | what happened | hangs | steps or rows lost | result |", "|---|---|---|---|---|"]
    for name, o in results:
        lines.append(f"| {name} | {o.happened.replace('|', '/')} | {o.hung} | {o.lost} | "
                     f"{'pass' if o.passed else 'FAIL'} |")
    hangs, lost_total = sum(o.hung for _, o in results), sum(o.lost for _, o in results)
    lines.append(f"\n{len(results)} cases, {sum(o.passed for _, o in results)} passed; hangs {hangs}; "
                 f"steps or rows lost {lost_total}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if args[:1] == ["worker"]:
        worker(args[1], args[2])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="", help=f"comma-separated, from {list(CASES)}; all by default")
    parser.add_argument("--demo", help="a built demo directory (scripts/make/make_demo.py DIR); built in a temp dir")
    parser.add_argument("--keep", help="run in this directory and keep it (default: a temporary one, removed)")
    opts = parser.parse_args(args)
    names = [n for n in opts.cases.split(",") if n]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        parser.error(f"unknown cases {unknown}; choose from {list(CASES)}")
    work = opts.keep or tempfile.mkdtemp(prefix="mpipe_faults_")
    os.makedirs(work, exist_ok=True)
    start = time.time()
    try:
        results = run_cases(names, opts.demo, work)
    finally:
        if not opts.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(table(results))
    print(f"({time.time() - start:.0f}s)")
    return 0 if all(o.passed for _, o in results) else 1


if __name__ == "__main__":
    sys.exit(main())
