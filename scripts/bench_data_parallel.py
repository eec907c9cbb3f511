"""FSDP2 against plain replicas for ``dp = 2 x pp = 2`` on the demo model (issue 15): step time and what each
rank keeps (weights, gradients, AdamW moments), measured in one run of each.

    python scripts/bench_data_parallel.py [--demo DIR] [--steps 8]

Both runs train the same recipe through ``mpipe-hf train`` (4 processes; on this 2-core machine they share the
cores, so step times are relative only). The step time is the median over the steps after the first; the bytes
are read from ``output_dir/memory.json`` (the local part of each tensor).
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import statistics
import subprocess
import sys
import tempfile

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(demo: str, work: str, shard: bool, steps: int) -> dict:
    out = os.path.join(work, "shard" if shard else "replicate")
    recipe = {"model": os.path.join(demo, "model"), "data": {"path": os.path.join(demo, "data", "train.jsonl")},
              "parallel": {"pp_size": 2, "vpp": 2, "num_micro": 4, "preprocess": "frozen", "dp_size": 2,
                           "dp_shard": shard, "timeout_s": 120},
              "train": {"max_steps": steps, "learning_rate": 2e-3, "output_dir": out}}
    path = out + ".yaml"
    with open(path, "w") as f:
        yaml.safe_dump(recipe, f)
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "mpipe-hf"), "train", path],
                          capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode:
        raise SystemExit(proc.stderr[-3000:])
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    with open(os.path.join(out, "memory.json")) as f:
        held = json.load(f)["model_state_bytes_per_rank"]
    return {"step_s": statistics.median(r["step_s"] for r in rows[1:]), "held": held,
            "activation_mib": rows[-1]["peak_activation_mib_per_rank"]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo", help="a built demo (scripts/make_demo.py DIR); built in a temp dir otherwise")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="mpipe_dp_")
    demo = args.demo or os.path.join(work, "demo")
    if not args.demo:
        runpy.run_path(os.path.join(ROOT, "scripts", "make_demo.py"))["main"]([demo])
    results = {name: run(demo, work, shard, args.steps) for name, shard in (("FSDP2", True), ("replicate", False))}
    mib = 2 ** 20
    print("| engine | step s (median) | global rank | weights MiB | gradients MiB | AdamW MiB | total MiB |")
    print("|---|---|---|---|---|---|---|")
    for name, r in results.items():
        for rank, held in enumerate(r["held"]):
            total = (held["params"] + held["grads"] + held["optimizer"]) / mib
            print(f"| {name} | {r['step_s']:.3f} | {rank} | {held['params'] / mib:.2f} | {held['grads'] / mib:.2f} | "
                  f"{held['optimizer'] / mib:.2f} | {total:.2f} |")
    ratio = results["FSDP2"]["step_s"] / results["replicate"]["step_s"]
    print(f"\nFSDP2 / replicate step time: {ratio:.2f}")


if __name__ == "__main__":
    main()
