"""Speed where arithmetic dominates: packed against padded against the plain HF Trainer, and MPipe
against the best torch schedule, on a real Qwen2.5-VL config scaled to hidden 768 (``bench_compute_stages.py``),
with the matmul share of a step measured by ``torch.profiler``.

Usage: python scripts/bench/bench_compute.py [--demo DIR] [--out outputs/bench_compute] [--skip-packing] [--skip-pipeline]
       python scripts/bench/bench_compute.py --tiny        # a smoke run at hidden 64: checks that every part runs

Three parts, one run:

1. **Matmul share.** ``torch.profiler`` over one-thread steps: the unsplit model's optimizer step on part 2's
   data (the padded run's ``--micro`` micro-batches of step 0, forward and backward each, then AdamW; the tower
   frozen), and a pipeline stage's forward and backward (2 decoder layers, part 3's micro-batch). Matmul time is
   the self CPU time of the GEMM and convolution kernels (``aten::mm``, ``addmm``, ``bmm``...) over the step's
   wall time; the attention kernels are printed beside it.
2. **Packing** (``bench_packing.py``'s runs, on this model): (a) packed, (b) padded, both ``mpipe-hf train`` at
   R = 2, V = 2, M = ``--micro``, frozen tower; (c) the plain one-process HF Trainer, padded, 2 threads. Label
   tokens/s, padding, bubble per rank, and the decoder multiply-adds per label token. Goal: packed >= 1.5x padded
   with <= 5% padding.
3. **Schedules** on 2 ranks of one thread each (gloo): the stages of ``bench_compute_stages.ComputeStages`` (the
   real layers, the real tower on one 224 x 224 image per 128-token micro-batch) under torch's
   ``ScheduleInterleaved1F1B`` (a), the same with the layers split as the simulator finds fastest (j; any split,
   the tower's stage 0 keeping fewer), ``ScheduleInterleavedZeroBubble`` (k, l) and ``ScheduleZBVZeroBubble``
   (m), all with the tower inside stage 0, against MPipe Transpose on our executor: ``full`` (d), bubble filling
   (f, frozen) or owner-backward (g, trainable), and zero-bubble (h). Goals: frozen tower >= 1.30x the best torch
   row, trainable >= 1.8x.

Where a goal is missed the script prints where the time went. Packing: the work per label token (multiply-adds),
the bubble, and the busy time per multiply-add (per-call overhead). Schedules, per row, from each part's cost timed
on one thread (``part_costs``): the mean rank's work (the ideal), the busiest rank's (imbalance), the row's own
order run with those costs and no overhead (bubble: the simulator for our orders and torch's 1F1B, a replay of
torch's order for its zero-bubble ones), and the measured step (overhead: the runtime and the machine).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.join(os.path.dirname(HERE), "make"))  # make_demo's DEMO_RANKS
from bench_compute_stages import TOKENS, ComputeStages, compute_config, matmul_share, part_costs  # noqa: E402
from bench_compute_report import (packing_report, pipeline_report, row_figures, share_lines,  # noqa: E402
                                  stage_costs_of)
from bench_schedules_stages import first_line, lockstep, run_ours, run_torch  # noqa: E402
from sleeping import run_ranks  # noqa: E402

MICRO = 8  # part 3's micro-batches per step (R = 2: four per rank)


def tokenizer():
    """The demo's tokenizer: the Qwen2 BPE cut to ``scripts/make/make_demo.py``'s ranks."""
    from mpipe_hf.data import qwen2_tokenizer
    from make_demo import DEMO_RANKS
    return qwen2_tokenizer(DEMO_RANKS)


def shape(args) -> dict:
    """``compute_config``'s sizes: the benchmark's, or a smoke run's."""
    return dict(layers=4, vision_depth=2, hidden=64) if args.tiny else {}


def build_model(demo: str, work: str, args) -> str:
    """A checkpoint folder ``work/compute`` beside the demo's data (a link): the benchmark's config, random
    weights, the demo's tokenizer, processor and chat template (as ``scripts/make/make_demo.py`` writes them)."""
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration
    from mpipe_hf.data import default_chat_template, qwen2_5_vl_processor
    from mpipe_hf.data.hub import save_processor_files
    folder = os.path.join(work, "compute")
    model_dir = os.path.join(folder, "model")
    if not os.path.exists(os.path.join(model_dir, "config.json")):
        tok = tokenizer()
        torch.manual_seed(0)
        model = Qwen2_5_VLForConditionalGeneration(compute_config(tok, **shape(args)))
        model.save_pretrained(model_dir)
        save_processor_files(model_dir, model.config, qwen2_5_vl_processor(tok, 56 * 56, 112 * 112),
                             default_chat_template("qwen2_5_vl"))
        print(f"wrote {model_dir}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters", flush=True)
    if not os.path.exists(os.path.join(folder, "data")):
        os.symlink(os.path.abspath(os.path.join(demo, "data")), os.path.join(folder, "data"))
    return folder


def packing_part(args, work: str, folder: str) -> list[dict]:
    """Part 2: ``bench_packing.run_all`` on this model; its three result rows."""
    import bench_packing
    packing_args = argparse.Namespace(rows=args.rows, steps=args.steps, warm=args.warm, micro=args.micro,
                                      budget_x=4.0, seed=0, demo=folder, out=work, timeout=args.timeout,
                                      quick=False, keep=True)
    return bench_packing.run_all(packing_args, work)


def share_part(work: str, args) -> list[str]:
    """Part 1: the matmul share of the unsplit model's training step on part 2's first padded micro-batch, and
    of a pipeline stage's forward and backward."""
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration
    import bench_packing
    torch.set_num_threads(1)
    plan, _ = bench_packing.plans(os.path.join(work, "padded.yaml"))
    batches = [plan.load(0, m) for m in range(args.micro)]
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(os.path.join(work, "compute", "model"))
    model.model.visual.requires_grad_(False)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)

    def step():  # one optimizer step: step 0's micro-batches accumulated, then AdamW
        for batch in batches:
            model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    whole = matmul_share(step)
    stages = ComputeStages(compute_config(tokenizer(), **shape(args)), "frozen", [2] * 4,
                           tokens=16 if args.tiny else TOKENS)
    chunk = stages.chunk(1, tower=False)
    hidden = torch.randn(1, stages.ids.shape[1], chunk.layers[0].hidden_size, requires_grad=True)
    stage = matmul_share(lambda: chunk(hidden).sum().backward(), repeats=2)
    return share_lines(whole, stage, [tuple(b["input_ids"].shape) for b in batches])


def pipeline_rows(args, rank: int, mode: str) -> tuple[list, dict, list[int]]:
    """Part 3 for one tower ``mode``: every row, measured on both ranks; ``(rows, part costs, even layout)``. A row
    is ``(name, family, measured s or None, error, figures)`` (:func:`bench_compute_report.row_figures`)."""
    from mpipe_hf.schedule import ScheduleConfig, build_schedule
    from mpipe_hf.schedule.simulate import simulate
    config = compute_config(tokenizer(), **shape(args))
    layers = config.text_config.num_hidden_layers
    tokens = 16 if args.tiny else TOKENS
    grid = (1, 4, 4) if args.tiny else None
    extra = {"grid": grid} if grid else {}
    even = [layers // 4] * 4
    costs = part_costs(ComputeStages(config, mode, even, tokens=tokens, **extra))
    identity = ScheduleConfig(2, 2, MICRO, "identity")
    # the strongest layout for torch's rows: every split of the layers over the 4 stages (1 or more each), by the
    # simulator with the timed costs, the tower in stage 0
    layouts = [[a, b, c, layers - a - b - c] for a in range(1, layers) for b in range(1, layers - a)
               for c in range(1, layers - a - b)]
    rebalanced = min(layouts, key=lambda lay: simulate(build_schedule(identity), stage_costs_of(
        costs, lay, inside=True).simulator()).makespan)
    rows = []

    def measure(name, family, run, layout, cfg=None):
        result, error = lockstep(run)
        step = None if result is None else (result[0] if family == "torch" else result)
        figures = row_figures(costs, layout, MICRO, cfg, None if result is None else result, family)
        rows.append((name, family, step, error, figures))
        if rank == 0:
            print(f"  {mode} {name}: {error or format(step, '.3f') + ' s'}", flush=True)

    def torch_row(name, kind, layout):
        stages = ComputeStages(config, mode, layout, tokens=tokens, **extra)
        measure(name, "torch", lambda: run_torch(kind, rank, stages, MICRO, args.pipeline_steps), layout)

    def ours_row(name, fields):
        cfg = ScheduleConfig(2, 2, MICRO, preprocess=mode, **fields)
        model = stage_costs_of(costs, even, inside=False, recompute=mode == "trainable"
                               and not fields.get("owner_backward")).simulator()
        stages = ComputeStages(config, mode, even, tokens=tokens, **extra)
        measure(name, "mpipe", lambda: run_ours(cfg, rank, stages, args.pipeline_steps, model)[0], even, cfg)

    # ours first: its executor makes the groups every later one reuses (bench_schedules.py, worker)
    ours_row("(d) MPipe full", dict(overflow="full"))
    if mode == "frozen":
        ours_row("(f) MPipe full, bubble filling", dict(placement="fill"))
        ours_row("(h) MPipe full, bubble filling + zero-bubble", dict(placement="fill", zero_bubble=True))
    else:
        ours_row("(g) MPipe full, owner-backward", dict(owner_backward=True))
        ours_row("(h) MPipe full, owner-backward + zero-bubble", dict(owner_backward=True, zero_bubble=True))
    torch_row("(a) torch interleaved 1F1B, tower in stage 0", "1f1b", even)
    torch_row(f"(j) torch interleaved 1F1B, layers per stage {rebalanced}", "1f1b", rebalanced)
    torch_row("(k) torch interleaved zero-bubble, tower in stage 0", "zb", even)
    torch_row(f"(l) torch interleaved zero-bubble, layers per stage {rebalanced}", "zb", rebalanced)
    torch_row("(m) torch ZBV zero-bubble, tower in stage 0", "zbv", even)
    return rows, costs, even


def worker(args):
    """One of part 3's 2 ranks: both tower modes; rank 0 prints the report."""
    import torch
    import torch.distributed as dist
    sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
    torch.set_num_threads(1)
    started = time.perf_counter()
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    rank = dist.get_rank()
    results = {}
    for mode in ("frozen", "trainable"):
        try:
            results[mode] = pipeline_rows(args, rank, mode)
        except Exception as error:  # a mode that cannot run at all still lets the other report
            results[mode] = ([], {}, [], first_line(error))
    if rank == 0:
        print(pipeline_report(results, MICRO, time.perf_counter() - started), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # the runtimes' helper threads can abort the interpreter's shutdown; the report is out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo", help="a built demo (default: built under --out)")
    parser.add_argument("--out", default="outputs/bench_compute")
    parser.add_argument("--rows", type=int, default=240, help="part 2: rows drawn")
    parser.add_argument("--steps", type=int, default=7, help="part 2: optimizer steps per run, warm ones included")
    parser.add_argument("--warm", type=int, default=2, help="part 2: first steps left out of the timing")
    parser.add_argument("--micro", type=int, default=4, help="part 2: micro-batches per step of the pipelined runs")
    parser.add_argument("--pipeline-steps", type=int, default=3, help="part 3: measured steps per row (median)")
    parser.add_argument("--timeout", type=int, default=1800, help="part 2: seconds per run")
    parser.add_argument("--skip-packing", action="store_true", help="parts 1 and 2 left out")
    parser.add_argument("--skip-pipeline", action="store_true", help="part 3 left out")
    parser.add_argument("--tiny", action="store_true", help="a smoke run: hidden 64, 24 rows, 1 step per row")
    args = parser.parse_args(argv)
    if args.tiny:
        args.rows, args.steps, args.warm, args.pipeline_steps = 24, 3, 1, 1
    if "RANK" in os.environ:
        return run_ranks(__file__, 2, worker, args)
    os.environ["OMP_NUM_THREADS"] = "1"
    work = os.path.abspath(args.out)
    os.makedirs(work, exist_ok=True)
    started = time.perf_counter()
    print(f"load average at the start: {os.getloadavg()[0]:.1f} (2 cores)", flush=True)
    if not args.skip_packing:
        from demo_run import demo_dir
        folder = build_model(demo_dir(args.demo, work), work, args)
        results = packing_part(args, work, folder)
        print(packing_report(results), flush=True)
        print("\n".join(share_part(work, args)), flush=True)
    if not args.skip_pipeline:
        run_ranks(__file__, 2, worker, args)
    print(f"load average at the end: {os.getloadavg()[0]:.1f}; the whole run took "
          f"{time.perf_counter() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
