"""Load memory per rank: this library's per-rank load against loading the whole model first (``from_pretrained``
then split, as every rank did before), on the ~1.2B Qwen2.5-VL checkpoint of ``scripts/make/make_1b.py``.

Usage: python scripts/bench/bench_load.py [--checkpoint DIR] [--pp 4] [--vpp 1] [--markdown FILE]

Each load runs in a fresh process (one per rank and method, one at a time), which reports its peak resident
memory (``VmHWM``) above what it held after the imports, its parameter bytes after the carve, and, for the
per-rank load, the same from the config with random init. The target is peak <= share + the checkpoint's largest
tensor (``P`` is part of the share).
"""

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MAKE_1B = os.path.join(os.path.dirname(HERE), "make", "make_1b.py")


def _rss(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)


def largest_disk_tensor(checkpoint: str) -> int:
    """Bytes of the checkpoint's largest tensor, as stored (sharded with an index, or one ``model.safetensors``)."""
    from safetensors import safe_open
    index = os.path.join(checkpoint, "model.safetensors.index.json")
    files = set(json.load(open(index))["weight_map"].values()) if os.path.isfile(index) else {"model.safetensors"}
    largest = 0
    for file in sorted(files):
        with safe_open(os.path.join(checkpoint, file), "pt", device="cpu") as f:
            for key in f.keys():
                largest = max(largest, f.get_tensor(key).nbytes)
    return largest


def worker(checkpoint: str, pp: int, vpp: int, rank: int, method: str) -> dict:
    import torch
    from transformers import AutoConfig
    from mpipe_hf.models import split
    from mpipe_hf.models.load import model_class, split_from_checkpoint, split_from_config
    from mpipe_hf.schedule import ScheduleConfig
    cfg = ScheduleConfig(pp, vpp, pp, "frozen")
    config = AutoConfig.from_pretrained(checkpoint)
    base, report = _rss("VmRSS"), None
    if method == "per-rank":
        carved, report = split_from_checkpoint(checkpoint, config, cfg, rank)
    elif method == "per-rank, random init":
        carved, report = split_from_config(config, cfg, rank)
    else:
        carved = split(model_class(config).from_pretrained(checkpoint, dtype=torch.float32), cfg, rank)
    peak = _rss("VmHWM") - base
    pre = sum(p.numel() * p.element_size() for fqn in carved.preprocess_fqns
              for p in carved.model.get_submodule(fqn).parameters())
    return {"rank": rank, "method": method, "peak_rss": peak, "preprocess_bytes": pre,
            "param_bytes": sum(p.numel() * p.element_size() for p in carved.model.parameters()),
            "full_model_bytes": report.full_model_bytes if report else None}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default="outputs/qwen2_5_vl_1b")
    parser.add_argument("--pp", type=int, default=4)
    parser.add_argument("--vpp", type=int, default=1)
    parser.add_argument("--markdown")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.checkpoint, args.pp, args.vpp, int(args.worker[0]), args.worker[1])))
        return
    if not os.path.isdir(args.checkpoint):
        subprocess.run([sys.executable, MAKE_1B, args.checkpoint], check=True)
    rows = []
    methods = ("per-rank", "per-rank, random init", "whole model, then split")
    for method in methods:
        for rank in range(args.pp):
            out = subprocess.run([sys.executable, __file__, "--checkpoint", args.checkpoint, "--pp", str(args.pp),
                                  "--vpp", str(args.vpp), "--worker", str(rank), method],
                                 capture_output=True, text=True, check=True)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            r = rows[-1]
            print(f"{method:>24} rank {rank}: peak RSS {r['peak_rss'] / 2**30:.2f} GiB, params "
                  f"{r['param_bytes'] / 2**30:.2f} GiB (P {r['preprocess_bytes'] / 2**30:.2f})", flush=True)
    gib = lambda b: f"{b / 2**30:.2f}"
    largest = largest_disk_tensor(args.checkpoint)
    lines = ["| rank | share after carve, P incl. (GiB) | target: share + largest tensor | peak RSS, per-rank load | "
             "peak RSS, per-rank random init | peak RSS, whole model then split (before) |", "|---|---|---|---|---|---|"]
    for rank in range(args.pp):
        new, init, old = (next(r for r in rows if r["rank"] == rank and r["method"] == m) for m in methods)
        lines.append(f"| {rank} | {gib(new['param_bytes'])} (P {gib(new['preprocess_bytes'])}) | "
                     f"{gib(new['param_bytes'] + largest)} | {gib(new['peak_rss'])} | {gib(init['peak_rss'])} | "
                     f"{gib(old['peak_rss'])} ({old['peak_rss'] / new['peak_rss']:.2f}x) |")
    lines.append(f"\nGiB; peak RSS is above the process's RSS after its imports. Full model {gib(rows[0]['full_model_bytes'])}"
                 f" GiB in fp32; largest checkpoint tensor {gib(largest)} GiB (bf16).")
    print("\n".join(lines))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
