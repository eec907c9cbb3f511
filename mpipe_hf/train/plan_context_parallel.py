"""Context parallelism in ``mpipe-hf plan`` and the simulator.

With ``parallel.cp_size = C`` the ``C`` ranks of a CP group hold the same stages, and each holds a contiguous
``1 / C`` of every micro-batch's sequence from the first decoder layer on (:mod:`mpipe_hf.models.sequence_split`):

- memory: what a decoder layer and the head save for the backward is per token (norms, projections, the MLP, the
  logits), and Ulysses attention (:mod:`mpipe_hf.runtime.context_parallel`) saves the whole sequence for ``heads /
  C`` heads, as many elements as the rank's slice of every head; so a layer's and the head's saved bytes are one
  process's over ``C``. Beyond that share a layer keeps :attr:`ContextPlan.extra_bytes`: the gathered attention
  output, a storage of its own that the output projection saves (one process's projection reads the attention
  kernel's output in place, whose memory is already ``(B, L, heads, d)``: one storage for both), and, where
  ``kv_heads % C != 0``, the keys and values repeated ``r`` times
  (:func:`~mpipe_hf.runtime.context_parallel.kv_repeats`) before the all-to-all. What does not divide at all is what
  runs on the whole micro-batch before
  the cut stays whole on every CP rank: the tower (``P``: its graph, when it trains), the first stage's front (the
  embedding, whose backward keeps the token ids, and the feature injection, which keeps its mask of image tokens:
  :attr:`ContextPlan.front_bytes`), and the masks and rotary tables, which keep nothing for a backward (built from
  the integer positions; a stage keeps only its slice of the tables);
- time: a layer's and the head's compute divide by ``C`` (attention: the whole sequence for ``heads / C`` heads;
  the rest per token), the tower's is counted whole (see the assumptions), and each attention layer adds four
  all-to-alls forward (query, key, value to whole-sequence heads, the output back) and four backward, of the sizes
  :mod:`mpipe_hf.runtime.context_parallel` states, timed by :func:`~mpipe_hf.schedule.hardware.ulysses_seconds`
  and charged to the stage's ``F`` and ``B`` (:class:`~mpipe_hf.schedule.simulate.Costs`' ``all_to_all``, as expert
  parallelism's);
- the hidden states a stage sends are its slice: ``1 / C`` of the bytes.

Assumptions: the split is even (``L % C`` tokens aside); the tower is counted whole on every CP rank, its graph,
seconds and features: exact for the families that run it whole, an upper bound for those that divide it by images
and frames (:mod:`mpipe_hf.models.tower_division`: each rank then runs about ``1 / C`` of it, plus one gather).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..runtime.context_parallel import kv_repeats

FRONT_BYTES_PER_TOKEN = 8 + 1  # the embedding's int64 token ids and the injection's bool mask, per token of B x L


@dataclass(frozen=True)
class ContextPlan:
    """What ``cp_size`` adds to a plan, per micro-batch and attention layer unless it says otherwise.

    Attributes:
        cp_size: ranks of a CP group. repeats: ``r``, the KV heads' repeat before the all-to-all.
        tokens: the micro-batch's tokens, whole (``B x L``).
        query_bytes: what one rank sends into the query's (and the output's) all-to-all: its slice, every head.
        kv_bytes: the same for the keys' (and the values') all-to-all, the KV heads repeated ``r`` times.
        extra_bytes: what a layer keeps beyond one process's over ``C``: the gathered output (``query_bytes``) and
            the repeated keys and values (``2 * (r - 1)`` times a slice of the KV heads).
        front_bytes: what the first stage's front keeps whole on every CP rank (:data:`FRONT_BYTES_PER_TOKEN`).
        forward_s, backward_s: an attention layer's all-to-alls (:func:`~mpipe_hf.schedule.hardware.ulysses_seconds`).
        attention_layers: the attention layers of each stage (``P``'s ``text_layers`` left out: they run whole).
        within_node: whether a CP group lies within a node (NVLink) or spans nodes (InfiniBand).
    """

    cp_size: int
    repeats: int
    tokens: float
    query_bytes: float
    kv_bytes: float
    extra_bytes: float
    front_bytes: float
    forward_s: float
    backward_s: float
    attention_layers: tuple[int, ...]
    within_node: bool

    def stage_seconds(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """``(forward, backward)`` all-to-all seconds of each stage per micro-batch."""
        return (tuple(n * self.forward_s for n in self.attention_layers),
                tuple(n * self.backward_s for n in self.attention_layers))

    def describe(self) -> str:
        """The plan's words for it (the layout line)."""
        link = "NVLink" if self.within_node else "InfiniBand"
        per_layer = 2 * (self.query_bytes + self.kv_bytes) / 2**20
        return (f"cp_size {self.cp_size}: 1/{self.cp_size} of each sequence a rank, KV heads x{self.repeats}; "
                f"Ulysses all-to-alls {per_layer:.1f} MiB an attention layer and micro-batch over {link}, "
                f"{1e3 * self.forward_s:.3f} ms forward, {1e3 * self.backward_s:.3f} ms backward")


def context_plan(config, profile, layers_per_stage: list[int], text_layers: int, cp_size: int,
                 dtype_bytes: int = 4, within_node: bool = True, cluster=None) -> ContextPlan | None:
    """The :class:`ContextPlan` of ``cp_size`` on ``profile``'s micro-batch (its tokens from ``activation_bytes``,
    the fp32 hidden states a stage sends: ``tokens * hidden * 4``, one process's), queries, keys and values of
    ``dtype_bytes`` (fp32 4, bf16 2); ``None`` for ``cp_size`` 1. Times on ``cluster`` (default
    :class:`~mpipe_hf.schedule.cluster.Cluster`: H100, NVLink 4, NDR).

    Raises:
        ValueError: ``cp_size`` below 1; as :func:`~mpipe_hf.runtime.context_parallel.kv_repeats` (heads that
            ``cp_size`` does not divide).
    """
    if cp_size < 1:
        raise ValueError(f"cp_size must be >= 1, got {cp_size}")
    if cp_size == 1:
        return None
    from ..schedule.cluster import Cluster
    from ..schedule.hardware import ulysses_seconds
    text = config.get_text_config()
    heads, kv_heads = text.num_attention_heads, text.num_key_value_heads or text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    repeats = kv_repeats(heads, kv_heads, cp_size)
    tokens = profile.activation_bytes / (4.0 * text.hidden_size)
    query = tokens / cp_size * heads * head_dim * dtype_bytes
    kv = tokens / cp_size * kv_heads * repeats * head_dim * dtype_bytes
    extra = query + 2 * (repeats - 1) * tokens / cp_size * kv_heads * head_dim * dtype_bytes
    forward, backward = ulysses_seconds(query, kv, cp_size, cluster or Cluster(), within_node)
    counts = list(layers_per_stage)
    counts[0] -= text_layers
    return ContextPlan(cp_size, repeats, tokens, query, kv, extra, FRONT_BYTES_PER_TOKEN * tokens, forward,
                       backward, tuple(counts), within_node)


def divided_profile(profile, cp_size: int):
    """``profile`` (a :class:`~mpipe_hf.schedule.tune.Profile` of one process's micro-batch) as one CP rank's: a
    layer's and the head's times and saved bytes, and the hidden states a stage sends, over ``cp_size``; the
    tower, its features and the raw inputs whole (they are made before the cut, on every CP rank)."""
    if cp_size == 1:
        return profile
    return dataclasses.replace(
        profile, layer_forward_s=profile.layer_forward_s / cp_size,
        layer_backward_s=profile.layer_backward_s / cp_size, head_forward_s=profile.head_forward_s / cp_size,
        head_backward_s=profile.head_backward_s / cp_size, activation_bytes=profile.activation_bytes / cp_size,
        layer_activation_bytes=profile.layer_activation_bytes / cp_size,
        head_activation_bytes=profile.head_activation_bytes / cp_size)


def rank_costs(whole, cfg, layers_per_stage: list[int], text_layers: int = 0, cp_size: int = 1):
    """The simulator's :class:`~mpipe_hf.schedule.simulate.Costs` of one CP rank
    (:func:`~mpipe_hf.schedule.tune.costs_for` on :func:`divided_profile`), ``whole`` being one process's
    profile: ``P`` and its ``text_layers`` run on the whole micro-batch, so their seconds and what they send are
    ``whole``'s."""
    from ..schedule.tune import costs_for
    costs = costs_for(divided_profile(whole, cp_size), cfg, layers_per_stage, text_layers)
    if cp_size == 1 or text_layers == 0:
        return costs
    pre = costs_for(whole, cfg, layers_per_stage, text_layers)
    sent = {k: pre.message_bytes[k] for k in ("FWD", "GRAD")}
    return dataclasses.replace(costs, preprocess_forward=pre.preprocess_forward,
                               preprocess_backward=pre.preprocess_backward,
                               message_bytes={**costs.message_bytes, **sent})


def with_ulysses(costs, context: ContextPlan | None):
    """``costs`` (:class:`~mpipe_hf.schedule.simulate.Costs`) with each stage's Ulysses all-to-all seconds added to
    its ``all_to_all`` (expert parallelism's, when both run); unchanged without context parallelism."""
    if context is None:
        return costs
    forward, backward = context.stage_seconds()

    def plus(base, extra):
        base = base if isinstance(base, tuple) else (base,) * len(extra)
        return tuple(b + e for b, e in zip(base, extra))
    back = costs.all_to_all if costs.all_to_all_backward is None else costs.all_to_all_backward
    return dataclasses.replace(costs, all_to_all=plus(costs.all_to_all, forward),
                               all_to_all_backward=plus(back, backward))
