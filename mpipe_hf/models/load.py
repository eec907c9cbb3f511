"""Build a rank's share of a Hugging Face model without ever holding the whole model (SPEC.md, "The job").

The model is built on the meta device, carved for one pipeline rank by :func:`~.registry.split`, and only the
tensors that rank keeps are materialised:

- from a checkpoint: each kept tensor is read from the checkpoint's safetensors shards, one at a time, with
  ``safe_open``; on-disk names are mapped to the model's names by transformers' own conversion mapping (a hub
  Qwen2.5-VL stores ``model.layers.*`` for ``model.language_model.layers.*``). Buffers the checkpoint does not
  hold (rotary ``inv_freq``) are computed by the model's own ``_init_weights``.
- from a config (random weights): the values equal ``set_seed(seed); cls.from_config(config)`` bit for bit. The
  meta build and the model's ``initialize_weights`` run as in the unsplit model, and every random draw on a meta
  tensor is replayed on a scratch CPU tensor of the same shape and dtype, so the torch generator advances exactly
  as it would; the kept tensors are real, and receive the very draws the unsplit model gives them.

Besides the kept share, a rank holds at most one scratch tensor (random init: the size of the tensor drawn) or
one block of a checkpoint tensor (at most :data:`READ_BLOCK_BYTES`, 64 MiB); :class:`LoadReport` counts both.
The meta-device machinery lives in :mod:`.materialize`, the reading of safetensors shards in :mod:`.shards`.
"""

from __future__ import annotations

import copy
import os
import re

import torch
from accelerate.utils import set_seed
from torch import nn

from ..schedule import ScheduleConfig
from .adapters import (ADAPTER, ADAPTER_WEIGHTS, PEFT_PREFIX, apply_adapter, base_name, check_adapter_placement,
                       check_mergeable, is_adapter_tensor, load_adapter_state)
from .base import SplitModel
from .materialize import (RANDOM_OPS, LoadReport, ParameterOrder, ReplayRandomOnMeta, check_materialized, full_bytes,
                          kept_names, materialize, meta_model, model_class)
from .registry import get_family, split
from .shards import READ_BLOCK_BYTES, checkpoint_files, disk_names, read_into, untie_if_saved_apart

__all__ = ["RANDOM_OPS", "READ_BLOCK_BYTES", "LoadReport", "check_adapter", "load_adapter_values", "load_share_values",
           "meta_model", "model_class", "split_checked", "split_from_checkpoint", "split_from_config"]


def split_from_config(config, cfg: ScheduleConfig, rank: int, layers_per_stage: list[int] | None = None,
                      text_layers: int = 0, seed: int = 0, adapter=None) -> tuple[SplitModel, LoadReport]:
    """Rank ``rank``'s share of a randomly initialised ``config`` model; its tensors equal those of
    ``set_seed(seed); model_class(config).from_config(config, dtype=torch.float32)`` bitwise, and with
    ``adapter`` (a ``peft.LoraConfig``) those of ``peft.get_peft_model`` called on that model next.

    The model is built twice. First on the meta device, numbering its parameters as they are registered, to
    carve it and learn which ones this rank keeps. Then as ``from_config`` builds it, with the same seed, where
    each parameter this rank does not keep moves to the meta device as it is registered and every random draw
    on it is replayed on a scratch tensor: the generator runs through the same sequence as in the unsplit
    build, and each kept parameter gets the unsplit model's values. Buffers (position ids, rotary
    frequencies) are built for real; they are small. The adapter's tensors are numbered and drawn the same way.

    Returns:
        ``(carved model on CPU, report)``; ``carved.peft`` is the ``PeftModel`` with an adapter.

    Raises:
        ValueError: as :func:`~.registry.split` (model type, layout); an adapter peft cannot put in, or one the
            split would freeze (:func:`~.adapters.check_adapter_placement`).
    """
    report = LoadReport()
    with ParameterOrder() as probe:
        shadow = meta_model(config)
        report.full_model_bytes = full_bytes(shadow)
        trained = _adapt_on_meta(shadow, adapter)
    number = {id(p): k for k, p in enumerate(probe.order)}
    names = {n: number[id(p)] for n, p in shadow.named_parameters(remove_duplicate=False) if id(p) in number}
    keep = {names[n] for n in kept_names(split_checked(shadow, cfg, rank, layers_per_stage, text_layers,
                                                        trained)) if n in names}
    del shadow
    set_seed(seed)
    with ReplayRandomOnMeta(report), ParameterOrder(keep, [p.shape for p in probe.order]):
        model = model_class(config).from_config(config, dtype=torch.float32)
        peft_model = apply_adapter(model, adapter) if adapter is not None else None
    carved = split(model, cfg, rank, layers_per_stage, text_layers)
    carved.peft = peft_model
    report.kept_bytes = full_bytes(carved.model)
    check_materialized(carved.model)
    return carved, report


def check_adapter(config, cfg: ScheduleConfig, adapter, layers_per_stage: list[int] | None = None,
                  text_layers: int = 0, merge: bool = False) -> None:
    """Put ``adapter`` into ``config``'s model on the meta device and split it (no weights, no process group):
    the checks a run makes at load, before it starts, and with ``merge`` the one its merged save makes at the
    end.

    Raises:
        ValueError: as :func:`split_from_config` with the adapter; with ``merge``, an adapted layer
            :func:`~.adapters.merged_state` cannot merge.
    """
    model = meta_model(config)
    trained = _adapt_on_meta(model, adapter)
    if merge:
        check_mergeable(model)
    split_checked(model, cfg, 0, layers_per_stage, text_layers, trained)


def _adapt_on_meta(model: nn.Module, adapter) -> set[str] | None:
    """Put ``adapter`` (or nothing, for ``None``) into the meta ``model``, its new tensors on the meta device
    too; return the names peft left trainable (``None`` without an adapter)."""
    if adapter is None:
        return None
    with torch.device("meta"):
        apply_adapter(model, adapter)
    return {n for n, p in model.named_parameters() if p.requires_grad}


def split_checked(model: nn.Module, cfg: ScheduleConfig, rank: int, layers_per_stage, text_layers: int,
                  trained: set[str] | None) -> SplitModel:
    """:func:`~.registry.split`, then (with an adapter: ``trained`` its trainable names, taken before the split)
    :func:`~.adapters.check_adapter_placement`.

    Raises:
        ValueError: as both.
    """
    carved = split(model, cfg, rank, layers_per_stage, text_layers)
    if trained is not None:
        check_adapter_placement(trained, carved.frozen, carved.preprocess_fqns, cfg.preprocess)
    return carved


def _adapt_for_rank(model: nn.Module, adapter, cfg: ScheduleConfig, rank: int, layers_per_stage,
                    text_layers: int, seed: int, report: LoadReport):
    """Put ``adapter`` into the meta ``model`` of a checkpoint as ``set_seed(seed); get_peft_model(model,
    adapter)`` would into the loaded one: the base tensors this rank keeps are made real first (filled with
    NaN, to be read from the checkpoint), so that the adapter's tensors this rank keeps are real and get the
    unsplit draws. Each other adapter tensor moves to the meta device as ``nn.Linear`` registers it (one
    layer's ``torch.empty`` at a time is allocated first) and its draws are replayed on a scratch tensor.
    Returns the ``PeftModel``."""
    shadow = copy.deepcopy(model)
    with ParameterOrder() as probe:
        trained = _adapt_on_meta(shadow, adapter)
    number = {id(p): k for k, p in enumerate(probe.order)}
    carved = split_checked(shadow, cfg, rank, layers_per_stage, text_layers, trained)
    kept = kept_names(carved)
    keep = {number[id(p)] for n, p in shadow.named_parameters(remove_duplicate=False) if id(p) in number}
    materialize(model, {base_name(n) for n in kept})
    del shadow, carved
    set_seed(seed)
    with ReplayRandomOnMeta(report), ParameterOrder(keep, [p.shape for p in probe.order]):
        return apply_adapter(model, adapter)


def split_from_checkpoint(path: str, config, cfg: ScheduleConfig, rank: int,
                          layers_per_stage: list[int] | None = None, text_layers: int = 0, adapter=None,
                          seed: int = 0) -> tuple[SplitModel, LoadReport]:
    """Rank ``rank``'s share of the checkpoint at ``path`` (fp32, eval mode as ``from_pretrained`` leaves it),
    reading only the tensors it keeps, one at a time. With ``adapter`` (a ``peft.LoraConfig``), the share of
    ``set_seed(seed); peft.get_peft_model(from_pretrained(path), adapter)``: the base tensors from the
    checkpoint, the adapter's as peft draws them (:func:`_adapt_for_rank`).

    Returns:
        ``(carved model on CPU, report)``; ``carved.peft`` is the ``PeftModel`` with an adapter.

    Raises:
        ValueError: as :func:`~.registry.split`; no safetensors weights; a tensor this rank keeps that the
            checkpoint lacks, or whose shape differs (the message names them); an adapter peft cannot put in, or
            one the split would freeze.
    """
    report = LoadReport()
    model = meta_model(config)
    files = checkpoint_files(path)
    source = disk_names(model, list(files), _holder(config))  # the carved model's names are a subset of the whole model's
    untie_if_saved_apart(model, source)
    report.full_model_bytes = full_bytes(model)
    peft_model = None
    if adapter is not None:
        peft_model = _adapt_for_rank(model, adapter, cfg, rank, layers_per_stage, text_layers, seed, report)
        names = [n for n, _ in [*model.named_parameters(remove_duplicate=False), *model.named_buffers()]]
        source = {n: source[base_name(n)] for n in names if base_name(n) in source}
    carved = split(model, cfg, rank, layers_per_stage, text_layers)
    carved.peft = peft_model
    model = carved.model
    for embed, head in carved.tied:  # lm_head's own copy of a tied embedding is read from the embedding
        if head not in source and embed in source:
            source[head] = source[embed]
    missing = [n for n, t in model.named_parameters() if n not in source and ".lora_" not in n]
    if missing:
        raise ValueError(f"checkpoint {path!r} lacks tensors rank {rank} holds: {missing[:5]}"
                         f"{' ...' if len(missing) > 5 else ''}")
    materialize(model)
    report.kept_bytes = full_bytes(model)
    state = model.state_dict(keep_vars=True)
    for name, t in state.items():  # the adapter's drawn values: neither read nor initialised again below
        if ".lora_" in name:
            t._is_hf_initialized = True
    by_file: dict[str, list[str]] = {}
    seen: set[int] = set()
    for name, t in state.items():
        if name in source and id(t) not in seen:  # a tied tensor (one process) is read once
            seen.add(id(t))
            by_file.setdefault(files[source[name]], []).append(name)
    with torch.no_grad():
        for file, names in sorted(by_file.items()):
            for name in names:
                read_into(file, source[name], state[name], report, path)
    model.initialize_weights()  # buffers the checkpoint does not hold (the loaded tensors are flagged)
    loaded = frozenset(id(t) for t in state.values() if hasattr(t, "_is_hf_initialized"))
    for t in state.values():
        if hasattr(t, "_is_hf_initialized"):
            del t._is_hf_initialized
    check_materialized(model, loaded)
    model.eval()
    return carved, report


def load_share_values(path: str, carved: SplitModel, cfg: ScheduleConfig, rank: int) -> LoadReport:
    """Copy into ``carved`` (in place: the modules, stages and optimizer keep their tensors) every tensor rank
    ``rank`` saves (``carved.state_dict``), read from the safetensors checkpoint at ``path`` block by block, as
    :func:`split_from_checkpoint` reads them. For resuming a run.

    Raises:
        ValueError: no safetensors weights; a tensor the rank holds that the checkpoint lacks, or whose shape
            differs.
    """
    report = LoadReport()
    files = checkpoint_files(path)
    state = carved.state_dict(cfg, rank)
    if all(n in files for n in state):  # a checkpoint of this project: the model's own names and layouts, written
        source = {n: n for n in state}  # by save_checkpoint (a family whose conversion fuses experts included)
    else:
        source = disk_names(carved.model, list(files), _holder(carved.model.config))
    missing = [n for n in state if n not in source]
    if missing:
        raise ValueError(f"checkpoint {path!r} lacks tensors rank {rank} holds: {missing[:5]}"
                         f"{' ...' if len(missing) > 5 else ''}")
    live = carved.model.state_dict(keep_vars=True)
    with torch.no_grad():
        for name in sorted(state, key=lambda n: files[source[n]]):
            read_into(files[source[name]], source[name], live[name], report, path)
            del live[name]._is_hf_initialized
    return report


def load_adapter_values(path: str, carved: SplitModel, cfg: ScheduleConfig, rank: int, experts=None) -> None:
    """Copy the adapter checkpoint at ``path`` (PEFT's ``adapter_model.safetensors``) into ``carved``'s adapter
    tensors in place, ``P``'s replica included; the base weights stay as loaded. For resuming a LoRA run.
    ``experts``: the :class:`~.expert_parallel.ExpertShards` of a share already made expert-parallel (the HF
    Trainer resumes after :meth:`~mpipe_hf.train.run.PipelineRun.start`): each fused expert adapter of the file is
    cut to this rank's part (:meth:`~.expert_parallel.ExpertShards.cut`) first.

    Raises:
        ValueError: ``path`` holds no adapter (a full fine-tuning checkpoint), or lacks an adapter tensor this
            rank holds.
    """
    from safetensors.torch import load_file
    file = os.path.join(path, ADAPTER_WEIGHTS)
    if not os.path.isfile(file):
        raise ValueError(f"checkpoint {path!r} has no {ADAPTER_WEIGHTS}: it is not a LoRA checkpoint "
                         f"(resume it without a lora section)")
    owned = [n for n in carved.state_dict(cfg, rank) if is_adapter_tensor(n)]
    weights = load_file(file, device="cpu")
    if experts is not None and experts.names:  # PEFT's X.lora_A.weight is the model's X.lora_A.default.weight
        weights = {k: experts.cut(re.sub(r"\.(lora_[AB])\.", rf".\1.{ADAPTER}.", k.removeprefix(PEFT_PREFIX)), t)
                   for k, t in weights.items()}
    try:
        load_adapter_state(carved.peft, weights, owned)
    except RuntimeError as err:  # load_state_dict's size mismatch: another r, or other layers
        raise ValueError(f"checkpoint {path!r}: its adapter does not fit this run's lora section (saved with "
                         f"another r or target_modules?): {' '.join(str(err).split())[:300]}") from err


def _holder(config) -> tuple[str, str] | None:
    """The transformers class whose checkpoints ``config``'s family loads from (:attr:`.family.Family.checkpoint`)."""
    return getattr(get_family(config.model_type), "checkpoint", None)
