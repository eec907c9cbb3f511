"""What the benchmark scripts share: train a recipe mapping through ``mpipe-hf train`` and read back what the run
wrote (``metrics.jsonl`` rows, ``memory.json``), and build the demo when none is given."""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def demo_dir(demo: str | None, work: str) -> str:
    """``demo``, or a demo built under ``work`` (``scripts/make/make_demo.py``)."""
    if demo is not None:
        return demo
    demo = os.path.join(work, "demo")
    runpy.run_path(os.path.join(ROOT, "scripts", "make", "make_demo.py"))["main"]([demo])
    return demo


def train(raw: dict, out: str) -> tuple[list[dict], list[dict]]:
    """Write ``raw`` (a recipe mapping whose ``train.output_dir`` is ``out``) beside ``out`` and train it;
    ``(metrics rows, model-state bytes per rank)``. Exits with the run's last error output when it fails."""
    path = out + ".yaml"
    with open(path, "w") as f:
        yaml.safe_dump(raw, f)
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "mpipe-hf"), "train", path],
                          capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode:
        raise SystemExit(proc.stderr[-3000:])
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    with open(os.path.join(out, "memory.json")) as f:
        return rows, json.load(f)["model_state_bytes_per_rank"]
