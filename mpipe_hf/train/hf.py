"""The Hugging Face Trainer, pipelined: :class:`MPipeTrainer`, :class:`MPipeCallback` and :class:`MPipeConfig`.

An existing ``transformers.Trainer`` script becomes an MPipe Transpose one by swapping the class and passing an
:class:`MPipeConfig` (README, "The Hugging Face Trainer"). The Trainer keeps what it does well (the outer loop,
``TrainingArguments``, the LR scheduler, logging, callbacks and ``report_to``, ``save_steps`` and
``save_total_limit``, ``resume_from_checkpoint``); the pipeline step and everything a rank holding one share of
the model needs are the components ``mpipe-hf train`` runs on (README, "Design notes"):

- one optimizer step is one schedule over the step's micro-batches (:func:`~.loop.run_step`): the Trainer's
  ``gradient_accumulation_steps`` is the number of micro-batches ``M`` and ``per_device_train_batch_size`` the
  rows per micro-batch. The Trainer's loop runs as for one process (its epochs, its last short step, its sample
  counts); its dataloader yields row indices, and the schedule runs at each step's first micro-batch;
- only the owner of a micro-batch reads and collates its rows, with the user's ``data_collator`` (or, for
  ``messages``/``images`` rows, :class:`~mpipe_hf.data.ConversationCollator`);
- AdamW over the rank's own parameters in the Trainer's decay groups (:func:`~.optimizer.build_optimizer`),
  clipping by the global norm over the pipeline (:func:`~.optimizer.clip_grad_norm`), bf16 autocast with fp32
  master weights (:mod:`.precision`);
- checkpoints: every rank writes its shard (:func:`~.checkpoint.save_checkpoint`) and its optimizer state; the
  Trainer writes the scheduler, the RNG states (per process) and ``trainer_state.json``. All of it goes into
  ``tmp-checkpoint-<step>`` beside the checkpoint, is flushed to disk and then renamed to ``checkpoint-<step>``
  (:meth:`MPipeTrainer._save_checkpoint`), so ``resume_from_checkpoint=True`` never picks up a half-written one;
- ``evaluate()`` runs the forward-only schedule (:mod:`mpipe_hf.schedule.forward`) and reports ``eval_loss``
  normalised by the eval set's label tokens.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import shutil
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader
from transformers import AutoConfig, Trainer, TrainerCallback
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_callback import ExportableState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, SaveStrategy, rotate_checkpoints
from transformers.utils import logging

from ..data import ConversationCollator, MicroBatchPlan
from ..data.owner import epoch_order
from ..models import get_family, split
from ..models.adapters import ADAPTER, check_adapted
from ..models.load import (load_adapter_values, load_share_values, split_checked, split_from_checkpoint,
                           split_from_config)
from ..runtime import PipelineExecutor, build_mesh, init_distributed
from .checkpoint import publish, save_adapter, save_checkpoint, save_hub_files, sync_tree
from .collective import together
from .loop import Skips, evaluate_rows, finite_step, run_step
from .optimizer import build_optimizer, clip_grad_norm, no_parameters
from .precision import autocast_modules
from .recipe import DataSection, ParallelSection, TrainSection

logger = logging.get_logger(__name__)
OPTIMIZERS = ("adamw_torch", "adamw_torch_fused")
SAMPLING = ("random", "sequential")
# A checkpoint being written is ``tmp-checkpoint-<step>``: neither the Trainer's resume (``get_last_checkpoint``,
# ``^checkpoint-(\d+)$``) nor its rotation (the glob ``checkpoint-*``) sees it; ``save_checkpoint`` adds its own
# ``.tmp``/``.old`` suffixes to that name, which neither sees either.
STAGING_PREFIX = "tmp-"


@dataclass(frozen=True, kw_only=True)
class MPipeConfig(ParallelSection):
    """The pipeline of an :class:`MPipeTrainer`: the recipe's ``parallel`` section (the schedule, SPEC.md
    "Modes", and the layout: ``pp_size``, ``vpp``, ``preprocess``, ``overflow``, ``owner_backward``,
    ``less_memory``, ``placement``, ``text_layers``, ``layers_per_stage``, ``profile``, ``timeout_s``) and the
    bad-sample policy of its ``data`` section. ``num_micro`` is not set here: it is the Trainer's
    ``gradient_accumulation_steps``.

    Attributes:
        max_length: the token limit of the default conversation collator.
        on_bad_sample, max_bad_steps: as the recipe's ``data`` section.

    Raises:
        ValueError: a bad value, naming the field and the allowed values; ``num_micro`` set.
    """

    max_length: int = 2048
    on_bad_sample: str = "skip"
    max_bad_steps: int = 3

    def __post_init__(self):
        if self.num_micro != 1:
            raise ValueError("MPipeConfig takes no num_micro: the micro-batches per step are "
                             "TrainingArguments.gradient_accumulation_steps")
        if self.owners != "modulo":  # the Trainer's dataset gives no image sizes without decoding its images
            raise ValueError(f"MPipeConfig owners must be 'modulo' (load-aware owners, 'balanced', are "
                             f"mpipe-hf train's: a recipe's parallel.owners), got {self.owners!r}")
        super().__post_init__()
        self.data()

    def parallel(self, num_micro: int) -> ParallelSection:
        """The recipe's ``parallel`` section with ``num_micro`` micro-batches per step."""
        return ParallelSection(**{f.name: getattr(self, f.name) for f in dataclasses.fields(ParallelSection)
                                  if f.name != "num_micro"}, num_micro=num_micro)

    def data(self, micro_batch_size: int = 1) -> DataSection:
        """The recipe's ``data`` section: the bad-sample policy and ``max_length``."""
        return DataSection(path="<the trainer's dataset>", micro_batch_size=micro_batch_size,
                           max_length=self.max_length, on_bad_sample=self.on_bad_sample,
                           max_bad_steps=self.max_bad_steps)


def check_training_args(args, mpipe: MPipeConfig) -> None:
    """Every ``TrainingArguments`` value a pipeline cannot honour, before any collective.

    Raises:
        ValueError: naming the argument and what to use instead.
    """
    problems = []
    if args.torch_compile:
        problems.append("torch_compile=True (compile each stage yourself; the pipeline runs the stages eagerly)")
    if args.deepspeed:
        problems.append("deepspeed (the pipeline holds one share of the model per rank; drop the DeepSpeed config)")
    if args.fsdp or args.fsdp_config and args.fsdp_config.get("fsdp_version"):
        problems.append("fsdp (data parallelism over the pipeline is not there yet; drop fsdp)")
    if args.fp16:
        problems.append("fp16=True (use bf16=True: fp32 master weights with bf16 autocast)")
    if args.optim not in OPTIMIZERS:
        problems.append(f"optim={args.optim!r} (one of {list(OPTIMIZERS)}: AdamW over each rank's parameters)")
    if args.train_sampling_strategy not in SAMPLING:
        problems.append(f"train_sampling_strategy={args.train_sampling_strategy!r} (one of {list(SAMPLING)})")
    if args.gradient_accumulation_steps < 1:
        problems.append(f"gradient_accumulation_steps={args.gradient_accumulation_steps} (the micro-batches per "
                        f"step, >= 1)")
    world = int(os.environ.get("WORLD_SIZE", 1))
    if world != mpipe.pp_size:
        problems.append(f"{world} processes for pp_size={mpipe.pp_size} (launch pp_size processes)")
    if problems:
        raise ValueError("MPipeTrainer cannot run with " + "; ".join(problems))


def _layout(parallel: ParallelSection, cfg) -> list[int] | None:
    """``layers_per_stage``, else the layout balanced by the costs of ``profile``, else ``None`` (balanced by the
    config's matmul costs)."""
    if parallel.layers_per_stage is not None or parallel.profile is None:
        return parallel.layers_per_stage
    from ..schedule.tune import Profile, profile_layers
    return profile_layers(Profile.load(parallel.profile), cfg, parallel.text_layers)


def _share(model, cfg, rank: int, layers_per_stage, text_layers: int, seed: int):
    """``(SplitModel, checkpoint path or None, decoder layers per stage)``: this rank's share of ``model``: a
    checkpoint path (read tensor by tensor), a model on the meta device (initialised from its config and
    ``seed``, bit for bit ``from_config``'s values), or a loaded model, carved in place (the modules this rank
    does not hold are dropped from it). A ``peft.PeftModel`` of either of the last two is carved with its
    adapter; a meta one is built anew by :func:`~mpipe_hf.models.load.split_from_config`, drawn as
    ``set_seed(seed); get_peft_model(from_config(config), its LoraConfig)`` (the trainer's ``carved.peft`` is
    then not the object the user passed)."""
    peft_model, adapter = None, None
    if _is_peft(model):
        peft_model, adapter = model, model.peft_config[ADAPTER]
        model = model.base_model.model
    path = str(model) if isinstance(model, (str, os.PathLike)) else None
    config = AutoConfig.from_pretrained(path) if path is not None else model.config
    counts = get_family(config.model_type).layer_counts(config, cfg, layers_per_stage, text_layers)
    if path is not None:
        return split_from_checkpoint(path, config, cfg, rank, counts, text_layers)[0], path, counts
    source = getattr(config, "_name_or_path", None) or None
    if any(p.is_meta for p in model.parameters()):
        return split_from_config(config, cfg, rank, counts, text_layers, seed, adapter)[0], None, counts
    if peft_model is None:
        return split(model, cfg, rank, counts, text_layers), source, counts
    check_adapted(model, adapter)
    carved = split_checked(model, cfg, rank, counts, text_layers,
                           {n for n, p in model.named_parameters() if p.requires_grad})
    carved.peft = peft_model
    return carved, peft_model.peft_config[ADAPTER].base_model_name_or_path or source, counts


def _is_peft(model) -> bool:
    try:
        from peft import PeftModel
    except ImportError:  # peft is needed only for a PeftModel, which cannot exist without it
        return False
    return isinstance(model, PeftModel)


class _EpochSampler(torch.utils.data.Sampler):
    """Row indices ``0 .. n-1`` in file order, or (``shuffle``) in the order of ``torch.randperm`` drawn from
    ``seed + epoch``: the same on every rank, and the same after a resume (the Trainer calls ``set_epoch``)."""

    def __init__(self, n: int, seed: int, shuffle: bool):
        self.n, self.seed, self.shuffle, self.epoch = n, seed, shuffle, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        if not self.shuffle:
            return iter(range(self.n))
        return iter(epoch_order(self.n, self.seed, self.epoch))


class _RowLoader(DataLoader):
    """A ``DataLoader`` of row indices whose ``set_epoch`` reaches its sampler."""

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)


class _Pipeline(nn.Module):
    """What the Trainer sees as the wrapped model: the rank's share (so ``zero_grad`` and ``train`` reach it),
    never wrapped by DDP."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module


class MPipeCallback(TrainerCallback):
    """Puts the pipeline's figures into every training log of the Trainer (so they reach every ``report_to``
    backend), over the steps since the last log: ``bubble`` (the ranks' share of time not computing),
    ``tokens_per_s`` (label tokens), ``step_s_rank<r>`` (mean step time of each rank, seconds),
    ``peak_activation_mib_rank<r>`` (most bytes saved for backward at once), ``peak_device_mib_rank<r>`` (on a GPU,
    ``max_memory_allocated``) and ``skipped_steps`` (in all). :class:`MPipeTrainer` adds it first, so the reporting
    callbacks see the figures."""

    def __init__(self):
        self.window, self.skips = [], None

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or "loss" not in logs:
            return
        before = set(logs)
        if self.window:
            world = len(self.window[0].rank_bubble)
            wall = sum(s.wall_s for s in self.window)
            logs["bubble"] = round(sum(s.bubble for s in self.window) / len(self.window), 4)
            logs["tokens_per_s"] = round(sum(s.num_tokens for s in self.window) / wall, 1) if wall else 0.0
            for r in range(world):
                logs[f"step_s_rank{r}"] = round(sum(s.rank_wall_s[r] for s in self.window) / len(self.window), 4)
                logs[f"peak_activation_mib_rank{r}"] = round(
                    max(s.rank_activation_bytes[r] for s in self.window) / 2 ** 20, 3)
                if self.window[0].rank_device_bytes:
                    logs[f"peak_device_mib_rank{r}"] = round(
                        max(s.rank_device_bytes[r] for s in self.window) / 2 ** 20, 1)
        logs["skipped_steps"] = self.skips.total if self.skips is not None else 0
        self.window = []
        last = state.log_history[-1] if state.log_history else {}
        if last.get("step") == state.global_step and "loss" in last:  # the Trainer kept this log before us
            last.update({k: v for k, v in logs.items() if k not in before})


def _release(executor: PipelineExecutor) -> None:
    """At interpreter exit: end the executor's helper threads and destroy the process groups while Python is
    still whole (a gloo group torn down during finalisation can abort the process after a finished run:
    "terminate called without an active exception")."""
    executor.watchdog.close()
    if dist.is_initialized():
        dist.destroy_process_group()


class MPipeTrainer(Trainer):
    """A ``transformers.Trainer`` whose training step is one MPipe Transpose schedule over the step's
    ``gradient_accumulation_steps`` micro-batches of ``per_device_train_batch_size`` rows each, under
    ``torchrun`` or ``accelerate launch`` with ``pp_size`` processes (module docstring).

    Args:
        model: a model loaded with ``from_pretrained`` (each rank then keeps only its share; the rest is dropped),
            a model built on the meta device (initialised from its config and ``args.seed``), or a checkpoint path
            (each rank reads only its tensors). With the last two no rank ever holds the whole model: use them for
            a large model. A ``peft.PeftModel`` (``get_peft_model`` on a loaded or meta model) trains its adapter
            only; checkpoints and ``save_model`` then write PEFT's adapter files.
        args: ``TrainingArguments``; ``learning_rate``, ``lr_scheduler_type``, ``warmup_*``, ``weight_decay``,
            ``adam_*``, ``max_grad_norm`` (the global norm over the pipeline), ``bf16``,
            ``gradient_checkpointing``, ``max_steps``/``num_train_epochs``, ``logging_steps``, ``save_steps``,
            ``save_total_limit``, ``eval_strategy``/``eval_steps``, ``report_to``, ``seed``,
            ``train_sampling_strategy`` (``random``: each epoch in an order drawn from ``data_seed`` or ``seed``,
            the same on every rank; ``sequential``) hold as for the Trainer.
        mpipe_config: the schedule and the layout.
        train_dataset, eval_dataset: indexable datasets of rows; ``messages``/``images`` rows need no collator.
        data_collator: rows -> a micro-batch dict (``input_ids``, ``attention_mask``, ``labels`` and the
            processor's image keys), called only by the owner of the micro-batch.
        processing_class: the processor (vision-language) or tokenizer; saved with every checkpoint.

    Raises:
        ValueError: a ``TrainingArguments`` value a pipeline cannot honour, a bad ``mpipe_config`` (before any
            collective), or an adapter inside a module the split freezes.
    """

    def __init__(self, model=None, args=None, mpipe_config: MPipeConfig | None = None, train_dataset=None,
                 eval_dataset=None, data_collator=None, processing_class=None, callbacks=None, **kwargs):
        if mpipe_config is None or args is None:
            raise ValueError("MPipeTrainer needs args (TrainingArguments) and mpipe_config (MPipeConfig)")
        check_training_args(args, mpipe_config)
        self.num_micro = args.gradient_accumulation_steps
        if args.gradient_checkpointing and args.gradient_checkpointing_kwargs is None:
            args.gradient_checkpointing_kwargs = {"use_reentrant": False}
        self.mpipe = mpipe_config
        self.parallel = mpipe_config.parallel(self.num_micro)
        self.cfg = self.parallel.schedule()
        self.rank = int(os.environ.get("RANK", 0))
        self.carved, self.source, counts = _share(model, self.cfg, self.rank, _layout(self.parallel, self.cfg),
                                          mpipe_config.text_layers, args.seed)
        self.params = self.carved.trainable_parameters(self.cfg, self.rank)  # none on a frozen-only rank
        self.user_collator = data_collator
        self.mpipe_callback = MPipeCallback()
        super().__init__(model=self.carved.model.train(), args=args, data_collator=data_collator,
                         train_dataset=train_dataset, eval_dataset=eval_dataset, processing_class=processing_class,
                         callbacks=callbacks, **kwargs)
        self.callback_handler.callbacks.insert(0, self.mpipe_callback)
        self.mpipe_callback.skips = self.skips = Skips()
        device = init_distributed(timedelta(seconds=mpipe_config.timeout_s))
        self.group = build_mesh(self.cfg.pp_size).get_group("pp")
        self.device = device
        self.model.to(device)
        heads = {id(p) for p, peer in self.carved.tied_parameters(self.cfg, self.rank) if peer == 0}
        self.counted = [p for p in self.params.values() if id(p) not in heads]
        stages, preprocess = ((autocast_modules(self.carved.stages, self.carved.preprocess, device)) if args.bf16
                              else (self.carved.stages, self.carved.preprocess))
        self.executor = PipelineExecutor(self.cfg, self.rank, stages, preprocess, self.group, device,
                                         self.params.values(), timedelta(seconds=mpipe_config.timeout_s),
                                         self.carved.tied_parameters(self.cfg, self.rank), seed=args.seed,
                                         measure_memory=True, loss_normalization=self.loss_normalization(),
                                         costs=self._costs(counts))
        atexit.register(_release, self.executor)
        self.pipeline = _Pipeline(self.model)

    def _costs(self, counts: list[int]):
        """The simulator costs of ``profile`` for this layout (placement ``fill`` places by them), or ``None``."""
        if self.parallel.profile is None:
            return None
        from ..schedule.tune import Profile, costs_for
        return costs_for(Profile.load(self.parallel.profile), self.cfg, counts, self.parallel.text_layers)

    def loss_normalization(self) -> str:
        """The Trainer's own: the step's summed token loss over its label tokens where it counts
        ``num_items_in_batch`` (a model that takes loss kwargs, or a ``compute_loss_func``), else the mean of the
        micro-batches' means (Qwen2.5-VL declares ``accepts_loss_kwargs = False``)."""
        return "tokens" if self.model_accepts_loss_kwargs or self.compute_loss_func is not None else "micro"

    # ---- data: the owner of a micro-batch reads its rows --------------------------------------------------

    def _collate(self):
        if self.user_collator is not None:
            return self.user_collator
        model_type = self.carved.model.config.model_type
        return ConversationCollator(self.processing_class, self.mpipe.max_length, model_type=model_type)

    def _plan(self, dataset, micro_batch_size: int) -> MicroBatchPlan:
        return MicroBatchPlan(dataset, self._collate(), self.num_micro, micro_batch_size, self.carved.validate_micro)

    def get_train_dataloader(self) -> DataLoader:
        """Row indices, ``per_device_train_batch_size`` per item (one micro-batch): the Trainer takes
        ``gradient_accumulation_steps`` items per optimizer step, as for one process, and the schedule reads the
        rows on their owners. Every rank iterates the same indices: sequential, or each epoch in an order drawn
        from ``data_seed`` (else ``seed``) and the epoch."""
        if self.train_dataset is None:
            raise ValueError("MPipeTrainer: training needs a train_dataset")
        self.plan = self._plan(self.train_dataset, self.args.per_device_train_batch_size)
        seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
        sampler = _EpochSampler(len(self.train_dataset), seed, self.args.train_sampling_strategy == "random")
        return _RowLoader(range(len(self.train_dataset)), batch_size=self.args.per_device_train_batch_size,
                          sampler=sampler, collate_fn=list)

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        """The update step's micro-batches (lists of row indices; fewer than ``M`` at the end of an epoch)."""
        self.step_rows = []
        for _ in range(num_batches):
            try:
                self.step_rows.append(next(epoch_iterator))
            except StopIteration:
                break
        return self.step_rows, None

    def floating_point_ops(self, inputs) -> int:
        return 0

    # ---- the step -----------------------------------------------------------------------------------------

    def _wrap_model(self, model, training: bool = True, dataloader=None):
        return self.pipeline  # not self.model: the Trainer then prepares only the optimizer (no DDP)

    def create_optimizer(self, model=None):
        if self.optimizer is None:
            args = self.args
            train = TrainSection(learning_rate=args.learning_rate, weight_decay=args.weight_decay,
                                 adam_beta1=args.adam_beta1, adam_beta2=args.adam_beta2, adam_epsilon=args.adam_epsilon)
            # a rank that trains nothing (only a frozen P, or LoRA layers elsewhere) steps an empty AdamW: no state
            self.optimizer = build_optimizer(self.model, self.params, train) or no_parameters(train)
        return self.optimizer

    def training_step(self, model, inputs, num_items_in_batch=None) -> torch.Tensor:
        """At the update step's first micro-batch: one schedule over all of the step's micro-batches, returning
        the step's loss (the same on every rank); at the others, 0, so the Trainer's sum is the step's loss. A
        skipped step (a bad sample, ``on_bad_sample: skip``) leaves no gradient and returns NaN, which the
        Trainer's ``logging_nan_inf_filter`` keeps out of the logged loss; the optimizer step and the LR
        schedule's step are skipped, as for an overflowing fp16 step."""
        if inputs is not self.step_rows[0]:
            return torch.zeros((), device=self.args.device)
        self.model.train()
        rows = list(self.step_rows)
        step = self.state.global_step
        stats = run_step(self.executor, lambda m: self.plan.load_rows(rows[m]),
                         self.mpipe.data(self.args.per_device_train_batch_size), self.skips, step,
                         num_micro=len(rows))
        self.optimizer._is_overflow = stats is None  # AcceleratedOptimizer: the Trainer then skips the LR step
        self.step_stats = stats
        if stats is None:
            if self.rank == 0:
                logger.warning(self.skips.warning(step))
            return torch.full((), float("nan"), device=self.args.device)
        self.mpipe_callback.window.append(stats)
        return torch.tensor(stats.loss, device=self.args.device)

    def _clip_grad_norm(self, model):
        return torch.tensor(clip_grad_norm(list(self.params.values()), self.counted, self.args.max_grad_norm,
                                           self.group, self.device))

    def _get_grad_norm(self, model, grad_norm=None):
        """The global gradient norm; a step whose loss or norm is not finite is skipped here, on every rank
        (its gradients dropped, no optimizer or LR step: :func:`~.loop.finite_step`)."""
        if grad_norm is None:
            grad_norm = clip_grad_norm(list(self.params.values()), self.counted, 0.0, self.group, self.device)
        stats = getattr(self, "step_stats", None)
        data = self.mpipe.data(self.args.per_device_train_batch_size)
        if stats is not None and not finite_step(stats, float(grad_norm), self.params.values(), self.skips, data):
            self.optimizer._is_overflow = True
            if self.rank == 0:
                logger.warning(self.skips.warning(self.state.global_step))
        return float(grad_norm)

    # ---- checkpoints --------------------------------------------------------------------------------------

    def _save_checkpoint(self, model, trial) -> None:
        """``checkpoint-<step>`` of the run's output directory, whole or not at all (the Trainer's own
        ``_save_checkpoint`` writes it in place). Every rank writes into ``tmp-checkpoint-<step>`` beside it:
        its shard (:meth:`save_model`; rank 0 also the index, config and processor files), its optimizer state
        and RNG state, rank 0 also the scheduler and ``trainer_state.json``; then every rank flushes the directory
        to disk, rank 0 renames it into place (:func:`~.checkpoint.publish`), pushes it where ``push_to_hub``
        asks, and rotates the checkpoints (``save_total_limit``, keeping ``best_model_checkpoint``). Each save
        first removes what a save that did not finish left (``tmp-checkpoint-*``). The rest is the Trainer's: the
        flos, the stateful callbacks' state, ``best_model_checkpoint`` (the final name, also for this step's).

        Raises:
            RuntimeError, ValueError: a write, flush or rename that failed on any rank, on every rank, as
                ``"pipeline rank R, saving DIR/checkpoint-<step>: OSError: ..."`` (:func:`~.collective.together`;
                a failure inside :meth:`save_model` names ``DIR/tmp-checkpoint-<step>``, as
                :func:`~.checkpoint.save_checkpoint` raises it). The temporary directory is removed;
                ``checkpoint-<step>`` and the checkpoints before it stay as they were.
        """
        if self.hp_search_backend is None and trial is None:
            self.store_flos()  # a collective over every process, where the Trainer has it
        run_dir = self._get_output_dir(trial=trial)
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        final, staging = os.path.join(run_dir, name), os.path.join(run_dir, STAGING_PREFIX + name)
        best = self.state.best_model_checkpoint

        def shared(fn):
            return together(fn, f"saving {final}", self.rank, self.cfg.pp_size, self.group)
        try:
            shared(lambda: self._remove_staging(run_dir))
            self.save_model(staging, _internal_call=True)
            self._note_best_checkpoint(run_dir)
            shared(lambda: self._save_training_state(staging))
            shared(lambda: sync_tree(staging))  # each rank its own files (on a shared file system)
            shared(lambda: publish(staging, final) if self.rank == 0 else None)
        except Exception:
            self.state.best_model_checkpoint = best
            if self.rank == 0:
                shutil.rmtree(staging, ignore_errors=True)
            raise
        shared(lambda: self._after_publish(final, run_dir))

    def _remove_staging(self, run_dir: str) -> None:
        """Rank 0: remove every ``tmp-checkpoint-*`` entry of ``run_dir``, the leftovers of saves that did not
        finish (raises ``OSError`` where one cannot be removed)."""
        if self.rank != 0 or not os.path.isdir(run_dir):
            return
        for entry in sorted(os.listdir(run_dir)):
            path = os.path.join(run_dir, entry)
            if entry.startswith(f"{STAGING_PREFIX}{PREFIX_CHECKPOINT_DIR}-"):
                logger.warning(f"mpipe_hf: removing {path}, left by a checkpoint save that did not finish")
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path)
                else:
                    os.remove(path)

    def _note_best_checkpoint(self, run_dir: str) -> None:
        """``state.best_model_checkpoint``, as the Trainer sets it, under the final name: the checkpoint of
        ``best_global_step`` when it is this step's (about to be published) or one on disk."""
        step = self.state.best_global_step
        if self.args.save_strategy not in (SaveStrategy.STEPS, SaveStrategy.EPOCH, SaveStrategy.BEST) or not step:
            return
        path = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{step}")
        if step == self.state.global_step or os.path.isdir(path):
            self.state.best_model_checkpoint = path

    def _save_training_state(self, output_dir: str) -> None:
        """Into ``output_dir``: this rank's optimizer state and RNG state, rank 0 also the scheduler (and the
        Trainer's gradient scaler where it has one), unless ``save_only_model``; on the saving process the stateful
        callbacks' state and ``trainer_state.json``."""
        if not self.args.save_only_model:
            self._save_optimizer_and_scheduler(output_dir)
            self._save_scaler(output_dir)
            self._save_rng_state(output_dir)
        if not self.args.should_save:
            return
        for callback in self.callback_handler.callbacks + [self.control]:
            if isinstance(callback, ExportableState):
                kind = type(callback).__name__
                if isinstance(self.state.stateful_callbacks.get(kind), list):
                    self.state.stateful_callbacks[kind].append(callback.state())
                else:
                    self.state.stateful_callbacks[kind] = callback.state()
        self.state.save_to_json(os.path.join(output_dir, TRAINER_STATE_NAME))

    def _after_publish(self, checkpoint: str, run_dir: str) -> None:
        """On the saving process: the hub push of ``checkpoint`` (``push_to_hub``) and the rotation of
        ``run_dir``'s checkpoints, as the Trainer's."""
        if self.args.push_to_hub:
            self._push_from_checkpoint(checkpoint)
        if self.args.should_save:
            rotate_checkpoints(output_dir=run_dir, save_total_limit=self.args.save_total_limit,
                               best_model_checkpoint=self.state.best_model_checkpoint, use_mtime=True)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Every rank writes its shard; rank 0 the index, config, processor files and generation config: a
        directory ``from_pretrained`` loads (written beside and renamed in, or merged file by file into an
        existing directory such as ``output_dir``). With an adapter: PEFT's ``adapter_config.json`` and
        ``adapter_model.safetensors`` (gathered on rank 0) and the processor files."""
        out = output_dir or self.args.output_dir

        def extras(directory):
            save_hub_files(directory, self.carved.model.config, self.processing_class, self.source,
                           with_config=self.carved.peft is None)
        state = self.carved.state_dict(self.cfg, self.rank)
        into = os.path.isdir(out) and bool(os.listdir(out))  # e.g. output_dir, beside its checkpoint-* directories
        if self.carved.peft is not None:  # PEFT's adapter files, which PeftModel.from_pretrained(base, out) loads
            save_adapter(out, self.carved.peft, state, self.rank, self.cfg.pp_size, self.group, self.source, extras,
                         merge=into)
            return
        save_checkpoint(out, state, self.rank, self.cfg.pp_size, self.group, extras, merge=into)

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        os.makedirs(output_dir, exist_ok=True)
        torch.save(self.optimizer.state_dict(), os.path.join(output_dir, f"optimizer-rank{self.rank}.pt"))
        if self.rank == 0:
            torch.save(self.lr_scheduler.state_dict(), os.path.join(output_dir, "scheduler.pt"))

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        if checkpoint is None:
            return
        path = os.path.join(checkpoint, f"optimizer-rank{self.rank}.pt")
        if not os.path.isfile(path):
            raise ValueError(f"checkpoint {checkpoint!r} has no optimizer state for pipeline rank {self.rank} "
                             f"({os.path.basename(path)}); resume with the pp_size it was saved with")
        self.optimizer.load_state_dict(torch.load(path, map_location=self.device, weights_only=True))
        self.lr_scheduler.load_state_dict(torch.load(os.path.join(checkpoint, "scheduler.pt"), weights_only=True))

    def _load_values(self, checkpoint: str) -> None:
        """This rank's share of ``checkpoint``'s weights (a LoRA run's: the adapter) into the model, in place."""
        load = load_adapter_values if self.carved.peft is not None else load_share_values
        load(checkpoint, self.carved, self.cfg, self.rank)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        self._load_values(resume_from_checkpoint)

    # ---- evaluation ---------------------------------------------------------------------------------------

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """``{prefix_loss, prefix_runtime, ...}``: the forward-only schedule over every row of the eval set once,
        in order, ``per_device_eval_batch_size`` rows per micro-batch; the loss is the sum of the token losses over
        the whole set divided by its label tokens (the same on every rank)."""
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if dataset is None:
            raise ValueError("MPipeTrainer.evaluate needs an eval_dataset")
        if isinstance(dataset, dict):  # several eval sets, as the Trainer: eval_<name>_loss each
            metrics = {}
            for name, part in dataset.items():
                metrics.update(self.evaluate(part, ignore_keys, f"{metric_key_prefix}_{name}"))
            return metrics
        start = time.perf_counter()
        plan = self._plan(dataset, self.args.per_device_eval_batch_size)
        n = len(dataset)
        loss, tokens = evaluate_rows(self.executor, plan.load_rows, n, self.args.per_device_eval_batch_size)
        runtime = time.perf_counter() - start
        metrics = {f"{metric_key_prefix}_loss": loss,
                   f"{metric_key_prefix}_runtime": round(runtime, 4),
                   f"{metric_key_prefix}_samples_per_second": round(n / runtime, 3),
                   f"{metric_key_prefix}_label_tokens": tokens}
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def predict(self, test_dataset, ignore_keys=None, metric_key_prefix: str = "test"):
        """Not supported: predictions (logits) live on the last rank only. Use ``evaluate()`` for the loss, or
        load the saved checkpoint with ``from_pretrained`` to predict."""
        raise NotImplementedError("MPipeTrainer.predict is not supported: the logits live on the last pipeline "
                                  "rank; use evaluate() for the loss, or from_pretrained(checkpoint) to predict")

    def _load_best_model(self) -> None:
        """``load_best_model_at_end``: every rank reads its share from the best checkpoint."""
        self._load_values(self.state.best_model_checkpoint)
