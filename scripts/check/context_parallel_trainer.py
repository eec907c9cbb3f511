"""Train the demo Qwen2.5-VL (frozen tower, pp 2, fp32) through ``mpipe-hf train`` at ``cp_size`` 1 and 2, each from
the same seed and rows, and compare: every step's loss and gradient norm (``metrics.jsonl``), the saved checkpoint's
tensors, and each rank's peak saved activations (cp 2 over cp 1). Prints one line per step and a verdict.

Usage: python scripts/check/context_parallel_trainer.py [--steps N] [--dp D] [--demo DIR] [--tol T]

``--dp 2``: both runs with 2 pipeline replicas under FSDP2 (``2 x 2`` and ``2 x 2 x 2`` processes), the cp run's
FSDP2 over the flattened ``dp x cp`` ranks.

Needs ``python scripts/make/make_demo.py demo``. Not in CI (2 + 4 processes; about 3 minutes on 2 CPU cores):
``tests/test_numerics.py::test_context_parallel_equals_one_process`` checks the executor at cp 2 x pp 2 against one
process. Exit status 1 when the first step's loss or gradient norm differs by more than ``--tol`` of its size
(default 1e-5: the CP ranks' gradients are summed in another order), a later step's by more than ``10 * tol`` (its
weights already differ a little), or a saved weight by more than 1% of one AdamW step (``LR / 100``: Adam divides
each element's gradient by its own running size, so a rounding difference in a gradient near zero moves that
element's update by more than its relative size).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

LR = 5.0e-3
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from resume_across_commits import weights  # noqa: E402  (a checkpoint's tensors, read as the resume check does)


def recipe_text(demo: str, cp: int, steps: int, out: str, dp: int = 1) -> str:
    """The recipe of one run: the demo model and rows, pp 2, 4 micro-batches, ``dp`` replicas of ``cp``
    context-parallel ranks."""
    return f"""model: {demo}/model
data:
  path: {demo}/data/train.jsonl
  micro_batch_size: 1
  min_pixels: 3136
  max_pixels: 12544
parallel:
  pp_size: 2
  vpp: 1
  num_micro: 4
  preprocess: frozen
  cp_size: {cp}
  dp_size: {dp}
train:
  max_steps: {steps}
  learning_rate: {LR}
  output_dir: {out}
"""


def run_recipe(path: str, out: str, work: str, name: str) -> tuple[list[dict], dict]:
    """``mpipe-hf train`` on the recipe at ``path`` (its ``output_dir`` ``out``), from ``work``: its metrics rows and
    its checkpoint's tensors. Raises RuntimeError, naming the run ``name``, with its last output lines when it
    fails."""
    proc = subprocess.run([sys.executable, "-m", "mpipe_hf.cli", "train", path], capture_output=True, text=True,
                          cwd=work, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed:\n" + "\n".join((proc.stdout + proc.stderr).splitlines()[-15:]))
    with open(os.path.join(out, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return rows, weights(os.path.join(out, "checkpoint"))


def weight_gap(one: dict, two: dict) -> float | None:
    """The largest absolute difference between two runs' checkpoint tensors of the same names; ``None``, with a
    FAILED line printed, where the checkpoints hold different names."""
    if sorted(one) != sorted(two):
        print("FAILED: the checkpoints hold different tensors")
        return None
    return max(float((one[k].float() - two[k].float()).abs().max()) for k in one)


def train(demo: str, cp: int, steps: int, work: str, dp: int = 1) -> tuple[list[dict], dict]:
    """Run one recipe; its metrics rows and its checkpoint's tensors. Raises RuntimeError with the run's last
    output lines when it fails."""
    out = os.path.join(work, f"cp{cp}")
    path = os.path.join(work, f"cp{cp}.yaml")
    with open(path, "w") as f:
        f.write(recipe_text(demo, cp, steps, out, dp))
    return run_recipe(path, out, work, f"cp_size {cp}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--demo", default=os.path.join(ROOT, "demo"))
    parser.add_argument("--tol", type=float, default=1e-5)
    parser.add_argument("--dp", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        (one, weights_one), (two, weights_two) = (train(os.path.abspath(args.demo), cp, args.steps, work, args.dp)
                                                  for cp in (1, 2))
    worst = 0.0
    for a, b in zip(one, two):  # in units of the step's tolerance: the first step's weights are the same
        scale = args.tol if a["step"] == 1 else 10 * args.tol
        worst = max(worst, abs(a["loss"] - b["loss"]) / abs(a["loss"]) / scale,
                    abs(a["grad_norm"] - b["grad_norm"]) / abs(a["grad_norm"]) / scale)
        peaks = [round(y / x, 3) for x, y in zip(a["peak_activation_mib_per_rank"], b["peak_activation_mib_per_rank"])]
        print(f"step {a['step']}: loss {a['loss']:.8f} (cp 1) {b['loss']:.8f} (cp 2); grad norm {a['grad_norm']:.6f} "
              f"{b['grad_norm']:.6f}; peak saved activations cp 2 / cp 1 per rank {peaks}")
    weight = weight_gap(weights_one, weights_two)
    if weight is None:
        return 1
    ok = len(one) == len(two) == args.steps and worst <= 1 and weight <= LR / 100
    print(f"{'OK' if ok else 'FAILED'}: losses and gradient norms within {worst:.3f} of their tolerance ({args.tol:g} "
          f"of their size at step 1, {10 * args.tol:g} later); checkpoint weights within {weight:.2e} (tolerance "
          f"{LR / 100:g})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
