"""Image rows and video rows in different micro-batches, for a family whose model cannot take both in
one forward (:attr:`~mpipe_hf.models.family.Family.media_apart`: GLM-4.1V / 4.5V / 4.6V, whose model finds a
video's tokens with the image tokens' mask and raises on a micro-batch holding both).

The planner (:class:`~.owner.MicroBatchPlan`) cuts each epoch's rows into micro-batches of one visual kind
(:func:`apart_blocks`); the packer (:class:`~.packing.PackedPlan`) moves the rows of the other kind out of a bin
that holds both (:func:`keep_apart`). Rows with neither (text only) go with either. Both read the rows' kinds from
the dataset's counts (:func:`row_kinds`), with nothing decoded, so every rank plans the same micro-batches.
"""

from __future__ import annotations

from typing import Sequence

IMAGE, VIDEO = "image", "video"


def media_apart(collate) -> bool:
    """Whether the micro-batches ``collate`` writes are for a model whose family keeps images and videos apart
    (``Family.media_apart``), told by the model type of its encoder (a
    :class:`~.conversation_collator.ConversationCollator`'s, also through a
    :class:`~.packing.PackedCollate`). ``False`` for a collator without one (a user's, ``list``) or a model type
    with no family."""
    model_type = getattr(getattr(collate, "encoder", None), "model_type", None)
    if not model_type:
        return False
    from ..families.registry import family  # at call time: the data layer imports without the families'
    return bool(getattr(family(model_type), "media_apart", False))


def _count_videos(row) -> int:
    """A row's videos: its ``videos`` (a loader row's references), else the video parts of its messages."""
    if not isinstance(row, dict):
        return 0
    if row.get("videos") is not None:
        return len(row["videos"])
    return sum(isinstance(part, dict) and part.get("type") == "video"
               for message in row.get("messages") or [] if isinstance(message, dict)
               for part in (message.get("content") if isinstance(message.get("content"), list) else []))


def row_kinds(dataset) -> list[str | None]:
    """Each row's visual kind: :data:`VIDEO` (a video, with or without images: a row with both is refused alone
    and dropped at load), :data:`IMAGE` (images only) or ``None`` (text only). A
    :class:`~.conversation.ConversationDataset`'s from its ``num_images`` / ``num_videos`` columns (counted by the
    loader); any other dataset's from each row's ``images`` and ``videos`` (or its messages' video parts)."""
    rows = getattr(dataset, "rows", None)
    if {"num_images", "num_videos"} <= set(getattr(rows, "column_names", ())):
        table = rows.with_format("arrow")  # the columns at once, not row by row
        images, videos = table["num_images"].to_pylist(), table["num_videos"].to_pylist()
    else:
        read = [dataset[i] for i in range(len(dataset))]
        images = [len(r.get("images") or []) if isinstance(r, dict) else 0 for r in read]
        videos = [_count_videos(r) for r in read]
    return [VIDEO if v else IMAGE if i else None for i, v in zip(images, videos)]


def apart_kinds(dataset, collate) -> list[str | None] | None:
    """The rows' kinds (:func:`row_kinds`) where the planner must keep image rows and video rows apart: the
    collator's model keeps them apart (:func:`media_apart`) and the dataset holds both; else ``None`` (the plan
    is the one without the rule)."""
    if not media_apart(collate):
        return None
    kinds = row_kinds(dataset)
    return kinds if IMAGE in kinds and VIDEO in kinds else None


def apart_blocks(order: Sequence[int], kinds: Sequence[str | None], size: int) -> list[list[int]]:
    """The rows ``order`` (one epoch's, in stream order) cut into micro-batches of at most ``size`` rows, none
    holding both an :data:`IMAGE` row and a :data:`VIDEO` row: each row joins the oldest open micro-batch that
    takes it (a text-only row: the oldest; an image (video) row: the oldest without a video (image)), else opens
    one; a micro-batch closes when it holds ``size`` rows, and those still open close at the end (at most two
    short micro-batches an epoch, one of images and one of videos). Every row of ``order`` lands in exactly one.

    Returns:
        the micro-batches in the order they close, each its rows in stream order.
    """
    closed, open_blocks = [], []  # open_blocks: [kind or None, rows], oldest first
    for row in order:
        kind = kinds[row]
        block = next((b for b in open_blocks if kind is None or b[0] in (None, kind)), None)
        if block is None:
            block = [kind, []]
            open_blocks.append(block)
        block[0] = block[0] or kind
        block[1].append(row)
        if len(block[1]) == size:
            open_blocks = [b for b in open_blocks if b is not block]
            closed.append(block[1])
    return closed + [rows for _, rows in open_blocks]


def _kind_of(items: list[int], kinds: Sequence[str | None]) -> str | None:
    """The kind of a bin: that of its first visual item (the lowest index: the oldest row), ``None`` for none."""
    return next((kinds[i] for i in sorted(items) if kinds[i] is not None), None)


def keep_apart(bins: list[list[int]], left: list[int], kinds: Sequence[str | None], lengths: Sequence[int],
               costs: Sequence[float], budget: int, cost_budget: float | None = None
               ) -> tuple[list[list[int]], list[int]]:
    """A packer step's ``(bins, left)`` (:func:`~.bin_packing.pack_step` over its buffer's items, ``kinds[i]`` item
    ``i``'s :func:`row_kinds`) with no bin holding both an image row and a video row: each bin keeps the kind of
    its oldest visual item (:func:`_kind_of`) and its items of the other kind leave it; each of those, oldest
    first, goes into the bin of its kind or of text only with room for its ``lengths`` within ``budget`` tokens
    (and its ``costs`` within ``cost_budget``) with the least token room left (ties: the lowest bin), else back
    to ``left`` for a later step. No bin empties (its oldest visual item stays), and the buffer's oldest visual
    row, once placed, always stays: no row waits for ever. Deterministic.

    Returns:
        ``(bins, left)``: each bin's items ascending, and ``left`` ascending.
    """
    kept, moved = [], []
    for items in bins:
        keep = _kind_of(items, kinds)
        kept.append([i for i in items if kinds[i] in (None, keep)])
        moved += [i for i in items if kinds[i] not in (None, keep)]
    left = list(left)
    for i in sorted(moved):
        tokens = [sum(lengths[j] for j in items) for items in kept]
        cost = [sum(costs[j] for j in items) for items in kept]
        fits = [b for b, items in enumerate(kept) if _kind_of(items, kinds) in (None, kinds[i])
                and tokens[b] + lengths[i] <= budget
                and (cost_budget is None or cost[b] + costs[i] <= cost_budget + 1e-9)]
        if fits:
            kept[min(fits, key=lambda b: (budget - tokens[b], b))].append(i)
        else:
            left.append(i)
    return [sorted(items) for items in kept], sorted(left)
