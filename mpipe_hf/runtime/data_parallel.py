"""Data parallelism over the ``dp`` dimension of the ``(dp, pp)`` mesh: ``dp_size`` pipeline replicas, each
running the same schedule on its own micro-batches (SPEC.md, "Runtime rules"; torchtitan composes FSDP with
pipelining the same way: one ``fully_shard`` per stage chunk).

Two engines, chosen by ``parallel.dp_shard``:

- ``shard`` (default): torch's FSDP2 (``torch.distributed.fsdp.fully_shard``) over the ``dp`` mesh, once per
  stage chunk. Parameters, gradients and AdamW states are sharded over the replicas. Within a step the
  parameters stay gathered (``reshard_after_forward=False``, and no reshard after a backward but the chunk's
  last), so each chunk gathers its weights once per step instead of once per micro-batch forward and again per
  backward; the gradients accumulate unsharded and are reduce-scattered once, by the chunk's last backward of the
  step (``set_requires_gradient_sync``). The price is one unsharded copy of the chunk's weights and gradients for
  the whole step, which a pipeline stage (``1 / (R V)`` of the model) affords.
- ``replicate``: every replica keeps the whole of its stages; after the step, one bucketed all-reduce sums the
  gradients (one flat buffer per dtype).

The executor then divides once by the label tokens of the whole global batch, over every dp and pp rank (a
sharded gradient, which FSDP averaged over the replicas, by that count over ``dp_size``; a divide factor of 1
would need ``PREMUL_SUM``, which gloo lacks), so the step equals one process's over the global batch. ``P`` stays
replicated in both engines (every pipeline rank holds a replica; rank 0 trains it): its gradient is all-reduced
over ``dp`` with the replicated ones.

Precision of ``shard`` under ``train.bf16`` (fp32 master weights, bf16 autocast; :mod:`mpipe_hf.train.precision`):
autocast computes every ``nn.Linear`` and ``nn.Conv1d/2d/3d`` on a bf16 cast of its fp32 weight and bias, and their
gradient in bf16, which it casts back to fp32 before the fp32 accumulation over the micro-batches; every other
weight (norms, embeddings) it uses in fp32. So each such matmul module whose parameters no other module shares (and
that is not a LoRA adapter's own layer: :func:`bf16_units`) is a nested FSDP2 unit of its own with
``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``: its all-gather moves bf16 (the cast autocast
would make, made per shard before the gather), its unsharded bf16 gradients are upcast into an fp32 accumulator
after each backward (FSDP2's ``unsharded_accumulated_grad``: the same fp32 sums as autocast's) and reduce-scattered
in fp32. The rest of the chunk is the root unit, in fp32 as without bf16. A whole-chunk bf16 ``param_dtype`` would
not be exact: it would run the norms and the embedding on bf16 weights, which autocast keeps in fp32.
``cast_forward_inputs`` is off: autocast casts the inputs, as on one process. ``tests/test_fsdp_bf16.py`` checks the
gradients bitwise against one process under autocast, and the collectives' dtypes.
"""

from __future__ import annotations

import warnings
from datetime import timedelta
from typing import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from .preload import control_group

ENGINES = ("shard", "replicate")
# the modules autocast runs in bf16 on a bf16 cast of their weights (torch's CUDA and CPU lower-precision op lists
# hold linear and conv1d/2d/3d); exact types: a subclass may use its weight elsewhere (MultiheadAttention's
# out_proj is an nn.Linear subclass whose forward never runs)
AUTOCAST_MATMULS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def is_sharded(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a DTensor (an FSDP2-sharded parameter, gradient or optimizer state)."""
    from torch.distributed.tensor import DTensor
    return isinstance(tensor, DTensor)


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor, or the tensor itself."""
    return tensor.to_local() if is_sharded(tensor) else tensor


def bf16_units(stages: dict[int, nn.Module]) -> list[nn.Module]:
    """The modules of ``stages`` that FSDP2 gathers in bf16 under ``train.bf16``: every ``nn.Linear`` and
    ``nn.Conv1d/2d/3d`` (exact types, :data:`AUTOCAST_MATMULS`) with floating parameters of its own that no other
    module of any chunk holds too (a tied LM head shares the embedding's weight, which the embedding uses in
    fp32). Each is called through its own ``forward`` (where FSDP2's hooks gather it); code that reads only its
    weight's dtype sees bf16 once gathered, and casts to the dtype autocast would cast to. Not a PEFT adapter's
    own layers (LoRA's ``lora_A`` and ``lora_B``): PEFT casts the adapter's input to ``lora_A``'s weight dtype
    before its dropout, which in bf16 would round the input before the dropout's scaling instead of after; the
    adapted layer's ``base_layer`` is a unit."""
    owners: dict[int, int] = {}
    adapters: set[int] = set()
    for module in stages.values():
        for sub in module.modules():
            for p in sub.parameters(recurse=False):
                owners[id(p)] = owners.get(id(p), 0) + 1
            if any(c.__name__ == "BaseTunerLayer" for c in type(sub).__mro__):  # a PEFT layer, without importing peft
                base = getattr(sub, "base_layer", None)
                adapters |= {id(m) for m in sub.modules() if m is not sub and m is not base}
    units = []
    for module in stages.values():
        for sub in module.modules():
            own = list(sub.parameters(recurse=False))
            if type(sub) in AUTOCAST_MATMULS and own and id(sub) not in adapters and all(
                    p.is_floating_point() and owners[id(p)] == 1 for p in own):
                units.append(sub)
    return units


def shared_between(groups: Iterable[Iterable[nn.Parameter]]) -> set[int]:
    """The ids of the parameters that more than one of ``groups`` holds (each a chunk's parameters, or ``P``'s):
    a tied LM head and embedding on one rank."""
    seen: dict[int, int] = {}
    for group in groups:
        for k in {id(p) for p in group}:
            seen[k] = seen.get(k, 0) + 1
    return {k for k, n in seen.items() if n > 1}


class DataParallel:
    """The ``dp`` side of one rank: wraps its stage chunks, and reduces their gradients once per step.

    Args:
        mesh: the 1-D ``dp`` sub-mesh of the ``(dp, pp)`` mesh (``mesh["dp"]``).
        engine: ``"shard"`` (FSDP2) or ``"replicate"``.
        bf16: the run computes under bf16 autocast (``train.bf16``): with ``shard``, the matmul modules
            (:func:`bf16_units`) are gathered in bf16 and reduced in fp32 (the module docstring says why this is
            exact); no effect with ``replicate``, whose all-reduce sums the fp32 gradients.
        experts: expert parallelism: ``(this rank's expert shards, the edp mesh)``
            (:class:`~mpipe_hf.models.expert_shards.ExpertShards`' ``params``,
            :func:`~.mesh.expert_mesh`'s ``["edp"]``). The shards differ between the EP ranks of ``dp``, and
            the all-to-all's backward already summed their gradients over the EP group: FSDP2 leaves them alone
            and they are summed over ``edp`` (the replicas holding the same experts), not ``dp``. A third item,
            the EP group (a :class:`~.watchdog.WatchedGroup`), lets :meth:`expert_sum` sum over it (the experts'
            squared gradient norms), and :meth:`start_step` renews it after a failed step broke it.
        cp_size: the CP ranks per replica when ``mesh`` is the flattened ``dp x cp`` mesh
            (:func:`~.mesh.reduction_mesh`): they split the same micro-batches, so :attr:`batches`, the replicas
            that take rows of their own (a per-micro divisor's and an evaluation's share), is ``size / cp_size``.

    Raises:
        ValueError: an unknown engine.
    """

    def __init__(self, mesh: DeviceMesh, engine: str = "shard", bf16: bool = False,
                 experts: tuple | None = None, cp_size: int = 1):
        if engine not in ENGINES:
            raise ValueError(f"parallel.dp_shard: the data-parallel engine must be one of {ENGINES}, got {engine!r}")
        self.mesh, self.engine, self.bf16 = mesh, engine, bf16
        self.experts = {id(p) for p in experts[0]} if experts is not None else set()
        self.expert_group = experts[1].get_group() if experts is not None and experts[1].size() > 1 else None
        self.ep_group = experts[2] if experts is not None and len(experts) > 2 else None
        self.group, self.size = mesh.get_group(), mesh.size()
        self.batches = self.size // cp_size
        self.rank = mesh.get_local_rank()
        # which parameters any replica gave a gradient is a host fact: voted on a gloo group, read on the host
        self.votes = self.group if self.size == 1 or dist.get_backend(self.group) == "gloo" else control_group(
            dist.get_process_group_ranks(self.group), timedelta(minutes=10))
        self.chunks: dict[int, nn.Module] = {}

    def wrap(self, stages: dict[int, nn.Module], unwrapped: Iterable[nn.Parameter] = ()) -> None:
        """``fully_shard`` each stage chunk over ``dp`` (engine ``shard``; nothing with ``replicate``), with
        ``bf16`` its matmul modules first, each a nested unit in bf16 with fp32 reduction. Call before the
        optimizer and the executor are built: the parameters become DTensors. A weight two chunks of this rank
        hold (an LM head tied to the embedding with ``pp_size`` 1 and ``vpp`` >= 2), or one a chunk shares with
        ``unwrapped`` (the parameters of ``P``, which FSDP2 does not wrap: an embedding there), is left out of the
        units: FSDP2 would shard it once per unit, two parameters each with one use's gradient. It stays one
        replicated parameter, its gradient summed over ``dp`` with the other replicated ones
        (:meth:`sum_replicated`)."""
        if self.engine != "shard" or self.size == 1:
            return
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        shared = shared_between([*(m.parameters() for m in stages.values()), unwrapped])  # tied: kept whole
        if self.bf16:  # bottom-up: the nested units first, then each chunk takes what is left
            policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                          cast_forward_inputs=False)
            for module in bf16_units(stages):
                if not any(id(p) in shared for p in module.parameters(recurse=False)):  # a head tied to P's
                    fully_shard(module, mesh=self.mesh, reshard_after_forward=False, mp_policy=policy)
            # a Linear on a 3-D input returns a view, and FSDP2 warns that an in-place op on it would drop the
            # unit's pre-backward hook; that hook only re-gathers, which weights kept gathered through the step
            # (reshard_after_forward=False) do not need
            warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module \(FSDP(Linear|Conv[123]d)\) returned "
                                    r"a view tensor")
        for stage, module in stages.items():
            ignored = {p for p in module.parameters() if id(p) in self.experts or id(p) in shared} or None
            fully_shard(module, mesh=self.mesh, reshard_after_forward=False, ignored_params=ignored)
            self.chunks[stage] = module

    def renew_ep_group(self) -> None:
        """Make the EP group anew if a failed step broke it (every rank of every replica calls this at the same
        point: before each step's and each evaluation's loads, :meth:`~.executor.PipelineExecutor._begin`)."""
        if self.ep_group is not None:
            self.ep_group.renew()

    def start_step(self) -> None:
        """Before a step: the chunks keep their gradients unsharded and their weights gathered; an EP group that
        a failed step broke is made anew (:meth:`renew_ep_group`)."""
        self.renew_ep_group()
        for module in self.chunks.values():
            module.set_requires_gradient_sync(False)
            module.set_reshard_after_backward(False)

    def before_last_backward(self, stage: int) -> None:
        """Before the step's last backward of chunk ``stage``: let it reduce-scatter its gradients and reshard."""
        module = self.chunks.get(stage)
        if module is not None:
            module.set_requires_gradient_sync(True)
            module.set_reshard_after_backward(True)

    def sum_replicated(self, params: Iterable[nn.Parameter]) -> None:
        """All-reduce (SUM) over ``dp`` the gradients of ``params`` that FSDP does not reduce (every one with
        ``replicate``, ``P``'s with ``shard``), in one flat buffer per dtype. A parameter no replica gave a
        gradient keeps none, as on one process (AdamW then leaves it alone); one that some replicas did not
        reach counts zeros there. Expert shards (``experts``) are summed over ``edp`` instead (with zeros for a
        missing gradient: the all-to-all gives every shard one in any step its layer trains)."""
        params = list(params)
        shards = [p for p in params if id(p) in self.experts]
        if self.expert_group is not None and shards:
            flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in shards])
            dist.all_reduce(flat, group=self.expert_group)
            for p, g in zip(shards, flat.split([p.numel() for p in shards])):
                p.grad = g.view_as(p).clone()
        plain = [p for p in params if not is_sharded(p) and id(p) not in self.experts]
        if self.size == 1 or not plain:
            return
        reached = torch.tensor([p.grad is not None for p in plain], dtype=torch.int32)  # host values: voted there
        dist.all_reduce(reached, group=self.votes)
        plain = [p for p, n in zip(plain, reached.tolist()) if n > 0]
        for dtype in sorted({p.dtype for p in plain}, key=str):
            group = [p for p in plain if p.dtype == dtype]
            flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in group])
            dist.all_reduce(flat, group=self.group)
            offset = 0
            for p in group:
                p.grad = flat[offset:offset + p.numel()].view_as(p).clone()
                offset += p.numel()

    def expert_sum(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` summed over the EP group (in place; unchanged without one): a sum over every expert of a
        stage's MoE layers, each shard counted once (the ``edp`` replicas of a shard are not summed)."""
        if self.ep_group is not None:
            dist.all_reduce(values, group=self.ep_group.get_group())
        return values

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` summed over the replicas (in place), e.g. the step's loss sum and label tokens."""
        if self.size > 1:
            dist.all_reduce(values, group=self.group)
        return values
