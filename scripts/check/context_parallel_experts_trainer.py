"""Train recipes/qwen3_vl_moe_ep.yaml's model (the demo Qwen3-VL-MoE: 4 experts, 2 active, the load-balancing term
on; trainable tower, pp 2 x V 2) through ``mpipe-hf train`` twice from the same seed and rows: on one pipeline
(``cp_size 1``, ``ep_size 1``, 2 processes) and with context and expert parallelism (``cp_size 2``, ``ep_size 2``,
``dp_size 1``, 4 processes: the EP group cut from the 2 CP ranks of each stage). Compares every step's loss,
gradient norm and MoE aux loss (``metrics.jsonl``) and the saved checkpoints' tensors (the experts saved fused).
Prints one line per step and a verdict.

Usage: python scripts/check/context_parallel_experts_trainer.py [--steps N] [--demo DIR] [--tol T]

Needs ``python scripts/make/make_demo.py demo``. Not in CI (2 + 4 processes; about 5 minutes on 2 CPU cores):
``tests/test_ep.py`` runs cp 2 x ep 2 x pp 2 against one process in its 4-process launch, and
``tests/test_numerics.py`` the router term at cp 2 x pp 2. Exit status 1 when a step's loss, gradient norm or aux loss
differs by more than ``--tol`` of its size (default 1e-5: the CP ranks' sums are added in another order), or a
saved weight by more than 1% of one AdamW step (``learning_rate / 100``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from context_parallel_trainer import run_recipe, weight_gap  # noqa: E402  (the same run, read the same way)
RUNS = {"cp 1": dict(dp_size=1, ep_size=1, cp_size=1), "cp 2 x ep 2": dict(dp_size=1, ep_size=2, cp_size=2)}
KEYS = ("loss", "grad_norm", "aux_loss")


def train(demo: str, name: str, parallel: dict, steps: int, work: str) -> tuple[list[dict], dict, float]:
    """One run of the EP recipe with ``parallel``'s sizes: its metrics rows, its checkpoint's tensors and its
    learning rate. Raises RuntimeError with the run's last output lines when it fails."""
    import yaml
    raw = yaml.safe_load(open(os.path.join(ROOT, "recipes", "qwen3_vl_moe_ep.yaml")))
    out = os.path.join(work, name.replace(" ", ""))
    raw["model"].update(config=os.path.join(demo, "configs", "qwen3_vl_moe.json"),
                        tokenizer=os.path.join(demo, "model"))
    raw["data"]["path"] = os.path.join(demo, "data", "train.jsonl")
    raw["parallel"].update(parallel)
    raw["train"].update(max_steps=steps, output_dir=out)
    path = out + ".yaml"
    with open(path, "w") as f:
        yaml.safe_dump(raw, f)
    rows, tensors = run_recipe(path, out, work, name)
    return rows, tensors, float(raw["train"]["learning_rate"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--demo", default=os.path.join(ROOT, "demo"))
    parser.add_argument("--tol", type=float, default=1e-5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        (one, weights_one, lr), (two, weights_two, _) = (
            train(os.path.abspath(args.demo), name, sizes, args.steps, work) for name, sizes in RUNS.items())
    worst = 0.0
    for a, b in zip(one, two):
        worst = max([worst] + [abs(a[k] - b[k]) / abs(a[k]) / args.tol for k in KEYS])
        print(f"step {a['step']}: " + "; ".join(f"{k} {a[k]:.8f} (cp 1) {b[k]:.8f} (cp 2 x ep 2)" for k in KEYS))
    weight = weight_gap(weights_one, weights_two)
    if weight is None:
        return 1
    ok = len(one) == len(two) == args.steps and worst <= 1 and weight <= lr / 100
    print(f"{'OK' if ok else 'FAILED'}: losses, gradient norms and aux losses within {worst:.3f} of their tolerance "
          f"({args.tol:g} of their size); checkpoint weights within {weight:.2e} (tolerance {lr / 100:g})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
