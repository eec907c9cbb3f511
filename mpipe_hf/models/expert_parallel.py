"""Expert parallelism inside a pipeline stage (docs/models.md, "Expert parallelism").

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
  and :class:`~.expert_shards.ExpertShards` says which they are, so that their gradients are summed over ``edp``
  only;
- LoRA on the experts (peft's ``ParamWrapper``, ``lora.target_parameters``): each wrapper's ``lora_A`` / ``lora_B``
  are cut with the experts (:class:`~.expert_shards.ExpertCut`: ``lora_B``'s experts are strided columns) and
  recorded in :class:`~.expert_shards.ExpertShards` beside them, so that peft's own forward, the gradient sums, the
  norm and the fused save treat them as the experts' tensors (docs/lora.md, "MoE layers").

Exactness: with top-2 routing, ``AllToAllEP``'s combine (``w_0 y_0 + w_1 y_1`` per token) adds the same two
products as the eager experts' ``index_add_`` in expert order (fp32 addition of two terms commutes), and the expert
rows are the same ``linear`` calls; an expert's weight gradient sums the rows of every replica of the EP group in
one matmul instead of one per micro-batch, an fp32 reordering. The router's load-balancing sums stay per
micro-batch: a micro-batch's tokens all live on the replica that routes them (the all-to-all moves rows, not the
router's inputs), so each replica's running sums (:mod:`.moe`) are already HF's per-micro value; all-reducing them
over the EP group would mix two micro-batches' sums into another number.

Under context parallelism (``cp_size > 1``) the EP groups are cut from the ``dp x cp`` ranks that hold a stage
(:func:`~mpipe_hf.runtime.mesh.expert_mesh`; Megatron-Core folds its expert-parallel group over DP x CP alike): a CP
rank dispatches the tokens of its slice of a micro-batch as a replica dispatches its micro-batches', and the
expert shards' gradients are summed over ``edp`` cut from the same ranks. The router sums of a micro are then
summed over its CP group (its slices), never over the EP group (:func:`~.moe.aux_loss`).
"""

from __future__ import annotations

import re

import torch
from torch import nn

from .base import SplitModel
from .decoder import layer_types
from .expert_shards import ExpertCut, ExpertShards
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
            experts, an ``E`` that ``ep_size`` does not divide, a LoRA adapter (``target_parameters``) on a fused
            per-expert bias (a plan tensor named ``*_bias``, ``(E, out)``: peft's ``ParamWrapper`` reads a 2-D
            parameter as one ``(out, in)`` matrix, so its ``lora_A`` spans every expert and no EP rank holds its
            experts' part alone), or
            packed micro-batches (``packed``, ``data.packing``) of a model with recurrent layers (Qwen3.5-MoE's
            linear attention, :data:`~.packed.RECURRENT`): each such layer, MoE MLP included, runs once per
            packed row, so two EP peers whose micros hold different numbers of rows would call the all-to-all a
            different number of times (measured: a gloo collective mismatch). Other layers take a packed micro
            in one pass, one all-to-all per MoE layer whatever its rows. Zero-bubble needs no check: ``B`` runs
            both all-to-alls' backward (they lie on the inputs' path) and ``W`` only the experts' grouped GEMMs
            from the dispatched tokens their nodes keep (:mod:`mpipe_hf.runtime.zero_bubble`). LoRA on the
            ``(E, ...)`` expert tensors themselves is sliced with them (:func:`shard_experts`).
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
    biases = [t for t in targets if any(_full_match(t, p.replace("*", "0")) or _full_match(p, t)
                                        for p, s in plan.items() if s == SHARD and p.endswith("_bias"))]
    if biases:
        raise ValueError(f"parallel.ep_size > 1 with LoRA on the experts' fused biases ({biases}) is not "
                         f"supported: peft adapts a 2-D (E, out) parameter with one lora_A shared by every expert, "
                         f"which no EP rank holds alone; drop them from lora.target_parameters, or set "
                         f"parallel.ep_size: 1")


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


def narrow_experts(model: nn.Module, config, ep_rank: int, ep_size: int, under: list[str],
                   names: set[str] | None = None) -> dict[str, ExpertCut]:
    """Give each fused ``(E, ...)`` parameter of the experts modules of the meta ``model`` below ``under`` (a rank's
    stages, :func:`stage_prefixes`) ``E / ep_size`` rows in its place, still on the meta device, so that
    materialising the model makes only EP rank ``ep_rank``'s experts (:func:`expert_rows`) real; ``names``: only
    the parameters named there (those a checkpoint stores fused). :func:`~.load.split_from_checkpoint` then reads
    each with :func:`~.shards.read_experts_into`, and :func:`shard_experts` finds it cut (and checks the rows: the
    experts module's ``_expert_cuts``, ``{parameter: its cut}``, say them).

    Returns:
        ``{parameter name: its :class:`ExpertCut`}``.

    Raises:
        ValueError: as :func:`check_expert_parallel`; a parameter not on the meta device or not of ``E`` rows.
    """
    check_expert_parallel(config, ep_size)
    total, rows = num_experts(config), expert_rows(config, ep_rank, ep_size)
    cuts = {}
    for fqn, tensors in expert_tensors(model, config, under).items():
        module = model.get_submodule(fqn)
        for key in [k for k in tensors if names is None or f"{fqn}.{k}" in names]:
            param = getattr(module, key)
            if not param.is_meta or param.shape[0] != total:
                raise ValueError(f"{fqn}.{key}: expected a meta tensor of {total} experts, got {tuple(param.shape)} "
                                 f"on {param.device}")
            cuts[f"{fqn}.{key}"] = ExpertCut(0, 1, 1, rows, tuple(param.shape))
            part = torch.empty((rows.stop - rows.start, *param.shape[1:]), dtype=param.dtype, device="meta")
            setattr(module, key, nn.Parameter(part, requires_grad=param.requires_grad))
            module._expert_cuts = {**getattr(module, "_expert_cuts", {}), key: cuts[f"{fqn}.{key}"]}
    return cuts


def shard_experts(carved: SplitModel, config, rank: int, pp_size: int, ep_mesh, tp_mesh) -> ExpertShards:
    """Make ``carved`` expert-parallel over ``ep_mesh`` (the 1-D ``ep`` mesh of
    :func:`~mpipe_hf.runtime.mesh.expert_mesh`): every experts module of ``rank``'s stages keeps its EP rank's
    rows (:func:`expert_rows`) of each fused tensor (sliced here when it is still whole; a share loaded with
    ``experts``, :func:`narrow_experts`, already holds them: this EP rank's), its ``num_experts`` becomes the
    local count, and its forward becomes transformers' ``AllToAllEP`` over ``ep_mesh`` (``tp_mesh``: a one-rank
    mesh, the ranks sharing a batch).
    Every rank of the EP group calls it (no collective runs here).

    Under LoRA on the fused tensors (``target_parameters``), the plan's experts FQN holds peft's ``ParamWrapper``
    (nested, one per adapted tensor) and the experts module is its innermost ``base_layer``: that module is
    sharded as above, and each wrapper keeps its experts' part of its ``lora_A`` / ``lora_B`` (:class:`ExpertCut`)
    and counts the local experts, so that the wrapped forward (the base weight plus ``scaling B_e @ A_e`` for each
    expert ``e``, peft's parametrization, then the dispatch) is the unsharded one's for this rank's experts.

    Returns:
        the :class:`ExpertShards` of this rank (the adapter shards included).

    Raises:
        ValueError: as :func:`check_expert_parallel`; a fused tensor whose first dimension is neither ``E`` nor
            ``E / ep_size``, or loaded for another EP rank; an adapter that is neither; another peft wrapper on an
            experts module (``lora.modules_to_save``).
    """
    from transformers.distributed.expert_parallel import EPImplementationInterface

    from ..runtime.watchdog import watched
    ep_size, ep_rank = ep_mesh.size(), ep_mesh.get_local_rank()
    check_expert_parallel(config, ep_size)
    total, rows = num_experts(config), expert_rows(config, ep_rank, ep_size)
    shards = ExpertShards(ep_rank, ep_size, group=watched(ep_mesh))
    for fqn, tensors in expert_tensors(carved.model, config, stage_prefixes(carved, rank, pp_size)).items():
        wrappers, path = _param_wrappers(carved.model.get_submodule(fqn), fqn)
        module = carved.model.get_submodule(path)
        loaded = {(c.rows.start, c.rows.stop) for c in getattr(module, "_expert_cuts", {}).values()}  # at load
        if loaded - {(rows.start, rows.stop)}:
            raise ValueError(f"{path} was loaded with the experts {loaded.pop()} (narrow_experts), but EP rank "
                             f"{ep_rank} of {ep_size} holds {(rows.start, rows.stop)}")
        for key in tensors:
            _shard_tensor(module, key, f"{path}.{key}", total, rows, shards)
        for name, wrapper in wrappers:
            if wrapper.parameter_name in tensors:
                _shard_adapter(wrapper, name, total, rows, shards)
        module.num_experts = total // ep_size
        module._is_expert_parallel = True  # transformers' batched and grouped kernels then mask off-rank ids
        dispatch = EPImplementationInterface()["all_to_all"](module, shards.group, tp_mesh)
        module.forward = _dispatching(dispatch)
    return shards


def _param_wrappers(module: nn.Module, fqn: str) -> tuple[list[tuple[str, nn.Module]], str]:
    """``([(FQN, peft ParamWrapper)] from the outermost, the experts module's FQN)`` of the module at ``fqn``.

    Raises:
        ValueError: another peft wrapper (``modules_to_save``' copy of the experts could not be sharded).
    """
    wrappers = []
    while any(c.__name__ == "BaseTunerLayer" for c in type(module).__mro__) or hasattr(module, "original_module"):
        if type(module).__name__ != "ParamWrapper":
            raise ValueError(f"{fqn} is a {type(module).__name__} (lora.modules_to_save or target_modules on an "
                             f"experts module), which parallel.ep_size > 1 cannot shard; adapt the experts with "
                             f"lora.target_parameters, or set parallel.ep_size: 1")
        wrappers.append((fqn, module))
        module, fqn = module.base_layer, f"{fqn}.base_layer"
    return wrappers, fqn


def _shard_tensor(module: nn.Module, key: str, name: str, total: int, rows: slice, shards: ExpertShards) -> None:
    """Keep ``rows`` of ``module``'s fused ``(E, ...)`` parameter ``key`` (``name`` in the model) in its place."""
    param = getattr(module, key)
    cut = ExpertCut(0, 1, 1, rows, (total, *param.shape[1:]))
    if param.shape[0] == total:
        param = nn.Parameter(cut.cut(param.detach()).clone(), requires_grad=param.requires_grad)
        setattr(module, key, param)
    elif param.shape[0] != rows.stop - rows.start:
        raise ValueError(f"{name} has {param.shape[0]} experts; expected {total} or {rows.stop - rows.start}")
    shards.add(name, cut, param)


def _shard_adapter(wrapper: nn.Module, fqn: str, total: int, rows: slice, shards: ExpertShards) -> None:
    """Keep the part of experts ``rows`` of each adapter of peft's ``ParamWrapper`` ``wrapper`` (at ``fqn``) on a
    fused ``(E, ...)`` tensor: ``lora_A`` ``(E r, in)`` and ``lora_B`` ``(out, r E)`` cut as :class:`ExpertCut`
    says, and ``wrapper.num_experts`` (which ``get_delta_weight`` and ``get_delta_factors`` reshape by) the local
    count.

    Raises:
        ValueError: an adapter of neither ``E`` nor ``E / ep_size`` experts, or of a parameter that is not 3-D.
    """
    per = rows.stop - rows.start
    if getattr(wrapper, "_param_ndim", 3) != 3 or wrapper.num_experts not in (total, per):
        raise ValueError(f"{fqn}: its LoRA adapter of {wrapper.parameter_name} holds {wrapper.num_experts} experts "
                         f"of a {getattr(wrapper, '_param_ndim', '?')}-D parameter; expected (E, ...) with {total} "
                         f"or {per}")
    whole = wrapper.num_experts == total
    for adapter in wrapper.lora_A:
        r, a, b = wrapper.r[adapter], wrapper.lora_A[adapter], wrapper.lora_B[adapter]
        for part, layer, cut in (("lora_A", a, ExpertCut(0, 1, r, rows, (total * r, a.weight.shape[1]))),
                                 ("lora_B", b, ExpertCut(1, r, 1, rows, (b.weight.shape[0], r * total)))):
            weight = layer.weight
            if whole:
                weight = nn.Parameter(cut.cut(weight.detach()).clone(), requires_grad=weight.requires_grad)
                layer.weight = weight
            shards.add(f"{fqn}.{part}.{adapter}.weight", cut, weight)
        a.out_features, b.in_features = r * per, r * per
    wrapper.num_experts = per


def _dispatching(dispatch):
    """The experts module's forward under EP: ``(rows (N, H), top-k ids (N, k), top-k weights (N, k)) -> (N, H)``,
    through ``dispatch`` (transformers' ``AllToAllEP``), in the rows' dtype."""
    def forward(hidden_states, top_k_index, top_k_weights):
        return dispatch(hidden_states, top_k_index, top_k_weights).to(hidden_states.dtype)
    return forward
