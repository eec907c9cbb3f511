"""Negative controls, patched into the worker's process for one case: the peers' packing bugs, which the packed
cases' check must catch (tests/test_numerics.py::test_packing_bugs_fail_the_packed_test), and a wrong gradient of
each kind the family checks once let through (test_gradient_checks_catch_each_weakness)."""

import contextlib
import dataclasses
from unittest import mock

import torch

from mpipe_hf.families.gemma import altup as gemma3n_altup, shared_kv as gemma_shared_kv
from mpipe_hf.models import decoder, deepstack, host_metadata, image_features, moe, packed, sequence_split
from mpipe_hf.runtime import tower_gather

_flat_features = image_features.flat_features
_lm_head_forward = decoder.LMHead.forward


def negative_controls(case):
    """The packing negative controls, the peers' packing bugs, each of which the packed cases must catch:
    ``case["one_range"]``, a packed micro's positions computed as one range over the whole packed sequence, on
    every axis; ``case["no_linear_reset"]``, the linear-attention layers run over the packed sequence at once (their
    state flows from one row into the next). The gradient controls: ``case["detach_features"]``, the image
    features cut from the tower's graph (:func:`detached_features`; the others are :func:`tamper_grads`);
    ``case["stage_sums"]``, the MoE load-balancing term from each stage's own routers (the sums not relayed).
    ``case["router_sums_local"]``, under context parallelism each CP rank's load-balancing term from its own slice's
    sums (not summed over the CP group).
    The video controls:
    ``case["no_video_time"]``, the host's ``get_rope_index`` call without Qwen2.5-VL's ``second_per_grid_ts`` (the
    videos' temporal positions spaced as at one second a temporal patch); ``case["deepstack_apart"]``, Qwen3-VL's
    video DeepStack features put after the images' instead of in the tokens' order. Gemma 3n's:
    ``case["altup_swapped"]``, AltUp streams 1 and 2 swapped where a stage hands its streams on
    (:func:`swapped_streams_forward`). Context parallelism's: ``case["positions_after_split"]``, each CP rank's
    rotary positions counted from 0 on its own slice (:func:`rotary_after_split`); ``case["rows_cut_at_split"]``, a
    packed micro's mask built from the rows each slice sees (:func:`rows_cut_at_split`);
    ``case["deepstack_offset_lost"]`` and ``case["per_layer_offset_lost"]``, DeepStack's rows and Gemma 4's
    per-layer inputs placed as if each CP rank's slice began the sequence (:func:`deepstack_offset_lost`,
    :func:`first_tokens`); ``case["tower_grads_unrouted"]``, the divided tower's feature gradients not summed over
    the CP group (:func:`unrouted_rows`); ``case["micro_tokens_local"]``, a per-micro mean over each CP rank's own
    slice's label tokens (:func:`slice_tokens_only`)."""
    def mrope(_rope_index, raw):
        return torch.arange(raw["input_ids"].shape[1]).view(1, 1, -1).expand(4, 1, -1)

    def rows(lengths, start=0):
        return torch.arange(sum(lengths)).unsqueeze(0) + start
    stack = contextlib.ExitStack()
    if case.get("one_range"):
        stack.enter_context(mock.patch.object(host_metadata, "mrope_positions", mrope))
        stack.enter_context(mock.patch.object(packed, "row_positions", rows))
    if case.get("detach_features"):  # the tower's gradient lost
        stack.enter_context(mock.patch.object(image_features, "flat_features", detached_features))
    if case.get("stage_sums"):  # the MoE term from each stage's own routers, not the relayed sums
        add = moe.RouterSums.add
        stack.enter_context(mock.patch.object(moe.RouterSums, "add", lambda self, state, *a: add(self, {}, *a)))
    if case.get("router_sums_local"):  # under cp, each rank's MoE term from its own slice's sums
        stack.enter_context(mock.patch.object(moe, "group_sums", lambda sums, _group: sums))
    if case.get("no_video_time"):
        grids = ("image_grid_thw", "video_grid_thw")
        stack.enter_context(mock.patch.object(host_metadata, "GRID_KEYS", grids))
        stack.enter_context(mock.patch.object(packed, "GRID_KEYS", grids))
    if case.get("deepstack_apart"):
        stack.enter_context(mock.patch.object(deepstack, "deepstack_order", lambda ids, _: torch.arange(len(ids))))
    if case.get("no_linear_reset"):
        stack.enter_context(mock.patch.object(decoder.DecoderStage, "run_layers", leaky_run_layers))
    if case.get("altup_swapped"):
        stack.enter_context(mock.patch.object(gemma3n_altup.AltUpStage, "forward", swapped_streams_forward))
    if case.get("positions_after_split"):  # each CP rank numbers its slice from 0
        stack.enter_context(mock.patch.object(decoder, "local_rotary", rotary_after_split))
    if case.get("rows_cut_at_split"):  # a packed micro's rows as each CP rank's slice sees them
        stack.enter_context(mock.patch.object(decoder, "row_lengths", rows_cut_at_split))
    if case.get("deepstack_offset_lost"):  # under cp, DeepStack rows placed as if each slice began the sequence
        stack.enter_context(mock.patch.object(deepstack, "add_at_tokens", deepstack_offset_lost))
    if case.get("tower_grads_unrouted"):  # under cp, the tower's feature gradients not summed over the CP group
        stack.enter_context(mock.patch.object(tower_gather._GatherRows, "backward", staticmethod(unrouted_rows)))
    if case.get("micro_tokens_local"):  # under cp, a per-micro mean over the rank's own slice's label tokens
        stack.enter_context(mock.patch.object(decoder.LMHead, "forward", slice_tokens_only))
    if case.get("per_layer_offset_lost"):  # under cp, Gemma 4's per-layer inputs cut from the sequence's start
        stack.enter_context(mock.patch.object(gemma_shared_kv, "local_if_whole", first_tokens))
    return stack


def slice_tokens_only(self, *args, **kwargs):
    """The LM head without the whole micro's label-token count (a negative control): under context parallelism a
    per-micro mean then divides each CP rank's slice sum by its own slice's label tokens."""
    return {k: v for k, v in _lm_head_forward(self, *args, **kwargs).items() if k != "micro_tokens"}


def unrouted_rows(ctx, grad):
    """The tower gather's backward without the routing (a negative control): each CP rank keeps its own rows of
    the gradient its own stages computed, not the sum over the CP group, so a feature whose token lies in another
    rank's slice gets none."""
    return grad.narrow(0, sum(ctx.counts[:ctx.rank]), ctx.counts[ctx.rank]), None, None


def at_sequence_start(split):
    """``split`` with this rank's slice moved to the sequence's start (its length and the total kept)."""
    own = split.lengths[split.rank]
    return dataclasses.replace(split, lengths=(own, split.total - own), rank=0)


def deepstack_offset_lost(hidden, flat_index, rows, split):
    """DeepStack under context parallelism with the slice's offset lost (a negative control): each CP rank adds the
    feature rows of the tokens at the whole sequence's first ``L_r`` positions, as if its slice began the sequence."""
    return sequence_split.add_at_tokens(hidden, flat_index, rows, at_sequence_start(split))


def first_tokens(t, split, dim=1):
    """Gemma 4's per-layer inputs (and shared key/value states) cut with the slice's offset lost (a negative
    control): every CP rank takes the whole sequence's first ``L_r`` tokens."""
    return sequence_split.local_if_whole(t, at_sequence_start(split), dim)


def rows_cut_at_split(state):
    """Context parallelism's packed mask built per slice (a negative control): a packed micro's rows as each CP
    rank's slice sees them, a row that crosses the split cut in two at it, so its tokens after the split no longer
    attend to those before; without a split, the rows as they are."""
    lengths, split = packed.row_lengths(state), state.get(decoder.SPLIT_KEY)
    if lengths is None or split is None:
        return lengths
    ends = sorted(set(torch.tensor(lengths).cumsum(0).tolist()) | set(torch.tensor(split.lengths).cumsum(0).tolist()))
    return [b - a for a, b in zip([0] + ends[:-1], ends)]


def rotary_after_split(rotary, split):
    """Context parallelism's positions computed after the split (a negative control): each CP rank's rotary
    embeddings those of positions ``0 .. L_r - 1``, as if it numbered its own slice, instead of its slice's of the
    whole sequence."""
    if isinstance(rotary, torch.Tensor):
        return rotary.narrow(rotary.dim() - 2, 0, split.lengths[split.rank])
    return type(rotary)(rotary_after_split(t, split) for t in rotary)


def swapped_streams_forward(self, inputs):
    """A Gemma 3n stage that hands on its AltUp streams ``(4, B, L, H)`` with streams 1 and 2 swapped (each stream
    has its own prediction and correction coefficients and unembedding projection, so the order matters); the
    last stage's loss is left as it is."""
    out = gemma3n_altup.SharedKVStage.forward(self, inputs)
    if "hidden_states" not in out:
        return out
    return {**out, "hidden_states": out["hidden_states"][[0, 2, 1, 3]]}


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


# the gradient negative controls: each a wrong gradient of the kind one of the three test weaknesses let through
GRADIENT_CONTROLS = ("detach_features", "scale_small", "scale_later")


def tamper_grads(case, params, step):
    """The gradient controls, applied to this rank's gradients after schedule step ``step``:
    ``case["scale_small"]``, the gradients of the parameters whose name ends with one of its suffixes (e.g.
    Qwen2.5-VL's vision ``norm2.weight``: 3e-7 to 5e-6, under the old absolute part of the tolerance) times 1.05;
    ``case["scale_later"]``, every gradient of the steps after the first times 1.05 (a wrong magnitude that AdamW's
    sign-sized updates hide from the parameter check)."""
    suffixes = tuple(case.get("scale_small") or ())
    with torch.no_grad():
        for name, param in params.items():
            if param.grad is None:
                continue
            if suffixes and name.endswith(suffixes):
                param.grad.mul_(1.05)
            if case.get("scale_later") and step > 0:
                param.grad.mul_(1.05)


def detached_features(pooled):
    """``flat_features`` with the image features cut from the tower's graph: the tower gets no gradient (what a
    zero-initialised projection hid)."""
    return _flat_features(pooled).detach()
