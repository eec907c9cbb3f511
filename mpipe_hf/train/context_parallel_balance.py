"""The costliest context-parallel rank over the mean, as ``mpipe-hf train``'s progress line and metrics row and
``mpipe-hf check-data``'s summary report it: the cost model of :mod:`mpipe_hf.schedule.context_parallel_cost` on
what every rank already knows, with no collective and nothing decoded:

- each micro-batch's rows (the data plan's, :meth:`~mpipe_hf.data.owner.MicroBatchPlan.rows`), their tokens and
  their image and video tokens (the dataset's columns, counted from the files' headers at load);
- the weights of an attended pair and of a tower patch against a token's per-token decoder work, from the model's
  config (:func:`cost_weights`).

Each row's images and its videos are one tower item each here (the finest division the dataset's columns give),
so the tower's share is at least as uneven as the division by images or frames the ranks make.
"""

from __future__ import annotations

from typing import Sequence

from ..models.costs import layer_costs
from ..models.decoder import layer_types
from ..schedule.context_parallel_cost import CostWeights, MicroWork, costliest_over_mean, rank_work

FULL_ATTENTION = "full_attention"  # the layers whose pairs are counted (a sliding window's fewer are left out)


def cost_weights(config, profile=None) -> CostWeights:
    """The :class:`CostWeights` of ``config`` (a model's HF config): an attended pair's multiply-adds in every
    full-attention layer (``2 x heads x head_dim``: scores and values) and a tower patch's work
    (:func:`~.sources.image_token_weight`, from ``profile`` when it measures one; 0 for a decoder-only LM), each
    over a token's per-token weights (every layer's, :func:`~mpipe_hf.models.costs.layer_costs`, and the head's).
    Sliding-window layers' pairs are left out, so the even attention share is never overstated."""
    from .sources import image_token_weight, is_vision_language
    text = config.get_text_config()
    per_token = sum(layer_costs(text)) + text.hidden_size * text.vocab_size
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    full = sum(t == FULL_ATTENTION for t in layer_types(text))
    patch = image_token_weight(config, profile) if is_vision_language(config) else 0.0
    return CostWeights(pair=full * 2 * text.num_attention_heads * head_dim / per_token, patch=patch)


def micro_work(tokens: Sequence[int], image_tokens: Sequence[int], video_tokens: Sequence[int],
               packed: bool) -> MicroWork:
    """A micro-batch of rows with ``tokens`` each (cut to the row length), ``image_tokens`` and ``video_tokens``
    each (a row's images, and its videos, one tower item each), ``packed`` into one sequence or padded."""
    items = tuple(int(n) for pair in zip(image_tokens, video_tokens) for n in pair if n)
    return MicroWork(tuple(int(n) for n in tokens), packed, items)


class Balance:
    """The costliest CP rank over the mean of each step of a run, from its data plan (``plan.rows(step, m)``)
    and ``dataset``'s columns (``num_tokens``, ``image_tokens``, ``video_tokens`` where it has them), each row cut
    to ``row_length`` tokens; ``cp`` ranks, ``num_micro`` micro-batches a step, ``packed`` or padded."""

    def __init__(self, plan, dataset, weights: CostWeights, cp: int, num_micro: int, packed: bool,
                 row_length: int):
        self.plan, self.weights, self.cp, self.num_micro, self.packed = plan, weights, cp, num_micro, packed
        self.tokens = [min(int(n), row_length) for n in dataset.num_tokens]
        self.images = list(getattr(dataset, "image_tokens", None) or [0] * len(self.tokens))
        self.videos = list(getattr(dataset, "video_tokens", None) or [0] * len(self.tokens))

    def step(self, step: int) -> float:
        """Step ``step``'s costliest CP rank over the mean (:func:`costliest_over_mean` of its micros)."""
        works = []
        for m in range(self.num_micro):
            rows = self.plan.rows(step, m)
            if rows:
                micro = micro_work([self.tokens[i] for i in rows], [self.images[i] for i in rows],
                                   [self.videos[i] for i in rows], self.packed)
                works.append(rank_work(micro, self.cp, self.weights))
        return costliest_over_mean(works)


def data_balance(tokens: Sequence[int], image_tokens: Sequence[int], video_tokens: Sequence[int], data,
                 weights: CostWeights, cp: int) -> tuple[float, float]:
    """``(over all micros, the worst micro)``: the costliest CP rank over the mean of the rows in file order
    grouped as micro-batches (``data.micro_batch_size`` rows, or with ``data.packing`` consecutive rows packed up
    to ``data.token_budget`` tokens), each row cut to ``data.row_length``."""
    tokens = [min(int(n), data.row_length) for n in tokens]
    groups, current, size = [], [], 0
    for i, n in enumerate(tokens):
        full = size + n > data.token_budget if data.packing else len(current) == data.micro_batch_size
        if current and full:
            groups.append(current)
            current, size = [], 0
        current.append(i)
        size += n
    groups += [current] if current else []
    works = [rank_work(micro_work([tokens[i] for i in g], [image_tokens[i] for i in g],
                                  [video_tokens[i] for i in g], data.packing), cp, weights) for g in groups]
    worst = max((costliest_over_mean([w]) for w in works), default=1.0)
    return costliest_over_mean(works), worst


def recipe_weights(recipe, config) -> CostWeights:
    """:func:`cost_weights` of ``config``, with the tower's weight from ``parallel.profile`` when it names one."""
    profile = None
    if recipe.parallel.profile is not None:
        from ..schedule.tune import Profile
        profile = Profile.load(recipe.parallel.profile)
    return cost_weights(config, profile)


def run_balance(plan, dataset, config, recipe, num_micro: int) -> Balance | None:
    """The :class:`Balance` ``mpipe-hf train`` reports each step (``None`` at ``parallel.cp_size`` 1): the
    recipe's data plan and rows, weights from ``config`` (:func:`recipe_weights`)."""
    if recipe.parallel.cp_size == 1:
        return None
    return Balance(plan, dataset, recipe_weights(recipe, config), recipe.parallel.cp_size, num_micro,
                   recipe.data.packing, recipe.data.row_length)
