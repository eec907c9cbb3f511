"""LoRA against full fine-tuning on the demo: what each pipeline rank keeps (weights, gradients,
AdamW moments) and the step time, measured in one run of each.

    python scripts/bench/bench_lora.py [--demo DIR] [--steps 10] [--repeats 2]

Both runs train ``recipes/qwen2_5_vl_lora.yaml``'s schedule (R = 4, V = 2, M = 8, frozen tower, bf16) through
``mpipe-hf train``: full fine-tuning is that recipe without its ``lora`` section. On this 2-core machine the 4
processes share the cores, so step times compare the two runs only. The step time is the median over the steps
after the first (and over ``--repeats`` runs of each, interleaved); the bytes are read from
``output_dir/memory.json``: the local part of each tensor a rank holds across steps (a gradient only for a
trained weight).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile

import yaml
from demo_run import demo_dir, train

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPE = os.path.join(ROOT, "recipes", "qwen2_5_vl_lora.yaml")


def run(demo: str, work: str, lora: bool, steps: int, repeat: int) -> dict:
    out = os.path.join(work, f"{'lora' if lora else 'full'}-{repeat}")
    raw = yaml.safe_load(open(RECIPE))
    raw["model"], raw["data"]["path"] = os.path.join(demo, "model"), os.path.join(demo, "data", "train.jsonl")
    raw["train"].update(max_steps=steps, output_dir=out)
    if not lora:
        del raw["lora"]
    rows, held = train(raw, out)
    return {"step_s": [r["step_s"] for r in rows[1:]], "held": held,
            "activation_mib": rows[-1]["peak_activation_mib_per_rank"]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo", help="a built demo (scripts/make/make_demo.py DIR); built in a temp dir otherwise")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be at least 2: the first step is left out of the timing")
    with tempfile.TemporaryDirectory() as work:
        demo = demo_dir(args.demo, work)
        results = {"full": [], "lora": []}
        for repeat in range(args.repeats):
            for kind in ("full", "lora"):
                results[kind].append(run(demo, work, kind == "lora", args.steps, repeat))
    kib = 1024

    def row(kind: str, rank: int) -> str:
        held = results[kind][0]["held"][rank]
        return (f"| {kind} | {rank} | {held['params'] / kib:.0f} | {held['grads'] / kib:.0f} | "
                f"{held['optimizer'] / kib:.0f} | {results[kind][0]['activation_mib'][rank]:.2f} |")
    print("| run | rank | weights KiB | gradients KiB | AdamW moments KiB | peak activations MiB |")
    print("|---|---|---|---|---|---|")
    for kind in ("full", "lora"):
        for rank in range(len(results[kind][0]["held"])):
            print(row(kind, rank))
    step = {k: statistics.median(s for r in v for s in r["step_s"]) for k, v in results.items()}
    full_opt = sum(h["optimizer"] for h in results["full"][0]["held"])
    lora_opt = sum(h["optimizer"] for h in results["lora"][0]["held"])
    print(f"\nstep time (median of {args.repeats} x {args.steps - 1} steps): full {step['full']:.3f} s, "
          f"lora {step['lora']:.3f} s, lora / full {step['lora'] / step['full']:.2f}")
    print(f"AdamW moments over all ranks: full {full_opt / kib:.0f} KiB, lora {lora_opt / kib:.0f} KiB "
          f"({lora_opt / full_opt:.3f} of full)")


if __name__ == "__main__":
    main()
