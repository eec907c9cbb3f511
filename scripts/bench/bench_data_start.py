"""Start-up cost of a large dataset: the wall time of ``mpipe-hf train`` to its first step on 100k rows
(90% text-only conversations, 10% with one of the demo's photos), first with an empty ``datasets`` cache, then
again with the cache the first run left.

The run is the demo model at ``R = 2`` for one step (``max_steps: 1``); what differs between the two runs is only
the data work (a third run on 100 rows gives the floor: the launch, the model and the step alone): the first run checks, renders and tokenises every row once, on the launching process with
``data.num_proc`` processes, and the workers read its cache; the second finds the cache and starts at once. The
old loader (every rank rendering and tokenising every row itself, one process each) is timed on the first
``--old-rows`` rows for scale.

Usage: python scripts/bench/bench_data_start.py [--rows 100000] [--demo demo] [--num-proc 2] [--old-tree DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUESTIONS = ["What is shown here?", "Describe the image.", "Give a short caption.", "What do you see?"]
WORDS = "the a photo of an old red small large bright dark quiet busy street river tree house road sky".split()


def write_rows(path: str, rows: int, image_share: float, images: list[str], seed: int = 0) -> None:
    """``rows`` conversation rows: text-only ones with answers of 5 to 60 words, and ``image_share`` of them with
    one image."""
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(rows):
            answer = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 60))) + "."
            if rng.random() < image_share:
                row = {"messages": [{"role": "user", "content": "<image>" + rng.choice(QUESTIONS)},
                                    {"role": "assistant", "content": answer}], "images": [rng.choice(images)]}
            else:
                question = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 30))) + "?"
                row = {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]}
            f.write(json.dumps(row) + "\n")


def timed_run(recipe: str, cache: str, tree: str | None = None) -> float:
    """Seconds of ``mpipe-hf train recipe`` with ``cache`` as ``HF_DATASETS_CACHE`` (``tree``: the package of
    another checkout, put first on ``PYTHONPATH`` and run from a neutral folder)."""
    env = {**os.environ, "HF_DATASETS_CACHE": cache, "OMP_NUM_THREADS": "1"}
    if tree is not None:
        env["PYTHONPATH"] = tree
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "mpipe_hf.cli", "train", recipe], capture_output=True, text=True,
                          env=env, cwd=os.path.dirname(recipe))
    if proc.returncode:
        raise SystemExit(proc.stdout[-2000:] + proc.stderr[-4000:])
    return time.perf_counter() - start


def old_loader_rate(path: str, processor, rows: int) -> float:
    """Rows per second of the previous loader's per-row work on one process: render, tokenise and label each
    row, and read each image header (what every rank did before its first step)."""
    from mpipe_hf.data.conversation_encoder import ConversationEncoder
    from mpipe_hf.data.conversation_rows import canonical_row
    from mpipe_hf.data.layouts import read_image
    encoder = ConversationEncoder(processor, model_type="qwen2_5_vl")
    lines = [json.loads(line) for _, line in zip(range(rows), open(path))]
    start = time.perf_counter()
    for i, obj in enumerate(lines):
        row = canonical_row(obj, os.path.dirname(path), str(i))
        sizes = [read_image({"path": p}, str(i), False) for p in row["images"]]
        encoder.encode(row["messages"], encoder.image_tokens_for_sizes(sizes), str(i))
    return rows / (time.perf_counter() - start)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--image-share", type=float, default=0.1)
    parser.add_argument("--demo", default=os.path.join(ROOT, "demo"))
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--old-rows", type=int, default=2000)
    parser.add_argument("--old-tree", help="a checkout of the previous loader (git worktree add DIR 351c14f): its "
                                           "mpipe-hf train on the same rows is timed too")
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="bench_data_")
    images = sorted(os.path.join(args.demo, "data", "images", n)
                    for n in os.listdir(os.path.join(args.demo, "data", "images")))
    data = os.path.join(work, "train.jsonl")
    write_rows(data, args.rows, args.image_share, images)
    recipe = os.path.join(work, "recipe.yaml")
    with open(recipe, "w") as f:
        yaml.safe_dump({"model": os.path.join(args.demo, "model"),
                        "data": {"path": data, "num_proc": args.num_proc, "micro_batch_size": 1},
                        "parallel": {"pp_size": 2, "vpp": 2, "num_micro": 2, "timeout_s": 600},
                        "train": {"max_steps": 1, "output_dir": os.path.join(work, "out")}}, f)
    cache = os.path.join(work, "hf_datasets_cache")
    first = timed_run(recipe, cache)
    cached = timed_run(recipe, cache)
    small = os.path.join(work, "small.jsonl")  # the floor: the same run on 100 rows, cached
    write_rows(small, 100, args.image_share, images)
    small_recipe = os.path.join(work, "small.yaml")
    with open(recipe) as f, open(small_recipe, "w") as g:
        g.write(f.read().replace(data, small))
    timed_run(small_recipe, cache)
    floor = timed_run(small_recipe, cache)
    old = None
    if args.old_tree:  # the previous recipe schema has no data.num_proc
        old_recipe = os.path.join(work, "old.yaml")
        with open(recipe) as f, open(old_recipe, "w") as g:
            g.write(f.read().replace(f"num_proc: {args.num_proc}", "shuffle: true"))
        old = timed_run(old_recipe, os.path.join(work, "old_cache"), args.old_tree)
    from mpipe_hf.data import load_checkpoint_processor
    rate = old_loader_rate(data, load_checkpoint_processor(os.path.join(args.demo, "model")), args.old_rows)
    print(f"rows: {args.rows} ({args.image_share:.0%} with an image), data.num_proc {args.num_proc}, "
          f"{os.cpu_count()} cores")
    print(f"mpipe-hf train to the end of step 1, first run (empty cache): {first:.1f} s")
    print(f"mpipe-hf train to the end of step 1, cached run: {cached:.1f} s")
    print(f"the same run on 100 rows, cached (launch, model and step alone): {floor:.1f} s")
    print(f"the old loader: {rate:.0f} rows/s on each rank, so {args.rows / rate:.0f} s of data work on every "
          f"rank before step 1, every run")
    if old is not None:
        print(f"the previous loader's mpipe-hf train to the end of step 1 ({args.old_tree}): {old:.1f} s, every run; "
              f"{old / first:.1f}x the first run, {old / cached:.1f}x the cached run")
    print(f"first / cached: {first / cached:.1f}x")


if __name__ == "__main__":
    main()
