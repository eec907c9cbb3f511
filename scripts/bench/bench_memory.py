"""Peak saved activations per rank in a real pipelined run: fp32 against bf16, without and with gradient
checkpointing, on a recipe (the demo's by default).

Usage: python scripts/bench/bench_memory.py [RECIPE.yaml] [--steps 5] [--out outputs/bench_memory]

Runs ``mpipe-hf train`` once per variant with ``max_steps`` = ``--steps`` and reads
``peak_activation_mib_per_rank`` from its ``metrics.jsonl``: the most bytes each rank held saved for its stage
backwards at once (distinct storages, weights left out, counted by the executor with ``saved_tensors_hooks``),
the maximum over the steps, together with the last step's loss to show the variants compute the same thing.
"""

import argparse
import json
import os
import subprocess
import sys

import yaml

from mpipe_hf.train.recipe_paths import resolve_paths

VARIANTS = {"fp32": {}, "fp32 + checkpointing": {"gradient_checkpointing": True}, "bf16": {"bf16": True},
            "bf16 + checkpointing": {"bf16": True, "gradient_checkpointing": True}}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", nargs="?", default="recipes/qwen2_5_vl_demo.yaml")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", default="outputs/bench_memory")
    args = parser.parse_args(argv)
    cli = os.path.join(os.path.dirname(sys.executable), "mpipe-hf")
    print(f"| variant | peak saved activations per rank, MiB | loss at step {args.steps} |\n|---|---|---|")
    for name, train in VARIANTS.items():
        # the copy lives in another folder: its relative paths are made absolute (they are the recipe's folder's)
        raw = resolve_paths(yaml.safe_load(open(args.recipe)), os.path.dirname(os.path.abspath(args.recipe)))
        out = os.path.abspath(os.path.join(args.out, name.replace(" + ", "_")))
        raw["train"] = {**raw.get("train", {}), "bf16": False, "gradient_checkpointing": False, **train,
                        "max_steps": args.steps, "output_dir": out}
        os.makedirs(out, exist_ok=True)
        path = os.path.join(out, "recipe.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(raw, f)
        subprocess.run([cli, "train", path], check=True, capture_output=True)
        rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
        rows = [r for r in rows if not r.get("skipped")]
        peak = [max(r["peak_activation_mib_per_rank"][k] for r in rows) for k in range(len(rows[0]["bubble_per_rank"]))]
        print(f"| {name} | {', '.join(f'{p:.2f}' for p in peak)} | {rows[-1]['loss']:.4f} |", flush=True)


if __name__ == "__main__":
    main()
