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


def local_rotary(rotary, split: SequenceSplit):
    """This rank's slice of rotary embeddings built on the whole sequence: a ``(cos, sin)`` pair (or one tensor)
    whose sequence dimension is the second to last (``(B, L, d)``, M-RoPE's ``(3, B, L, d)``)."""
    if rotary is None:
        return None
    if isinstance(rotary, torch.Tensor):
        return split.local(rotary, rotary.dim() - 2).contiguous()
    return type(rotary)(local_rotary(t, split) for t in rotary)


def local_positions(text_positions: torch.Tensor | None, split: SequenceSplit) -> torch.Tensor | None:
    """This rank's slice of the text positions ``(B, L)`` handed to the layers (``None`` stays ``None``)."""
    return None if text_positions is None else split.local(text_positions, text_positions.dim() - 1).contiguous()


def local_shift_labels(labels: torch.Tensor, split: SequenceSplit) -> torch.Tensor:
    """The labels each of this rank's tokens predicts: ``labels`` ``(B, L)`` shifted left by one on the whole
    sequence (the last token predicts nothing: -100), then this rank's ``(B, L_r)`` slice."""
    shifted = nn.functional.pad(labels[..., 1:], (0, 1), value=-100)
    return split.local(shifted, shifted.dim() - 1).contiguous()  # the loss views it flat
