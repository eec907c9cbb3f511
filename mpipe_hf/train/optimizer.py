"""The optimizer of one pipeline rank, its learning-rate schedule, and gradient clipping by the global norm over
the pipeline: what ``transformers.Trainer`` does on one process, spread over the ranks that each hold a share.

- AdamW over the parameters this rank trains, in the Trainer's two groups: weight decay on every parameter but
  biases and norm weights (``Trainer.get_decay_parameter_names``), ``adam_beta1``, ``adam_beta2``,
  ``adam_epsilon``.
- The schedule is ``transformers.get_scheduler(lr_scheduler_type, ...)`` with ``warmup_steps``, or
  ``ceil(warmup_ratio * steps)`` when ``warmup_steps`` is 0, as ``TrainingArguments.get_warmup_steps``.
- :func:`clip_grad_norm` sums the squared gradient norms of every rank's own parameters over the pipeline group,
  so the norm is the unsplit model's ``torch.nn.utils.clip_grad_norm_`` norm; a tied weight held as two copies
  (embedding on rank 0, head on the last rank) counts once, and a replica of ``P`` on a rank that does not own
  it not at all.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn
from transformers.optimization import get_scheduler

from .recipe import TrainSection


def decay_names(model: nn.Module) -> set[str]:
    """Names of the parameters of ``model`` that take weight decay: the HF Trainer's own choice (not biases, not
    LayerNorm or RMSNorm weights)."""
    from transformers import Trainer  # at call time: the Trainer's module costs a process about 1 s to import
    return set(Trainer.get_decay_parameter_names(None, model))  # reads only the model


def build_optimizer(model: nn.Module, params: dict[str, nn.Parameter], train: TrainSection):
    """AdamW over ``params`` (``{name in model: parameter}``, this rank's trained ones) in the HF Trainer's decay
    and no-decay groups, or ``None`` when the rank trains nothing (a rank holding only a frozen ``P``)."""
    if not params:
        return None
    decay = decay_names(model)
    groups = [{"params": [p for n, p in params.items() if n in decay], "weight_decay": train.weight_decay},
              {"params": [p for n, p in params.items() if n not in decay], "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=train.learning_rate,
                             betas=(train.adam_beta1, train.adam_beta2), eps=train.adam_epsilon)


def warmup_steps(train: TrainSection, total_steps: int) -> int:
    """``warmup_steps``, else ``ceil(warmup_ratio * total_steps)``."""
    return train.warmup_steps if train.warmup_steps > 0 else math.ceil(train.warmup_ratio * total_steps)


def no_parameters(train: TrainSection) -> torch.optim.AdamW:
    """An AdamW over no parameters (it holds no state), at ``learning_rate``: what a rank that trains nothing
    steps, so that its LR schedule (and the Trainer's) runs as everywhere else."""
    return torch.optim.AdamW([{"params": []}], lr=train.learning_rate)


def build_scheduler(optimizer, train: TrainSection, total_steps: int):
    """``transformers.get_scheduler`` for ``train.lr_scheduler_type`` over ``total_steps`` steps. A rank without an
    optimizer (it trains nothing) gets the schedule over an AdamW of no parameters, which holds no state: the
    learning rate it logs and saves is the run's."""
    if optimizer is None:
        optimizer = no_parameters(train)
    return get_scheduler(train.lr_scheduler_type, optimizer, num_warmup_steps=warmup_steps(train, total_steps),
                         num_training_steps=total_steps)


def clip_grad_norm(params: list[nn.Parameter], counted: list[nn.Parameter], max_norm: float, group,
                   device: torch.device, data_parallel=None) -> float:
    """Scale every gradient of ``params`` (all this rank trains) so that the norm over the whole pipeline is at
    most ``max_norm`` (when ``max_norm > 0``); return that norm before clipping. The norm sums the gradients of
    ``counted`` only: every rank of ``group`` calls it with the parameters it counts, so that each tied pair and
    each ``P`` is counted once over the pipeline, while both copies of a tied pair are scaled alike. With data
    parallelism (``data_parallel``), a sharded gradient's squares are summed over the replicas' shards, and a
    replicated one (already summed over them) counts once: the norm of the global batch's gradient. With expert
    parallelism (``data_parallel.experts``), an expert shard's squares are summed over its EP group (each shard
    once; its ``edp`` replicas hold the same gradient), as Megatron-LM's expert-parallel norm.

    The norm is ``sqrt(sum over ranks of the squared norms)`` in fp32, the scale ``max_norm / (norm + 1e-6)``
    capped at 1, as ``torch.nn.utils.clip_grad_norm_``.
    """
    from ..runtime.data_parallel import is_sharded, local

    experts = data_parallel.experts if data_parallel is not None else set()

    def squares(sharded: bool, expert: bool = False) -> torch.Tensor:
        parts = [local(p.grad).detach().float().norm() ** 2 for p in counted
                 if p.grad is not None and is_sharded(p.grad) == sharded and (id(p) in experts) == expert]
        return (torch.stack(parts).sum() if parts else torch.zeros(())).to(device=device, dtype=torch.float32)
    total = squares(False)
    if data_parallel is not None and data_parallel.chunks:  # the same chunks on every replica of this stage
        total = total + data_parallel.sum(squares(True))
    if data_parallel is not None and data_parallel.ep_group is not None:  # the same experts modules in the group
        total = total + data_parallel.expert_sum(squares(False, expert=True))
    dist.all_reduce(total, group=group)
    norm = total.sqrt()
    if max_norm > 0:
        scale = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        for p in params:
            if p.grad is not None:
                local(p.grad).mul_(scale.to(p.grad.device, p.grad.dtype))
    return float(norm)
