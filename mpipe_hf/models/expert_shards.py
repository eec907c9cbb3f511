"""The record of an EP rank's expert shards, and their way back to whole tensors for a checkpoint.

An EP rank holds ``E / ep_size`` experts of each fused ``(E, ...)`` tensor of its stages' MoE layers, and under
LoRA their part of each expert adapter (:mod:`.expert_parallel` cuts them, at load or from a whole model).
:class:`ExpertCut` says where one such part lies in its fused tensor (a row range, or strided columns for peft's
``lora_B``), and :class:`ExpertShards` lists this rank's parts: the gradient sums over ``edp`` and the norm read its
``params``, and a checkpoint's weights and AdamW moments are all-gathered over the EP group into the fused tensors
(:meth:`ExpertShards.fused`, :meth:`ExpertShards.fused_optimizer`) and cut again after a resume, whatever
``ep_size`` wrote them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass(frozen=True)
class ExpertCut:
    """Where an EP rank's experts lie in a fused tensor of shape ``fused``: its dimension ``dim`` read as
    ``(outer, E, inner)``, the rank holding experts ``rows`` of the middle axis (:func:`~.expert_parallel.expert_rows`).

    - the experts' own ``(E, ...)`` tensors (``gate_up_proj``, ``down_proj``): ``dim`` 0, ``outer`` 1, ``inner`` 1,
      a row range;
    - peft's ``ParamWrapper`` adapter of one (``lora.layer.ParamWrapper.get_delta_weight`` reads ``lora_A``
      ``(E r, in)`` as ``(E, r, in)`` and ``lora_B`` ``(out, r E)`` as ``(out, r, E)``): ``lora_A`` ``dim`` 0,
      ``inner`` ``r`` (expert-major, a row range); ``lora_B`` ``dim`` 1, ``outer`` ``r`` (strided: expert ``e``'s
      columns are ``e, e + E, ..., e + (r - 1) E``).

    The cut keeps the layout: a cut ``lora_B`` is ``(out, r E_local)`` read as ``(out, r, E_local)``.
    """

    dim: int
    outer: int
    inner: int
    rows: slice
    fused: tuple[int, ...]

    @property
    def experts(self) -> int:
        """``E``, the experts of the fused tensor."""
        return self.fused[self.dim] // (self.outer * self.inner)

    def cut(self, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's part of a tensor of the ``fused`` shape (a copy when the part is strided)."""
        view = tensor.unflatten(self.dim, (self.outer, self.experts, self.inner))
        return view[(slice(None),) * (self.dim + 1) + (self.rows,)].flatten(self.dim, self.dim + 2)

    def joined(self, parts: list[torch.Tensor]) -> torch.Tensor:
        """The fused tensor from every EP rank's part (each of this rank's part's shape), in EP rank order."""
        per = self.rows.stop - self.rows.start
        views = [p.unflatten(self.dim, (self.outer, per, self.inner)) for p in parts]
        return torch.cat(views, dim=self.dim + 1).flatten(self.dim, self.dim + 2)


@dataclass
class ExpertShards:
    """This rank's expert shards (the experts' fused tensors and, under LoRA, their adapters): ``{parameter name:
    its cut}`` and the parameters.

    Attributes:
        ep_rank, ep_size: this rank's place in its EP group.
        names: ``{name in the model: its :class:`ExpertCut` of the fused tensor}``, in the order of ``params``.
        params: the sharded parameters (their gradients are summed over ``edp``, not ``dp``; the clipping norm
            sums their squares over the EP group).
        group: the EP group's :class:`~mpipe_hf.runtime.watchdog.WatchedGroup` (the all-to-alls' group, which the
            watchdog breaks when a step fails and renews after), or ``None``.
    """

    ep_rank: int
    ep_size: int
    group: object = None
    names: dict[str, ExpertCut] = field(default_factory=dict)
    params: list[nn.Parameter] = field(default_factory=list)

    def add(self, name: str, cut: ExpertCut, param: nn.Parameter) -> None:
        """Record shard ``name`` (``param``, cut from its fused tensor as ``cut`` says)."""
        self.names[name] = cut
        self.params.append(param)

    def cut(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` (``name``'s value as a checkpoint holds it) cut to this rank's part when ``name`` is a shard
        and ``tensor`` has the fused shape; else ``tensor`` itself."""
        cut = self.names.get(name)
        return cut.cut(tensor) if cut is not None and tuple(tensor.shape) == cut.fused else tensor

    def fused(self, state: dict[str, torch.Tensor], group) -> dict[str, torch.Tensor]:
        """``state`` with every expert shard replaced by the fused tensor, all-gathered over the EP ``group`` (a
        collective: every EP rank calls it with the same names), for a checkpoint that ``from_pretrained`` (or
        PEFT's ``PeftModel.from_pretrained``) loads."""
        out = dict(state)
        for name in sorted(n for n in state if n in self.names):
            out[name] = self.names[name].joined(_gathered(state[name], self.ep_size, group))
        return out

    def fused_optimizer(self, state: dict, names: list[str], group) -> dict:
        """An optimizer ``state_dict`` (``state``, its per-parameter entries indexed as ``names``) with each AdamW
        moment of an expert shard (a tensor of the shard's shape) all-gathered over the EP ``group`` into the
        fused moment, so that a checkpoint's training state holds every expert's moments whatever ``ep_size``
        wrote it (:meth:`slice_optimizer` cuts them for the run that reads it). A collective, as :meth:`fused`."""
        shapes = {name: tuple(p.shape) for name, p in zip(self.names, self.params)}
        out = {**state, "state": dict(state["state"])}
        for index, name in enumerate(names):
            if name not in shapes or index not in state["state"]:
                continue
            out["state"][index] = {k: self.names[name].joined(_gathered(v, self.ep_size, group))
                                   if torch.is_tensor(v) and tuple(v.shape) == shapes[name] else v
                                   for k, v in state["state"][index].items()}
        return out

    def slice_optimizer(self, optimizer) -> None:
        """Cut every fused AdamW moment of ``optimizer``'s expert shards (as a checkpoint holds them:
        :meth:`fused_optimizer`, or a run without EP) to this rank's part, in place; a moment of the shard's own
        shape (a fresh state) is left alone."""
        for cut, param in zip(self.names.values(), self.params):
            state = optimizer.state.get(param, {})
            for key, value in list(state.items()):
                if torch.is_tensor(value) and tuple(value.shape) == cut.fused and tuple(param.shape) != cut.fused:
                    state[key] = cut.cut(value).clone()


def _gathered(tensor: torch.Tensor, ep_size: int, group) -> list[torch.Tensor]:
    """``tensor`` of every rank of the EP ``group``, in EP rank order (all_gather)."""
    import torch.distributed as dist
    shard = tensor.detach().contiguous()
    parts = [torch.empty_like(shard) for _ in range(ep_size)]
    dist.all_gather(parts, shard, group=group)
    return parts
