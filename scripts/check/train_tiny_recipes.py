"""Train every tiny recipe (recipes/tiny/*.yaml) through ``mpipe-hf train``, each from a scratch working directory
(not the repository root), and print one line per family: the first and last loss, or why it failed.

Usage: python scripts/check/train_tiny_recipes.py [--only TYPE ...] [--timeout SECONDS] [--recipes DIR]

Needs, from the repository root: ``python scripts/make/make_demo.py demo`` and ``python scripts/make/make_tiny_models.py``
(the recipes read ../../demo and ../../tiny relative to their folder). Not in CI (about half a minute a family on
2 CPU cores): ``tests/test_tiny_models.py`` trains the Gemma 3 one. Exit status 1 when any family failed.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RECIPES = os.path.join(os.path.dirname(os.path.dirname(HERE)), "recipes", "tiny")


def train_one(path: str, timeout: float) -> str:
    """Run ``mpipe-hf train path`` from a temporary working directory; return its one-line outcome (``loss A ->
    B`` over the logged steps, or ``FAILED: ...`` with the last line of its error)."""
    from mpipe_hf.train import load_recipe
    output_dir = load_recipe(path).train.output_dir
    command = [os.path.join(os.path.dirname(sys.executable), "mpipe-hf"), "train", os.path.abspath(path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as cwd:
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)
        except subprocess.TimeoutExpired:
            return f"FAILED: still running after {timeout:.0f} s"
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        errors = [line for line in lines if "error" in line.lower()] or lines or ["(no output)"]
        return f"FAILED (exit {proc.returncode}): {errors[-1].strip()[:300]}"
    with open(os.path.join(output_dir, "metrics.jsonl")) as f:
        losses = [json.loads(line)["loss"] for line in f]
    return f"{len(losses)} steps, loss {losses[0]:.4f} -> {losses[-1]:.4f}"


def main(argv=None) -> int:
    """The command line (module docstring); returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", metavar="TYPE", help="train only these model types")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per family (default 600)")
    parser.add_argument("--recipes", default=RECIPES, help="the recipes' folder (default: recipes/tiny)")
    args = parser.parse_args(argv)
    paths = sorted(glob.glob(os.path.join(args.recipes, "*.yaml")))
    if args.only:
        paths = [p for p in paths if os.path.basename(p)[:-5] in args.only]
    failed, start = 0, time.time()
    for path in paths:
        began = time.time()
        try:
            line = train_one(path, args.timeout)
        except (OSError, ValueError) as err:  # the recipe or its metrics could not be read
            line = f"FAILED: {' '.join(str(err).split())[:300]}"
        failed += line.startswith("FAILED")
        print(f"{os.path.basename(path)[:-5]}: {line} ({time.time() - began:.0f} s)", flush=True)
    print(f"{len(paths) - failed} of {len(paths)} trained in {time.time() - start:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
