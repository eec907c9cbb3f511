"""Build a rank's share of a Hugging Face model without ever holding the whole model (SPEC.md, "The job").

The model is built on the meta device, carved for one pipeline rank by :func:`~.registry.split`, and only the
tensors that rank keeps are materialised:

- from a checkpoint: each kept tensor is read from the checkpoint's safetensors shards, one at a time, with
  ``safe_open``; on-disk names are mapped to the model's names by transformers' own conversion mapping (a hub
  Qwen2.5-VL stores ``model.layers.*`` for ``model.language_model.layers.*``). Buffers the checkpoint does not
  hold (rotary ``inv_freq``) are computed by the model's own ``_init_weights``. Under expert parallelism each fused
  ``(E, ...)`` expert tensor of the rank's stages is made real, and read, with its EP rank's experts alone.
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
from .shards import (READ_BLOCK_BYTES, checkpoint_files, disk_names, read_experts_into, read_into,
                     untie_if_saved_apart)

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
    Under expert parallelism the experts are drawn whole (the draws must be ``from_config``'s, which fill each
    fused ``(E, ...)`` tensor in one call) and :func:`~.expert_parallel.shard_experts` slices them after; only
    :func:`split_from_checkpoint` cuts them at load.

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
                    text_layers: int, seed: int, report: LoadReport, narrow):
    """Put ``adapter`` into the meta ``model`` of a checkpoint as ``set_seed(seed); get_peft_model(model,
    adapter)`` would into the loaded one: the base tensors this rank keeps are made real first (filled with
    NaN, to be read from the checkpoint), so that the adapter's tensors this rank keeps are real and get the
    unsplit draws. Each other adapter tensor moves to the meta device as ``nn.Linear`` registers it (one
    layer's ``torch.empty`` at a time is allocated first) and its draws are replayed on a scratch tensor.
    ``narrow`` (:func:`_expert_narrowing`) cuts the rank's fused experts on ``model`` before any is made real.
    Returns ``(the PeftModel, narrow's cuts)``."""
    shadow = copy.deepcopy(model)
    with ParameterOrder() as probe:
        trained = _adapt_on_meta(shadow, adapter)
    number = {id(p): k for k, p in enumerate(probe.order)}
    carved = split_checked(shadow, cfg, rank, layers_per_stage, text_layers, trained)
    kept = kept_names(carved)
    keep = {number[id(p)] for n, p in shadow.named_parameters(remove_duplicate=False) if id(p) in number}
    cuts = narrow(model, carved)  # the experts' FQNs are the shadow's: the adapter leaves the experts alone
    materialize(model, {base_name(n) for n in kept})
    del shadow, carved
    set_seed(seed)
    with ReplayRandomOnMeta(report), ParameterOrder(keep, [p.shape for p in probe.order]):
        return apply_adapter(model, adapter), cuts


def _expert_narrowing(config, cfg: ScheduleConfig, rank: int, experts, adapter, source: dict[str, str],
                      layouts: dict[str, tuple[int, int]]):
    """The function ``(meta model, its split) -> {name: ExpertCut}`` that gives the fused experts of the split's
    stages on the model EP rank ``experts[0]``'s rows alone (:func:`~.expert_parallel.narrow_experts`), or one
    that cuts nothing: without ``experts`` (or ``ep_size`` 1), and under an adapter with ``target_parameters``
    (peft's ``ParamWrapper`` sizes its ``lora_A`` / ``lora_B`` by the experts it finds, and their draws must be
    the unsplit model's: the experts load whole and :func:`~.expert_parallel.shard_experts` cuts both). Only the
    tensors the checkpoint stores under the model's name (``source``) with the experts on dimension 0
    (``layouts``: a transposition that leaves it) are cut; any other loads whole, as without ``experts``, and is
    sliced by ``shard_experts`` (a family whose checkpoints hold per-expert tensors, fused by transformers'
    converters, has none: :func:`~.shards.disk_names` refuses its checkpoints for now)."""
    from .expert_parallel import narrow_experts, stage_prefixes
    if experts is None or experts[1] == 1 or getattr(adapter, "target_parameters", None):
        return lambda model, carved: {}
    names = {n for n in source if 0 not in layouts.get(n, (1, 1))}
    return lambda model, carved: narrow_experts(model, config, experts[0], experts[1],
                                                stage_prefixes(carved, rank, cfg.pp_size), names)


def split_from_checkpoint(path: str, config, cfg: ScheduleConfig, rank: int,
                          layers_per_stage: list[int] | None = None, text_layers: int = 0, adapter=None,
                          seed: int = 0, experts: tuple[int, int] | None = None) -> tuple[SplitModel, LoadReport]:
    """Rank ``rank``'s share of the checkpoint at ``path`` (fp32, eval mode as ``from_pretrained`` leaves it),
    reading only the tensors it keeps, one at a time. With ``adapter`` (a ``peft.LoraConfig``), the share of
    ``set_seed(seed); peft.get_peft_model(from_pretrained(path), adapter)``: the base tensors from the
    checkpoint, the adapter's as peft draws them (:func:`_adapt_for_rank`). ``experts``: ``(ep_rank, ep_size)``
    under expert parallelism: each fused ``(E, ...)`` expert tensor of the rank's stages (not ``P``'s) is made
    real with EP rank ``ep_rank``'s ``E / ep_size`` experts only, and only those rows are read
    (:func:`_expert_narrowing` says which tensors; :func:`~.expert_parallel.shard_experts` then takes them as
    they are), so no rank builds all ``E``; the report counts those rows alone.

    Returns:
        ``(carved model on CPU, report)``; ``carved.peft`` is the ``PeftModel`` with an adapter.

    Raises:
        ValueError: as :func:`~.registry.split`; no safetensors weights; a tensor this rank keeps that the
            checkpoint lacks, or whose shape differs (the message names them); an adapter peft cannot put in, or
            one the split would freeze; with ``experts``, as :func:`~.expert_parallel.check_expert_parallel`.
    """
    report = LoadReport()
    model = meta_model(config)
    files = checkpoint_files(path)
    layouts: dict[str, tuple[int, int]] = {}  # the tensors stored transposed: {model name: (dim0, dim1)}
    source = disk_names(model, list(files), _holder(config), layouts)  # the carved model's names are a subset
    untie_if_saved_apart(model, source)
    report.full_model_bytes = full_bytes(model)
    narrow = _expert_narrowing(config, cfg, rank, experts, adapter, source, layouts)
    peft_model = None
    if adapter is not None:
        peft_model, cuts = _adapt_for_rank(model, adapter, cfg, rank, layers_per_stage, text_layers, seed, report,
                                           narrow)
        names = [n for n, _ in [*model.named_parameters(remove_duplicate=False), *model.named_buffers()]]
        source = {n: source[base_name(n)] for n in names if base_name(n) in source}
    carved = split(model, cfg, rank, layers_per_stage, text_layers)
    carved.peft = peft_model
    model = carved.model
    if adapter is None:
        cuts = narrow(model, carved)
    for embed, head in carved.tied:  # lm_head's own copy of a tied embedding is read from the embedding
        if head not in source and embed in source:
            source[head] = source[embed]
    missing = [n for n, t in model.named_parameters() if n not in source and ".lora_" not in n]
    if missing:
        raise ValueError(f"checkpoint {path!r} lacks tensors rank {rank} holds: {missing[:5]}"
                         f"{' ...' if len(missing) > 5 else ''}")
    materialize(model)
    report.kept_bytes = full_bytes(model)
    _read_share(model, source, files, {n: layouts.get(base_name(n)) for n in source}, cuts, report, path)
    model.eval()
    return carved, report


def _read_share(model: nn.Module, source: dict[str, str], files: dict[str, str], layouts: dict, cuts: dict,
                report: LoadReport, path: str) -> None:
    """Read every tensor of the materialised ``model`` that ``source`` names from its shard (``files``; an
    expert tensor that ``cuts`` names: only its rows, :func:`~.shards.read_experts_into`; ``layouts``: each
    name's transposition, or ``None``), shard by shard; compute the buffers the checkpoint does not hold; check
    that every tensor was written."""
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
                if name in cuts:
                    read_experts_into(file, source[name], state[name], cuts[name], report, path, layouts[name])
                else:
                    read_into(file, source[name], state[name], report, path, layouts[name])
    model.initialize_weights()  # buffers the checkpoint does not hold (the loaded tensors are flagged)
    loaded = frozenset(id(t) for t in state.values() if hasattr(t, "_is_hf_initialized"))
    for t in state.values():
        if hasattr(t, "_is_hf_initialized"):
            del t._is_hf_initialized
    check_materialized(model, loaded)


def load_share_values(path: str, carved: SplitModel, cfg: ScheduleConfig, rank: int, experts=None) -> LoadReport:
    """Copy into ``carved`` (in place: the modules, stages and optimizer keep their tensors) every tensor rank
    ``rank`` saves (``carved.state_dict``), read from the safetensors checkpoint at ``path`` block by block, as
    :func:`split_from_checkpoint` reads them. For resuming a run. ``experts``: the
    :class:`~.expert_shards.ExpertShards` of a share already made expert-parallel (the HF Trainer resumes after
    :meth:`~mpipe_hf.train.run.PipelineRun.start`): each of its shards reads only this rank's experts of the
    checkpoint's fused ``(E, ...)`` tensor (:func:`~.shards.read_experts_into`); without it, so do the experts
    :func:`split_from_checkpoint` cut at load (``mpipe-hf train`` resumes before ``start``).

    Raises:
        ValueError: no safetensors weights; a tensor the rank holds that the checkpoint lacks, or whose shape
            differs (an expert shard's: from the fused shape).
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
    cuts = experts.names if experts is not None else {  # before shard_experts: the cuts made at load, if any
        f"{fqn}.{key}": cut for fqn, m in carved.model.named_modules()
        for key, cut in getattr(m, "_expert_cuts", {}).items()}
    with torch.no_grad():
        for name in sorted(state, key=lambda n: files[source[n]]):
            cut = cuts.get(name)
            if cut is not None and tuple(live[name].shape) != cut.fused:
                read_experts_into(files[source[name]], source[name], live[name], cut, report, path)
            else:
                read_into(files[source[name]], source[name], live[name], report, path)
            del live[name]._is_hf_initialized
    return report


def load_adapter_values(path: str, carved: SplitModel, cfg: ScheduleConfig, rank: int, experts=None) -> None:
    """Copy the adapter checkpoint at ``path`` (PEFT's ``adapter_model.safetensors``) into ``carved``'s adapter
    tensors in place, ``P``'s replica included; the base weights stay as loaded. For resuming a LoRA run.
    ``experts``: the :class:`~.expert_shards.ExpertShards` of a share already made expert-parallel (the HF
    Trainer resumes after :meth:`~mpipe_hf.train.run.PipelineRun.start`): each fused expert adapter of the file is
    cut to this rank's part (:meth:`~.expert_shards.ExpertShards.cut`) first.

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
