"""Context parallelism's attention: one micro-batch's sequence split over the ``cp`` ranks of a group, attention
exact, by DeepSpeed-Ulysses (Jacobs et al. 2023, "DeepSpeed Ulysses", arXiv:2309.14509).

Each rank holds a contiguous slice of the sequence (:class:`SequenceSplit`), every head of it. In each attention
layer one all-to-all per query, key and value (:func:`scatter_heads`) turns that into the WHOLE sequence for
``heads / cp`` of the heads; the model's own attention function ("sdpa", or the family's "eager") runs on it with
the mask of the whole sequence; a fourth all-to-all (:func:`gather_heads`) hands each rank back its slice of every
head. transformers' attention layers call it through ``AttentionInterface`` (:func:`register_ulysses`); the split
travels with the call as the keyword ``sequence_split`` (decoder layers hand their keywords on to the attention
function), and without it the wrapper is the model's own function.

Why Ulysses first:

- every mask stays whole on a rank: causal, sliding window, Gemma's bidirectional image blocks and packed rows'
  block-diagonal masks are built once on the whole sequence (every rank knows every position and token type) and
  used as they are. Gated DeltaNet (a per-head recurrence) and LFM2's short convolutions (per channel) can take the
  same all-to-all over heads or channels and stay exact (not done here);
- ring attention passes key/value blocks round the group: it needs a mask per pair of blocks and a load-balanced
  (zig-zag) causal split, and torch's experimental ``context_parallel`` handles only SDPA's causal or absent mask;
- every rank attends over the whole sequence with ``heads / cp`` heads, so the attention's work is even whatever
  the split; a split balanced by cost has only the per-token work (MLP, norms) to even out.

Limits: ``cp <= heads`` and ``heads % cp == 0``. Where ``kv_heads % cp != 0`` the keys and values are repeated, each
KV head ``r`` times in place (as ``repeat_kv`` does), to the fewest ``kv_heads * r`` that ``cp`` divides and that
divides ``heads`` (:func:`kv_repeats`): the all-to-all then moves ``r`` times the KV bytes.

Communication per attention layer, forward: 4 all-to-alls, each taking a rank's ``B x L / cp x heads x head_dim``
elements (keys and values: ``kv_heads * r`` heads) and sending ``(cp - 1) / cp`` of them to the other ranks; the
backward runs as many, of the same sizes (the transposed all-to-alls).
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Callable

import torch
import torch.distributed as dist

ULYSSES_NAMES = {"sdpa": "mpipe_ulysses_sdpa", "eager": "mpipe_ulysses_eager"}  # base -> registered name


@dataclasses.dataclass(frozen=True)
class SequenceSplit:
    """How one micro-batch's sequence lies over a CP group: rank ``r`` of ``group`` holds ``lengths[r]`` tokens,
    contiguous, in rank order (rank 0 the first). ``lengths`` may differ (a split balanced by cost)."""

    group: object  # torch.distributed.ProcessGroup
    lengths: tuple[int, ...]
    rank: int

    @classmethod
    def even(cls, group, total: int) -> "SequenceSplit":
        """``total`` tokens in ``cp`` contiguous slices of ``total // cp`` (the first ``total % cp`` one longer);
        raises ValueError when a slice would be empty."""
        cp, rank = dist.get_world_size(group), dist.get_rank(group)
        if total < cp:
            raise ValueError(f"a sequence of {total} tokens cannot be split over {cp} context-parallel ranks")
        return cls(group, tuple(total // cp + (r < total % cp) for r in range(cp)), rank)

    @property
    def size(self) -> int:
        return len(self.lengths)

    @property
    def total(self) -> int:
        return sum(self.lengths)

    @property
    def start(self) -> int:
        return sum(self.lengths[:self.rank])

    def local(self, whole: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """This rank's slice of ``whole`` along ``dim`` (``whole.shape[dim] == total``): a view."""
        if whole.shape[dim] != self.total:
            raise ValueError(f"dim {dim} of a {tuple(whole.shape)} tensor is not the split sequence's {self.total}")
        return whole.narrow(dim, self.start, self.lengths[self.rank])


class _AllToAll(torch.autograd.Function):
    """``dist.all_to_all_single`` along dim 0 (``send[i]`` rows to rank ``i``, ``recv[i]`` rows from it), whose
    backward is the transposed all-to-all of the gradient (torch's own autograd wrapper,
    ``torch.distributed.nn.functional.all_to_all_single``, is deprecated)."""

    @staticmethod
    def forward(ctx, x, send, recv, group):
        ctx.send, ctx.recv, ctx.group = send, recv, group
        out = x.new_empty((sum(recv), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), list(recv), list(send), group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return _AllToAll.apply(grad.contiguous(), ctx.recv, ctx.send, ctx.group), None, None, None


def scatter_heads(x: torch.Tensor, split: SequenceSplit) -> torch.Tensor:
    """``(B, H, L_r, d)`` (this rank's slice of the sequence, every head) -> ``(B, H / cp, L, d)`` (the whole
    sequence, this rank's ``H / cp`` heads: rank ``i`` the ``i``-th block of heads). Raises ValueError when ``cp``
    does not divide ``H`` or ``L_r`` is not this rank's length."""
    batch, heads, length, dim = x.shape
    cp, own = split.size, split.lengths[split.rank]
    if heads % cp or length != own:
        raise ValueError(f"{heads} heads x {length} tokens cannot be scattered over {cp} ranks holding "
                         f"{split.lengths} tokens (heads must be a multiple of cp; this rank holds {own})")
    per = heads // cp
    send = x.reshape(batch, cp, per, length, dim).transpose(0, 1).reshape(cp * batch * per * length, dim)
    recv = [batch * per * n for n in split.lengths]
    out = _AllToAll.apply(send, (batch * per * length,) * cp, tuple(recv), split.group)
    chunks = [c.reshape(batch, per, n, dim) for c, n in zip(out.split(recv), split.lengths)]
    return torch.cat(chunks, dim=2)


def gather_heads(x: torch.Tensor, split: SequenceSplit) -> torch.Tensor:
    """``(B, L, H / cp, d)`` (the whole sequence, this rank's heads: what transformers' attention functions return)
    -> ``(B, L_r, H, d)`` (this rank's slice, every head, in head order): the inverse of :func:`scatter_heads`."""
    batch, length, per, dim = x.shape
    cp, own = split.size, split.lengths[split.rank]
    if length != split.total:
        raise ValueError(f"{length} tokens to gather; the split sequence has {split.total}")
    send = torch.cat([c.reshape(-1, dim) for c in x.split(list(split.lengths), dim=1)])
    rows = batch * own * per
    out = _AllToAll.apply(send, tuple(batch * n * per for n in split.lengths), (rows,) * cp, split.group)
    return out.reshape(cp, batch, own, per, dim).permute(1, 2, 0, 3, 4).reshape(batch, own, cp * per, dim)


def kv_repeats(heads: int, kv_heads: int, cp: int) -> int:
    """The times each KV head is repeated so that ``cp`` ranks can each take a block of them: the least ``r``
    with ``kv_heads * r`` a multiple of ``cp`` and a divisor of ``heads``. Raises ValueError, with the numbers,
    where ``cp`` does not divide ``heads`` (Ulysses splits the heads, so ``cp <= heads``)."""
    if heads % cp or heads % kv_heads:
        raise ValueError(f"context parallelism by heads (Ulysses) needs cp ({cp}) to divide the attention heads "
                         f"({heads}), and the KV heads ({kv_heads}) to divide the heads: choose a cp_size that "
                         f"divides {heads}")
    groups = heads // kv_heads
    return next(r for r in range(1, groups + 1) if groups % r == 0 and kv_heads * r % cp == 0)


def _repeat_heads(x: torch.Tensor, times: int) -> torch.Tensor:
    """``(B, K, L, d)`` -> ``(B, K * times, L, d)``, each head ``times`` times in place (``repeat_kv``'s order)."""
    return x if times == 1 else x.repeat_interleave(times, dim=1)


class _GroupsView:
    """``module`` as the inner attention function sees it after the KV heads were repeated: its
    ``num_key_value_groups`` (query heads per KV head) is the one after the repeat; every other attribute is
    ``module``'s."""

    def __init__(self, module: torch.nn.Module, groups: int):
        self._module, self.num_key_value_groups = module, groups

    def __getattr__(self, name: str):
        return getattr(self._module, name)


def _check_mask(mask: torch.Tensor | None, split: SequenceSplit) -> None:
    if mask is not None and tuple(mask.shape[-2:]) != (split.total, split.total):
        raise ValueError(f"the attention mask covers {tuple(mask.shape[-2:])} (queries, keys); the sequence split "
                         f"over {split.size} context-parallel ranks has {split.total} tokens: build the masks and "
                         f"positions on the whole sequence, before the split")


def ulysses_forward(inner: Callable, module, query, key, value, attention_mask, split: SequenceSplit, **kwargs):
    """``inner`` (a transformers attention function) over the whole sequence for this rank's heads.

    Args:
        query: ``(B, H, L_r, d)``, this rank's tokens (positions already applied); key, value: ``(B, K, L_r, d)``.
        attention_mask: the whole sequence's mask, ``(B, 1, L, L)``, or ``None`` (a causal ``sdpa`` mask skipped).
    Returns:
        ``((B, L_r, H, d), None)``: this rank's tokens, every head (no attention weights).
    Raises:
        ValueError: a mask not of the whole sequence, heads that ``cp`` does not divide, a wrong slice length.
        NotImplementedError: per-head extras (attention sinks ``s_aux``, a ``position_bias``).

    Attention dropout, where a config sets it above 0, draws its mask over another layout than one process's: the
    same in distribution, not the same draws.
    """
    _check_mask(attention_mask, split)
    if kwargs.get("s_aux") is not None or kwargs.get("position_bias") is not None:
        raise NotImplementedError("Ulysses context parallelism does not split per-head attention sinks or biases")
    heads, kv_heads = query.shape[1], key.shape[1]
    times = kv_repeats(heads, kv_heads, split.size)
    query = scatter_heads(query, split)
    key = scatter_heads(_repeat_heads(key, times), split)
    value = scatter_heads(_repeat_heads(value, times), split)
    groups = heads // (kv_heads * times)
    seen = module if groups == getattr(module, "num_key_value_groups", 1) else _GroupsView(module, groups)
    out, _ = inner(seen, query, key, value, attention_mask, **kwargs)
    return gather_heads(out, split), None


def _own_function(base: str, module) -> Callable:
    """The attention function ``module`` would call under ``base``: transformers' ``sdpa``, or the ``eager``
    function of the module's own modeling file."""
    if base == "sdpa":
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        return sdpa_attention_forward
    eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if eager is None:
        raise NotImplementedError(f"{type(module).__name__}'s modeling file has no eager_attention_forward to wrap")
    return eager


def _wrapper(base: str) -> Callable:
    def attend(module, query, key, value, attention_mask, sequence_split: SequenceSplit | None = None, **kwargs):
        inner = _own_function(base, module)
        if sequence_split is None or sequence_split.size == 1:
            return inner(module, query, key, value, attention_mask, **kwargs)
        return ulysses_forward(inner, module, query, key, value, attention_mask, sequence_split, **kwargs)
    attend.__name__ = f"ulysses_{base}_attention"
    return attend


def register_ulysses(base: str) -> str:
    """Register the Ulysses wrapper of ``base`` ("sdpa" or "eager") with transformers' ``AttentionInterface``, and
    ``base``'s mask builder under the same name with ``AttentionMaskInterface`` (so the masks are those ``base``
    gets); returns the name, for ``config._attn_implementation``. Raises NotImplementedError for another base
    (FlashAttention's varlen kernels take no whole-sequence mask to keep)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    if base not in ULYSSES_NAMES:
        raise NotImplementedError(f"Ulysses context parallelism wraps {sorted(ULYSSES_NAMES)} attention, not "
                                  f"{base!r}")
    name = ULYSSES_NAMES[base]
    AttentionInterface.register(name, _wrapper(base))
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[base])
    return name


def use_ulysses(config) -> str:
    """Set ``config``'s attention to the Ulysses wrapper of its own ("sdpa" or "eager"; ``None`` reads as sdpa)
    and return the name (a config set to one already keeps it). Raises NotImplementedError for another."""
    current = config._attn_implementation or "sdpa"
    base = {name: base for base, name in ULYSSES_NAMES.items()}.get(current, current)
    config._attn_implementation = register_ulysses(base)  # again in a process that read the name from a file
    return config._attn_implementation
