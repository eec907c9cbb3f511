"""The per-token inputs between decoder layers cut with the sequence (``mpipe_hf/models/sequence_split.py``), on one
process: DeepStack's rows added to each CP rank's slice, joined over the ranks, equal the rows added to the whole
micro-batch, bit for bit, and so do the rows' gradients summed over the ranks; a per-layer input is cut where it
arrives whole; and ``check_splittable`` refuses only stage classes that do not declare that their hooks cut with
the sequence. The distributed cases (Qwen3-VL, Gemma 3, Gemma 4 through the pipeline at cp 2 x pp 2) are
tests/test_numerics.py::test_context_parallel_equals_one_process."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mpipe_hf.families.gemma.altup import AltUpStage
from mpipe_hf.families.qwen_like.stages import TokenTypeStage
from mpipe_hf.families.gemma.shared_kv import SharedKVStage
from mpipe_hf.models.context_parallel_stages import check_splittable
from mpipe_hf.models.deepstack import DeepStackStage
from mpipe_hf.models.sequence_split import add_at_tokens, local_if_whole
from mpipe_hf.runtime.context_parallel import SequenceSplit

LENGTHS = (7, 6)  # an uneven split of 13 tokens over 2 ranks


def splits(lengths=LENGTHS):
    return [SequenceSplit(None, lengths, rank) for rank in range(len(lengths))]


def whole_add(hidden, index, rows):
    """DeepStack on one process: ``rows`` added at the flat positions ``index`` of ``hidden`` ``(B, L, H)``."""
    where = torch.unravel_index(index, hidden.shape[:-1])
    return hidden.index_put(where, hidden[where] + rows)


def test_deepstack_rows_cut_with_the_sequence_equal_one_process():
    """Two rows of 13 tokens, image tokens on both slices of both rows (one at each side of the split), the first
    row's visual tokens before the second's in the flat (row-major) order."""
    torch.manual_seed(0)
    hidden, index = torch.randn(2, 13, 5), torch.tensor([1, 5, 6, 7, 12, 13 + 2, 13 + 6, 13 + 7, 13 + 11])
    rows = torch.randn(len(index), 5, requires_grad=True)
    want = whole_add(hidden, index, rows)
    (want * torch.arange(want.numel()).view_as(want)).sum().backward()
    want_grad, rows.grad = rows.grad, None
    parts = [add_at_tokens(split.local(hidden), index, rows, split) for split in splits()]
    got = torch.cat(parts, dim=1)
    (got * torch.arange(got.numel()).view_as(got)).sum().backward()
    assert torch.equal(got, want) and torch.equal(rows.grad, want_grad)
    # the negative control: the second rank's positions counted from the sequence's start (its offset lost)
    lost = dataclasses.replace(splits()[1], lengths=(6, 7), rank=0)
    wrong = torch.cat([parts[0], add_at_tokens(splits()[1].local(hidden), index, rows, lost)], dim=1)
    assert not torch.equal(wrong.detach(), want.detach())


def test_a_per_token_input_is_cut_where_it_arrives_whole():
    first, second = splits()
    whole = torch.arange(2 * 13 * 3).view(2, 13, 3)
    assert torch.equal(local_if_whole(whole, second), whole[:, 7:])
    handed_on = whole[:, 7:]  # the slice the previous stage handed on: kept as it is
    assert local_if_whole(handed_on, second) is handed_on
    kv = torch.randn(2, 4, 13, 8)  # shared key/value states: the sequence on dim 2
    assert torch.equal(local_if_whole(kv, first, 2), kv[:, :, :7])
    with pytest.raises(ValueError, match="neither the split sequence"):
        local_if_whole(whole[:, :5], first)


def test_only_stages_whose_hooks_cut_with_the_sequence_pass():
    """DeepStack and Gemma 4 declare it; Gemma 3n's AltUp stage inherits Gemma 4's hooks but carries streams of
    another shape, ERNIE 4.5-VL's layer loop hands every layer the whole sequence's token types, and a subclass that
    does not declare it again is refused, by name."""
    for cls in (DeepStackStage, SharedKVStage):
        check_splittable(cls.__new__(cls))
    undeclared = type("UndeclaredStage", (DeepStackStage,), {})
    for cls in (AltUpStage, TokenTypeStage, undeclared):
        with pytest.raises(NotImplementedError, match=cls.__name__):
            check_splittable(cls.__new__(cls))
