"""What one pipeline step measured (:class:`StepStats`), as :meth:`~.executor.PipelineExecutor.step` returns it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StepStats:
    """What one step measured. ``loss`` is the mean over the step's label tokens; ``bubble`` is the fraction of
    the ranks' wall time spent not computing (``1 - sum busy / sum wall``), and ``rank_bubble[r]`` the same for
    pipeline rank ``r`` alone; ``peak_activations`` is the most
    stage forwards this rank held for their backward at once (its activation-memory peak, in stage-micro units).
    ``rank_activation_bytes[r]``: the most bytes autograd held saved for the stage backwards of rank ``r`` at once
    (the distinct storages its stage forwards saved, weights left out; :mod:`.memory`), when the executor
    measures them, else empty; ``rank_device_bytes[r]``: ``torch.cuda.max_memory_allocated`` over the step on a
    GPU, else empty; ``rank_wall_s[r]``: rank ``r``'s step time, seconds. ``bad_rows``: the rows the step's loads
    dropped on every rank together (a row that failed to load costs that row, not the step; look-ahead loads count
    in the step that made them), ``bad_row``: one of their texts, ``"WHERE (WHY)"``, the same on every rank.
    ``aux_loss``: the MoE load-balancing term inside ``loss`` (``router_aux_loss_coef`` times the loss; the
    micro-batches' mean, or token-weighted as ``loss`` is), ``None`` for a model without one."""

    loss: float
    num_tokens: int
    bubble: float
    wall_s: float
    peak_activations: int
    rank_bubble: list[float] = field(default_factory=list)
    rank_activation_bytes: list[int] = field(default_factory=list)
    rank_device_bytes: list[int] = field(default_factory=list)
    rank_wall_s: list[float] = field(default_factory=list)
    bad_rows: int = 0
    bad_row: str | None = None
    aux_loss: float | None = None
