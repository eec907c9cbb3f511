"""The trainer: every rank loads the checkpoint, keeps its stages, loads its own micro-batches and runs the MPipe
Transpose schedule; AdamW steps each rank's own parameters (SPEC.md, "The job").

Launch with ``mpipe-hf train RECIPE.yaml`` (starts the processes itself), ``torchrun ... -m mpipe_hf.train
RECIPE.yaml`` or ``accelerate launch ... -m mpipe_hf.train RECIPE.yaml``.

:func:`train` is the loop; the pieces it calls are :class:`~.job.RecipeJob` (the recipe's data, optimizer,
metrics and checkpoints) around :class:`~.run.PipelineRun` (the pipeline itself, shared with
:class:`~.hf.MPipeTrainer`).
"""

from __future__ import annotations

import os
import time

import torch.distributed as dist

from ..runtime.liveness import announce_end
from .checks import check, check_layout, check_output_dir  # cli.py, the tests and the scripts import them here
from .job import RecipeJob, TrainResult
from .recipe import Recipe, load_recipe
from .report import error_line, log_failure
from .sources import (is_vision_language, load_config, load_data, load_model,
                      load_processor, load_share, owner_costs)

__all__ = ["TrainResult", "train", "main", "check", "check_layout", "check_output_dir",
           "is_vision_language", "load_config", "load_data", "load_model", "load_processor", "load_share",
           "owner_costs"]


def train(recipe: Recipe) -> TrainResult:
    """Run ``recipe.train.max_steps`` optimizer steps (or ``num_train_epochs`` passes over the data) and save a
    checkpoint to ``output_dir/checkpoint``.

    After each step (and its evaluation and ``checkpoint-<step>``), the loop asks the job whether to stop
    (:meth:`~.job.RecipeJob.stop_requested`, preemption): it then leaves a resumable ``checkpoint-<step>`` and
    returns without the final save.

    Raises:
        ValueError: a bad recipe, model or sample (before any collective for the recipe and model).
    """
    job = RecipeJob(recipe, check(recipe))
    job.announce()
    start = time.perf_counter()
    for step in job.progress():
        job.train_step(step)
        done = step + 1
        if job.eval_due(done):
            job.evaluate(done)
        saved = job.save(done) if job.save_due(done) else None
        if job.stop_requested():  # SIGTERM or SIGUSR1 on any rank (preemption)
            return job.stop(done, saved, time.perf_counter() - start)
    if job.eval_set is not None and job.start_step == job.steps:  # resumed at the end: only the evaluation left
        job.evaluate(job.steps)
    return job.finish(time.perf_counter() - start)


def main(argv: list[str] | None = None) -> None:
    """``python -m mpipe_hf.train RECIPE.yaml`` under torchrun or accelerate launch.

    A failure prints one line, ``mpipe-hf: error: ...`` (on rank 0 for an error every rank shares, the error of a
    pipeline step; on each failing rank for one of its own), writes each rank's full traceback to
    ``output_dir/logs/rank<r>.log`` and exits with status 1.
    """
    import sys
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: python -m mpipe_hf.train RECIPE.yaml (under torchrun or accelerate launch)")
    recipe = load_recipe(args[0])
    rank = int(os.environ.get("RANK", 0))
    try:
        train(recipe)
    except Exception as err:  # noqa: BLE001 - reported as one line, the traceback in the log
        path = log_failure(err, recipe.train.output_dir, rank)
        shared = getattr(err, "shared", False) or str(err).startswith("pipeline rank")
        announce_end(f"mpipe-hf: error: rank {rank}: {error_line(err)}")  # peers blocked on NCCL end too
        if rank == 0 or not shared:
            where = "" if shared or int(os.environ.get("WORLD_SIZE", 1)) == 1 else f"rank {rank}: "
            print(f"mpipe-hf: error: {where}{error_line(err)} (tracebacks: {os.path.dirname(path)})",
                  file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(1)  # no teardown: a failed step's helper threads would only add noise ("terminate called ...")
    if dist.is_initialized():
        dist.destroy_process_group()


