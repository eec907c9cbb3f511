"""Issue 30's negative controls: the peers' packing bugs, patched into the worker's process for one case, which the
packed cases' check must catch (tests/test_numerics.py::test_packing_bugs_fail_the_packed_test)."""

import contextlib
from unittest import mock

import torch

from mpipe_hf.models import decoder, host_metadata, packed


def negative_controls(case):
    """Issue 30's negative controls, the peers' packing bugs, each of which the packed cases must catch:
    ``case["one_range"]``, a packed micro's positions computed as one range over the whole packed sequence, on
    every axis; ``case["no_linear_reset"]``, the linear-attention layers run over the packed sequence at once (their
    state flows from one row into the next)."""
    def mrope(_rope_index, raw):
        return torch.arange(raw["input_ids"].shape[1]).view(1, 1, -1).expand(4, 1, -1)

    def rows(lengths, start=0):
        return torch.arange(sum(lengths)).unsqueeze(0) + start
    stack = contextlib.ExitStack()
    if case.get("one_range"):
        stack.enter_context(mock.patch.object(host_metadata, "mrope_positions", mrope))
        stack.enter_context(mock.patch.object(packed, "row_positions", rows))
    if case.get("no_linear_reset"):
        stack.enter_context(mock.patch.object(decoder, "row_lengths", lambda state: None))
    return stack
