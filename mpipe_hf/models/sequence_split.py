"""A pipeline stage under context parallelism: what a :class:`~.decoder.DecoderStage` does with a micro-batch whose
sequence is split over a CP group (:mod:`mpipe_hf.runtime.context_parallel`).

Everything that needs the whole sequence is done on the whole sequence, on every CP rank alike, and only then cut:

- the front (embedding, the tower's features injected, M-RoPE ids) runs on the whole micro-batch; its hidden states
  are cut to this rank's slice before the first layer, and only the slice travels to the next stage (the position
  ids, the padding mask and the labels travel whole: they are ``B x L`` integers);
- masks are built for the whole sequence (from a stand-in of the whole sequence's shape, :func:`whole_like`), and
  the rotary embeddings from the whole sequence's positions, then cut (:func:`local_rotary`);
- the labels are shifted on the whole sequence, then cut (:func:`local_shift_labels`): a slice's last token
  predicts the next slice's first.

Each decoder layer gets the split as ``sequence_split=`` and hands it to its attention function (the Ulysses
wrapper). A stage knows whether its hidden states are whole or already cut by their length against the position
ids' (a preprocess that runs decoder layers ships them whole; a stage hands the next its slice).
"""

from __future__ import annotations

import torch
from torch import nn

from ..runtime.context_parallel import SequenceSplit

SPLIT_KEY = "sequence_split"  # where a stage's forward keeps the micro's split in its state (never transferred)


def stage_split(group, position_ids: torch.Tensor) -> SequenceSplit | None:
    """The even split over CP ``group`` of a micro-batch whose position ids are ``position_ids`` (``(B, L)``-like
    or ``(k, B, L)``: ``L`` is the last dimension); ``None`` without a group. Raises ValueError when ``L`` is
    shorter than the group."""
    if group is None:
        return None
    return SequenceSplit.even(group, position_ids.shape[-1])


def whole_like(hidden: torch.Tensor, total: int) -> torch.Tensor:
    """A stand-in for the whole sequence's hidden states, ``(B, total, H)`` of ``hidden``'s dtype and device, zero
    strides (no memory): what the mask builders and rotary modules read (shape, dtype, device) of their input."""
    return hidden.new_zeros(()).expand(hidden.shape[0], total, *hidden.shape[2:])


def own_slice(split: SequenceSplit, t: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """This rank's slice of ``t`` along ``dim``, copied to a storage of its own. ``contiguous()`` is not enough: a
    slice of a batch of one along its sequence is already contiguous, so it stays a view, and whatever autograd
    saves of it (the first layer's norm its input, the rotary products ``cos`` and ``sin``, the loss its labels)
    keeps the WHOLE sequence's storage alive on every CP rank until the backward."""
    return split.local(t, dim).clone(memory_format=torch.contiguous_format)


def local_rotary(rotary, split: SequenceSplit):
    """This rank's slice of rotary embeddings built on the whole sequence: a ``(cos, sin)`` pair (or one tensor)
    whose sequence dimension is the second to last (``(B, L, d)``, M-RoPE's ``(3, B, L, d)``)."""
    if rotary is None:
        return None
    if isinstance(rotary, torch.Tensor):
        return own_slice(split, rotary, rotary.dim() - 2)
    return type(rotary)(local_rotary(t, split) for t in rotary)


def local_positions(text_positions: torch.Tensor | None, split: SequenceSplit) -> torch.Tensor | None:
    """This rank's slice of the text positions ``(B, L)`` handed to the layers (``None`` stays ``None``)."""
    return None if text_positions is None else own_slice(split, text_positions, text_positions.dim() - 1)


def local_shift_labels(labels: torch.Tensor, split: SequenceSplit) -> torch.Tensor:
    """The labels each of this rank's tokens predicts: ``labels`` ``(B, L)`` shifted left by one on the whole
    sequence (the last token predicts nothing: -100), then this rank's ``(B, L_r)`` slice."""
    shifted = nn.functional.pad(labels[..., 1:], (0, 1), value=-100)
    return own_slice(split, shifted, shifted.dim() - 1)  # the loss views it flat


# a stage class that sets this True in its own body (not inherited: a subclass may change what travels) declares
# that its per-token hooks (``after_layer``, ``layer_kwargs``) cut their inputs with the sequence
CUTS_WITH_SEQUENCE = "hooks_cut_sequence"


def local_if_whole(t: torch.Tensor, split: SequenceSplit, dim: int = 1) -> torch.Tensor:
    """This rank's slice of a per-token tensor ``t`` along ``dim`` where it holds the whole sequence there (from a
    front, or from a preprocess that runs decoder layers on the whole sequence); ``t`` as it is where it is already
    this rank's slice (handed on by the previous stage). Raises ValueError for any other length."""
    own = split.lengths[split.rank]
    if t.shape[dim] == split.total and own != split.total:
        return own_slice(split, t, dim)
    if t.shape[dim] != own:
        raise ValueError(f"dim {dim} of a {tuple(t.shape)} tensor is neither the split sequence's {split.total} "
                         f"tokens nor this rank's {own}")
    return t


def local_token_index(flat_index: torch.Tensor, split: SequenceSplit) -> tuple[torch.Tensor, torch.Tensor]:
    """Where tokens given by their flat positions in the whole ``(B, L)`` micro-batch (``flat_index`` ``(n,)``
    int64, row-major: ``row * L + column``) lie in this rank's ``(B, L_r + 1)`` slice plus one spare column:
    ``(rows, columns)``, each ``(n,)``; a token outside the slice gets column ``L_r`` (the spare). Computed on the
    device without reading a count back to the host (a boolean selection would)."""
    own = split.lengths[split.rank]
    rows, columns = flat_index // split.total, flat_index % split.total - split.start
    outside = (columns < 0) | (columns >= own)
    return rows, columns.masked_fill(outside, own)


def add_at_tokens(hidden: torch.Tensor, flat_index: torch.Tensor, rows: torch.Tensor,
                  split: SequenceSplit) -> torch.Tensor:
    """``hidden`` ``(B, L_r, H)`` (this rank's slice) with ``rows[i]`` (``rows`` ``(n, H)``) added at token
    ``flat_index[i]`` of the whole ``(B, L)`` micro-batch (row-major flat positions, ``(n,)``) for those tokens in
    this rank's slice; the other rows are dropped (another CP rank adds them). Out of place, a tensor of its own (no
    view: a stage's output may be an FSDP2 unit's); the gradient of ``rows`` is zero at the dropped ones. The sums
    equal one process's ``hidden[where] + rows`` bit for bit (``0 + r`` is ``r``; other tokens gain ``0``). Raises
    ValueError where ``hidden`` is not this rank's slice."""
    batch, own = hidden.shape[:2]
    if own != split.lengths[split.rank]:
        raise ValueError(f"{tuple(hidden.shape)} hidden states are not this rank's {split.lengths[split.rank]} tokens")
    where = local_token_index(flat_index, split)  # the dropped rows land in a spare column, left out below
    placed = hidden.new_zeros(batch, own + 1, *hidden.shape[2:])
    placed = placed.index_put(where, rows.to(hidden.device, hidden.dtype), accumulate=True)
    return hidden + placed[:, :own]
