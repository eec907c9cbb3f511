"""Expert parallelism inside a pipeline stage (issue 40; docs/models.md, "Expert parallelism").

The ``ep_size`` replicas of one stage rank (an EP group, :func:`~mpipe_hf.runtime.mesh.expert_mesh`) each run
their own micro-batches through the same schedule, and each holds ``E / ep_size`` experts of every MoE layer of its
stages: EP rank ``r`` the experts ``r * E / ep_size .. (r + 1) * E / ep_size - 1``, a row range of the fused
``(E, ...)`` tensors that transformers' experts modules hold (``gate_up_proj``, ``down_proj``). Attention, norms,
the router and shared experts stay replicated; so do the experts of the ``T`` text layers of a transposed ``P``
(every pipeline rank runs ``P`` for its own micro-batches, at its own times).

What is transformers' and what is not:

- which tensors are the experts' and which module dispatches comes from the config's ``base_model_ep_plan``
  (``layers.*.mlp.experts.gate_up_proj: grouped_gemm`` etc.), read here, not restated per family;
- the dispatch and the combine are transformers' ``AllToAllEP`` (``transformers.distributed.expert_parallel``):
  the (token, expert) pairs sorted by expert, the per-expert counts exchanged first by ``all_to_all_single``
  (dropless: no capacity, the split sizes read on the host), the rows sent by torch's autograd all-to-all, the
  experts' own forward run on the received rows with local expert ids, and the outputs sent back and weighted by
  the router's top-k weights on the sender. Its TP mesh (the ranks that share one batch) is a one-rank mesh here:
  no two ranks of an EP group hold the same tokens;
- not ``apply_expert_parallelism`` itself: it turns the expert weights into ``DTensor`` shards on the EP mesh,
  which the runtime reads as FSDP2 shards (their gradients averaged over ``dp``, their squares summed over ``dp``
  in the norm, gathered at save), and FSDP2 would shard them again over every replica. Here each rank's expert
  weights are plain tensors, sliced once (at load, :mod:`.load`, or from a whole model, :func:`shard_experts`),
  and :class:`ExpertShards` says which they are, so that their gradients are summed over ``edp`` only.

Exactness: with top-2 routing, ``AllToAllEP``'s combine (``w_0 y_0 + w_1 y_1`` per token) adds the same two
products as the eager experts' ``index_add_`` in expert order (fp32 addition of two terms commutes), and the expert
rows are the same ``linear`` calls; an expert's weight gradient sums the rows of every replica of the EP group in
one matmul instead of one per micro-batch, an fp32 reordering. The router's load-balancing sums stay per
micro-batch: a micro-batch's tokens all live on the replica that routes them (the all-to-all moves rows, not the
router's inputs), so each replica's running sums (:mod:`.moe`) are already HF's per-micro value; all-reducing them
over the EP group would mix two micro-batches' sums into another number.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch
from torch import nn

from .base import SplitModel
from .decoder import layer_types
from .packed import RECURRENT

DISPATCH, SHARD = "ep_dispatch_experts", "grouped_gemm"  # the styles of transformers' EP plans that this reads


def ep_plan(config) -> dict[str, str]:
    """The text config's ``base_model_ep_plan`` (``{pattern: style}``, ``{}`` without one)."""
    return dict(getattr(config.get_text_config(), "base_model_ep_plan", None) or {})


def num_experts(config) -> int | None:
    """``E``, the routed experts of each MoE layer (``num_experts``, ``num_local_experts`` or
    ``n_routed_experts``), or ``None``."""
    text = config.get_text_config()
    for key in ("num_experts", "num_local_experts", "n_routed_experts"):
        if getattr(text, key, None):
            return int(getattr(text, key))
    return None


def check_expert_parallel(config, ep_size: int, adapter=None, packed: bool = False) -> None:
    """The checks of ``parallel.ep_size`` against the model, made before any collective.

    Raises:
        ValueError: ``ep_size > 1`` with a model whose config has no ``base_model_ep_plan`` that dispatches
            experts, an ``E`` that ``ep_size`` does not divide, a LoRA adapter on the
            experts' fused tensors (``target_parameters``: its ``(E, ...)`` adapter would need slicing too), or
            packed micro-batches (``packed``, ``data.packing``) of a model with recurrent layers (Qwen3.5-MoE's
            linear attention, :data:`~.packed.RECURRENT`): each such layer, MoE MLP included, runs once per
            packed row, so two EP peers whose micros hold different numbers of rows would call the all-to-all a
            different number of times (measured: a gloo collective mismatch). Other layers take a packed micro
            in one pass, one all-to-all per MoE layer whatever its rows. Zero-bubble needs no check: ``B`` runs
            both all-to-alls' backward (they lie on the inputs' path) and ``W`` only the experts' grouped GEMMs
            from the dispatched tokens their nodes keep (:mod:`mpipe_hf.runtime.zero_bubble`).
    """
    if ep_size == 1:
        return
    plan, experts = ep_plan(config), num_experts(config)
    if DISPATCH not in plan.values() or not experts:
        raise ValueError(f"parallel.ep_size = {ep_size} needs a mixture-of-experts model whose config has a "
                         f"base_model_ep_plan (transformers' expert-parallel plan); {config.model_type} has none: "
                         f"set parallel.ep_size: 1")
    if experts % ep_size:
        raise ValueError(f"parallel.ep_size must divide the model's {experts} experts per layer, got {ep_size}")
    recurrent = sorted(set(layer_types(config.get_text_config())) & RECURRENT)
    if packed and recurrent:
        raise ValueError(f"parallel.ep_size > 1 with data.packing is not supported for {config.model_type}: its "
                         f"{recurrent} layers run once per packed row, so the EP peers' all-to-alls would not pair "
                         f"up; set data.packing: false or parallel.ep_size: 1")
    targets = getattr(adapter, "target_parameters", None) or []
    touched = [t for t in targets if any(_full_match(t, p.replace("*", "0")) or _full_match(p, t)
                                         for p, s in plan.items() if s == SHARD)]
    if touched:
        raise ValueError(f"parallel.ep_size > 1 with LoRA on the fused expert tensors ({touched}) is not "
                         f"supported: drop them from lora.target_parameters, or set parallel.ep_size: 1")


def expert_tensors(model: nn.Module, config, under: list[str] | None = None) -> dict[str, list[str]]:
    """``{experts module FQN: [its fused parameter names]}`` of ``model``, by the EP plan: the modules styled
    ``ep_dispatch_experts`` and, of each, the parameters styled ``grouped_gemm``. ``under``: only modules
    below these FQN prefixes (a rank's stage layers)."""
    plan = ep_plan(config)
    modules = [p for p, s in plan.items() if s == DISPATCH]
    tensors = [p for p, s in plan.items() if s == SHARD]
    out = {}
    for name, _ in model.named_modules():
        if not any(_full_match(p, name) for p in modules):
            continue
        if under is not None and not any(name == u or name.startswith(u + ".") for u in under):
            continue
        out[name] = [t.rpartition(".")[2] for t in tensors if t.rpartition(".")[0] in modules]
    return out


def _full_match(pattern: str, name: str) -> bool:
    regex = re.escape(pattern).replace(r"\*", r"\d+")
    return re.search(rf"(^|\.){regex}$", name) is not None


def stage_prefixes(carved: SplitModel, rank: int, pp_size: int) -> list[str]:
    """The FQNs of the modules of ``rank``'s stages (not ``P``'s: its experts stay whole)."""
    return [fqn for s in range(rank, len(carved.layout), pp_size) for fqn in carved.layout[s]]


def expert_rows(config, ep_rank: int, ep_size: int) -> slice:
    """The rows (experts) of the fused ``(E, ...)`` tensors EP rank ``ep_rank`` of ``ep_size`` holds."""
    per = num_experts(config) // ep_size
    return slice(ep_rank * per, (ep_rank + 1) * per)


@dataclass
class ExpertShards:
    """This rank's expert shards: ``{parameter name: (rows of the fused tensor, fused shape)}`` and the parameters.

    Attributes:
        ep_rank, ep_size: this rank's place in its EP group.
        names: ``{name in the model: (rows of the fused (E, ...) tensor, fused shape)}``.
        params: the sharded parameters (their gradients are summed over ``edp``, not ``dp``).
        group: the EP group's :class:`~mpipe_hf.runtime.watchdog.WatchedGroup` (the all-to-alls' group, which the
            watchdog breaks when a step fails and renews after), or ``None``.
    """

    ep_rank: int
    ep_size: int
    group: object = None
    names: dict[str, tuple[slice, tuple[int, ...]]] = field(default_factory=dict)
    params: list[nn.Parameter] = field(default_factory=list)

    def fused(self, state: dict[str, torch.Tensor], group) -> dict[str, torch.Tensor]:
        """``state`` with every expert shard replaced by the fused ``(E, ...)`` tensor, all-gathered over the
        EP ``group`` (a collective: every EP rank calls it with the same names), for a checkpoint that
        ``from_pretrained`` loads."""
        out = dict(state)
        for name in sorted(n for n in state if n in self.names):
            out[name] = _gathered(state[name], self.ep_size, group)
        return out

    def fused_optimizer(self, state: dict, names: list[str], group) -> dict:
        """An optimizer ``state_dict`` (``state``, its per-parameter entries indexed as ``names``) with each AdamW
        moment of an expert shard (a tensor of the shard's shape) all-gathered over the EP ``group`` into the
        fused ``(E, ...)`` moment, so that a checkpoint's training state holds every expert's moments whatever
        ``ep_size`` wrote it (:meth:`slice_optimizer` cuts them for the run that reads it). A collective, as
        :meth:`fused`."""
        shapes = {name: tuple(p.shape) for name, p in zip(self.names, self.params)}
        out = {**state, "state": dict(state["state"])}
        for index, name in enumerate(names):
            if name not in shapes or index not in state["state"]:
                continue
            out["state"][index] = {k: _gathered(v, self.ep_size, group)
                                   if torch.is_tensor(v) and tuple(v.shape) == shapes[name] else v
                                   for k, v in state["state"][index].items()}
        return out

    def slice_optimizer(self, optimizer) -> None:
        """Cut every fused ``(E, ...)`` AdamW moment of ``optimizer``'s expert shards (as a checkpoint holds them:
        :meth:`fused_optimizer`, or a run without EP) to this rank's rows, in place; a moment of the shard's own
        shape (a fresh state) is left alone."""
        for (rows, fused), param in zip(self.names.values(), self.params):
            state = optimizer.state.get(param, {})
            for key, value in list(state.items()):
                if torch.is_tensor(value) and tuple(value.shape) == fused and tuple(param.shape) != fused:
                    state[key] = value[rows].clone()


def _gathered(tensor: torch.Tensor, ep_size: int, group) -> torch.Tensor:
    """The rows of ``tensor`` of every rank of the EP ``group``, concatenated in EP rank order (all_gather)."""
    import torch.distributed as dist
    shard = tensor.detach().contiguous()
    parts = [torch.empty_like(shard) for _ in range(ep_size)]
    dist.all_gather(parts, shard, group=group)
    return torch.cat(parts, dim=0)


def shard_experts(carved: SplitModel, config, rank: int, pp_size: int, ep_mesh, tp_mesh) -> ExpertShards:
    """Make ``carved`` expert-parallel over ``ep_mesh`` (the 1-D ``ep`` mesh of
    :func:`~mpipe_hf.runtime.mesh.expert_mesh`): every experts module of ``rank``'s stages keeps its EP rank's
    rows (:func:`expert_rows`) of each fused tensor (sliced here when it is still whole; a share loaded with
    ``ep`` already holds them), its ``num_experts`` becomes the local count, and its forward becomes
    transformers' ``AllToAllEP`` over ``ep_mesh`` (``tp_mesh``: a one-rank mesh, the ranks sharing a batch).
    Every rank of the EP group calls it (no collective runs here).

    Returns:
        the :class:`ExpertShards` of this rank.

    Raises:
        ValueError: as :func:`check_expert_parallel`; a fused tensor whose first dimension is neither ``E`` nor
            ``E / ep_size``.
    """
    from transformers.distributed.expert_parallel import EPImplementationInterface

    from ..runtime.watchdog import watched
    ep_size, ep_rank = ep_mesh.size(), ep_mesh.get_local_rank()
    check_expert_parallel(config, ep_size)
    total, rows = num_experts(config), expert_rows(config, ep_rank, ep_size)
    shards = ExpertShards(ep_rank, ep_size, group=watched(ep_mesh))
    for fqn, tensors in expert_tensors(carved.model, config, stage_prefixes(carved, rank, pp_size)).items():
        module = carved.model.get_submodule(fqn)
        for key in tensors:
            param = getattr(module, key)
            if param.shape[0] == total:
                param = nn.Parameter(param.detach()[rows].clone(), requires_grad=param.requires_grad)
                setattr(module, key, param)
            elif param.shape[0] != total // ep_size:
                raise ValueError(f"{fqn}.{key} has {param.shape[0]} experts; expected {total} or {total // ep_size}")
            shards.names[f"{fqn}.{key}"] = (rows, (total, *param.shape[1:]))
            shards.params.append(param)
        module.num_experts = total // ep_size
        module._is_expert_parallel = True  # transformers' batched and grouped kernels then mask off-rank ids
        dispatch = EPImplementationInterface()["all_to_all"](module, shards.group, tp_mesh)
        module.forward = _dispatching(dispatch)
    return shards


def _dispatching(dispatch):
    """The experts module's forward under EP: ``(rows (N, H), top-k ids (N, k), top-k weights (N, k)) -> (N, H)``,
    through ``dispatch`` (transformers' ``AllToAllEP``), in the rows' dtype."""
    def forward(hidden_states, top_k_index, top_k_weights):
        return dispatch(hidden_states, top_k_index, top_k_weights).to(hidden_states.dtype)
    return forward
