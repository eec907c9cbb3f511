"""Packed micro-batches: the rows of a micro-batch concatenated into one sequence with no padding
(:func:`pack_micro`, :class:`PackedCollate`), and the planner that says which dataset rows form each packed
micro-batch of a step (:class:`PackedPlan`): a window of the row stream, each step's bins chosen by
:func:`~.bin_packing.pack_step` (best-fit decreasing, then LPT rebalancing by cost), rows that fit nowhere waiting
for a later step. A row is never split."""

from __future__ import annotations

import bisect
import functools
import math
from typing import Callable, Sequence

import torch

from .apart import keep_apart
from .bin_packing import pack_step
from .collate import IGNORE
from .owner import MicroBatchPlan

# image tensors whose leading dim is the micro-batch's rows (Idefics3 / SmolVLM): (B, tiles, ...) -> (1, B*tiles, ...)
BATCH_SHAPED = ("pixel_values", "pixel_attention_mask")
# image tensors never taken as per-token, whatever their shape
IMAGE_KEYS = ("pixel_values", "pixel_values_videos", "pixel_attention_mask", "image_grid_thw", "video_grid_thw",
              "image_sizes", "batch_num_images")


def _batch_shaped(batch: dict, rows: int) -> tuple[str, ...]:
    """The keys of :data:`BATCH_SHAPED` to flatten: only the Idefics3 / SmolVLM layout, told by its
    ``pixel_attention_mask`` ``(B, tiles, h, w)`` next to ``pixel_values`` ``(B, tiles, C, h, w)`` (LLaVA-NeXT's
    ``(images, crops, C, h, w)`` has no such mask and stays as it is even when ``images == B``)."""
    mask, pixels = batch.get("pixel_attention_mask"), batch.get("pixel_values")
    if not (isinstance(mask, torch.Tensor) and isinstance(pixels, torch.Tensor)):
        return ()
    if mask.dim() == 4 and pixels.dim() == 5 and mask.shape[0] == pixels.shape[0] == rows:
        return BATCH_SHAPED
    return ()


def pack_micro(batch: dict) -> dict:
    """One collated micro-batch -> one packed sequence with no padding.

    Every per-token tensor (``input_ids``, ``labels``, ``mm_token_type_ids``, ``token_type_ids``, ...: any tensor
    of ``input_ids``' shape ``(B, L)`` that is not an image key) becomes ``(1, N)``, ``N`` the real tokens
    (``attention_mask == 1``; right or left padding), the rows concatenated in order. ``attention_mask`` is removed
    (no mask = no padding). The first token of every row gets label ``-100``: the LM head scores ``logits[i]``
    against ``labels[i + 1]``, so without it a row's last token would predict the next row's first token (nothing
    predicts it unpacked); the label tokens counted after the shift are those of the unpacked batch. New key
    ``packed_lengths``: int64 CPU ``(B,)``, each row's real tokens. Image tensors are per image in row order and
    stay as they are, except Idefics3 / SmolVLM's batch-shaped :data:`BATCH_SHAPED` ``pixel_values``
    ``(B, tiles, C, h, w)`` -> ``(1, B*tiles, C, h, w)`` and ``pixel_attention_mask`` ``(B, tiles, h, w)`` ->
    ``(1, B*tiles, h, w)`` (the model drops the all-zero tiles). A batch with ``packed_lengths`` is returned as is.

    Raises:
        ValueError: no 2-D ``input_ids``, or ``labels`` / ``attention_mask`` of another shape.
    """
    if "packed_lengths" in batch:
        return batch
    ids = batch.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        raise ValueError("pack_micro needs input_ids of shape (B, L)")
    shape = tuple(ids.shape)
    for key in ("attention_mask", "labels"):
        if key in batch and tuple(batch[key].shape) != shape:
            raise ValueError(f"pack_micro: {key} has shape {tuple(batch[key].shape)}, input_ids {shape}")
    mask = batch.get("attention_mask")
    keep = torch.ones(shape, dtype=torch.bool) if mask is None else mask.to("cpu", torch.bool)
    lengths = keep.sum(1).to(torch.int64)
    flat, tiles = keep.reshape(-1), _batch_shaped(batch, shape[0])
    out = {}
    for key, value in batch.items():
        if key == "attention_mask":
            continue
        if isinstance(value, torch.Tensor) and tuple(value.shape) == shape and key not in IMAGE_KEYS:
            out[key] = value.reshape(-1)[flat.to(value.device)].unsqueeze(0)
        elif key in tiles:
            out[key] = value.reshape(1, -1, *value.shape[2:])
        else:
            out[key] = value
    if "labels" in out:
        starts = (torch.cumsum(lengths, 0) - lengths)[lengths > 0]
        out["labels"][0, starts.to(out["labels"].device)] = IGNORE
    out["packed_lengths"] = lengths
    return out


def _packed_null(collate) -> dict:
    return pack_micro(collate.null_batch())


class PackedCollate:
    """``rows -> pack_micro(collate(rows))``. Has ``null_batch()`` (the inner collator's, packed) only when the
    inner collator has one, so ``getattr(packed, "null_batch", None)`` is ``None`` otherwise (what
    :meth:`~.owner.MicroBatchPlan.load_rows` checks). Other attributes are read from the inner collator."""

    def __init__(self, collate: Callable[[list], dict]):
        self.collate = collate
        if callable(getattr(collate, "null_batch", None)):
            self.null_batch = functools.partial(_packed_null, collate)

    def __call__(self, rows: list) -> dict:
        return pack_micro(self.collate(rows))

    def __getattr__(self, name: str):
        if name.startswith("__") or name in ("collate", "null_batch"):
            raise AttributeError(name)
        return getattr(self.__dict__["collate"], name)


# steps a row may wait in the packer's buffer before it goes first (oldest first): pure best-fit decreasing leaves
# short rows waiting for hundreds of steps, as long rows keep arriving to fill the bins before them
STALE_AFTER = 4


def default_window(lengths: Sequence[int], num_bins: int, budget: int) -> int:
    """Rows the packer looks at per step: enough to fill the step's ``num_bins`` bins 4 times at the mean row
    length, at least 16, at most ``len(lengths)`` (a small dataset's step does not take each row several times
    over), and at least ``num_bins``."""
    mean = sum(lengths) / len(lengths)
    return max(num_bins, min(len(lengths), max(16, math.ceil(4 * num_bins * budget / mean))))


def _checked_inputs(n: int, budget: int, lengths, costs) -> tuple[list[int], list[float]]:
    """``lengths`` and ``costs`` as lists, checked (see :class:`PackedPlan`)."""
    if budget < 1:
        raise ValueError(f"data.max_tokens_per_micro must be >= 1, got {budget}")
    lengths = [int(x) for x in lengths]
    if len(lengths) != n:
        raise ValueError(f"lengths gives {len(lengths)} lengths for {n} dataset rows")
    for i, length in enumerate(lengths):
        if length < 1:
            raise ValueError(f"lengths[{i}] = {length}: dataset row {i} has no token")
        if length > budget:
            raise ValueError(f"dataset row {i} has {length} tokens, more than data.max_tokens_per_micro = {budget} "
                             f"(cut or drop it by max_length)")
    costs = [float(x) for x in lengths] if costs is None else [float(x) for x in costs]
    if len(costs) != n:
        raise ValueError(f"costs gives {len(costs)} costs for {n} dataset rows")
    for i, cost in enumerate(costs):
        if not math.isfinite(cost) or cost < 0:
            raise ValueError(f"costs[{i}] = {cost}: the cost of dataset row {i} must be finite and >= 0")
    return lengths, costs


class PackedPlan(MicroBatchPlan):
    """Token-budget micro-batches: which dataset rows form packed micro ``m`` of step ``k``.

    The rows stream as :class:`~.owner.MicroBatchPlan` reads them (stream position ``p`` -> row
    ``order(p // n)[p % n]``, each epoch's order :func:`~.owner.epoch_order` with ``shuffle``, file order
    without, epoch after epoch). Step ``k`` fills ``num_replicas * num_micro`` bins of ``max_tokens_per_micro``
    tokens: the buffer is refilled from the stream up to ``window`` rows; :func:`~.bin_packing.pack_step` chooses
    rows by best-fit decreasing on length and rebalances them by cost (LPT); rows that fit nowhere wait in the
    buffer, and a row that has waited :data:`STALE_AFTER` steps goes first (oldest first), so none waits for long;
    with ``kinds`` (the collator's family's ``media_apart``) no bin holds both an image and a video row
    (:mod:`.apart`).
    A row is never split. Bin ``replica * num_micro + micro`` is micro ``micro`` of replica ``replica``. Every rank
    computes the same bins (a pure function of lengths, costs, seed, shuffle, window, budget and bins), with no
    dataset read: steps are computed in order, once (a resume at step ``k`` replays steps ``0 .. k-1``).

    ``collate`` is wrapped in :class:`PackedCollate`, so :meth:`load` / :meth:`load_rows` (bad rows dropped, the
    null micro-batch) give packed micro-batches (:func:`pack_micro`); :meth:`micro_costs` works on :meth:`rows`.

    Args:
        dataset, collate, num_micro, validate, shuffle, seed, replica, num_replicas, drop_bad_rows: as
            :class:`~.owner.MicroBatchPlan` (``validate`` sees the packed micro-batch).
        max_tokens_per_micro: the token budget of a micro-batch (``data.max_tokens_per_micro``).
        lengths: ``lengths[i]``, dataset row ``i``'s tokens after the cut (``min(num_tokens[i], max_length)``).
        costs: ``costs[i]``, row ``i``'s balancing cost (e.g. its text and image tokens weighed by the cost
            profile); default ``lengths``.
        window: rows in the buffer per step; default :func:`default_window`.
        cost_budget: the most ``costs`` a micro-batch holds besides its tokens (:func:`~.bin_packing.pack_step`);
            ``None``: none.

    Raises:
        ValueError: naming the field: ``max_tokens_per_micro`` below 1, ``len(lengths)`` or ``len(costs)`` not
            ``len(dataset)``, a length below 1 or above the budget (naming the row), a negative or non-finite
            cost, ``window`` below the step's bins, ``num_micro`` or ``num_replicas`` below 1, an empty dataset, a
            ``cost_budget`` below a row's cost.
    """

    def __init__(self, dataset, collate: Callable, num_micro: int, max_tokens_per_micro: int, lengths,
                 costs=None, validate: Callable[[dict], None] | None = None, shuffle: bool = False, seed: int = 0,
                 replica: int = 0, num_replicas: int = 1, drop_bad_rows: bool = True, window: int | None = None,
                 cost_budget: float | None = None):
        super().__init__(dataset, collate, num_micro, 1, validate, shuffle, seed, replica, num_replicas, drop_bad_rows)
        if num_micro < 1 or num_replicas < 1:
            raise ValueError(f"num_micro and num_replicas must be >= 1, got {num_micro} and {num_replicas}")
        self.budget = int(max_tokens_per_micro)
        self.lengths, self.costs = _checked_inputs(len(dataset), self.budget, lengths, costs)
        if cost_budget is not None and not max(self.costs, default=0.0) <= cost_budget < math.inf:
            raise ValueError(f"cost_budget = {cost_budget} is below a row's cost ({max(self.costs)}) or not finite")
        self.cost_budget = cost_budget
        self.num_bins = num_replicas * num_micro
        self.window = default_window(self.lengths, self.num_bins, self.budget) if window is None else int(window)
        if self.window < self.num_bins:
            raise ValueError(f"window = {self.window} rows is below the step's {self.num_bins} micro-batches")
        self.collate = collate if isinstance(collate, PackedCollate) else PackedCollate(collate)
        self._steps: list[list[list[tuple[int, int]]]] = []  # step -> bin -> (stream position, row)
        self._buffer: list[tuple[int, int, int]] = []  # (stream position, row, step it entered), in stream order
        self._next, self._per_epoch = 0, None

    def _row_at(self, position: int) -> int:
        n = len(self.dataset)
        return self._order(position // n)[position % n] if self.shuffle else position % n

    def _pack_next(self) -> None:
        """The next step's bins from the buffer, refilled from the stream."""
        step = len(self._steps)
        while len(self._buffer) < self.window:
            self._buffer.append((self._next, self._row_at(self._next), step))
            self._next += 1
        items = self._buffer
        stale = bisect.bisect_right([entered for _, _, entered in items], step - STALE_AFTER)
        lengths, costs = [self.lengths[r] for _, r, _ in items], [self.costs[r] for _, r, _ in items]
        bins, left = pack_step(lengths, costs, self.num_bins, self.budget, stale, self.cost_budget)
        if self.kinds is not None:  # the collator's family's media_apart (MicroBatchPlan.kinds)
            bins, left = keep_apart(bins, left, [self.kinds[r] for _, r, _ in items], lengths, costs, self.budget,
                                    self.cost_budget)
        self._steps.append([[items[i][:2] for i in b] for b in bins])
        self._buffer = [items[i] for i in left]

    def placed(self, step: int) -> list[list[tuple[int, int]]]:
        """Every bin of step ``step`` (all replicas, bin ``replica * num_micro + micro``), each a list of
        ``(stream position, dataset row)`` in stream order. Computes the steps up to ``step`` once."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        while len(self._steps) <= step:
            self._pack_next()
        return self._steps[step]

    def bins(self, step: int) -> list[list[int]]:
        """The dataset rows of every bin of step ``step`` (all replicas), as :meth:`placed`."""
        return [[row for _, row in b] for b in self.placed(step)]

    def rows(self, step: int, micro: int) -> list[int]:
        """The dataset indices of this replica's packed micro ``micro`` of step ``step``, in stream order."""
        return [row for _, row in self.placed(step)[self.replica * self.num_micro + micro]]

    def steps_per_epoch(self) -> float:
        """Steps the packer takes to place every row of epoch 0 (replayed once): the steps before the one that
        places the last of them, plus the share of that step's rows that are epoch 0's."""
        if self._per_epoch is None:
            n, done, step = len(self.dataset), 0, 0
            while True:
                positions = [p for b in self.placed(step) for p, _ in b]
                now = sum(p < n for p in positions)
                done += now
                if done == n:
                    self._per_epoch = step + now / len(positions)
                    break
                step += 1
        return self._per_epoch

    def packing_stats(self, step: int, all_replicas: bool = False) -> dict[str, list]:
        """This replica's micro-batches of step ``step`` (every bin with ``all_replicas``): ``tokens`` (real tokens of
        each), ``fill`` (tokens / ``max_tokens_per_micro``), ``cost`` (sum of ``costs``), ``rows`` (rows in each)."""
        bins = self.bins(step)
        if not all_replicas:
            bins = bins[self.replica * self.num_micro:(self.replica + 1) * self.num_micro]
        tokens = [sum(self.lengths[r] for r in b) for b in bins]
        return {"tokens": tokens, "fill": [t / self.budget for t in tokens],
                "cost": [sum(self.costs[r] for r in b) for b in bins], "rows": [len(b) for b in bins]}
