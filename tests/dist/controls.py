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
        stack.enter_context(mock.patch.object(decoder.DecoderStage, "run_layers", leaky_run_layers))
    return stack


def leaky_run_layers(self, hidden, state, padding):
    """The packed micro's attention layers row by row, as they must be, but its linear-attention layers over the
    whole packed sequence at once (a state that does not start afresh at each row)."""
    lengths = packed.row_lengths(state)
    if lengths is None:
        return self._layers(hidden, state, padding, None)
    rope, text = decoder.split_positions(state["position_ids"])
    rotary = self.rotary_emb(hidden, rope)
    for layer, layer_type in zip(self.layers, self.layer_types):
        kwargs = dict(attention_mask=None, cache=None, use_cache=False)
        if layer_type == packed.LINEAR:
            hidden = layer(hidden, position_embeddings=rotary, position_ids=text, **kwargs)
        else:
            hidden = packed.per_row(layer, hidden, lengths, rotary, text, **kwargs)
    return hidden
