"""The checkpoints of the pipelined HF Trainer (:class:`~.hf.MPipeTrainer` takes these methods from
:class:`CheckpointMixin`): ``checkpoint-<step>`` directories in the one format both trainers write (the
weights as ``from_pretrained`` or PEFT loads them and each rank's ``rank<r>_state.pt``, :mod:`.state`), plus the
Trainer's own files (``trainer_state.json``, its RNG states), written whole or not at all.
"""

from __future__ import annotations

import os
import shutil

from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_callback import ExportableState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, SaveStrategy, rotate_checkpoints
from transformers.utils import logging

from .checkpoint import publish, save_hub_files, sync_tree
from .collective import together

logger = logging.get_logger(__name__)
# A checkpoint being written is ``tmp-checkpoint-<step>``: neither the Trainer's resume (``get_last_checkpoint``,
# ``^checkpoint-(\d+)$``) nor its rotation (the glob ``checkpoint-*``) sees it; ``save_checkpoint`` adds its own
# ``.tmp``/``.old`` suffixes to that name, which neither sees either.
STAGING_PREFIX = "tmp-"


class CheckpointMixin:
    """``_save_checkpoint``, ``save_model`` and the loads of a resume, for a Trainer that holds a
    :class:`~.run.PipelineRun` as ``self.run``."""

    def _save_checkpoint(self, model, trial) -> None:
        """``checkpoint-<step>`` of the run's output directory, whole or not at all (the Trainer's own
        ``_save_checkpoint`` writes it in place). Every rank writes into ``tmp-checkpoint-<step>`` beside it:
        its shard (:meth:`save_model`; rank 0 also the index, config and processor files), its training state
        (``rank<r>_state.pt``) and the Trainer's RNG state, rank 0 also ``trainer_state.json``; then every rank
        flushes the directory to disk, rank 0 renames it into place (:func:`~.checkpoint.publish`), pushes it
        where ``push_to_hub`` asks, and rotates the checkpoints (``save_total_limit``, keeping
        ``best_model_checkpoint``). Each save first removes what a save that did not finish left
        (``tmp-checkpoint-*``). The rest is the Trainer's: the flos, the stateful callbacks' state,
        ``best_model_checkpoint`` (the final name, also for this step's).

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

        def shared(fn):  # over every process: with cp_size > 1, every CP rank's pipeline
            return together(fn, f"saving {final}", *self.run.every)
        lead = self.run.rank == 0 and self.run.cp_rank == 0  # one writer per CP group, as the weights'
        try:
            shared(lambda: self._remove_staging(run_dir))
            self.save_model(staging, _internal_call=True)
            self._note_best_checkpoint(run_dir)
            shared(lambda: self._save_training_state(staging))
            shared(lambda: sync_tree(staging))  # each rank its own files (on a shared file system)
            shared(lambda: publish(staging, final) if lead else None)
        except Exception:
            self.state.best_model_checkpoint = best
            if lead:
                shutil.rmtree(staging, ignore_errors=True)
            raise
        shared(lambda: self._after_publish(final, run_dir))

    def _remove_staging(self, run_dir: str) -> None:
        """Rank 0 (of the first CP group): remove every ``tmp-checkpoint-*`` entry of ``run_dir``, the leftovers of
        saves that did not finish (raises ``OSError`` where one cannot be removed)."""
        if self.run.rank != 0 or self.run.cp_rank != 0 or not os.path.isdir(run_dir):
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
        """Into ``output_dir``: this rank's training state (``rank<r>_state.pt``: the optimizer, the LR schedule,
        the RNG states, the skips) and the Trainer's RNG state (and its gradient scaler where it has one), unless
        ``save_only_model``; on the saving process the stateful callbacks' state and ``trainer_state.json``."""
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
        run = self.run

        def extras(directory):
            save_hub_files(directory, run.carved.model.config, self.processing_class, run.source,
                           with_config=run.carved.peft is None)
        into = os.path.isdir(out) and bool(os.listdir(out))  # e.g. output_dir, beside its checkpoint-* directories
        run.save_weights(out, extras, merge=into)

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        """This rank's ``rank<r>_state.pt`` (:meth:`.PipelineRun.write_state`), the format ``mpipe-hf train``
        writes: the optimizer, the Trainer's LR schedule, the RNG states, the skips and the step. With
        ``cp_size > 1`` the CP group's first rank writes it: its peers hold the same state."""
        if self.run.cp_rank == 0:
            self.run.write_state(output_dir, self.state.global_step, self.optimizer, self.lr_scheduler)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        """This rank's optimizer and LR schedule from ``checkpoint`` (:meth:`.PipelineRun.load_state`: saved by
        another ``pp_size`` or layout, the optimizer state by parameter name)."""
        if checkpoint is not None:
            self.run.load_state(checkpoint, self.optimizer, self.lr_scheduler)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        """This rank's share of ``resume_from_checkpoint``'s weights (a LoRA run's: the adapter), in place."""
        self.run.load_weights(resume_from_checkpoint)
