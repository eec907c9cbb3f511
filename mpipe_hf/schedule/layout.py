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
