"""A checkpoint written by an older commit resumes with this tree, bit for bit.

Usage:
    python scripts/check/resume_across_commits.py OLD_COMMIT [--demo demo] [--out /tmp/resume_across]

The older commit (a ``git worktree`` of it, imported in place of this tree's editable install) trains the demo
model 4 steps with ``save_steps: 2``: the reference. This tree then resumes from a copy of that run's
``checkpoint-2`` and trains steps 3 and 4. The script prints each step's loss and gradient norm from both, and
exits 1 unless they and the final weights are equal bit for bit. It then loads the older run's final checkpoint
with this tree (``from_pretrained`` and :func:`mpipe_hf.data.load_checkpoint_processor`). Use it after a change
that moves code a checkpoint could name (module paths, class names).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SITE = """import sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path.insert(0, {tree!r})
"""  # every process of the older run (the launcher's children too) imports the older tree


def recipe(demo: str, path: str, output_dir: str, parallel: dict | None = None, **train) -> str:
    """The demo's recipe of these checks (pp 2, vpp 2, 4 micro-batches, a trainable tower, 4 steps saved at step
    2), ``parallel``'s keys over its ``parallel`` section and ``train``'s over its ``train``; written to ``path``."""
    import yaml
    raw = {"model": os.path.join(demo, "model"),
           "data": {"path": os.path.join(demo, "data", "train.jsonl"), "micro_batch_size": 1},
           "parallel": {"pp_size": 2, "vpp": 2, "num_micro": 4, "preprocess": "trainable", "timeout_s": 300,
                        **(parallel or {})},
           "train": {"max_steps": 4, "learning_rate": 2e-3, "save_steps": 2, "output_dir": output_dir, **train}}
    with open(path, "w") as f:
        yaml.safe_dump(raw, f)
    return path


def train(path: str, site: str | None = None) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if site is not None:
        env["PYTHONPATH"] = site
    code = "from mpipe_hf.cli import main; main()"
    proc = subprocess.run([sys.executable, "-c", code, "train", path], capture_output=True, text=True, env=env,
                          timeout=1200, cwd=ROOT if site is None else os.path.dirname(path))
    if proc.returncode != 0:
        sys.exit(f"training failed ({'older commit' if site else 'this tree'}):\n{proc.stderr[-3000:]}")


def weights(directory: str) -> dict:
    from safetensors.torch import load_file
    out = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith(".safetensors"):
            out.update(load_file(os.path.join(directory, name), device="cpu"))
    return out


def older_run(commit: str, demo: str, out: str) -> str:
    """The reference run of the older commit; returns its output directory."""
    tree, site = os.path.join(out, "tree"), os.path.join(out, "site")
    subprocess.run(["git", "-C", ROOT, "worktree", "add", "--force", "--detach", tree, commit], check=True,
                   capture_output=True)
    os.makedirs(site)
    with open(os.path.join(site, "sitecustomize.py"), "w") as f:
        f.write(SITE.format(tree=tree))
    run = os.path.join(out, "older")
    train(recipe(demo, os.path.join(out, "older.yaml"), run), site)
    subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", tree], check=True, capture_output=True)
    return run


def compare(older: str, resumed: str) -> list[str]:
    """Each step's figures, and what differs (empty: bit for bit)."""
    a = [json.loads(r) for r in open(os.path.join(older, "metrics.jsonl"))]
    b = [json.loads(r) for r in open(os.path.join(resumed, "metrics.jsonl"))]
    problems = []
    for x, y in zip(a, b):
        same = (x["loss"], x["grad_norm"]) == (y["loss"], y["grad_norm"])
        print(f"step {x['step']}: loss {x['loss']!r} / {y['loss']!r}, grad norm {x['grad_norm']!r} / "
              f"{y['grad_norm']!r}  {'equal' if same else 'DIFFERENT'}")
        problems += [] if same else [f"step {x['step']}"]
    wa, wb = weights(os.path.join(older, "checkpoint")), weights(os.path.join(resumed, "checkpoint"))
    differ = sorted(k for k in wa if k not in wb or not wa[k].equal(wb[k]))
    print(f"final weights: {len(wa) - len(differ)} of {len(wa)} tensors equal")
    return problems + differ


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("commit", help="the older commit whose checkpoint this tree resumes")
    parser.add_argument("--demo", default=os.path.join(ROOT, "demo"), help="the demo folder (make_demo.py's)")
    parser.add_argument("--out", default="/tmp/resume_across", help="a scratch folder (emptied first)")
    args = parser.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    os.makedirs(args.out)
    older = older_run(args.commit, os.path.abspath(args.demo), args.out)
    resumed = os.path.join(args.out, "resumed")
    os.makedirs(resumed)
    shutil.copytree(os.path.join(older, "checkpoint-2"), os.path.join(resumed, "checkpoint-2"))
    rows = open(os.path.join(older, "metrics.jsonl")).read().splitlines()
    with open(os.path.join(resumed, "metrics.jsonl"), "w") as f:
        f.write("\n".join(rows[:2]) + "\n")
    train(recipe(os.path.abspath(args.demo), os.path.join(args.out, "resumed.yaml"), resumed, resume="auto"))
    problems = compare(older, resumed)
    from transformers import AutoModelForImageTextToText

    from mpipe_hf.data import load_checkpoint_processor
    final = os.path.join(older, "checkpoint")
    model = AutoModelForImageTextToText.from_pretrained(final)
    processor = load_checkpoint_processor(final)
    print(f"the older run's checkpoint loads here: {type(model).__name__}, {type(processor).__name__}")
    if problems:
        sys.exit(f"resume across commits is not exact: {problems[:5]}")
    print("resume across commits: bit for bit")


if __name__ == "__main__":
    main()
