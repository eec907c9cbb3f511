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
would need ``PREMUL_SUM``, which gloo lacks), so the step equals one process's over the global batch. ``P`` stays replicated in both engines (every pipeline rank holds a replica; rank 0 trains it):
its gradient is all-reduced over ``dp`` with the replicated ones.
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

ENGINES = ("shard", "replicate")


def is_sharded(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a DTensor (an FSDP2-sharded parameter, gradient or optimizer state)."""
    from torch.distributed.tensor import DTensor
    return isinstance(tensor, DTensor)


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor, or the tensor itself."""
    return tensor.to_local() if is_sharded(tensor) else tensor


class DataParallel:
    """The ``dp`` side of one rank: wraps its stage chunks, and reduces their gradients once per step.

    Args:
        mesh: the 1-D ``dp`` sub-mesh of the ``(dp, pp)`` mesh (``mesh["dp"]``).
        engine: ``"shard"`` (FSDP2) or ``"replicate"``.

    Raises:
        ValueError: an unknown engine.
    """

    def __init__(self, mesh: DeviceMesh, engine: str = "shard"):
        if engine not in ENGINES:
            raise ValueError(f"parallel.dp_shard: the data-parallel engine must be one of {ENGINES}, got {engine!r}")
        self.mesh, self.engine = mesh, engine
        self.group, self.size = mesh.get_group(), mesh.size()
        self.rank = mesh.get_local_rank()
        self.chunks: dict[int, nn.Module] = {}

    def wrap(self, stages: dict[int, nn.Module]) -> None:
        """``fully_shard`` each stage chunk over ``dp`` (engine ``shard``; nothing with ``replicate``). Call
        before the optimizer and the executor are built: the parameters become DTensors."""
        if self.engine != "shard" or self.size == 1:
            return
        from torch.distributed.fsdp import fully_shard
        for stage, module in stages.items():
            fully_shard(module, mesh=self.mesh, reshard_after_forward=False)
            self.chunks[stage] = module

    def start_step(self) -> None:
        """Before a step: the chunks keep their gradients unsharded and their weights gathered."""
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
        reach counts zeros there."""
        plain = [p for p in params if not is_sharded(p)]
        if self.size == 1 or not plain:
            return
        reached = torch.tensor([p.grad is not None for p in plain], dtype=torch.int32, device=plain[0].device)
        dist.all_reduce(reached, group=self.group)
        plain = [p for p, n in zip(plain, reached.tolist()) if n > 0]
        for dtype in sorted({p.dtype for p in plain}, key=str):
            group = [p for p in plain if p.dtype == dtype]
            flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in group])
            dist.all_reduce(flat, group=self.group)
            offset = 0
            for p in group:
                p.grad = flat[offset:offset + p.numel()].view_as(p).clone()
                offset += p.numel()

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` summed over the replicas (in place), e.g. the step's loss sum and label tokens."""
        if self.size > 1:
            dist.all_reduce(values, group=self.group)
        return values
