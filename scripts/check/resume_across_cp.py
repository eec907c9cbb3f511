"""A checkpoint does not depend on ``parallel.cp_size``: written at cp 1 or 2, it resumes at either.

Usage: python scripts/check/resume_across_cp.py [--demo demo] [--out DIR]

Trains the demo Qwen2.5-VL (trainable tower, pp 2, vpp 2, 4 micro-batches, shuffled rows, fp32) through ``mpipe-hf
train`` for 4 steps with ``save_steps: 2`` at cp 1 and at cp 2, then checks, printing a line for each:

1. **The same state, written at either cp:** the two ``checkpoint-2`` directories hold the same files, the same
   tensor names, shapes, dtypes and safetensors metadata, and the same training state (the step, the skips, the LR
   schedule, the optimizer's parameter names and hyperparameters, every RNG state bit for bit); their weights and
   AdamW moments differ only by the rounding of the two runs' sums (printed).
2. **Loaded at the other cp, the state is restored bit for bit:** each ``checkpoint-2``, loaded by the trainer's own
   path (:class:`~mpipe_hf.train.job.RecipeJob`: the weights, the optimizer, the schedule, the RNG states, the
   skips and the step) at the other ``cp_size`` and saved again at once, gives the same weight files byte for byte
   and the same ``rank<r>_state.pt`` contents bit for bit. Its RNG states are drawn from first
   (:func:`with_drawn_rng`), so that a load that left the seed's in place would fail. (The data position is the
   step: the rows of step ``k`` come from the seeded plan of the ``dp`` replica, which every CP rank of it shares.)
3. **At the same cp, a resume is the uninterrupted run:** cp 2 resumed from its own ``checkpoint-2`` gives steps 3
   and 4 with the same losses and gradient norms, and the same final weights, bit for bit.
4. **At another cp, a resume continues from the saved state:** cp 1 resumed from cp 2's ``checkpoint-2`` (and cp 2
   from cp 1's) starts from exactly that state (2.), so its step 3 is the step the uninterrupted other-cp run took
   from it, but for the rounding of context parallelism's sums: its loss and gradient norm within ``1e-5`` of
   theirs (relative; the tolerance of ``context_parallel_trainer.py``'s first step, whose weights are also the
   same), step 4 within ``1e-4``, the learning rates equal, and the final weights within 1% of one AdamW step.

Exit status 1 when any check fails. Not in CI (8 runs of 2 to 4 processes; about 10 minutes on 2 CPU cores):
``tests/test_resume.py`` resumes a cp 1 checkpoint at cp 2 with another layout, and its same-layout resume is
bit for bit at cp 1.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from resume_across_commits import recipe, weights  # noqa: E402  (the same demo recipe, its weights read alike)
LR = 2e-3  # the recipe's learning rate
RUN_FILES = ("trainer_state.json", "recipe.yaml")  # name the run (its output_dir, cp_size and its log), not its state


def run(command: list[str], what: str) -> None:
    """Run ``command``; raise RuntimeError with its last output lines when it fails."""
    proc = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed:\n" + "\n".join((proc.stdout + proc.stderr).splitlines()[-20:]))


def train(demo: str, work: str, name: str, cp: int, **train_keys) -> str:
    """``mpipe-hf train`` of one recipe; its output directory."""
    out = os.path.join(work, name)
    path = recipe(demo, os.path.join(work, f"{name}.yaml"), out, {"cp_size": cp}, **train_keys)
    run([sys.executable, "-m", "mpipe_hf.cli", "train", path], name)
    return out


def resave(demo: str, work: str, name: str, cp: int, checkpoint: str) -> str:
    """Load ``checkpoint`` at ``cp`` through the trainer's own set-up and save it again at once, as
    ``<out>/checkpoint-<step>``; the new directory."""
    out = os.path.join(work, name)
    path = recipe(demo, os.path.join(work, f"{name}.yaml"), out, {"cp_size": cp}, resume=checkpoint)
    run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={2 * cp}",
         os.path.abspath(__file__), "--resave-worker", path], name)
    return os.path.join(out, os.path.basename(checkpoint))


def with_drawn_rng(checkpoint: str, copy: str) -> str:
    """A copy of ``checkpoint`` whose rank states' RNG states are drawn from (torch, Python and NumPy): nothing in
    these runs draws from the global generators, so their saved states are the seed's, which a load that skipped
    them would also leave; drawn from, they tell a restored state from a fresh one. Returns ``copy``."""
    import random
    import shutil

    import torch

    from mpipe_hf.train.state import rng_states, set_rng_states
    shutil.copytree(checkpoint, copy)
    kept = rng_states()
    for path in sorted(glob.glob(os.path.join(copy, "rank*_state.pt"))):
        state = torch.load(path, map_location="cpu", weights_only=False)
        set_rng_states(state["rng"])
        torch.rand(3), random.random(), np.random.rand()
        state["rng"] = rng_states()
        torch.save(state, path)
    set_rng_states(kept)
    return copy


def resave_worker(path: str) -> None:
    """One process of :func:`resave`: the trainer's set-up (the weights, then the optimizer, the schedule, the RNG
    states, the skips and the step from the checkpoint), then the checkpoint's save at the step it resumed at."""
    from mpipe_hf.train.job import RecipeJob
    from mpipe_hf.train.recipe import load_recipe
    from mpipe_hf.train.trainer import check
    recipe = load_recipe(path)
    job = RecipeJob(recipe, check(recipe))
    job.save(job.start_step)
    job.run.close()


def metadata(directory: str) -> dict:
    """``{file: (its safetensors metadata, {tensor: (dtype, shape)})}``."""
    from safetensors import safe_open
    out = {}
    for shard in sorted(glob.glob(os.path.join(directory, "*.safetensors"))):
        with safe_open(shard, "pt", device="cpu") as f:
            out[os.path.basename(shard)] = (f.metadata(), {k: (str(f.get_slice(k).get_dtype()),
                                                               tuple(f.get_slice(k).get_shape())) for k in f.keys()})
    return out


def states(directory: str) -> dict:
    import torch
    return {os.path.basename(p): torch.load(p, map_location="cpu", weights_only=False)
            for p in sorted(glob.glob(os.path.join(directory, "rank*_state.pt")))}


def differences(a, b, where: str = "", floats: bool = False) -> tuple[list[str], float]:
    """``(where a and b differ, the largest difference of their float tensors)``: bit for bit everywhere, or with
    ``floats`` the float tensors compared by value (their largest difference returned) and the rest bit for bit."""
    import torch
    if isinstance(a, dict) and isinstance(b, dict):
        if sorted(a, key=str) != sorted(b, key=str):
            return [f"{where}: keys {sorted(set(a) ^ set(b), key=str)[:4]}"], 0.0
        found, worst = [], 0.0
        for key in a:
            more, diff = differences(a[key], b[key], f"{where}/{key}", floats)
            found, worst = found + more, max(worst, diff)
        return found, worst
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{where}: lengths {len(a)} and {len(b)}"], 0.0
        found, worst = [], 0.0
        for i, (x, y) in enumerate(zip(a, b)):
            more, diff = differences(x, y, f"{where}[{i}]", floats)
            found, worst = found + more, max(worst, diff)
        return found, worst
    if torch.is_tensor(a) and torch.is_tensor(b):
        if a.dtype != b.dtype or a.shape != b.shape:
            return [f"{where}: {a.dtype}{tuple(a.shape)} and {b.dtype}{tuple(b.shape)}"], 0.0
        if floats and a.is_floating_point():
            return [], float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
        return ([] if torch.equal(a, b) else [f"{where}: tensors differ"]), 0.0
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return ([] if a.dtype == b.dtype and np.array_equal(a, b) else [f"{where}: arrays differ"]), 0.0
    return ([] if type(a) is type(b) and a == b else [f"{where}: {a!r:.60} and {b!r:.60}"]), 0.0


def files(directory: str) -> list[str]:
    return sorted(os.listdir(directory))


def same_state(one: str, two: str) -> tuple[list[str], float, float]:
    """Check 1: ``(what differs beyond float rounding, the largest weight and optimizer-state differences)``."""
    found = [] if files(one) == files(two) else [f"files {sorted(set(files(one)) ^ set(files(two)))}"]
    if metadata(one) != metadata(two):
        found.append("safetensors names, dtypes, shapes or metadata")
    for name in files(one):
        if name.endswith((".json", ".jinja", ".txt")) and name not in RUN_FILES and name in files(two):
            if open(os.path.join(one, name), "rb").read() != open(os.path.join(two, name), "rb").read():
                found.append(name)
    more, weight = differences(weights(one), weights(two), "weights", floats=True)
    sa, sb = states(one), states(two)
    state, moments = differences({f: {k: v for k, v in s.items() if k != "optimizer"} for f, s in sa.items()},
                                 {f: {k: v for k, v in s.items() if k != "optimizer"} for f, s in sb.items()},
                                 "state")
    opt, moment = differences({f: s["optimizer"] for f, s in sa.items()}, {f: s["optimizer"] for f, s in sb.items()},
                              "optimizer", floats=True)
    return found + more + state + opt, weight, max(moments, moment)


def restored(saved: str, again: str) -> list[str]:
    """Check 2: what differs, bit for bit, between a checkpoint and its re-save at another cp."""
    found = [] if files(saved) == files(again) else [f"files {sorted(set(files(saved)) ^ set(files(again)))}"]
    for name in files(saved):
        if name not in RUN_FILES and not name.endswith(".pt") and name in files(again):
            if open(os.path.join(saved, name), "rb").read() != open(os.path.join(again, name), "rb").read():
                found.append(name)
    return found + differences(states(saved), states(again), "state")[0]


def metrics(out: str) -> list[dict]:
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def continued(reference: list[dict], resumed: list[dict], tolerances: tuple[float, ...] = (0.0, 0.0)) -> list[str]:
    """Checks 3 and 4: steps 3 and 4 of ``resumed`` against ``reference``'s, step ``3 + i`` within
    ``tolerances[i]`` of its size (0: bit for bit)."""
    found = [] if [r["step"] for r in resumed] == [3, 4] else [f"steps {[r['step'] for r in resumed]}"]
    for a, b, tol in zip(reference[2:], resumed, tolerances):
        for key in ("loss", "grad_norm"):
            if abs(a[key] - b[key]) > tol * abs(a[key]):
                found.append(f"step {a['step']} {key} {a[key]!r} and {b[key]!r}")
        if a["learning_rate"] != b["learning_rate"]:
            found.append(f"step {a['step']} learning rate")
    return found


def report(label: str, found: list[str], extra: str = "") -> bool:
    print(f"{'OK' if not found else 'FAILED'}: {label}{extra}" + "".join(f"\n    {f}" for f in found[:8]), flush=True)
    return not found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo", default=os.path.join(ROOT, "demo"))
    parser.add_argument("--out", default=None, help="keep the runs here (default: a temporary folder)")
    parser.add_argument("--resave-worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.resave_worker is not None:
        resave_worker(args.resave_worker)
        return 0
    demo = os.path.abspath(args.demo)
    with tempfile.TemporaryDirectory() as tmp:
        work = args.out or tmp
        os.makedirs(work, exist_ok=True)
        full = {cp: train(demo, work, f"full-cp{cp}", cp) for cp in (1, 2)}
        ckpt = {cp: os.path.join(full[cp], "checkpoint-2") for cp in (1, 2)}
        found, weight, moment = same_state(ckpt[1], ckpt[2])
        ok = report("checkpoint-2 of cp 1 and of cp 2 hold the same files, names, metadata and training state",
                    found, f"; weights within {weight:.2e}, AdamW moments within {moment:.2e} (the runs' rounding)")
        for cp, other in ((1, 2), (2, 1)):
            drawn = with_drawn_rng(ckpt[cp], os.path.join(work, f"drawn-cp{cp}", "checkpoint-2"))
            again = resave(demo, work, f"resave-cp{cp}-at-cp{other}", other, drawn)
            ok &= report(f"cp {cp}'s checkpoint-2 (its RNG states drawn from) loaded at cp {other} and saved again: "
                         f"the same weight files byte for byte and the same rank states bit for bit",
                         restored(drawn, again))
        same = train(demo, work, "resume-cp2-at-cp2", 2, resume=ckpt[2])
        wa, wb = weights(os.path.join(full[2], "checkpoint")), weights(os.path.join(same, "checkpoint"))
        ok &= report("cp 2 resumed at cp 2: steps 3 and 4 and the final weights bit for bit",
                     continued(metrics(full[2]), metrics(same)) + differences(wa, wb, "weights")[0])
        for cp, other in ((2, 1), (1, 2)):
            moved = train(demo, work, f"resume-cp{cp}-at-cp{other}", other, resume=ckpt[cp])
            ref, got = metrics(full[cp]), metrics(moved)
            wa, wb = weights(os.path.join(full[cp], "checkpoint")), weights(os.path.join(moved, "checkpoint"))
            found, worst = differences(wa, wb, "weights", floats=True)
            found += continued(ref, got, (1e-5, 1e-4)) + ([f"weights {worst:.2e}"] if worst > LR / 100 else [])
            steps = "; ".join(f"step {a['step']} loss {a['loss']:.8f} / {b['loss']:.8f}, grad norm "
                              f"{a['grad_norm']:.6f} / {b['grad_norm']:.6f}" for a, b in zip(ref[2:], got))
            ok &= report(f"cp {cp}'s checkpoint-2 resumed at cp {other} continues the cp {cp} run", found,
                         f" ({steps}; final weights within {worst:.2e})")
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
