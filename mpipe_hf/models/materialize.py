"""Building a model on the meta device and making only a rank's share of it real (used by :mod:`.load`).

- :func:`meta_model` builds the HF model of a config on the meta device; :class:`ParameterOrder` numbers its
  parameters as they are registered (and, on the second build, moves the ones a rank does not keep to the meta
  device); :class:`ReplayRandomOnMeta` replays every random draw on a meta tensor on a scratch CPU tensor, so the
  generator advances as in the unsplit build.
- :func:`materialize` gives meta tensors real storage filled with NaN, and :func:`check_materialized` finds any
  tensor that nothing wrote afterwards.
- :class:`LoadReport` counts the bytes a rank kept, read and held for a while.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

from .base import SplitModel

_aten = torch.ops.aten
RANDOM_OPS = {_aten.uniform_, _aten.normal_, _aten.bernoulli_, _aten.exponential_, _aten.random_, _aten.cauchy_,
              _aten.log_normal_, _aten.geometric_, _aten.randn, _aten.rand, _aten.randint, _aten.randperm,
              _aten.normal, _aten.bernoulli, _aten.multinomial, _aten.rand_like, _aten.randn_like}


@dataclass
class LoadReport:
    """What a rank materialised while loading, in bytes.

    Attributes:
        kept_bytes: the parameters and buffers the rank holds after the load (its share, ``P`` included).
        largest_temporary_bytes: the largest tensor held at one time besides the share: a scratch tensor for a
            replayed random draw (as large as the tensor drawn), or a block of a checkpoint tensor read from disk
            before it is copied into place (at most :data:`~.shards.READ_BLOCK_BYTES`).
        read_bytes: bytes read from the checkpoint (0 for a config).
        full_model_bytes: the parameters and buffers of the unsplit model (counted on the meta device).
    """

    kept_bytes: int = 0
    largest_temporary_bytes: int = 0
    read_bytes: int = 0
    full_model_bytes: int = 0


def nbytes(t: torch.Tensor) -> int:
    """Bytes of ``t``'s elements."""
    return t.numel() * t.element_size()


class ReplayRandomOnMeta(TorchDispatchMode):
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
                    self.report.largest_temporary_bytes = max(self.report.largest_temporary_bytes, nbytes(scratch))
                del scratch, cpu_args
        return func(*args, **kwargs)


TIMM_TOWERS = ("timm_wrapper", "gemma3n_vision")  # vision_config.model_type of the timm towers


def require_timm(config) -> None:
    """Raise ``ImportError`` when ``config``'s vision tower is a timm model (``vision_config.model_type``
    ``timm_wrapper``: FastVLM, Perception-LM; ``gemma3n_vision``: Gemma 3n's MobileNet-V5) and timm does not import
    here: timm needs torchvision, both installed beside a torch they were built for (``pip install timm
    torchvision``)."""
    if getattr(getattr(config, "vision_config", None), "model_type", None) not in TIMM_TOWERS:
        return
    try:
        import timm  # noqa: F401
    except Exception as err:  # noqa: BLE001 - timm raises whatever torchvision's import raised
        raise ImportError(f"model_type {config.model_type!r}: its vision tower is a timm model (TimmWrapperModel), "
                          f"which needs timm and torchvision installed for this torch ({err}); install both, e.g. "
                          "pip install timm torchvision") from err

def model_class(config):
    """The Auto class of ``config``: image-text-to-text for a vision-language model, else causal LM; a decoder-only
    type that transformers maps to image-text-to-text alone (``mistral4``) loads through that map."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    require_timm(config)
    if hasattr(config, "vision_config") or config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return AutoModelForImageTextToText
    return AutoModelForCausalLM


def meta_model(config) -> nn.Module:
    """The HF model of ``config`` on the meta device (fp32), built by ``from_config`` as a user would, on a copy
    of ``config`` (the load may change the model's own)."""
    with torch.device("meta"):
        return model_class(config).from_config(copy.deepcopy(config), dtype=torch.float32)


class ParameterOrder:
    """While a model is built, number every new ``nn.Parameter`` in the order it is registered; with ``keep``,
    every parameter whose number is not in ``keep`` is put on the meta device as it is registered (its draws are
    then replayed by :class:`ReplayRandomOnMeta`)."""

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


def kept_names(carved: SplitModel) -> set[str]:
    """Every parameter and buffer name of the carved model, tied and shared names included."""
    model = carved.model
    return {n for n, _ in [*model.named_parameters(remove_duplicate=False),
                           *model.named_buffers(remove_duplicate=False)]}


def check_materialized(model: nn.Module, loaded: frozenset[int] = frozenset()) -> None:
    """Every tensor left is real, and none besides those read from the checkpoint (``loaded`` ids) still holds
    what :func:`materialize` filled it with (NaN; an integer tensor all at its smallest value): one that the
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


def full_bytes(model: nn.Module) -> int:
    """Bytes of ``model``'s parameters and buffers, each tensor counted once (meta tensors too)."""
    return sum(nbytes(t) for t in {id(t): t for t in [*model.parameters(), *model.buffers()]}.values())


def materialize(model: nn.Module, only: set[str] | None = None) -> None:
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
