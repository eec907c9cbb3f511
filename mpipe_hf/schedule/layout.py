"""How many decoder layers each pipeline stage holds (pure; the model splitters and the tuner share it)."""

from __future__ import annotations


def balanced_layers(num_layers: int, num_stages: int) -> list[int]:
    """Layers per stage, as even as possible; the spare layers go to the middle stages first, because stage 0
    also embeds and the last stage also runs the LM head and loss.

    Raises:
        ValueError: when there are more stages than layers.
    """
    if num_stages > num_layers:
        raise ValueError(f"pp_size * vpp = {num_stages} stages exceeds the model's {num_layers} decoder layers; "
                         f"every stage needs at least one layer, so lower pp_size or vpp")
    base, extra = divmod(num_layers, num_stages)
    order = list(range(1, num_stages - 1)) + [0, num_stages - 1] if num_stages > 2 else list(range(num_stages))
    counts = [base] * num_stages
    for s in order[:extra]:
        counts[s] += 1
    return counts


def check_layers_per_stage(counts: list[int], num_layers: int, num_stages: int) -> list[int]:
    """Validate a user layout. Raises ``ValueError`` naming ``layers_per_stage``."""
    if len(counts) != num_stages or any(c < 1 for c in counts) or sum(counts) != num_layers:
        raise ValueError(f"layers_per_stage must list {num_stages} positive counts (pp_size * vpp) that sum to "
                         f"{num_layers} decoder layers, got {counts}")
    return list(counts)


def stage0_layers(num_layers: int, num_stages: int, keep: int) -> list[int]:
    """Layers per stage when stage 0 keeps ``keep`` layers and the rest are balanced over the other stages (the
    Megatron-LM remedy for a heavy first stage).

    Raises:
        ValueError: ``keep`` is not in ``1 .. num_layers - num_stages + 1``.
    """
    if not 1 <= keep <= num_layers - num_stages + 1:
        raise ValueError(f"stage 0 can keep 1 to {num_layers - num_stages + 1} of {num_layers} layers over "
                         f"{num_stages} stages, got {keep}")
    if num_stages == 1:
        return [num_layers]
    return [keep] + balanced_layers(num_layers - keep, num_stages - 1)


def stage_costs(counts: list[int], layer_cost: float | list[float], first_cost: float = 0.0,
                last_cost: float = 0.0, text_layers: int = 0) -> list[float]:
    """Compute per micro-batch of each stage: its layers (stage 0's first ``text_layers`` run in ``P`` instead),
    plus ``first_cost`` on stage 0 and ``last_cost`` on the last stage. ``layer_cost`` is one cost for every
    layer, or a list of each layer's in order (hybrid and dense-first MoE models)."""
    per_layer = list(layer_cost) if isinstance(layer_cost, (list, tuple)) else [layer_cost] * sum(counts)
    starts = [sum(counts[:s]) for s in range(len(counts))]
    costs = [sum(per_layer[a:a + n]) for a, n in zip(starts, counts)]
    costs[0] += first_cost - sum(per_layer[:text_layers])
    costs[-1] += last_cost
    return costs


def cost_balanced_layers(num_layers: int, pp_size: int, vpp: int = 1, layer_cost: float | list[float] = 1.0,
                         first_cost: float = 0.0, last_cost: float = 0.0, text_layers: int = 0) -> list[int]:
    """Layers per stage balanced by cost, not by count: the embedding (``first_cost``, stage 0) and the LM head
    with its loss (``last_cost``, the last stage) count as the compute they take, in the same unit as
    ``layer_cost`` (Megatron-LM's ``account_for_embedding_in_pipeline_split`` and
    ``account_for_loss_in_pipeline_split`` count each as one layer; here they count as measured or estimated).

    Every rank runs all its ``vpp`` stages for every micro-batch, so in the steady state of 1F1B the busiest rank
    sets the pace. The layout minimises, in order: the busiest rank's compute, the heaviest stage's (the warm-up
    and cooldown wait on single stages), then the other ranks' loads, largest first. It starts from
    :func:`balanced_layers` and moves one layer at a time between two stages while that improves the order above;
    stage 0 keeps at least ``max(1, text_layers)`` layers and every other stage at least one.

    Returns:
        ``pp_size * vpp`` counts summing to ``num_layers``.

    Raises:
        ValueError: more stages than layers, or ``text_layers`` too large to leave a layer for every stage.
    """
    stages = pp_size * vpp
    counts = balanced_layers(num_layers, stages)
    floor = [max(1, text_layers)] + [1] * (stages - 1)
    if sum(floor) > num_layers:
        raise ValueError(f"text_layers = {text_layers} leaves fewer than one decoder layer for each of the other "
                         f"{stages - 1} stages of {num_layers} layers")
    while counts[0] < floor[0]:  # stage 0 must hold the T layers P takes
        counts[counts.index(max(counts[1:]), 1)] -= 1
        counts[0] += 1

    def loads(c):
        per_stage = stage_costs(c, layer_cost, first_cost, last_cost, text_layers)
        return per_stage, [sum(per_stage[r::pp_size]) for r in range(pp_size)]

    def key(c):
        per_stage, per_rank = loads(c)
        return (round(max(per_rank), 12), round(max(per_stage), 12),
                sorted((round(x, 12) for x in per_rank), reverse=True))
    best = key(counts)
    while True:  # only a layer leaving the busiest rank or the heaviest stage can improve the key
        per_stage, per_rank = loads(counts)
        busiest = max(range(pp_size), key=per_rank.__getitem__)
        sources = set(range(busiest, stages, pp_size)) | {max(range(stages), key=per_stage.__getitem__)}
        moves = [(key(c), c) for i in sources for j in range(stages)
                 if i != j and counts[i] > floor[i]
                 for c in [[n - (s == i) + (s == j) for s, n in enumerate(counts)]]]
        score, candidate = min(moves, key=lambda m: m[0], default=(best, counts))
        if score >= best:
            return counts
        best, counts = score, candidate
