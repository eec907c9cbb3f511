"""FSDP2 against plain replicas for ``dp = 2 x pp = 2`` on the demo model: step time and what each
rank keeps (weights, gradients, AdamW moments), measured in one run of each.

    python scripts/bench/bench_data_parallel.py [--demo DIR] [--steps 8]

Both runs train the same recipe through ``mpipe-hf train`` (4 processes; on this 2-core machine they share the
cores, so step times are relative only). The step time is the median over the steps after the first; the bytes
are read from ``output_dir/memory.json`` (the local part of each tensor).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile

from demo_run import demo_dir, train



def run(demo: str, work: str, shard: bool, steps: int) -> dict:
    out = os.path.join(work, "shard" if shard else "replicate")
    recipe = {"model": os.path.join(demo, "model"), "data": {"path": os.path.join(demo, "data", "train.jsonl")},
              "parallel": {"pp_size": 2, "vpp": 2, "num_micro": 4, "preprocess": "frozen", "dp_size": 2,
                           "dp_shard": shard, "timeout_s": 120},
              "train": {"max_steps": steps, "learning_rate": 2e-3, "output_dir": out}}
    rows, held = train(recipe, out)
    return {"step_s": statistics.median(r["step_s"] for r in rows[1:]), "held": held,
            "activation_mib": rows[-1]["peak_activation_mib_per_rank"]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo", help="a built demo (scripts/make/make_demo.py DIR); built in a temp dir otherwise")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be at least 2: the first step is left out of the timing")
    work = tempfile.mkdtemp(prefix="mpipe_dp_")
    demo = demo_dir(args.demo, work)
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
