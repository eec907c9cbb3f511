"""The Hugging Face Trainer, pipelined: :class:`MPipeTrainer`, :class:`MPipeCallback` and :class:`MPipeConfig`.

An existing ``transformers.Trainer`` script becomes an MPipe Transpose one by swapping the class and passing an
:class:`MPipeConfig` (README, "The Hugging Face Trainer"). The Trainer keeps what it does well (the outer loop,
``TrainingArguments``, the LR scheduler, logging, callbacks and ``report_to``, ``save_steps`` and
``save_total_limit``, ``resume_from_checkpoint``); the pipeline step and everything a rank holding one share of
the model needs are the :class:`~.run.PipelineRun` that ``mpipe-hf train`` runs on (README, "Design notes"):

- one optimizer step is one schedule over the step's micro-batches (:func:`~.loop.run_step`): the Trainer's
  ``gradient_accumulation_steps`` is the number of micro-batches ``M`` and ``per_device_train_batch_size`` the
  rows per micro-batch. The Trainer's loop runs as for one process (its epochs, its last short step, its sample
  counts); its dataloader yields row indices, and the schedule runs at each step's first micro-batch;
- only the owner of a micro-batch reads and collates its rows, with the user's ``data_collator`` (or, for
  ``messages``/``images`` rows, :class:`~mpipe_hf.data.ConversationCollator`);
- AdamW over the rank's own parameters in the Trainer's decay groups (:func:`~.optimizer.build_optimizer`),
  clipping by the global norm over the pipeline (:func:`~.optimizer.clip_grad_norm`), bf16 autocast with fp32
  master weights (:mod:`.precision`);
- checkpoints: every rank writes its shard (:func:`~.checkpoint.save_checkpoint`) and its training state
  (``rank<r>_state.pt``: optimizer, LR schedule, RNG states; the format ``mpipe-hf train`` writes); the Trainer
  writes its RNG states (per process) and ``trainer_state.json``. All of it goes into ``tmp-checkpoint-<step>``
  beside the checkpoint, is flushed to disk and then renamed to ``checkpoint-<step>``
  (:meth:`MPipeTrainer._save_checkpoint`), so ``resume_from_checkpoint=True`` never picks up a half-written one;
- ``evaluate()`` runs the forward-only schedule (:mod:`mpipe_hf.schedule.forward`) and reports ``eval_loss``
  normalised by the eval set's label tokens, with the rows it ran on; ``predict()`` runs the same and returns
  the loss in a ``PredictionOutput`` with no predictions (the logits stay on the last rank).
- ``MPipeConfig(swap=..., trace=True, zero_bubble=True)`` work as in a recipe; ``dp_size > 1`` and ``owners:
  balanced`` are refused (:class:`MPipeConfig`);
- ``MPipeConfig(cp_size=C)``: context parallelism over ``pp_size * C`` processes, the run's ``(cp, pp)`` mesh and
  the CP ranks' gradients summed as a recipe's (:class:`~.run.PipelineRun`); the CP ranks of a group iterate the
  same row indices, as every rank does, so each micro-batch is the same on all of them before its sequence is cut.
"""

from __future__ import annotations

import atexit
import os
import time

import torch
from torch.utils.data import DataLoader
from transformers import Trainer
from transformers.trainer_utils import PredictionOutput
from transformers.utils import logging

from ..data import ConversationCollator, MicroBatchPlan
from ..data.packing import PackedCollate
from ..models.decoder import check_packable
from ..models.freeze import check_trainable
from .hf_checkpoint import STAGING_PREFIX, CheckpointMixin
from .hf_parts import (MPipeCallback, MPipeConfig, PreemptionCallback, _EpochSampler, _Pipeline, _RowLoader,
                       check_context_parallel_trainer, check_training_args)
from .loop import saves_before_stop
from .optimizer import build_optimizer, no_parameters
from .recipe import TrainSection
from .report import layout_text
from .run import PipelineRun
from .sources import node_first, trainer_rows

__all__ = ["MPipeTrainer", "MPipeConfig", "MPipeCallback", "check_training_args", "STAGING_PREFIX"]
logger = logging.get_logger(__name__)


class MPipeTrainer(CheckpointMixin, Trainer):
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
            collective), an adapter inside a module the split freezes, or with ``cp_size`` above 1 what context
            parallelism refuses (:class:`MPipeConfig`), all before any collective.
        NotImplementedError: with ``cp_size`` above 1, a stage class whose hooks do not cut with the sequence
            (:func:`~mpipe_hf.models.context_parallel_stages.check_splittable`), when the stages are set up: on
            every rank alike, before the first step.

    Rank 0 prints the layout once started (``mpipe_hf: MPipeTrainer pp_size=R vpp=V ... [cp_size=C]``, as
    ``mpipe-hf train``'s start-up line names it).
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
        self.run = PipelineRun(mpipe_config.parallel(self.num_micro), args.seed,
                               mpipe_config.data(args.per_device_train_batch_size))
        self.run.adopt(model)  # before the process group: a rank never holds more than its share
        spec, carved = mpipe_config.trainable_spec(), self.run.carved  # the whole model checked on the meta device
        check_trainable(carved.model.config, self.run.cfg, spec,
                        next(iter(carved.peft.peft_config.values())) if carved.peft is not None else None,
                        self.run.parallel.text_layers)
        self.run.freeze(spec)
        check_context_parallel_trainer(mpipe_config, carved.model.config)
        self.user_collator, self._loaded = data_collator, {}
        self.mpipe_callback = MPipeCallback()
        super().__init__(model=self.run.carved.model.train(), args=args, data_collator=data_collator,
                         train_dataset=train_dataset, eval_dataset=eval_dataset, processing_class=processing_class,
                         callbacks=callbacks, **kwargs)
        self.callback_handler.callbacks.insert(0, self.mpipe_callback)
        self.mpipe_callback.skips = self.run.skips
        self.model.to(self.run.connect())
        self.add_callback(PreemptionCallback(self.run.device))
        self.run.start(bf16=args.bf16, trace=mpipe_config.trace, swap=mpipe_config.swap,
                       loss_normalization=self.loss_normalization())
        atexit.register(self.run.close)
        if self.run.lead:
            print(f"mpipe_hf: MPipeTrainer {layout_text(self.run.parallel, self.run.cfg)}", flush=True)
        self.pipeline = _Pipeline(self.model)
        self.step_result = None

    def loss_normalization(self) -> str:
        """The Trainer's own: the step's summed token loss over its label tokens where it counts
        ``num_items_in_batch`` (a model that takes loss kwargs, or a ``compute_loss_func``), else the mean of the
        micro-batches' means (Qwen2.5-VL declares ``accepts_loss_kwargs = False``)."""
        return "tokens" if self.model_accepts_loss_kwargs or self.compute_loss_func is not None else "micro"

    def train(self, *args, **kwargs):
        """The Trainer's ``train``; with ``MPipeConfig(trace=True)`` every rank's actions then go to
        ``output_dir/trace.json`` (a Chrome trace)."""
        output = super().train(*args, **kwargs)
        if self.mpipe.trace:
            self.run.write_trace(os.path.join(self.args.output_dir, "trace.json"))
        return output

    # ---- data: the owner of a micro-batch reads its rows --------------------------------------------------

    def _collate(self):
        if self.user_collator is not None:
            return self.user_collator
        model_type = self.run.carved.model.config.model_type
        return ConversationCollator(self.processing_class, self.mpipe.max_length, model_type=model_type)

    def _rows(self, dataset):
        """``dataset`` through the loader ``mpipe-hf train`` uses (any layout, a ``datasets.Dataset``, a list of
        rows or a path: :func:`~.sources.trainer_rows`), each node's first process first; as it is with a user's
        ``data_collator``. The loaded rows are kept, so a dataset is checked once."""
        if self.user_collator is not None:
            return dataset
        loaded = self._loaded.get(id(dataset))
        if loaded is None or loaded[0] is not dataset:
            rows = node_first(lambda: trainer_rows(dataset, self.processing_class, self.mpipe.data(),
                                                   self.run.carved.model.config.model_type, self.args.seed),
                              "data load", self.run.every)
            loaded = self._loaded[id(dataset)] = (dataset, rows)
        return loaded[1]

    def _plan(self, dataset, micro_batch_size: int, evaluation: bool = False) -> MicroBatchPlan:
        collate = self._collate()
        if self.mpipe.packing:  # MPipeConfig.packing: each micro-batch's rows in one sequence
            check_packable(self.run.carved.model.config.get_text_config())
            collate = PackedCollate(collate)
        return MicroBatchPlan(dataset, collate, self.num_micro, micro_batch_size, self.run.carved.validate_micro,
                              drop_bad_rows=self.mpipe.on_bad_sample == "skip", evaluation=evaluation)

    def get_train_dataloader(self) -> DataLoader:
        """Row indices, ``per_device_train_batch_size`` per item (one micro-batch): the Trainer takes
        ``gradient_accumulation_steps`` items per optimizer step, as for one process, and the schedule reads the
        rows on their owners. Every rank iterates the same indices: sequential, or each epoch in an order drawn
        from ``data_seed`` (else ``seed``) and the epoch."""
        if self.train_dataset is None:
            raise ValueError("MPipeTrainer: training needs a train_dataset")
        self.train_dataset = self._rows(self.train_dataset)
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

    def get_total_train_batch_size(self, args) -> int:
        """Rows per optimizer step: ``per_device_train_batch_size * gradient_accumulation_steps``, of one pipeline
        (the Trainer's own multiplies by the processes, which here hold stages and CP slices of the same rows)."""
        return self._train_batch_size * args.gradient_accumulation_steps

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
            self.optimizer = build_optimizer(self.model, self.run.params, train) or no_parameters(train)
        return self.optimizer

    def training_step(self, model, inputs, num_items_in_batch=None) -> torch.Tensor:
        """At the update step's first micro-batch: one schedule over all of the step's micro-batches, clipped by
        ``max_grad_norm`` and checked finite (:meth:`.PipelineRun.step`), returning the step's loss (the same on
        every rank); at the others, 0, so the Trainer's sum is the step's loss. With ``on_bad_sample: skip`` a
        row that fails to load is dropped and the step trains on the rest. A skipped step (a micro-batch the
        user's collator cannot load, no row left, or a loss or gradient norm that is not finite) leaves no
        gradient, and the optimizer step and the LR schedule's step are skipped, as for an overflowing fp16
        step; a step skipped for its data returns NaN, which the Trainer's ``logging_nan_inf_filter`` keeps out
        of the logged loss. A row that failed is left out from then on and counted once; before the run stops
        for bad data, ``checkpoint-<step>`` is saved (:func:`~.loop.saves_before_stop`)."""
        if inputs is not self.step_rows[0]:
            return torch.zeros((), device=self.args.device)
        self.model.train()
        rows, step = list(self.step_rows), self.state.global_step
        try:
            result = self.run.step(step, lambda m: self.plan.load_rows(rows[m]), self.args.max_grad_norm or 0.0,
                                   num_micro=len(rows), plan=self.plan)
        except ValueError as err:  # stopped for bad data: a resumable checkpoint-<step> first, where that is safe
            if step > 0 and saves_before_stop(err, self.run.data_parallel is not None):  # step 0: nothing to keep
                self._save_checkpoint(self.model, trial=None)
                if self.run.lead:
                    logger.warning(f"mpipe_hf: stopping for bad data after step {step}: saved checkpoint-{step} in "
                                   f"{self.args.output_dir}; resume_from_checkpoint continues from it")
            raise
        self.step_result = result
        self.optimizer._is_overflow = not result.ran  # AcceleratedOptimizer: the Trainer then skips the LR step
        if not result.ran and self.run.rank == 0:
            logger.warning(self.run.skips.warning(step))
        elif result.stats.bad_rows and self.run.rank == 0:  # the owners printed theirs, on their own output
            logger.warning(self.run.skips.dropped_warning(step, result.stats))
        if result.stats is None:
            return torch.full((), float("nan"), device=self.args.device)
        self.mpipe_callback.window.append(result.stats)
        return torch.tensor(result.stats.loss, device=self.args.device)

    def _clip_grad_norm(self, model):
        """The global gradient norm before clipping (the step clipped already: :meth:`training_step`)."""
        return torch.tensor(self._get_grad_norm(model))

    def _get_grad_norm(self, model, grad_norm=None):
        """The step's global gradient norm (0 for a step whose data was bad: it left no gradient)."""
        result = self.step_result
        return float(result.grad_norm) if result is not None and result.grad_norm is not None else 0.0

    # ---- evaluation ---------------------------------------------------------------------------------------

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """``{prefix_loss, prefix_runtime, ...}``: the forward-only schedule over every row of the eval set once
        (:meth:`_forward_metrics`), logged and passed to the callbacks' ``on_evaluate``."""
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if dataset is None:
            raise ValueError("MPipeTrainer.evaluate needs an eval_dataset")
        if isinstance(dataset, dict):  # several eval sets, as the Trainer: eval_<name>_loss each
            metrics = {}
            for name, part in dataset.items():
                metrics.update(self.evaluate(part, ignore_keys, f"{metric_key_prefix}_{name}"))
            return metrics
        metrics = self._forward_metrics(dataset, metric_key_prefix)
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def predict(self, test_dataset, ignore_keys=None, metric_key_prefix: str = "test") -> PredictionOutput:
        """The Trainer's ``predict`` on the pipeline's eval path: ``PredictionOutput(predictions=None,
        label_ids=None, metrics)``, ``metrics`` as :meth:`evaluate`'s under ``metric_key_prefix`` (``test_loss``,
        ``test_runtime``, ``test_samples_per_second``, ``test_label_tokens``, ``test_rows``,
        ``test_rows_dropped``), the same on every rank; the callbacks' ``on_predict`` sees them, nothing is
        logged. ``predictions`` and ``label_ids`` are ``None`` whatever ``prediction_loss_only`` says (a warning
        when it is false): the logits exist only on the last pipeline rank, a micro-batch at a time, and are
        reduced to the loss there. For predictions, load a saved checkpoint with ``from_pretrained`` and run
        ``generate`` or ``Trainer.predict`` on one process (docs/trainer.md).

        Raises:
            ValueError: ``test_dataset`` is ``None``; as :meth:`evaluate`.
        """
        if test_dataset is None:
            raise ValueError("MPipeTrainer.predict needs a test_dataset")
        if not self.args.prediction_loss_only and self.run.rank == 0:
            logger.warning("MPipeTrainer.predict returns the loss only: predictions and label_ids are None (the "
                           "logits stay on the last pipeline rank); for predictions, load a saved checkpoint with "
                           "from_pretrained (docs/trainer.md)")
        metrics = self._forward_metrics(test_dataset, metric_key_prefix)
        self.control = self.callback_handler.on_predict(self.args, self.state, self.control, metrics)
        return PredictionOutput(predictions=None, label_ids=None, metrics=metrics)

    def _forward_metrics(self, dataset, prefix: str) -> dict[str, float]:
        """The forward-only schedule over every row of ``dataset`` once, in order, ``per_device_eval_batch_size``
        rows per micro-batch: ``{prefix_loss}`` (the token losses summed over the set over its label tokens),
        ``prefix_runtime`` (seconds), ``prefix_samples_per_second``, ``prefix_label_tokens``, ``prefix_rows`` (the
        rows it ran on) and ``prefix_rows_dropped`` (rows that failed to load and were left out, gathered from
        their owners; they count towards no limit, and rank 0 warns with their count). The same on every rank."""
        start = time.perf_counter()
        dataset = self._rows(dataset)
        plan = self._plan(dataset, self.args.per_device_eval_batch_size, evaluation=True)
        n = len(dataset)
        loss, tokens = self.run.evaluate(plan.load_rows, plan.eval_micros())
        dropped = self.run.gathered_rows(plan.take_dropped())
        if dropped and self.run.rank == 0:
            logger.warning(f"MPipeTrainer: the {prefix} set ran on {n - len(dropped)} of {n} rows: {len(dropped)} "
                           f"failed to load and were left out (the first: {dropped[0]})")
        runtime = time.perf_counter() - start
        return {f"{prefix}_loss": loss, f"{prefix}_runtime": round(runtime, 4),
                f"{prefix}_samples_per_second": round(n / runtime, 3), f"{prefix}_label_tokens": tokens,
                f"{prefix}_rows": n - len(dropped), f"{prefix}_rows_dropped": len(dropped)}

    def _load_best_model(self) -> None:
        """``load_best_model_at_end``: every rank reads its share from the best checkpoint."""
        self.run.load_weights(self.state.best_model_checkpoint)
