"""A pipelined run's checkpoints, one format for both trainers: the weights as ``from_pretrained`` (or PEFT) loads
them, each pipeline rank writing its share (:func:`~.checkpoint.save_checkpoint`, :func:`~.checkpoint.save_adapter`),
and each rank's training state ``rank<r>_state.pt`` (:mod:`.state`); reading both back on resume. Under data
parallelism FSDP2 shards are gathered first (:func:`gather_full`), and under expert parallelism the experts' shards
and their AdamW moments are fused over the EP group at save and cut again at load
(:class:`~mpipe_hf.models.expert_shards.ExpertShards`), so that a checkpoint depends on neither ``dp_size`` nor
``ep_size``.
"""

from __future__ import annotations

import os
from typing import Callable

import torch

from ..models.adapters import is_adapter_tensor, merged_state
from ..models.load import load_adapter_values, load_share_values
from .checkpoint import save_adapter, save_checkpoint
from .collective import raise_or, together
from .state import load_rank_state, rank_state, rank_state_name


class RunCheckpoints:
    """The checkpoint methods of :class:`~.run.PipelineRun`, which sets what they read: ``carved`` (this rank's
    share), ``cfg``, ``rank``, ``dp_rank``, ``cp_rank`` (0 writes), ``group`` (the ``pp`` group), ``every`` (a setup
    error's ranks), ``source`` (the model's name or path), ``params`` (the trained parameters), ``skips``,
    ``data_parallel`` and ``experts`` (this rank's :class:`~mpipe_hf.models.expert_shards.ExpertShards`, or
    ``None``)."""

    def load_weights(self, path: str) -> None:
        """This rank's share of ``path``'s weights (a LoRA run's: its adapter; after
        :meth:`~.run.PipelineRun.start` under expert parallelism, its experts and expert adapters cut to this rank's
        experts) into the model, in place; a failure on any rank is raised on every rank."""
        load = load_adapter_values if self.carved.peft is not None else load_share_values
        together(lambda: load(path, self.carved, self.cfg, self.rank, self.experts), "resume", *self.every)

    def save_weights(self, path: str, extras: Callable[[str], None] | None, rank_files: dict | None = None,
                     merged: bool = False, merge: bool = False) -> None:
        """This pipeline's share of the weights into ``path`` (:func:`~.checkpoint.save_checkpoint`, atomically;
        ``merge``: into an existing directory, file by file), written by replica 0 (the replicas hold the same
        values; FSDP2 shards are gathered first, on every replica). ``extras(directory)``: rank 0 adds the hub
        files. ``rank_files``: ``{name: object}`` each rank also writes there. A LoRA run writes its adapter in
        PEFT's format, or with ``merged`` the weights with the adapter merged in.

        Raises:
            RuntimeError, ValueError: a write that failed on any rank, on every rank (``"pipeline rank R, saving
                DIR: ..."``); ``path`` is as it was.
        """
        state = self.carved.state_dict(self.cfg, self.rank)
        adapter_only = self.carved.peft is not None and not merged
        if adapter_only:  # the frozen base is not saved again (nor gathered from its FSDP2 shards)
            state = {n: t for n, t in state.items() if is_adapter_tensor(n)}
        state, rank_files = gather_full(state), gather_full(rank_files or {})
        if self.experts is not None:  # the fused (E, ...) tensors and adapters, as from_pretrained (PEFT's) loads them
            state = self.experts.fused(state, self.experts.group.get_group())
        failure = None
        if self.dp_rank == 0 and self.cp_rank == 0:  # one writer: a CP group holds the same share
            try:
                self._write(path, state, extras, rank_files, adapter_only, merged, merge)
            except Exception as err:  # noqa: BLE001 - shared with the other replicas below
                failure = err
        if self.data_parallel is None and failure is not None:
            raise failure
        if self.data_parallel is not None:
            together(lambda: raise_or(failure), f"saving {path}", *self.every)

    def _write(self, path, state, extras, rank_files, adapter_only, merged, merge) -> None:
        world = self.cfg.pp_size
        if adapter_only:
            save_adapter(path, self.carved.peft, state, self.rank, world, self.group, self.source, extras,
                         rank_files, merge=merge)
            return
        if merged:
            state = together(lambda: merged_state(self.carved.model, state), f"merging {path}", self.rank, world,
                             self.group)
        save_checkpoint(path, state, self.rank, world, self.group, extras, merge=merge, rank_files=rank_files)

    def rank_files(self, done: int, optimizer, scheduler) -> dict:
        """``{rank<r>_state.pt: this rank's training state after ``done`` steps}`` (:func:`~.state.rank_state`:
        the optimizer, the LR schedule, the RNG states, the skips and the step)."""
        state = rank_state(done, optimizer, scheduler, self.skips, self.params)
        if self.experts is not None and state["optimizer"] is not None:  # the experts' moments fused, as the weights
            state["optimizer"] = self.experts.fused_optimizer(state["optimizer"], state["param_names"],
                                                              self.experts.group.get_group())
        return {rank_state_name(self.rank): state}

    def save(self, path: str, done: int, optimizer, scheduler, extras: Callable[[str], None] | None) -> None:
        """A resumable checkpoint at ``path`` after ``done`` steps, whole or not at all: the weights (as
        :meth:`save_weights`) and every rank's ``rank<r>_state.pt``."""
        self.save_weights(path, extras, self.rank_files(done, optimizer, scheduler))

    def write_state(self, directory: str, done: int, optimizer, scheduler) -> None:
        """This rank's ``rank<r>_state.pt`` into ``directory`` (a checkpoint being written beside its weights,
        as the HF Trainer writes a checkpoint's parts one by one)."""
        os.makedirs(directory, exist_ok=True)
        for name, state in gather_full(self.rank_files(done, optimizer, scheduler)).items():
            torch.save(state, os.path.join(directory, name))

    def load_state(self, path: str, optimizer, scheduler, reset_optimizer: bool = False) -> int:
        """Restore this rank's optimizer, LR schedule, RNG states and skips from ``path``
        (:func:`~.state.load_rank_state`, onto this run's device); return the steps done. A failure on any rank
        is raised on every rank."""
        done = together(lambda: load_rank_state(path, self.rank, optimizer, scheduler, self.skips, self.params,
                                                reset_optimizer), "resume", *self.every)
        if self.experts is not None and optimizer is not None:  # a checkpoint holds the fused moments: any ep_size
            self.experts.slice_optimizer(optimizer)
        return done


def gather_full(tree):
    """``tree`` (dicts, lists and tensors, as a state dict) with every DTensor replaced by its full tensor (a
    collective over its mesh: every replica calls this with the same tree)."""
    from ..runtime.data_parallel import is_sharded
    if isinstance(tree, dict):
        return {k: gather_full(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(gather_full(v) for v in tree)
    return tree.full_tensor() if torch.is_tensor(tree) and is_sharded(tree) else tree
