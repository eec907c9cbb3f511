"""The packed step in the simulator: ``mpipe-hf plan`` on a recipe with ``data.packing`` shows
step 0's packed micro-batches (:class:`~mpipe_hf.data.packing.PackedPlan`, as ``mpipe-hf train`` packs them),
weighs each against the cost profile's micro-batch, and simulates the packed step next to the same rows padded at
``data.micro_batch_size`` rows per micro-batch.

Cost model: a micro-batch's body ``F``/``B``/``W`` (layers, embedding, head) costs the profile's times its decoder
tokens over the profile's tokens per micro-batch, and its ``P`` (the tower, :class:`~mpipe_hf.schedule.simulate.Costs`'
``micro_preprocess_weights``) the profile's times its image tokens over the profile's image tokens: linear in
tokens, as the profile's matmul FLOPs are (:func:`~.plan_estimate.estimate_profile`). Attention's term quadratic
in a row's length is not modelled (packed rows attend only within themselves), nor do message sizes follow the
tokens. A padded micro-batch computes ``rows * longest row`` decoder tokens, what padding to the longest row costs;
its image tokens are its rows' (padding adds none).

A row's tower cost (:class:`TowerCost`) is its image and video tokens plus the tower's attention, which grows with
the square of the patches (before the merge) of each image or frame group it attends within: the packer balances by
it (:func:`packing_costs`) and the simulator weighs ``P`` by it, so that a step of video rows stays balanced.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from ..data.conversation import column
from ..data.packing import PackedPlan
from ..schedule import build_schedule
from ..schedule.owners import step_owners, with_owners
from ..schedule.simulate import simulate
from ..schedule.tune import costs_for
from .plan_experts import with_all_to_all
from .sources import image_token_weight, is_vision_language, load_data, load_processor, packing_rows


@dataclass(frozen=True)
class StepMicros:
    """One replica's micro-batches of a step as the simulator weighs them, one entry per micro-batch.

    Attributes:
        tokens: decoder tokens each computes: packed, its rows' lengths summed; padded, ``rows * longest row``.
        real_tokens: its rows' own tokens (after the ``max_length`` cut); ``tokens`` when packed.
        image_tokens: its rows' tower load: their image and video tokens, or their :func:`tower_units`.
        rows: how many rows it holds.
    """

    tokens: tuple[int, ...]
    real_tokens: tuple[int, ...]
    image_tokens: tuple[float, ...]
    rows: tuple[int, ...]

    @property
    def padding(self) -> float:
        """The share of the computed tokens that is padding: ``1 - sum(real_tokens) / sum(tokens)``."""
        return 1.0 - sum(self.real_tokens) / sum(self.tokens) if sum(self.tokens) else 0.0


@dataclass(frozen=True)
class SimulatedRows:
    """What processing a :class:`StepMicros` takes: ``seconds`` (all its steps, in the profile's unit), ``bubble``
    (the idle share over those steps, ``1 - busy / (ranks * seconds)``) and ``steps`` (schedule runs of at most
    ``num_micro`` micro-batches)."""

    seconds: float
    bubble: float
    steps: int


@dataclass(frozen=True)
class TowerCost:
    """What a row's images and videos cost the vision tower, in visual tokens: each token's share of the tower's
    matmuls (1 a token: what :func:`~.sources.image_token_weight` weighs), plus its attention, ``4 * width`` FLOPs
    a patch pair a layer (``QK^T`` and ``AV``), over the matmul FLOPs of a visual token. Qwen2-VL's tower attends
    within each image and each video frame group (a temporal patch; ``cu_seqlens``), Qwen2.5-VL's the same in its
    ``fullatt_block_indexes`` layers and within windows of ``(window_size / patch_size)**2`` patches in the others.

    Attributes:
        patches_per_token: patches the tower encodes per visual token (``spatial_merge_size**2``).
        pair: attention FLOPs a patch pair over all full-attention layers, over the matmul FLOPs a token.
        window_pair: the same over the windowed layers; window: patches a window (0: none).
    """

    patches_per_token: float
    pair: float
    window_pair: float = 0.0
    window: int = 0

    def units(self, image_tokens: list[int], video_tokens: list[int], video_groups: list[int]) -> float:
        """A row's tower cost in visual tokens: its tokens, plus the attention of each image (one group) and each
        video (``video_groups`` groups), a group of ``n = tokens / groups * patches_per_token`` patches costing
        ``n**2 * pair + n * min(n, window) * window_pair``."""
        total = float(sum(image_tokens) + sum(video_tokens))
        for tokens, groups in [(t, 1) for t in image_tokens] + list(zip(video_tokens, video_groups)):
            n = tokens / max(1, groups) * self.patches_per_token
            total += groups * (n * n * self.pair + n * min(n, self.window) * self.window_pair)
        return total


def tower_cost(config) -> TowerCost | None:
    """The :class:`TowerCost` of ``config``'s tower, from the config and its matmul weights
    (:func:`~.plan_vision.vision_parts` on the meta model); ``None`` for a tower whose patches per image are fixed
    (no ``spatial_merge_size``: LLaVA's, the tiled towers'), whose attention is then a fixed cost per image token,
    in its weight already."""
    vision = getattr(config, "vision_config", None)
    if vision is None or not getattr(vision, "spatial_merge_size", None):
        return None
    from ..models.load import meta_model
    from .plan_vision import patches_per_image_token, vision_parts
    per_patch = patches_per_image_token(config)
    sizes = vision_parts(meta_model(config), config.model_type)
    per_token = 2.0 * (sizes[0] * per_patch + sum(sizes[1:]))
    depth = getattr(vision, "depth", None) or vision.num_hidden_layers
    width = getattr(vision, "embed_dim", None) or vision.hidden_size
    full = getattr(vision, "fullatt_block_indexes", None)
    full = depth if full is None else len(full)
    window = (vision.window_size // vision.patch_size) ** 2 if getattr(vision, "window_size", None) else 0
    return TowerCost(per_patch, 4.0 * width * full / per_token, 4.0 * width * (depth - full) / per_token, window)


def row_metadata(dataset) -> list[dict] | None:
    """Each row's visual metadata (the prepared rows' ``visual`` column, :meth:`~mpipe_hf.data.budgets.RowBudget.
    metadata`), or ``None`` for a dataset without it."""
    rows = getattr(dataset, "rows", None)
    if rows is None or "visual" not in getattr(rows, "column_names", ()):
        return None
    return [json.loads(v) if v else {} for v in column(rows, "visual")]


def tower_units(dataset, config) -> list[float] | None:
    """Each row's tower cost in visual tokens (:meth:`TowerCost.units`), or ``None`` where the tower or the
    dataset gives none (the rows' visual tokens stand for it then)."""
    cost, meta = (tower_cost(config), row_metadata(dataset)) if is_vision_language(config) else (None, None)
    if cost is None or meta is None:
        return None
    return [cost.units(m.get("image_tokens", []), m.get("video_tokens", []), m.get("video_groups", [])) for m in meta]


def packing_costs(dataset, config, data, profile=None) -> tuple[list[int], list[float]]:
    """``(lengths, costs)`` for the packer: :func:`~.sources.packing_rows`' (``tokens + w * visual tokens``), with
    each row's tower attention added at the same weight ``w`` (``w * (tower_units - visual tokens)``,
    :func:`tower_units`) where the tower attends within images and frames of any size."""
    lengths, costs = packing_rows(dataset, config, data, profile)
    units = tower_units(dataset, config)
    if units is None:
        return lengths, costs
    weight = image_token_weight(config, profile)
    return lengths, [c + weight * (u - v) for c, u, v in zip(costs, units, _visual_tokens(dataset))]


def _visual_tokens(dataset) -> list[int]:
    images = [int(i) for i in getattr(dataset, "image_tokens", None) or []] or [0] * len(dataset)
    videos = [int(v) for v in getattr(dataset, "video_tokens", None) or []] or [0] * len(dataset)
    return [i + v for i, v in zip(images, videos)]


def packed_plan(dataset, config, recipe, num_micro: int, collate=None, **kwargs) -> PackedPlan:
    """The :class:`PackedPlan` ``mpipe-hf train`` builds for ``dataset`` (``recipe.data.packing``): lengths and
    balancing costs from :func:`packing_costs` (weighed by ``parallel.profile`` when the recipe names one), the
    budget ``data.token_budget`` tokens and, for a vision-language model, as much cost as that many tokens of the
    dataset's mean row hold (:func:`cost_budget`), ``data.shuffle``, the seed ``train.seed``, ``parallel.dp_size``
    replicas. ``dataset`` needs ``len()`` and the columns ``num_tokens`` and ``image_tokens`` (a
    :class:`~mpipe_hf.data.conversation.ConversationDataset`); ``collate``: the micro-batch collator (``None``: the
    plan is only read, never loaded); ``kwargs``: :class:`PackedPlan`'s ``validate``, ``replica``,
    ``drop_bad_rows``.

    Raises:
        ValueError: as :class:`PackedPlan` (a row longer than the budget, an empty dataset, ...).
    """
    profile = None
    if recipe.parallel.profile is not None:  # its measured vision and decoder times weigh the rows
        from ..schedule.tune import Profile
        profile = Profile.load(recipe.parallel.profile)
    data = recipe.data
    lengths, costs = packing_costs(dataset, config, data, profile)
    limit = cost_budget(lengths, costs, data.token_budget) if is_vision_language(config) else None
    return PackedPlan(dataset, collate or list, num_micro, data.token_budget, lengths, costs, shuffle=data.shuffle,
                      seed=recipe.train.seed, num_replicas=recipe.parallel.dp_size, cost_budget=limit, **kwargs)


def cost_budget(lengths: list[int], costs: list[float], budget: int) -> float:
    """The cost a packed micro-batch may hold besides its ``budget`` tokens: what ``budget`` tokens of the rows'
    mean cost per token cost (``budget * sum(costs) / sum(lengths)``), at least the costliest row's. Rows dearer
    than their tokens (images, videos: the tower's work) then fill a micro-batch by cost before tokens, so a step of
    video rows is balanced with one of text rows instead of taking the budget's tokens at several times the cost."""
    return max(budget * sum(costs) / max(1, sum(lengths)), max(costs, default=0.0))


def packing_line(plan: PackedPlan, step: int = 0) -> str:
    """The line rank 0 prints at start-up of a packed run (``data.packing``): the budget, and of step
    ``step``'s micro-batches on this replica the rows per micro-batch (fewest, mean, most), the fill (tokens over
    the budget: mean and lowest) and the padding packing saves: the tokens the same micro-batches would compute
    padded to their longest row (``rows x longest`` each), less the tokens they hold."""
    stats = plan.packing_stats(step)
    rows, fill, tokens = stats["rows"], stats["fill"], sum(stats["tokens"])
    bins = [b for b in plan.bins(step)[plan.replica * plan.num_micro:(plan.replica + 1) * plan.num_micro] if b]
    padded = sum(len(b) * max(plan.lengths[r] for r in b) for b in bins)
    saved = padded - tokens
    per_micro = (f"{rows[0]} rows" if min(rows) == max(rows)
                 else f"{min(rows)} to {max(rows)} rows (mean {sum(rows) / len(rows):.1f})")
    return (f"mpipe_hf: packing on (data.packing): micro-batches of whole rows up to {plan.budget} tokens, one "
            f"sequence each; step {step + 1}: {per_micro} a micro-batch, fill {sum(fill) / len(fill):.0%} of the "
            f"budget (lowest {min(fill):.0%}); "
            f"padding saved: {saved} of the {padded} tokens these micro-batches would compute padded to their "
            f"longest row ({saved / padded if padded else 0:.0%})")


def _image_column(dataset, units: list[float] | None = None) -> list[float]:
    """Each row's tower load: ``units`` (:func:`tower_units`) when given, else its image and video tokens."""
    return list(units) if units is not None else _visual_tokens(dataset)


def packed_micros(plan: PackedPlan, step: int = 0, units: list[float] | None = None) -> StepMicros:
    """``plan``'s replica's packed micro-batches of step ``step``: tokens (its rows' lengths summed, tokens),
    image tokens (each row's ``units``, :func:`tower_units`, else its image and video tokens, summed) and rows."""
    stats = plan.packing_stats(step)
    tokens = tuple(stats["tokens"])
    return StepMicros(tokens, tokens, tuple(plan.micro_costs(step, _image_column(plan.dataset, units))),
                      tuple(stats["rows"]))


def padded_micros(plan: PackedPlan, micro_batch_size: int, step: int = 0,
                  units: list[float] | None = None) -> StepMicros:
    """The rows of :func:`packed_micros` (the same step and replica), in stream order, in micro-batches of
    ``micro_batch_size`` rows (the last one may hold fewer), each computing ``rows * longest row`` tokens.

    Raises:
        ValueError: ``micro_batch_size`` below 1.
    """
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    images = _image_column(plan.dataset, units)
    placed = plan.placed(step)[plan.replica * plan.num_micro:(plan.replica + 1) * plan.num_micro]
    rows = [row for _, row in sorted(p for b in placed for p in b)]
    chunks = [rows[i:i + micro_batch_size] for i in range(0, len(rows), micro_batch_size)]
    return StepMicros(tuple(len(c) * max(plan.lengths[r] for r in c) for c in chunks),
                      tuple(sum(plan.lengths[r] for r in c) for c in chunks),
                      tuple(sum(images[r] for r in c) for c in chunks), tuple(len(c) for c in chunks))


def mean_tokens(micros: StepMicros) -> tuple[float, float]:
    """``(tokens, image tokens)`` per micro-batch of ``micros``, their means: the reference of the weights when
    the profile was measured (its micro-batch is taken to be the step's mean packed micro-batch)."""
    n = len(micros.tokens)
    return sum(micros.tokens) / n, sum(micros.image_tokens) / n


def micro_weights(micros: StepMicros, reference_tokens: float,
                  reference_image_tokens: float) -> tuple[tuple[float, ...], tuple[float, ...] | None]:
    """``(weights, preprocess_weights)`` of ``micros`` for :class:`~mpipe_hf.schedule.simulate.Costs`:
    ``tokens[m] / reference_tokens`` and ``image_tokens[m] / reference_image_tokens``, the references being the
    profile's tokens and image tokens per micro-batch: ``mpipe-hf plan``'s ``--tokens`` / ``--image-tokens`` for
    an estimated profile, else :func:`mean_tokens` of the packed step. ``preprocess_weights`` is ``None``
    (uniform) when ``reference_image_tokens`` is 0 (a profile with no image tokens).

    Raises:
        ValueError: ``reference_tokens`` not > 0, or ``reference_image_tokens`` < 0.
    """
    if not reference_tokens > 0 or reference_image_tokens < 0:
        raise ValueError(f"reference tokens must be > 0 and reference image tokens >= 0, got {reference_tokens} "
                         f"and {reference_image_tokens}")
    weights = tuple(t / reference_tokens for t in micros.tokens)
    if reference_image_tokens == 0:
        return weights, None
    return weights, tuple(i / reference_image_tokens for i in micros.image_tokens)


def simulate_micros(profile, cfg, layers_per_stage: list[int], text_layers: int, micros: StepMicros,
                    reference: tuple[float, float], owners: str = "modulo", experts=None) -> SimulatedRows:
    """Simulate ``micros`` in schedule runs of ``cfg.num_micro`` micro-batches (the last of what is left), each
    under ``profile``'s costs (:func:`~mpipe_hf.schedule.tune.costs_for`) weighed by :func:`micro_weights` against
    ``reference`` (tokens, image tokens). ``owners="balanced"``: each run's owners by
    :func:`~mpipe_hf.schedule.owners.step_owners` on its image tokens (its tokens when it has none), starting even.
    ``experts``: expert parallelism's :class:`~.plan_experts.ExpertPlan` (its all-to-alls weighed with the tokens).
    Returns the runs' summed time (seconds) and their time-weighted bubble."""
    seconds = idle = 0.0
    weights, pre = micro_weights(micros, *reference)
    starts = range(0, len(micros.tokens), cfg.num_micro)
    for start in starts:
        part = slice(start, start + cfg.num_micro)
        run = dataclasses.replace(cfg, num_micro=len(weights[part]), owners=None)
        if owners == "balanced":
            load = micros.image_tokens[part] if sum(micros.image_tokens[part]) else micros.tokens[part]
            run = with_owners(run, step_owners("balanced", load, run))
        costs = dataclasses.replace(with_all_to_all(costs_for(profile, run, layers_per_stage, text_layers), experts),
                                    micro_weights=weights[part],
                                    micro_preprocess_weights=None if pre is None else pre[part])
        sim = simulate(build_schedule(run, costs), costs)
        seconds, idle = seconds + sim.makespan, idle + sim.mean_bubble * sim.makespan
    return SimulatedRows(seconds, idle / seconds if seconds else 0.0, len(starts))


def packed_table(micros: StepMicros, budget: int, weights, pre) -> list[str]:
    """One line per packed micro-batch: rows, tokens, fill (tokens / ``budget``), image tokens and weights."""
    lines = [f"{'micro':>5} {'rows':>4} {'tokens':>6} {'fill':>5} {'image':>6} {'weight':>7} {'P weight':>8}"]
    for m, (t, i, r) in enumerate(zip(micros.tokens, micros.image_tokens, micros.rows)):
        lines.append(f"{m:>5} {r:>4} {t:>6} {t / budget:5.2f} {round(i):>6} {weights[m]:7.3f} "
                     f"{'-' if pre is None else f'{pre[m]:.3f}':>8}")
    return lines


def packed_section(recipe, config, result, reference: tuple[float, float] | None = None, step: int = 0) -> str:
    """``mpipe-hf plan``'s packed part for a recipe with ``data.packing``: step ``step``'s packed micro-batches of
    replica 0 (:func:`packed_table`), and the simulated time and bubble of the packed step against the same rows
    padded at ``data.micro_batch_size`` rows (:func:`simulate_micros`), on ``result``'s profile and layout
    (a :class:`~.plan.Plan`). ``reference``: the estimated profile's ``(tokens, image tokens)`` per micro-batch;
    ``None`` (a measured profile): the packed step's means (:func:`mean_tokens`). When the data does not load,
    one line saying why."""
    data, cfg = recipe.data, recipe.schedule()
    try:
        dataset, _ = load_data(recipe, config, load_processor(recipe, config), quiet=True)
    except Exception as err:  # noqa: BLE001 - the plan stands without the data; say why and skip
        return f"packed step: not shown, the data did not load: {type(err).__name__}: {str(err).splitlines()[0]}"
    plan, units = packed_plan(dataset, config, recipe, cfg.num_micro), tower_units(dataset, config)
    packed, padded = packed_micros(plan, step, units), padded_micros(plan, data.micro_batch_size, step, units)
    source = "the profile's micro-batch" if reference else "the packed step's mean micro-batch (measured profile)"
    reference = reference or mean_tokens(packed)
    args = (result.profile, cfg, result.layers_per_stage, recipe.parallel.text_layers)
    fast = simulate_micros(*args, packed, reference, recipe.parallel.owners, result.experts)
    slow = simulate_micros(*args, padded, reference, recipe.parallel.owners, result.experts)
    rows, tokens = sum(packed.rows), sum(packed.tokens)
    lines = [f"packed step {step} (data.packing, {data.token_budget} tokens a micro-batch; replica 0 of "
             f"{recipe.parallel.dp_size}); weights against {source}: {reference[0]:g} tokens, {reference[1]:g} "
             f"image tokens"]
    lines += packed_table(packed, data.token_budget, *micro_weights(packed, *reference))
    lines.append(f"packed: {rows} rows, {tokens} tokens in {len(packed.tokens)} micro-batches, {fast.steps} step: "
                 f"{fast.seconds:.4g} s, bubble {fast.bubble:.3f}")
    lines.append(f"padded: the same {rows} rows at data.micro_batch_size = {data.micro_batch_size} a micro-batch "
                 f"(rows x longest row each): {sum(padded.tokens)} tokens ({padded.padding:.1%} padding) in "
                 f"{len(padded.tokens)} micro-batches, {slow.steps} step(s) of at most {cfg.num_micro}: "
                 f"{slow.seconds:.4g} s, bubble {slow.bubble:.3f}")
    lines.append(f"packed / padded time: {fast.seconds / slow.seconds:.3f}")
    return "\n".join(lines)
