"""Packed against padded micro-batches: label tokens/s, padding, bubble, on a LLaVA-Instruct-like mix.

Usage: python scripts/bench/bench_packing.py [--rows 600] [--steps 20] [--warm 2] [--micro 8] [--out outputs/bench_packing]
       python scripts/bench/bench_packing.py --quick            # a smoke run: 64 rows, 3 steps

Data (seeded by ``--seed``, default 0), ``messages``/``images`` JSONL rows with the demo's photos from
``skimage.data`` (``scripts/make/make_demo_data.py``: at most 112 px a side, the processor's bound; 4 to 16 tokens):

- images per row: 0 with probability 0.10, 1 with 0.75, 2 with 0.10, 3 with 0.05, all in the first user turn,
  each photo drawn uniformly from the demo's 24;
- turns (user, assistant pairs): ``min(6, 1 + floor(X))``, ``X ~ lognormal(mu=-0.5, sigma=1.0)``
  (P(1 turn) = 0.69);
- words per question ``max(3, round(lognormal(ln 10, 0.5)))``, per answer ``max(1, round(lognormal(ln 25, 1.0)))``
  (heavy-tailed: the 99th percentile answer is 10x the median), drawn from the demo captions' vocabulary;
- rows longer than the packing budget (``--budget-x`` x the median row, in tokens) are left out (30% more rows are
  drawn than kept), so every run trains every row whole.

Runs, on the demo model (``scripts/make/make_demo.py``: tiny Qwen2.5-VL, frozen tower, fp32), rows in file order:
(a) packed: ``mpipe-hf train`` with ``data.packing`` at R = 2, V = 2, M = ``--micro``; (b) padded: the same with
``micro_batch_size`` = the packed plan's mean rows per micro, rounded; (c) the plain one-process HF Trainer
(``examples/sft_qwen2_5_vl.py --batch-size`` that size, 8 micro-batches of accumulation a step, 2 threads where
each rank has 1): with M = 8 its micro-batches are (b)'s. Over the steps after ``--warm``:

- label tokens/s: label tokens (``labels[:, 1:] != -100`` of each micro-batch, collated as the run collates it)
  over the step times: ``step_s`` of ``metrics.jsonl`` for (a) and (b) (the schedule, AdamW left out); step end to
  step end for (c) (a ``TrainerCallback``, AdamW in);
- padding: padded tokens / tokens computed; the packed budget's fill (tokens / budget);
- the bubble per rank of ``metrics.jsonl``;
- the simulator's bubble and step (``recipes/profiles/qwen2_5_vl_demo.yaml``, the run's layout): each micro's body
  weighed by its tokens computed, its ``P`` by its image tokens, both over the packed run's mean micro-batch
  (``Costs.micro_weights``; uniform when ``Costs`` has none). Linear in tokens: attention's quadratic term and
  the per-action overhead are not in it.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.join(ROOT, "scripts", "make"))  # make_demo_data's PHOTOS
from demo_run import demo_dir  # noqa: E402
from make_demo_data import PHOTOS  # noqa: E402

IMAGES_P = (0.10, 0.75, 0.10, 0.05)  # P(0, 1, 2, 3 images)
PLAIN = os.path.join(ROOT, "examples", "sft_qwen2_5_vl.py")
PROFILE = os.path.join(ROOT, "recipes", "profiles", "qwen2_5_vl_demo.yaml")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "ACCELERATE_USE_CPU": "1"}


def draw_row(rng: np.random.Generator, photos: list[str], vocab: list[str]) -> dict:
    """One conversation row of the module docstring's distribution."""
    def words(mu: float, sigma: float, least: int) -> str:
        n = max(least, int(round(rng.lognormal(mu, sigma))))
        return " ".join(rng.choice(vocab, n)).capitalize()
    images = int(rng.choice(4, p=IMAGES_P))
    turns = min(6, 1 + int(rng.lognormal(-0.5, 1.0)))
    messages = []
    for t in range(turns):
        question = words(math.log(10), 0.5, 3) + "?"
        messages.append({"role": "user", "content": ("<image>" * images if t == 0 else "") + question})
        messages.append({"role": "assistant", "content": words(math.log(25), 1.0, 1) + "."})
    row = {"messages": messages}
    if images:
        row["images"] = [photos[i] for i in rng.integers(len(photos), size=images)]
    return row


def write_data(folder: str, demo: str, rows: int, seed: int, budget_x: float) -> tuple[str, int]:
    """Draw the rows (module docstring) into ``folder/train.jsonl``; ``(path, budget)``: the budget is
    ``budget_x`` times the median row of the draw (tokens as the loader counts them), rows above it left out."""
    from mpipe_hf.data import load_checkpoint_processor, load_conversation_dataset
    os.makedirs(folder, exist_ok=True)
    images = os.path.join(demo, "data", "images")
    photos = sorted(os.path.join(images, name) for name in os.listdir(images))
    vocab = sorted({w.strip(".,'").lower() for _, _, caps in PHOTOS for c in caps for w in c.split()} - {""})
    rng = np.random.default_rng(seed)
    pool = [draw_row(rng, photos, vocab) for _ in range(int(rows * 1.3) + 16)]
    first = os.path.join(folder, "draw.jsonl")
    with open(first, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in pool)
    tokens = load_conversation_dataset(first, load_checkpoint_processor(os.path.join(demo, "model")),
                                       2048).num_tokens
    budget = int(budget_x * float(np.median(tokens)))
    kept = [r for r, n in zip(pool, tokens) if n <= budget][:rows]
    if len(kept) < rows:
        raise SystemExit(f"only {len(kept)} of {len(pool)} drawn rows fit the budget of {budget} tokens")
    path = os.path.join(folder, "train.jsonl")
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in kept)
    counts = np.bincount([len(r.get("images", [])) for r in kept], minlength=4)
    print(f"data: {rows} rows ({sum(n > budget for n in tokens)} of {len(pool)} drawn over the budget, left out); "
          f"images per row 0/1/2/3: {counts.tolist()}; tokens per drawn row median {np.median(tokens):.0f}, "
          f"mean {np.mean(tokens):.1f}, p95 {np.percentile(tokens, 95):.0f}, max {max(tokens)}; budget {budget}")
    return path, budget


def write_recipe(out: str, demo: str, data: str, micro: int, steps: int, **data_keys) -> str:
    """A recipe at ``out + '.yaml'``: the demo model at R = 2, V = 2, ``micro`` micro-batches, frozen tower,
    fp32, rows in file order, ``steps`` steps, writing to ``out``."""
    import yaml
    raw = {"model": os.path.join(demo, "model"),
           "data": {"path": data, "shuffle": False, "min_pixels": 3136, "max_pixels": 12544, **data_keys},
           "parallel": {"pp_size": 2, "vpp": 2, "num_micro": micro, "preprocess": "frozen", "timeout_s": 300},
           "train": {"max_steps": steps, "learning_rate": 1e-3, "warmup_steps": 2, "output_dir": out,
                     "save_steps": 0}}
    with open(out + ".yaml", "w") as f:
        yaml.safe_dump(raw, f)
    return out + ".yaml"


def run_pipeline(recipe: str, out: str, timeout: int) -> tuple[list[dict], str]:
    """Train ``recipe`` with ``mpipe-hf train``; ``(metrics rows, rank 0's setup line)``."""
    cli = os.path.join(os.path.dirname(sys.executable), "mpipe-hf")
    proc = subprocess.run([cli, "train", recipe], capture_output=True, text=True, timeout=timeout, env=ENV)
    if proc.returncode:
        raise SystemExit(f"{recipe} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    setup = next(line for line in (proc.stdout + proc.stderr).splitlines() if " layers per stage=" in line)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if "loss" in r and not r.get("skipped")], setup


def run_plain(demo: str, data: str, out: str, batch: int, steps: int, timeout: int) -> list[float]:
    """The plain example on one process of 2 threads (the pipeline's 2 ranks have 1 each), timed by
    :func:`hf_worker`; each step's end (s since its start)."""
    clock = out + "_clock.json"
    args = ["--model", os.path.join(demo, "model"), "--data", data, "--output-dir", out, "--max-steps", str(steps),
            "--batch-size", str(batch), "--learning-rate", "1e-3"]
    proc = subprocess.run([sys.executable, __file__, "--hf-worker", clock, *args], capture_output=True, text=True,
                          timeout=timeout, env={**ENV, "OMP_NUM_THREADS": "2"}, cwd=ROOT)  # the ranks' 2 cores
    if proc.returncode:
        raise SystemExit(f"the plain Trainer failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    with open(clock) as f:
        return json.load(f)


def hf_worker(clock: str, args: list[str]) -> None:
    """Run the plain example's ``main(args)`` with its ``Trainer`` given a callback that writes the time of every
    step end (``on_step_end``, after AdamW) to ``clock``, seconds from ``on_train_begin``."""
    from transformers import Trainer, TrainerCallback

    start, ends = time.perf_counter(), []

    class Clock(TrainerCallback):
        def on_step_end(self, *a, **k):
            ends.append(time.perf_counter() - start)
            with open(clock, "w") as f:
                json.dump(ends, f)

    class TimedTrainer(Trainer):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.add_callback(Clock())

    spec = importlib.util.spec_from_file_location("sft_plain", PLAIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.Trainer = TimedTrainer  # main() looks its Trainer up in the module at call time
    module.main(args)


def plans(recipe: str):
    """``(plan, dataset)`` as ``mpipe-hf train`` builds them for ``recipe`` (mpipe_hf.train.job)."""
    from mpipe_hf.data import MicroBatchPlan
    from mpipe_hf.train import load_recipe
    from mpipe_hf.train.plan_packing import packed_plan
    from mpipe_hf.train.sources import load_config, load_data, load_processor
    recipe = load_recipe(recipe)
    config = load_config(recipe.model)
    dataset, collate = load_data(recipe, config, load_processor(recipe, config), quiet=True)
    data, num_micro = recipe.data, recipe.parallel.num_micro
    if not data.packing:
        return MicroBatchPlan(dataset, collate, num_micro, data.micro_batch_size), dataset
    return packed_plan(dataset, config, recipe, num_micro, collate), dataset


def micro_figures(plan, dataset, steps: range, num_micro: int) -> dict:
    """Each step's micro-batches collated as the run collates them: ``labels`` (label tokens per step, after the
    shift); per micro ``computed`` (tokens incl. padding), ``real`` (without), ``image`` (image tokens), ``rows``,
    ``scores`` (attention scores a dense mask computes: ``B * L**2``) and ``blocks`` (those within a row)."""
    out = {k: [] for k in ("labels", "computed", "real", "image", "rows", "scores", "blocks")}
    for step in steps:
        micros = [plan.load(step, m) for m in range(num_micro)]
        out["labels"].append(sum(int((b["labels"][:, 1:] != -100).sum()) for b in micros))
        shapes = [tuple(b["input_ids"].shape) for b in micros]
        out["computed"].append([bs * n for bs, n in shapes])
        out["real"].append([int(b["attention_mask"].sum()) if "attention_mask" in b else b["input_ids"].numel()
                            for b in micros])
        out["image"].append([sum(dataset.image_tokens[i] for i in plan.rows(step, m)) for m in range(num_micro)])
        out["rows"].append([len(plan.rows(step, m)) for m in range(num_micro)])
        out["scores"].append([bs * n * n for bs, n in shapes])
        out["blocks"].append([int((b["packed_lengths"] ** 2).sum()) if "packed_lengths" in b else bs * n * n
                              for b, (bs, n) in zip(micros, shapes)])
    return out


def layer_macs(config) -> tuple[int, int]:
    """A decoder layer's multiply-adds: ``(per token: q, k, v, o and the MLP; per attention score: Q K^T and
    A V over every head)``, from the text config."""
    t = config.get_text_config()
    head = getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads
    kv = t.num_key_value_heads * head
    return 2 * t.hidden_size * (t.num_attention_heads * head + kv) + 3 * t.hidden_size * t.intermediate_size, \
        2 * t.num_attention_heads * head


def simulated(setup: str, figures: dict, reference: tuple[float, float]) -> tuple[float | None, float, str]:
    """The simulator over the timed steps of the run whose setup line is ``setup``: the demo profile's costs for
    its layout and knobs, each micro's body ``F``/``B`` weighed by its tokens computed (padding included) over
    ``reference[0]`` and its ``P`` by its image tokens over ``reference[1]`` (the packed run's mean micro-batch
    for both runs), when ``Costs`` has ``micro_weights``; else uniform. ``(mean bubble, mean step in profile
    seconds, 'per micro' or 'uniform')``."""
    from mpipe_hf.schedule import ScheduleConfig, build_schedule
    from mpipe_hf.schedule.simulate import Costs, simulate
    from mpipe_hf.schedule.tune import Profile, costs_for
    knobs = dict(re.findall(r"(\w+)=(\[[^\]]*\]|\S+)", setup))
    cfg = ScheduleConfig(int(knobs["pp_size"]), int(knobs["vpp"]), int(knobs["M"]), knobs["preprocess"],
                         placement=knobs["placement"])
    base = costs_for(Profile.load(PROFILE), cfg, json.loads(knobs["stage"]))  # "layers per stage=[...]"
    per_micro = "micro_weights" in {f.name for f in dataclasses.fields(Costs)}
    bubbles, makespans = [], []
    for computed, image in zip(figures["computed"], figures["image"]):
        costs = base
        if per_micro:
            costs = dataclasses.replace(base, micro_weights=tuple(c / reference[0] for c in computed),
                                        micro_preprocess_weights=tuple(i / reference[1] for i in image))
        sim = simulate(build_schedule(cfg, costs), costs)
        bubbles.append(sim.mean_bubble)
        makespans.append(sim.makespan)
    return float(np.mean(bubbles)), float(np.mean(makespans)), "per micro" if per_micro else "uniform"


def summarise(name: str, times: list[float], figures: dict, macs: tuple[int, int]) -> dict:
    """One table row from the timed steps' times (s), their figures (:func:`micro_figures`) and a decoder layer's
    multiply-adds (:func:`layer_macs`): per label token with a dense mask (``macs``) and within rows only."""
    total = {k: sum(map(sum, figures[k])) for k in ("computed", "real", "rows", "scores", "blocks")}
    labels = sum(figures["labels"])
    return {"run": name, "rows_per_step": total["rows"] / len(times), "step_s": float(np.mean(times)),
            "label_tok_s": labels / sum(times), "padding": 1 - total["real"] / total["computed"],
            "median_tok_s": float(np.median([n / t for n, t in zip(figures["labels"], times)])),
            "labels_per_step": labels / len(times), "fill": None, "bubble_per_rank": None, "sim_bubble": None,
            "sim_step": None, "macs": (macs[0] * total["computed"] + macs[1] * total["scores"]) / labels,
            "macs_rows": (macs[0] * total["computed"] + macs[1] * total["blocks"]) / labels}


def measured(rows: list[dict], warm: int) -> tuple[list[float], list[float]]:
    """``(step_s of the timed steps, mean bubble per rank over them)`` from ``metrics.jsonl`` rows."""
    timed = rows[warm:]
    return [r["step_s"] for r in timed], np.mean([r["bubble_per_rank"] for r in timed], axis=0).tolist()


def check_tokens(rows: list[dict], figures: dict, warm: int, name: str) -> None:
    """Warn when the label tokens counted here differ by over 1% from the run's own (tokens_per_s x step_s)."""
    for row, labels in zip(rows[warm:], figures["labels"]):
        theirs = row["tokens_per_s"] * row["step_s"]
        if abs(theirs - labels) > 0.01 * labels + 1:
            print(f"warning: {name} step {row['step']}: {labels} label tokens counted here, the run's "
                  f"metrics give {theirs:.0f}")


def pipeline_arm(name: str, recipe: str, args, macs: tuple[int, int]) -> tuple[dict, dict, str]:
    """Train one pipelined arm; ``(table row, figures of the timed steps, rank 0's setup line)``."""
    start = time.perf_counter()
    rows, setup = run_pipeline(recipe, recipe[:-len(".yaml")], args.timeout)
    plan, dataset = plans(recipe)
    timed = range(args.warm, args.steps)
    figures = micro_figures(plan, dataset, timed, args.micro)
    check_tokens(rows, figures, args.warm, name)
    times, bubbles = measured(rows, args.warm)
    row = {**summarise(name, times, figures, macs), "bubble_per_rank": bubbles}
    if hasattr(plan, "packing_stats"):
        row["fill"] = float(np.mean([f for s in timed for f in plan.packing_stats(s)["fill"]]))
    print(f"{name}: {time.perf_counter() - start:.0f} s wall; {setup.split(': ', 1)[-1][:150]}", flush=True)
    return row, figures, setup


def plain_arm(demo: str, data: str, work: str, batch: int, args, recipe: str, macs: tuple[int, int]) -> dict:
    """The plain HF Trainer on rows in file order, ``batch`` a micro-batch, 8 of them a step: the micro-batches
    of ``recipe`` (``M = 8``, ``micro_batch_size`` = ``batch``, rows in file order)."""
    start = time.perf_counter()
    ends = run_plain(demo, data, os.path.join(work, "plain"), batch, args.steps, args.timeout)
    times = [b - a for a, b in zip(ends[args.warm - 1:], ends[args.warm:])]
    plan, dataset = plans(recipe)
    row = summarise("(c) plain HF Trainer, padded, 1 process", times,
                    micro_figures(plan, dataset, range(args.warm, args.steps), 8), macs)
    print(f"{row['run']}: {time.perf_counter() - start:.0f} s wall", flush=True)
    return row


def table(results: list[dict]) -> str:
    """The markdown table of the runs, with the packed run's label tokens/s over each."""
    packed = results[0]["label_tok_s"]
    lines = ["| run | rows/step | label tokens/step | step s | label tokens/s (median step) | packed / this | "
             "padding | budget fill | bubble per rank, measured | simulated bubble | simulated step, profile s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    num = lambda value, form: "-" if value is None else format(value, form)  # noqa: E731
    for r in results:
        bubble = ", ".join(f"{b:.3f}" for b in r["bubble_per_rank"]) if r["bubble_per_rank"] else "-"
        lines.append(f"| {r['run']} | {r['rows_per_step']:.1f} | {r['labels_per_step']:.0f} | {r['step_s']:.3f} | "
                     f"{r['label_tok_s']:.0f} ({r['median_tok_s']:.0f}) | {packed / r['label_tok_s']:.2f}x | {r['padding']:.3f} | "
                     f"{num(r['fill'], '.3f')} | {bubble} | {num(r['sim_bubble'], '.3f')} | "
                     f"{num(r['sim_step'], '.4f')} |")
    return "\n".join(lines)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--hf-worker"]:
        return hf_worker(argv[1], argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=600, help="rows drawn")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps per run, warm ones included")
    parser.add_argument("--warm", type=int, default=2, help="first steps left out of the timing (>= 1)")
    parser.add_argument("--micro", type=int, default=8, help="M, micro-batches per step (the peer accumulates 8)")
    parser.add_argument("--budget-x", type=float, default=4.0, help="packing budget in median rows")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--demo", help="a built demo (default: built under --out)")
    parser.add_argument("--out", default="outputs/bench_packing")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per run")
    parser.add_argument("--quick", action="store_true", help="smoke run: 64 rows, 3 steps, 1 warm")
    parser.add_argument("--keep", action="store_true", help="keep the runs' folders")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.steps, args.warm = 64, 3, 1
    args.warm = max(1, args.warm)
    work = os.path.abspath(args.out)
    os.makedirs(work, exist_ok=True)
    try:
        run_all(args, work)
    finally:
        if not args.keep:
            for name in ("packed", "padded", "plain", "data"):
                shutil.rmtree(os.path.join(work, name), ignore_errors=True)


def run_all(args, work: str) -> None:
    """Draw the data, run the three arms, simulate the pipelined ones, print the table and the ratios; the rows."""
    from mpipe_hf.train import load_recipe
    from mpipe_hf.train.sources import load_config
    demo = demo_dir(args.demo, work)
    data, budget = write_data(os.path.join(work, "data"), demo, args.rows, args.seed, args.budget_x)
    packed_recipe = write_recipe(os.path.join(work, "packed"), demo, data, args.micro, args.steps, packing=True,
                                 max_tokens_per_micro=budget)
    plan, _ = plans(packed_recipe)
    batch = max(1, round(np.mean([len(plan.rows(s, m)) for s in range(args.steps) for m in range(args.micro)])))
    padded_recipe = write_recipe(os.path.join(work, "padded"), demo, data, args.micro, args.steps,
                                 micro_batch_size=batch)
    macs = layer_macs(load_config(load_recipe(packed_recipe).model))
    arms = [pipeline_arm(f"(a) packed, budget {budget}, R=2 V=2 M={args.micro}", packed_recipe, args, macs),
            pipeline_arm(f"(b) padded, {batch} rows/micro, R=2 V=2 M={args.micro}", padded_recipe, args, macs)]
    packed_figures = arms[0][1]
    reference = (float(np.mean(packed_figures["computed"])), float(np.mean(packed_figures["image"])))
    for row, figures, setup in arms:
        row["sim_bubble"], row["sim_step"], kind = simulated(setup, figures, reference)
    plain_recipe = write_recipe(os.path.join(work, "plain_rows"), demo, data, 8, args.steps, micro_batch_size=batch)
    results = [arms[0][0], arms[1][0], plain_arm(demo, data, work, batch, args, plain_recipe, macs)]
    report(results, kind, args)
    return results  # scripts/bench/bench_compute.py reads them


def report(results: list[dict], kind: str, args) -> None:
    """Print the table, the ratios and the packing targets (padding, label tokens/s, bubble)."""
    packed, padded, plain = results
    print(table(results))
    print(f"timed steps {args.warm + 1}..{args.steps}; simulator weights: {kind}")
    sim = ((packed["labels_per_step"] / packed["sim_step"]) / (padded["labels_per_step"] / padded["sim_step"]))
    print(f"packed / padded label tokens/s: {packed['label_tok_s'] / padded['label_tok_s']:.2f}x measured, "
          f"{sim:.2f}x simulated; packed / plain HF Trainer: {packed['label_tok_s'] / plain['label_tok_s']:.2f}x; "
          f"padded / plain HF Trainer: {padded['label_tok_s'] / plain['label_tok_s']:.2f}x")
    print(f"decoder-layer multiply-adds per label token, attention over a dense mask: packed {packed['macs']:.3g}, "
          f"padded {padded['macs']:.3g} ({packed['macs'] / padded['macs']:.3f}x); attention within rows only "
          f"(varlen): packed {packed['macs_rows']:.3g} ({packed['macs_rows'] / padded['macs']:.3f}x padded)")
    targets = [("padding <= 5% packed", packed["padding"] <= 0.05),
               ("label tokens/s >= 1.5x padded", packed["label_tok_s"] >= 1.5 * padded["label_tok_s"]),
               ("measured bubble lower than padded",
                np.mean(packed["bubble_per_rank"]) < np.mean(padded["bubble_per_rank"])),
               ("simulated bubble lower than padded", packed["sim_bubble"] < padded["sim_bubble"])]
    for what, met in targets:
        print(f"target {what}: {'met' if met else 'MISSED'}")


if __name__ == "__main__":
    main()
