"""How a micro-batch's work lies over a context-parallel group, as pure functions of costs every rank knows
(no collective, no torch.distributed).

The tower's items (a micro's images, and a video's groups of temporal patches) go to the CP ranks by the LPT rule
(:func:`~mpipe_hf.schedule.owners.balance_owners`: heaviest first, to the least loaded rank), so every rank
computes the same division from the same per-item costs (patches).

The cost model (:func:`rank_work`), in one unit, a token's per-token work through the decoder (every layer's
projections, MLP and norms, and the head): CP rank ``r``'s work for a micro is

- ``width * lengths[r]``: its tokens' per-token work (``width`` rows of ``lengths[r]`` positions; a padded batch's
  padding is computed like any token, so it counts);
- ``pair * pairs / cp``: its attention share. Ulysses gives each rank the whole sequence for ``heads / cp`` heads,
  so each computes ``1 / cp`` of the attended (query, key) pairs whatever the token split (:func:`causal_pairs`);
- ``patch * tower[r]``: the patches (image and video tokens) of the tower items :func:`divide_tower` gives it.

Why an even token split (:func:`even_lengths`, ``SequenceSplit.even``) is kept for the layers. Under ring
attention each rank attends with its own queries, so a causal mask skews a contiguous split: rank ``r`` of ``cp``
computes ``(2 r + 1) / cp^2`` of the pairs (:func:`ring_pairs`), the last rank ``2 - 1 / cp`` times the mean (1.75
at cp 4: the zig-zag split exists for this), and an image-heavy span skews it too. Under Ulysses the attention share
is ``1 / cp`` on every rank, whatever the mask and wherever the images lie, and the per-token work is as even as the
tokens: an even split's costliest rank is at most ``ceil(L / cp) / (L / cp)`` of the mean (``1.0001`` for ``L =
32768`` at cp 4 with one odd token; ``1.0`` when cp divides ``L``). Padding changes nothing: the padded positions
are computed. An image's decoder tokens cost what text tokens cost; its extra work is the tower's, which the split of
the sequence cannot even out: every attention layer's all-to-all waits for the slowest rank, so slices shortened to
make up for a rank's tower share would make every layer wait instead. The tower's imbalance is its item division's
(a micro of one image: one rank runs it all), and it is what :func:`costliest_over_mean` shows above 1. So no split
by cost is needed under Ulysses, and none is made.

Figures (Qwen2.5-VL-7B's config, :func:`~mpipe_hf.train.context_parallel_balance.cost_weights`: an attended pair
1.8e-5 of a token's per-token work, a tower patch 0.17), one 32k-token row, even split: the layers' costliest rank
1.00002 at cp 2 and 1.00007 at cp 4 (32769 tokens); a video of 16 frame groups of 1920 tokens, 1.0 with its
tower; one 30720-token image the tower cannot divide, 1.11 at cp 2 and 1.33 at cp 4. Ring attention on the same
split: the last rank's layer work 1.12x (cp 2) and 1.17x (cp 4) the mean, attention being 23% of the work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .owners import balance_owners


def divide_tower(costs: Sequence[int], cp: int) -> tuple[int, ...]:
    """The CP rank that runs each tower item: ``costs`` one per item (its patches, or any unit of the tower's
    work, each ``>= 0``), ``cp`` the group's size; LPT with deterministic ties (equal costs: the earlier item
    first; equal loads: fewer items, then the lower rank). Raises ValueError for ``cp < 1``."""
    if cp < 1:
        raise ValueError(f"a context-parallel group has at least 1 rank, got {cp}")
    return balance_owners(list(costs), cp) if costs else ()


@dataclass(frozen=True)
class CostWeights:
    """The work of one attended (query, key) pair (``pair``, every decoder layer's attention) and of one tower
    patch (``patch``: an image or video token through the vision part), each over one token's per-token decoder
    work (every layer's projections and MLP, and the head). Both ``>= 0``."""

    pair: float
    patch: float


@dataclass(frozen=True)
class MicroWork:
    """What every rank knows of a micro-batch: ``rows`` its rows' tokens, ``packed`` whether they are packed into
    one sequence (else padded to the longest, ``len(rows) x max(rows)``), ``items`` its tower items' patches."""

    rows: tuple[int, ...]
    packed: bool = False
    items: tuple[int, ...] = ()

    @property
    def width(self) -> int:
        """The rows of the ``(B, L)`` tensor the stages split along ``L``: 1 packed, else ``len(rows)``."""
        return 1 if self.packed else len(self.rows)

    @property
    def length(self) -> int:
        """``L``, the sequence the CP group splits: the rows' sum packed, else the longest row."""
        return sum(self.rows) if self.packed else max(self.rows, default=0)


def even_lengths(total: int, cp: int) -> tuple[int, ...]:
    """``SequenceSplit.even``'s slices: ``total // cp`` tokens each, the first ``total % cp`` one more. Raises
    ValueError for ``cp < 1``."""
    if cp < 1:
        raise ValueError(f"a context-parallel group has at least 1 rank, got {cp}")
    return tuple(total // cp + (r < total % cp) for r in range(cp))


def causal_pairs(micro: MicroWork) -> int:
    """The (query, key) pairs a causal mask lets attend in ``micro``: ``n (n + 1) / 2`` per packed row (each row
    only within itself); padded, ``L (L + 1) / 2`` per row (the kernel computes the padding's too)."""
    if micro.packed:
        return sum(n * (n + 1) // 2 for n in micro.rows)
    return micro.width * micro.length * (micro.length + 1) // 2


def ring_pairs(lengths: Sequence[int]) -> list[int]:
    """Each rank's causal pairs if it attended with its own queries only (ring attention) over one sequence split
    in contiguous ``lengths``: rank ``r``'s queries ``[s, s + n)`` see ``s + 1 .. s + n`` keys. For comparison;
    Ulysses gives each rank ``1 / cp`` of the total."""
    out, start = [], 0
    for n in lengths:
        out.append(n * start + n * (n + 1) // 2)
        start += n
    return out


def rank_work(micro: MicroWork, cp: int, weights: CostWeights,
              lengths: Sequence[int] | None = None) -> list[float]:
    """Each CP rank's work for ``micro`` in per-token units (module docstring): its ``width x lengths[r]`` tokens,
    ``1 / cp`` of the causal pairs times ``weights.pair``, and the patches of the tower items :func:`divide_tower`
    gives it times ``weights.patch``. ``lengths``: the split (default :func:`even_lengths`). Raises ValueError for
    ``cp < 1`` or lengths that are not ``cp`` slices of the micro's sequence."""
    lengths = even_lengths(micro.length, cp) if lengths is None else tuple(lengths)
    if len(lengths) != cp or sum(lengths) != micro.length:
        raise ValueError(f"{cp} slices of {lengths} do not split a sequence of {micro.length} tokens")
    tower = [0] * cp
    for item, rank in zip(micro.items, divide_tower(micro.items, cp)):
        tower[rank] += item
    attention = weights.pair * causal_pairs(micro) / cp
    return [micro.width * n + attention + weights.patch * t for n, t in zip(lengths, tower)]


def costliest_over_mean(works: Sequence[Sequence[float]]) -> float:
    """The costliest CP rank over the mean, over micro-batches whose ranks wait for each other in every layer:
    ``sum_m max_r works[m][r] / sum_m mean_r works[m][r]`` (``works[m]``: :func:`rank_work` of micro ``m``); 1.0
    for no work."""
    top = sum(max(w) for w in works if w)
    mean = sum(sum(w) / len(w) for w in works if w)
    return top / mean if mean > 0 else 1.0
