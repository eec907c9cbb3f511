"""A recipe's run (``mpipe-hf train``): the :class:`~.run.PipelineRun` built from the recipe, with what only the
recipe route has around it: the processor and the datasets read from ``data``, the seeded micro-batch plan, the
optimizer and LR schedule of ``train``, the metrics log and trackers, resuming and ``checkpoint-<step>``
directories. :func:`.trainer.train` loops over its methods.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from dataclasses import dataclass
from functools import partial

import torch.distributed as dist
import yaml
from accelerate.utils import set_seed
from tqdm.auto import tqdm

from ..data import MicroBatchPlan
from ..data.packing import PackedCollate
from ..models.decoder import check_packable
from .checkpoint import save_hub_files
from .context_parallel_balance import run_balance
from .loop import saves_before_stop
from .metrics import MetricsLog
from .optimizer import build_optimizer, build_scheduler
from .preempt import MARKER, Preemption
from .recipe import Recipe
from .report import progress_fields, setup_line, state_bytes, step_row, summary_line, tracker_config
from .plan_packing import packed_plan, packing_line
from .run import PipelineRun
from .sources import load_config, load_data, load_processor, node_first, owner_costs
from .state import checkpoints, resolve_resume


@dataclass
class TrainResult:
    """Per-step losses (mean over label tokens), and where the checkpoint went."""

    losses: list[float]
    checkpoint: str
    wall_s: float


class RecipeJob:
    """Everything ``mpipe-hf train`` runs, built from ``recipe`` in the order that keeps a run reproducible: the
    process group and this rank's share (:class:`~.run.PipelineRun`), the seed, the data and its plan, the
    resumed weights, the executor, the optimizer and schedule, the resumed training state, the metrics and the
    eval set.

    Args:
        recipe: a validated recipe.
        layers_per_stage: the decoder layers per stage (:func:`~.checks.check`).

    Raises:
        ValueError: a bad model, data file or checkpoint (on every rank, naming the rank that failed).
    """

    def __init__(self, recipe: Recipe, layers_per_stage: list[int]):
        self.recipe, opt = recipe, recipe.train
        self.preemption = Preemption().install()  # first: a signal during the set-up stops after the first step
        os.makedirs(opt.output_dir, exist_ok=True)
        self.run = run = PipelineRun(recipe.parallel, opt.seed, recipe.data)
        self.config = load_config(recipe.model)  # before the mesh: parallel.mesh_order auto weighs its sizes
        run.connect(self.config, opt.bf16)
        self.preemption.connect()
        run.carve(recipe.model, self.config, layers_per_stage,
                  recipe.lora.peft_config() if recipe.lora is not None else None)
        run.freeze(opt.trainable_spec())
        if opt.gradient_checkpointing:
            run.carved.model.activation_checkpointing_enable({"use_reentrant": False})
        set_seed(opt.seed)
        self.processor = load_processor(recipe, self.config)
        dataset, self.collate = self._read(None, "data load")
        self.left_out = (dict(getattr(dataset, "dropped", {})), len(getattr(dataset, "bad", ())))  # at launch
        self.plan = self._plan(dataset)
        self.balance = run_balance(self.plan, dataset, self.config, recipe, run.cfg.num_micro)  # None at cp 1
        self.steps = opt.total_steps(self.plan.steps_per_epoch())
        if recipe.parallel.owners == "balanced":
            per_micro = recipe.data.micro_batch_size if not recipe.data.packing else sum(
                len(self.plan.rows(0, m)) for m in range(run.cfg.num_micro)) / run.cfg.num_micro
            run.use_owners(self.plan, owner_costs(dataset, self.config), per_micro)
        self.run_id = os.environ.get("TORCHELASTIC_RUN_ID", "")
        self.restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
        self.resume = resolve_resume(opt.resume, opt.output_dir, self.run_id, self.restart)
        if self.resume is not None:  # the weights first, into the whole tensors (before FSDP shards them)
            run.load_weights(self.resume)
        run.start(bf16=opt.bf16, trace=opt.trace, swap=recipe.swap, loss_normalization=opt.loss_normalization)
        self.optimizer = build_optimizer(run.carved.model, run.params, opt)  # None: a frozen P is all it holds
        self.scheduler = build_scheduler(self.optimizer, opt, self.steps)
        self.start_step = 0 if self.resume is None else run.load_state(self.resume, self.optimizer, self.scheduler,
                                                                        opt.reset_optimizer)
        self.metrics = MetricsLog(opt.output_dir, opt.report_to, self.start_step if self.resume is not None else None,
                                  tracker_config(recipe), enabled=run.lead)
        self.eval_set = None
        if recipe.data.eval_path is not None:
            self.eval_set = self._read(recipe.data.eval_path, "eval data load")[0]
            collate = PackedCollate(self.collate) if recipe.data.packing else self.collate  # the same rows, packed
            self.eval_plan = MicroBatchPlan(self.eval_set, collate, run.cfg.num_micro,
                                            recipe.data.micro_batch_size, run.carved.validate_micro, evaluation=True)
        self.eval_rows = None  # (rows evaluated, eval rows) of the last evaluation
        self.losses, self.bubbles, self.peaks, self.bar = [], [], [], None
        self.step_ran, self.stopped_by = True, None  # the last step ran; the signal that stopped the run

    def _plan(self, dataset) -> MicroBatchPlan:
        """The rows of each step's micro-batches: ``data.micro_batch_size`` rows each, or with ``data.packing``
        whole rows up to ``data.max_tokens_per_micro`` tokens, packed into one sequence and balanced by cost
        (:class:`~mpipe_hf.data.packing.PackedPlan`)."""
        data, run = self.recipe.data, self.run
        validate, drop = run.carved.validate_micro, data.on_bad_sample == "skip"
        if data.packing:
            check_packable(self.config.get_text_config())
            return packed_plan(dataset, self.config, self.recipe, run.cfg.num_micro, self.collate, validate=validate,
                               replica=run.dp_rank, drop_bad_rows=drop)
        return MicroBatchPlan(dataset, self.collate, run.cfg.num_micro, data.micro_batch_size, validate, data.shuffle,
                              self.recipe.train.seed, run.dp_rank, self.recipe.parallel.dp_size, drop_bad_rows=drop)

    def _read(self, path: str | None, what: str):
        """``(dataset, collate)`` of the recipe's data (``path``: that file alone, the eval set) on every rank
        (:func:`~.sources.load_data`). The first read checks and tokenises the rows on each node's first process
        (``LOCAL_RANK`` 0) while the node's others wait, then they read its cache (``mpipe-hf train`` built it
        before the launch, so this is quick). A failure on any rank is raised on every rank."""
        quiet = not self.run.lead or os.environ.get("MPIPE_HF_DATA_CHECKED") == "1"  # the launcher printed them
        return node_first(lambda: load_data(self.recipe, self.config, self.processor, quiet=quiet, path=path), what,
                          self.run.every)

    # ---- the loop's steps ---------------------------------------------------------------------------------

    def progress(self):
        """The steps left, ``start_step .. steps - 1``, as a progress bar on rank 0."""
        self.bar = tqdm(range(self.start_step, self.steps), disable=not self.run.lead, desc="train",
                        dynamic_ncols=True, initial=self.start_step, total=self.steps)
        return self.bar

    def train_step(self, step: int) -> None:
        """Step ``step`` (0-based): the schedule, clipping and the finite check (:meth:`.PipelineRun.step`), then
        AdamW's and the LR schedule's step and the metrics row (every ``logging_steps`` and the last, with the
        rows the step dropped at load, ``bad_rows``, and the run's, ``bad_rows_total``); a skipped step takes
        neither and is logged as skipped. Before the run stops for bad data, it saves ``checkpoint-<step>``
        (:meth:`save_before_stop`)."""
        ahead = partial(self.plan.load, step + 1) if step + 1 < self.steps else None  # placement fill loads it early
        try:
            result = self.run.step(step, partial(self.plan.load, step), self.recipe.train.max_grad_norm, ahead,
                                   plan=self.plan)
        except ValueError as err:
            if step > 0 and saves_before_stop(err, self.run.data_parallel is not None):  # step 0: nothing to keep
                self.save_before_stop(step)
            raise
        self.step_ran = result.ran
        if not result.ran:
            return self._skipped(step)
        lr = self.scheduler.get_last_lr()[0]
        if self.optimizer is not None:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        else:  # the schedule's AdamW of no parameters (a rank that trains nothing): a no-op, in torch's order
            self.scheduler.optimizer.step()
        self.scheduler.step()  # on every rank: the learning rate rank 0 logs is the run's
        stats = result.stats
        if stats.bad_rows and self.run.lead:  # the owners printed theirs, on their own output
            tqdm.write(self.run.skips.dropped_warning(step, stats))
        self.losses.append(stats.loss)
        self.bubbles.append(stats.rank_bubble)
        self.peaks.append(stats.rank_activation_bytes)
        row = step_row(step, stats, result.grad_norm, lr, self.run.skips.total)
        row["bad_rows"], row["bad_rows_total"] = stats.bad_rows, self.run.skips.bad_rows  # rows dropped at load
        if self.balance is not None:  # the costliest CP rank's work over the mean, from the step's rows
            row["cp_costliest_over_mean"] = round(self.balance.step(step), 3)
        if self.bar is not None:
            self.bar.set_postfix(progress_fields(stats, row))
        if (step + 1) % self.recipe.train.logging_steps == 0 or step + 1 == self.steps:
            self.metrics.log(row)

    def save_before_stop(self, done: int) -> None:
        """The run stops for bad data after ``done`` steps (:func:`~.loop.saves_before_stop`): an ordinary
        resumable ``checkpoint-<done>`` first, holding the rows that failed (a resumed run leaves them out), and
        rank 0 prints where it is and how to go on."""
        path = os.path.join(self.recipe.train.output_dir, f"checkpoint-{done}")
        # the checkpoint save_steps wrote after step done, or the one this run resumed from, is kept as it is (every
        # rank decides alike, from the step and the recipe, never from what its own disk holds: the save is
        # collective)
        if not (self.save_due(done) or (self.resume is not None and done == self.start_step)):
            path = self.save(done)
        if self.run.lead:
            print(f"mpipe_hf: stopping for bad data after step {done}: saved {os.path.abspath(path)}; leave the bad "
                  f"rows out (mpipe-hf check-data RECIPE --write-clean FILE, then data.clean_rows: FILE) or raise "
                  f"data.max_bad_rows, and continue with train.resume: auto (or that path)", flush=True)

    def _skipped(self, step: int) -> None:
        skips = self.run.skips
        if self.run.lead:
            tqdm.write(skips.warning(step))
        self.metrics.log({"step": step + 1, "skipped": True, "skipped_steps": skips.total,
                          "bad_rows_total": skips.bad_rows, "error": skips.last})

    def eval_due(self, done: int) -> bool:
        """An evaluation after step ``done`` (1-based): every ``eval_steps`` and after the last step."""
        every = self.recipe.train.eval_steps
        return self.eval_set is not None and ((every and done % every == 0) or done == self.steps)

    def evaluate(self, done: int) -> None:
        """``eval_loss`` over the whole eval set, logged at step ``done`` with the rows it ran on (``eval_rows``)
        and those that failed to load and were left out (``eval_rows_dropped``, gathered from their owners; they
        count towards no limit). Rank 0 prints the loss and the rows, and a warning when any were left out."""
        import time
        begin = time.perf_counter()
        loss, tokens = self.run.evaluate(self.eval_plan.load_rows, self.eval_plan.eval_micros())
        dropped = self.run.gathered_rows(self.eval_plan.take_dropped())
        total = len(self.eval_set)
        used = total - len(dropped)
        self.eval_rows = (used, total)
        self.metrics.log({"step": done, "eval_loss": loss, "eval_label_tokens": tokens, "eval_rows": used,
                          "eval_rows_dropped": len(dropped), "eval_runtime": round(time.perf_counter() - begin, 3)})
        if self.run.lead:
            tqdm.write(f"mpipe_hf: step {done}: eval_loss {loss:.5f} over {tokens} label tokens of {used} of {total} "
                       f"eval rows")
            if dropped:
                tqdm.write(f"mpipe_hf: warning: step {done}: the evaluation ran on {used} of {total} rows: "
                           f"{len(dropped)} failed to load and were left out (the first: {dropped[0]}); "
                           f"mpipe-hf check-data RECIPE lists them all")

    def save_due(self, done: int) -> bool:
        """A ``checkpoint-<done>`` after step ``done``: every ``save_steps``."""
        every = self.recipe.train.save_steps
        return bool(every) and done % every == 0

    def stop_requested(self) -> bool:
        """Whether any rank has received SIGTERM or SIGUSR1 (preemption, :mod:`.preempt`): the same answer on
        every rank, from one all-reduce over the world. Call it once after each step.

        Not after a skipped step (every rank skips the same steps): a failed step can leave a data-parallel
        collective of FSDP2 pending on one replica, which only the next step's matches; an all-reduce first would
        wait on it for ever. The signal is then taken after the next step."""
        if not self.step_ran:
            return False
        self.stopped_by = self.preemption.agreed(self.run.device)
        return self.stopped_by is not None

    def stop(self, done: int, saved: str | None, wall_s: float) -> TrainResult:
        """End a preempted run after step ``done``: ``checkpoint-<done>`` (unless ``saved``, this step's, is on disk
        already), then rank 0 records it in ``output_dir/preempted.json`` (the launcher's sign that the workers
        saved) and prints one line saying where it is and how to go on."""
        path = saved or self.save(done)
        self.metrics.close()
        self.preemption.uninstall()
        if self.bar is not None:
            self.bar.close()
        if self.run.lead:
            record = os.path.join(self.recipe.train.output_dir, MARKER)
            with open(record + ".tmp", "w") as f:
                json.dump({"signal": self.stopped_by, "step": done, "checkpoint": os.path.abspath(path)}, f)
            os.replace(record + ".tmp", record)
            print(f"mpipe_hf: preempted by {self.stopped_by} after step {done} of {self.steps}: saved "
                  f"{os.path.abspath(path)}; continue with train.resume: auto (or that path)", flush=True)
        return TrainResult(self.losses, path, wall_s)

    # ---- checkpoints and the end --------------------------------------------------------------------------

    def extras(self, directory: str, with_config: bool | None = None) -> None:
        """What a hub snapshot holds besides the weights (config unless the run saves an adapter, processor
        files, chat template, generation config)."""
        if with_config is None:
            with_config = self.run.carved.peft is None
        save_hub_files(directory, self.run.carved.model.config, self.processor, self.recipe.model.name_or_path,
                       with_config)

    def save(self, done: int) -> str:
        """``output_dir/checkpoint-<done>``, whole or not at all: the weights, the hub files, every rank's
        training state (:meth:`.PipelineRun.save`), ``trainer_state.json`` (the step, the run's id and its log)
        and ``recipe.yaml``; then the oldest beyond ``save_total_limit`` are removed. Returns its path."""
        opt = self.recipe.train

        def with_state(directory):
            self.extras(directory)
            with open(os.path.join(directory, "trainer_state.json"), "w") as f:
                json.dump({"global_step": done, "max_steps": self.steps, "run_id": self.run_id,
                           "log_history": self.metrics.history}, f, indent=1)
            with open(os.path.join(directory, "recipe.yaml"), "w") as f:
                yaml.safe_dump(dataclasses.asdict(self.recipe), f)
        path = os.path.join(opt.output_dir, f"checkpoint-{done}")
        self.run.save(path, done, self.optimizer, self.scheduler, with_state)
        if self.run.lead and opt.save_total_limit is not None:
            for _, old in checkpoints(opt.output_dir)[:-opt.save_total_limit]:
                shutil.rmtree(old, ignore_errors=True)
        return path

    def announce(self) -> None:
        """Rank 0 prints the run's settings, with ``data.packing`` the packing of the first step it runs
        (:func:`~.plan_packing.packing_line`), and after a restart where it resumed from."""
        if not self.run.lead:
            return
        print(setup_line(self.recipe, self.run, self.config, self.resume, self.start_step), flush=True)
        if self.recipe.data.packing:
            print(packing_line(self.plan, min(self.start_step, max(self.steps - 1, 0))), flush=True)
        if self.restart:
            print(f"mpipe_hf: restart {self.restart} of the worker group after a failure: "
                  + (f"resumed from {self.resume}" if self.resume is not None else "no checkpoint of this run yet: "
                     "from the start"), flush=True)

    def finish(self, wall_s: float) -> TrainResult:
        """Save ``output_dir/checkpoint`` (and ``merged`` for a LoRA recipe with ``merge``), the trace, each
        rank's state bytes (``memory.json``) and the summary line; close the metrics."""
        opt, run = self.recipe.train, self.run
        self.preemption.uninstall()  # the run ends now anyway: a signal from here on has its usual effect
        out = os.path.join(opt.output_dir, "checkpoint")
        run.save_weights(out, self.extras)
        if self.recipe.lora is not None and self.recipe.lora.merge:
            run.save_weights(os.path.join(opt.output_dir, "merged"), partial(self.extras, with_config=True),
                             merged=True)
        if opt.trace:
            run.write_trace(os.path.join(opt.output_dir, "trace.json"))
        self.metrics.close()
        held = [None] * dist.get_world_size()
        dist.all_gather_object(held, state_bytes(run.carved.model, self.optimizer))
        if run.lead:
            with open(os.path.join(opt.output_dir, "memory.json"), "w") as f:
                json.dump({"model_state_bytes_per_rank": held}, f, indent=1)
            print(summary_line(self, wall_s, out), flush=True)
        return TrainResult(self.losses, out, wall_s)
