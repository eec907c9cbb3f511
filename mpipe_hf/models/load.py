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
"""

from __future__ import annotations

import copy
import json
import os
import warnings
from dataclasses import dataclass

import torch
from accelerate.utils import set_seed
from safetensors import safe_open
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
from transformers.core_model_loading import WeightConverter, rename_source_key
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME

from ..schedule import ScheduleConfig
from .adapters import (ADAPTER_WEIGHTS, apply_adapter, base_name, check_adapter_placement, check_mergeable,
                       is_adapter_tensor, load_adapter_state)
from .base import SplitModel
from .registry import split

_aten = torch.ops.aten
RANDOM_OPS = {_aten.uniform_, _aten.normal_, _aten.bernoulli_, _aten.exponential_, _aten.random_, _aten.cauchy_,
              _aten.log_normal_, _aten.geometric_, _aten.randn, _aten.rand, _aten.randint, _aten.randperm,
              _aten.normal, _aten.bernoulli, _aten.multinomial, _aten.rand_like, _aten.randn_like}


READ_BLOCK_BYTES = 64 * 2**20  # the most of one checkpoint tensor held beside its target while it is read


@dataclass
class LoadReport:
    """What a rank materialised while loading, in bytes.

    Attributes:
        kept_bytes: the parameters and buffers the rank holds after the load (its share, ``P`` included).
        largest_temporary_bytes: the largest tensor held at one time besides the share: a scratch tensor for a
            replayed random draw (as large as the tensor drawn), or a block of a checkpoint tensor read from disk
            before it is copied into place (at most :data:`READ_BLOCK_BYTES`).
        read_bytes: bytes read from the checkpoint (0 for a config).
        full_model_bytes: the parameters and buffers of the unsplit model (counted on the meta device).
    """

    kept_bytes: int = 0
    largest_temporary_bytes: int = 0
    read_bytes: int = 0
    full_model_bytes: int = 0


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class _ReplayRandomOnMeta(TorchDispatchMode):
    """Runs every random op whose tensors are on the meta device once more on a scratch CPU tensor of the same
    shape and dtype, so the CPU generator advances as it would for real tensors; the meta result is returned."""

    def __init__(self, report: LoadReport):
        super().__init__()
        self.report = report

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.overloadpacket in RANDOM_OPS:
            meta = [a for a in args if isinstance(a, torch.Tensor) and a.is_meta]
            if meta or kwargs.get("device") == torch.device("meta"):
                cpu_args = [torch.empty(a.shape, dtype=a.dtype) if isinstance(a, torch.Tensor) and a.is_meta else a
                            for a in args]
                cpu_kwargs = {**kwargs, "device": torch.device("cpu")} if "device" in kwargs else kwargs
                scratch = func(*cpu_args, **cpu_kwargs)
                if isinstance(scratch, torch.Tensor):
                    self.report.largest_temporary_bytes = max(self.report.largest_temporary_bytes, _nbytes(scratch))
                del scratch, cpu_args
        return func(*args, **kwargs)


def model_class(config):
    """The Auto class of ``config``: image-text-to-text for a vision-language model, else causal LM."""
    return AutoModelForImageTextToText if hasattr(config, "vision_config") else AutoModelForCausalLM


def meta_model(config) -> nn.Module:
    """The HF model of ``config`` on the meta device (fp32), built by ``from_config`` as a user would, on a copy
    of ``config`` (the load may change the model's own)."""
    with torch.device("meta"):
        return model_class(config).from_config(copy.deepcopy(config), dtype=torch.float32)


class _ParameterOrder:
    """While a model is built, number every new ``nn.Parameter`` in the order it is registered; with ``keep``,
    every parameter whose number is not in ``keep`` is put on the meta device as it is registered (its draws are
    then replayed by :class:`_ReplayRandomOnMeta`)."""

    def __init__(self, keep: set[int] | None = None, shapes: list[torch.Size] | None = None):
        self.keep, self.shapes, self.order, self._seen = keep, shapes, [], set()

    def __enter__(self):
        self._original = original = nn.Module.register_parameter

        def register(module, name, param):
            if param is not None and id(param) not in self._seen:
                k = len(self.order)
                if self.shapes is not None and (k >= len(self.shapes) or self.shapes[k] != param.shape):
                    raise RuntimeError(f"parameter {k} ({name}, {tuple(param.shape)}) differs between the two "
                                       f"builds of the model; the build is not deterministic")
                if self.keep is not None and k not in self.keep and not param.is_meta:
                    param = nn.Parameter(torch.empty_like(param, device="meta"), requires_grad=param.requires_grad)
                self.order.append(param)
                self._seen.add(id(param))
            original(module, name, param)
        nn.Module.register_parameter = register
        return self

    def __exit__(self, *exc):
        nn.Module.register_parameter = self._original


def _kept_names(carved: SplitModel) -> set[str]:
    model = carved.model
    return {n for n, _ in [*model.named_parameters(remove_duplicate=False),
                           *model.named_buffers(remove_duplicate=False)]}


def _check_materialized(model: nn.Module, loaded: frozenset[int] = frozenset()) -> None:
    """Every tensor left is real, and none besides those read from the checkpoint (``loaded`` ids) still holds
    what :func:`_materialize` filled it with (NaN; an integer tensor all at its smallest value): one that the
    model's init did not write."""
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if t.is_meta:
            raise RuntimeError(f"{name} was not materialised")
        if id(t) in loaded:
            continue
        flat = t.detach().reshape(-1)
        blocks = [flat[i:i + 2**24] for i in range(0, flat.numel(), 2**24)]
        if t.is_floating_point():
            unwritten = any(b.isnan().any() for b in blocks)
        elif t.dtype != torch.bool and flat.numel():
            unwritten = all((b == torch.iinfo(t.dtype).min).all() for b in blocks)
        else:
            unwritten = False
        if unwritten:
            raise RuntimeError(f"{name} was materialised but never initialised (no checkpoint tensor and no "
                               f"_init_weights branch writes it)")


def _full_bytes(model: nn.Module) -> int:
    return sum(_nbytes(t) for t in {id(t): t for t in [*model.parameters(), *model.buffers()]}.values())


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
    with _ParameterOrder() as probe:
        shadow = meta_model(config)
        report.full_model_bytes = _full_bytes(shadow)
        trained = _adapt_on_meta(shadow, adapter)
    number = {id(p): k for k, p in enumerate(probe.order)}
    names = {n: number[id(p)] for n, p in shadow.named_parameters(remove_duplicate=False) if id(p) in number}
    keep = {names[n] for n in _kept_names(split_checked(shadow, cfg, rank, layers_per_stage, text_layers,
                                                        trained)) if n in names}
    del shadow
    set_seed(seed)
    with _ReplayRandomOnMeta(report), _ParameterOrder(keep, [p.shape for p in probe.order]):
        model = model_class(config).from_config(config, dtype=torch.float32)
        peft_model = apply_adapter(model, adapter) if adapter is not None else None
    carved = split(model, cfg, rank, layers_per_stage, text_layers)
    carved.peft = peft_model
    report.kept_bytes = _full_bytes(carved.model)
    _check_materialized(carved.model)
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
    with _ParameterOrder() as probe:
        trained = _adapt_on_meta(shadow, adapter)
    number = {id(p): k for k, p in enumerate(probe.order)}
    carved = split_checked(shadow, cfg, rank, layers_per_stage, text_layers, trained)
    kept = _kept_names(carved)
    keep = {number[id(p)] for n, p in shadow.named_parameters(remove_duplicate=False) if id(p) in number}
    _materialize(model, {base_name(n) for n in kept})
    del shadow, carved
    set_seed(seed)
    with _ReplayRandomOnMeta(report), _ParameterOrder(keep, [p.shape for p in probe.order]):
        return apply_adapter(model, adapter)


def _materialize(model: nn.Module, only: set[str] | None = None) -> None:
    """Give every meta parameter and buffer of ``model`` (or those of which one name is in ``only``) real CPU
    storage filled with NaN (integers: their smallest value), keeping tied tensors tied (a tied weight is made
    real under all its names when one of them is kept)."""
    wanted = None
    if only is not None:
        named = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
        wanted = {id(t) for n, t in named if n in only}
    done: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for store, is_param in ((module._parameters, True), (module._buffers, False)):
            for key, t in list(store.items()):
                if t is None or not t.is_meta or (wanted is not None and id(t) not in wanted):
                    continue
                if id(t) not in done:
                    fill = (float("nan") if t.is_floating_point() else False if t.dtype == torch.bool
                            else torch.iinfo(t.dtype).min)
                    real = torch.full(t.shape, fill, dtype=t.dtype)
                    done[id(t)] = nn.Parameter(real, requires_grad=t.requires_grad) if is_param else real
                store[key] = done[id(t)]


def _checkpoint_files(path: str) -> dict[str, str]:
    """``{on-disk tensor name: shard file}`` of a safetensors checkpoint directory.

    Raises:
        ValueError: the directory has no safetensors weights.
    """
    index = os.path.join(path, SAFE_WEIGHTS_INDEX_NAME)
    if os.path.isfile(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        return {k: os.path.join(path, v) for k, v in weight_map.items()}
    single = os.path.join(path, SAFE_WEIGHTS_NAME)
    if not os.path.isfile(single):
        raise ValueError(f"model.name_or_path {path!r} has no safetensors weights ({SAFE_WEIGHTS_NAME} or "
                         f"{SAFE_WEIGHTS_INDEX_NAME}); convert it with save_pretrained(safe_serialization=True)")
    with safe_open(single, "pt") as f:
        return {k: single for k in f.keys()}


def _rename(model: nn.Module, disk_names: list[str]) -> dict[str, str]:
    """``{model tensor name: on-disk name}`` through transformers' conversion mapping of ``model``.

    Raises:
        ValueError: the model's mapping merges or splits tensors (not a plain renaming).
    """
    from transformers.conversion_mapping import get_model_conversion_mapping
    transforms = get_model_conversion_mapping(model)
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    if converters:
        raise ValueError(f"{type(model).__name__}'s checkpoint conversion merges or splits tensors "
                         f"({converters[0]!r}); per-rank loading supports renamings only")
    meta_state = model.state_dict()
    out = {}
    for disk in disk_names:
        name, _ = rename_source_key(disk, transforms, [], model.base_model_prefix, meta_state)
        out[name] = disk
    return out


def _read_into(file: str, key: str, target: torch.Tensor, report: LoadReport, path: str) -> None:
    """Copy tensor ``key`` of shard ``file`` into ``target``, in blocks of rows of at most
    :data:`READ_BLOCK_BYTES`. The shard is opened afresh for each block, so neither the block nor the memory
    map (whose file pages count as resident while mapped) ever covers more than one block.

    Raises:
        ValueError: the checkpoint's shape differs from the model's.
    """
    with safe_open(file, "pt") as f:
        shape = tuple(f.get_slice(key).get_shape())
    if shape != tuple(target.shape):
        raise ValueError(f"checkpoint {path!r}: {key} has shape {shape}, the model's tensor {tuple(target.shape)}")
    rows = shape[0] if shape else 1
    step = max(1, READ_BLOCK_BYTES * rows // max(1, _nbytes(target)))
    for start in range(0, rows, step):
        with safe_open(file, "pt") as f:
            piece = f.get_slice(key)[start:start + step] if shape else f.get_tensor(key)
            (target[start:start + step] if shape else target).copy_(piece)
            report.read_bytes += _nbytes(piece)
            report.largest_temporary_bytes = max(report.largest_temporary_bytes, _nbytes(piece))
            del piece
    target._is_hf_initialized = True


def _untie_if_saved_apart(model: nn.Module, source: dict[str, str]) -> None:
    """A config that ties ``lm_head`` to the input embedding, with a checkpoint that stores an ``lm_head`` of its
    own: keep the two apart, as ``from_pretrained`` does (and warn), so that neither overwrites the other and
    their gradients are not summed."""
    head = getattr(model, "lm_head", None)
    embed = model.get_input_embeddings()
    if head is None or head.weight is not embed.weight or "lm_head.weight" not in source:
        return
    embed_name = next(n for n, p in model.named_parameters() if p is embed.weight)
    if source.get(embed_name) == source["lm_head.weight"]:
        return
    warnings.warn(f"the config ties lm_head to {embed_name}, but the checkpoint stores lm_head.weight apart "
                  f"({source['lm_head.weight']}); loading both, untied")
    head.weight = nn.Parameter(torch.empty_like(embed.weight), requires_grad=embed.weight.requires_grad)
    for cfg in {id(c): c for c in (model.config, model.config.get_text_config())}.values():
        cfg.tie_word_embeddings = False


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
    files = _checkpoint_files(path)
    source = _rename(model, list(files))  # the carved model's names are a subset of the whole model's
    _untie_if_saved_apart(model, source)
    report.full_model_bytes = _full_bytes(model)
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
    _materialize(model)
    report.kept_bytes = _full_bytes(model)
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
                _read_into(file, source[name], state[name], report, path)
    model.initialize_weights()  # buffers the checkpoint does not hold (the loaded tensors are flagged)
    loaded = frozenset(id(t) for t in state.values() if hasattr(t, "_is_hf_initialized"))
    for t in state.values():
        if hasattr(t, "_is_hf_initialized"):
            del t._is_hf_initialized
    _check_materialized(model, loaded)
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
    files = _checkpoint_files(path)
    source = _rename(carved.model, list(files))
    state = carved.state_dict(cfg, rank)
    missing = [n for n in state if n not in source]
    if missing:
        raise ValueError(f"checkpoint {path!r} lacks tensors rank {rank} holds: {missing[:5]}"
                         f"{' ...' if len(missing) > 5 else ''}")
    live = carved.model.state_dict(keep_vars=True)
    with torch.no_grad():
        for name in sorted(state, key=lambda n: files[source[n]]):
            _read_into(files[source[name]], source[name], live[name], report, path)
            del live[name]._is_hf_initialized
    return report


def load_adapter_values(path: str, carved: SplitModel, cfg: ScheduleConfig, rank: int) -> None:
    """Copy the adapter checkpoint at ``path`` (PEFT's ``adapter_model.safetensors``) into ``carved``'s adapter
    tensors in place, ``P``'s replica included; the base weights stay as loaded. For resuming a LoRA run.

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
    try:
        load_adapter_state(carved.peft, load_file(file), owned)
    except RuntimeError as err:  # load_state_dict's size mismatch: another r, or other layers
        raise ValueError(f"checkpoint {path!r}: its adapter does not fit this run's lora section (saved with "
                         f"another r or target_modules?): {' '.join(str(err).split())[:300]}") from err
