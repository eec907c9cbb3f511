"""The tower's features gathered over a context-parallel group: each CP rank ran the tower on its share of a
micro-batch's images and frames (:mod:`mpipe_hf.models.tower_division`), and every rank needs the whole
micro-batch's features, because the first stage injects them into the whole sequence before the split.

:func:`gather_rows` all-gathers the ranks' rows (their counts differ, so each rank's rows are padded to the
largest count) and returns them in rank order. Its backward routes each row's gradient to the rank that computed
it: the ranks' gradients of the whole are summed (an all-reduce: each CP rank's stages hand back the gradient of
its own slice's image tokens only, or, with decoder layers in the preprocess, a partial sum) and each rank keeps
its own rows. The tower's weight gradients are then summed over the CP group with every other weight's.

Communication per micro-batch: forward, one all-gather of ``cp x max(counts)`` rows; backward (a trainable
tower), one all-reduce of ``sum(counts)`` rows. Every CP rank of a group calls it for the same micro-batches in
the same order (their action lists are the same), a rank with no rows of its own included.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist


class _GatherRows(torch.autograd.Function):
    """All-gather of rows along dim 0 with per-rank ``counts``; backward: the summed gradient, this rank's rows."""

    @staticmethod
    def forward(ctx, local, counts, group):
        rank = dist.get_rank(group)
        ctx.counts, ctx.group, ctx.rank = counts, group, rank
        width = max(counts)
        padded = local.new_zeros((width, *local.shape[1:]))
        padded[:local.shape[0]] = local
        parts = [torch.empty_like(padded) for _ in counts]
        dist.all_gather(parts, padded, group=group)
        return torch.cat([part[:n] for part, n in zip(parts, counts)])

    @staticmethod
    def backward(ctx, grad):
        total = grad.contiguous().clone()  # summed in place
        dist.all_reduce(total, group=ctx.group)
        start = sum(ctx.counts[:ctx.rank])
        return total.narrow(0, start, ctx.counts[ctx.rank]), None, None


def gather_rows(local: torch.Tensor, counts: Sequence[int], group) -> torch.Tensor:
    """Every CP rank's rows, in rank order: ``local`` ``(counts[rank], ...)`` -> ``(sum(counts), ...)``.

    Args:
        local: this rank's rows (zero rows where it ran nothing; it still joins the collective).
        counts: every rank's row count, the same list on every rank (each computes it from the micro-batch).
        group: the CP group (a ``torch.distributed`` process group).
    Raises:
        ValueError: ``counts`` has not one entry per rank of ``group``, or ``local`` has not this rank's count.
    """
    counts = tuple(int(n) for n in counts)
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    if len(counts) != size or local.shape[0] != counts[rank]:
        raise ValueError(f"rank {rank} of a {size}-rank group holds {local.shape[0]} rows; the counts say "
                         f"{list(counts)}")
    if not sum(counts):  # nothing anywhere: every rank skips alike
        return local
    return _GatherRows.apply(local.contiguous(), counts, group)
