"""Activation swap against none on the demo: each rank's peak of saved-activation bytes on the device
and the step time, measured in one run of each.

    python scripts/bench/bench_swap.py [--demo DIR] [--steps 8] [--repeats 2]

Every run trains ``recipes/qwen2_5_vl_demo.yaml``'s schedule (R = 4, V = 2, M = 8, frozen tower, bf16) through
``mpipe-hf train``: without a ``swap`` section, with ``swap: {enabled: true, ranks: [0], min_bytes: 0}`` and with
every rank swapping (``min_bytes: 0``: every saved tensor of the demo is under the default threshold). The peak is the executor's count of the bytes the stage forwards saved that are on the device (with
swap: what the swap manager has not moved to the host), the largest over the steps. On CPU, "device" and host are
the same memory: the figures count the tensors the pipeline holds for its backwards, not the process's memory,
and the copies cost CPU time that a GPU's copy engine would overlap. Step time: median over the steps after the
first and over ``--repeats`` interleaved runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile

import yaml
from demo_run import demo_dir, train

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPE = os.path.join(ROOT, "recipes", "qwen2_5_vl_demo.yaml")
# min_bytes 0: the demo's saved tensors are tens of KiB (hidden 64), under the default 64 KiB threshold
RUNS = {"none": None, "rank 0": {"enabled": True, "ranks": [0], "min_bytes": 0},
        "every rank": {"enabled": True, "min_bytes": 0}}


def run(demo: str, work: str, name: str, steps: int, repeat: int, gap: int) -> dict:
    out = os.path.join(work, f"{name.replace(' ', '_')}-{repeat}")
    raw = yaml.safe_load(open(RECIPE))
    raw["model"], raw["data"]["path"] = os.path.join(demo, "model"), os.path.join(demo, "data", "train.jsonl")
    raw["train"].update(max_steps=steps, output_dir=out)
    if RUNS[name] is not None:
        raw["swap"] = {**RUNS[name], "min_swap_gap": gap}
    rows, _ = train(raw, out)
    peaks = [max(r["peak_activation_mib_per_rank"][k] for r in rows) for k in range(len(rows[0]["step_s_per_rank"]))]
    return {"step_s": [r["step_s"] for r in rows[1:]], "peak_mib": peaks, "loss": [r["loss"] for r in rows]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo", help="a built demo (scripts/make/make_demo.py DIR); built in a temp dir otherwise")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--min-swap-gap", type=int, default=2)
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be at least 2: the first step is left out of the timing")
    with tempfile.TemporaryDirectory() as work:
        demo = demo_dir(args.demo, work)
        results = {name: [] for name in RUNS}
        for repeat in range(args.repeats):
            for name in RUNS:
                results[name].append(run(demo, work, name, args.steps, repeat, args.min_swap_gap))
    base = results["none"][0]
    print("| swap | step s (median) | step time vs none | peak saved activations on the device, MiB per rank | "
          "rank 0 vs none |")
    print("|---|---|---|---|---|")
    for name, runs in results.items():
        step = statistics.median(s for r in runs for s in r["step_s"])
        base_step = statistics.median(s for r in results["none"] for s in r["step_s"])
        peaks = runs[0]["peak_mib"]
        print(f"| {name} | {step:.3f} | {step / base_step:.2f} | {', '.join(f'{p:.2f}' for p in peaks)} | "
              f"{peaks[0] / base['peak_mib'][0]:.2f} |")
    same = all(r["loss"] == base["loss"] for runs in results.values() for r in runs)
    print(f"\nlosses of every run equal the run without swap, bit for bit: {same}")


if __name__ == "__main__":
    main()
