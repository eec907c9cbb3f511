"""Training rows from any source and layout (docs/data.md): each source read (:mod:`.containers`), checked and
counted once (:mod:`.prepare`), its kept rows mixed with the other sources' by weight
(``datasets.interleave_datasets``), as one :class:`ConversationDataset`.

Every row becomes ``{"messages": [{"role", "content": [parts]}], "images": [references], "videos":
[references]}`` (or ``{"text"}`` in the ``text`` layout); images and videos stay where they are until the collator
of the micro-batch that holds them opens them, so only a micro-batch's owner decodes them (SPEC.md,
"DATA_LOAD"). The rendering, tokens and labels are :mod:`.conversation_encoder`'s, the micro-batch
:mod:`.conversation_collator`'s (their public names are importable from here too).
"""

from __future__ import annotations

import json
import math
import os
import warnings
from dataclasses import dataclass, field
from typing import Sequence

import datasets

from .containers import as_container, read_container
from .conversation_collator import ConversationCollator
from .conversation_encoder import ConversationEncoder, Encoded
from .conversation_rows import PLACEHOLDER, ROLES, plain_messages
from .layouts import open_image
from .prepare import FEATURES, RowCheck, detect_layout, prepare

__all__ = ["FEATURES", "PLACEHOLDER", "ROLES", "ConversationCollator", "ConversationDataset", "ConversationEncoder",
           "Encoded", "Prepared", "Source", "dropped_warning", "load_conversation_dataset", "load_sources", "read_source"]
KEPT = ("ok", "cut")


@dataclass(frozen=True)
class Source:
    """One source of rows, as a recipe's ``data`` names it (:class:`mpipe_hf.train.recipe_data.DataSource`);
    ``path`` may also be a dataset object (:func:`~.containers.as_container`)."""

    path: object
    format: str = "auto"
    images: str | None = None
    weight: float = 1.0
    split: str = "train"


@dataclass
class ConversationDataset:
    """The rows a run trains on, mixed from its sources (module docstring).

    ``rows`` is a ``datasets.Dataset`` of :data:`~.prepare.FEATURES`; ``dataset[i]`` gives row ``i`` ready for
    the collator, ``where(i)`` its file and line (or row index). ``num_tokens[i]`` is row ``i``'s length in tokens
    before truncation (images and videos expanded); ``image_tokens[i]`` the tokens its images take, counted from
    the image headers, and ``video_tokens[i]`` its videos', from the video headers (every rank has them without
    decoding anything; :attr:`visual_tokens`, their sum, is what load-aware owners balance,
    :mod:`mpipe_hf.schedule.owners`). ``dropped`` maps each row left out for ``max_length`` to the reason;
    ``bad`` lists ``(where, reason)`` of each row that failed the check, left out too. ``layout`` is the rows'
    layout (``text``: ``{"text"}`` rows of a decoder-only LM)."""

    path: str
    rows: datasets.Dataset
    num_tokens: list[int]
    dropped: dict[str, str] = field(default_factory=dict)
    image_tokens: list[int] = field(default_factory=list)
    bad: list[tuple[str, str]] = field(default_factory=list)
    layout: str = "messages"
    video_tokens: list[int] = field(default_factory=list)

    @property
    def visual_tokens(self) -> list[int]:
        """Each row's image and video tokens together: what its rows cost the vision tower (a video token is
        ``spatial_merge_size ** 2`` patches of the same tower, as an image token is)."""
        videos = self.video_tokens or [0] * len(self.image_tokens)
        return [i + v for i, v in zip(self.image_tokens, videos)]

    @property
    def num_dropped(self) -> int:
        return len(self.dropped)

    def __len__(self) -> int:
        return len(self.rows)

    def where(self, index: int) -> str:
        """Row ``index``'s file and 1-based line (or row index)."""
        return self.rows[int(index)]["where"]

    def __getitem__(self, index: int) -> dict:
        row = self.rows[int(index)]
        if self.layout == "text":
            return {"where": row["where"], "text": row["text"]}
        return {"where": row["where"], "messages": plain_messages(row["messages"]),
                "images": [open_image(ref) for ref in row["images"]],
                "videos": [json.loads(ref) for ref in row.get("videos") or []],
                "resize": json.loads(row["visual"]).get("resize") if row.get("visual") else None}


@dataclass
class Prepared:
    """One source's rows after the check (:func:`~.prepare.prepare`): ``rows``, their ``layout``, the raw rows'
    ``datasets`` ``fingerprint`` (what a clean row list is tied to) and the source's ``label``."""

    rows: datasets.Dataset
    layout: str
    fingerprint: str
    label: str


def read_source(source, processor, max_length: int | None, model_type: str | None = None, *,
                chat_template: str | None = None, decode: bool = False, num_proc: int | None = None,
                caps=None) -> Prepared:
    """The prepared rows of one ``source`` (:class:`Source`-like): read, the layout told
    (``format: auto``), every row checked and counted (:func:`~.prepare.prepare`; with ``decode`` every image is
    decoded; ``caps``: the per-row visual caps, :class:`~.budgets.RowCaps`). A training start reuses the rows
    ``mpipe-hf check-data`` decoded.

    Raises:
        ValueError: the container cannot be read, its image folder is not a folder, or its layout cannot be told
            (naming the file and row); text rows for a vision-language processor.
    """
    if source.images is not None and not os.path.isdir(source.images):
        raise ValueError(f"{source.path}: its image folder (data.images) {source.images!r} is not a folder")
    if isinstance(source.path, (str, os.PathLike)):
        path = os.fspath(source.path)
        container = read_container(path, source.split)
        base = source.images or (path if os.path.isdir(path) else os.path.dirname(path))
    else:  # a dataset object (MPipeTrainer's train_dataset): image paths relative to the working directory
        container, base = as_container(source.path), source.images or os.getcwd()
    layout = detect_layout(container) if source.format == "auto" else source.format
    if layout == "text" and getattr(processor, "image_processor", None) is not None:
        raise ValueError(f"{container.label}: text rows ({{'text': ...}}) train a decoder-only LM; a vision-language "
                         f"model reads conversations: write each row as {{'messages': [user turn, assistant turn]}} "
                         f"(data.format: {source.format})")
    per_row = "auto" if source.format == "auto" and layout != "text" else layout  # a file may mix layouts
    check = RowCheck(container, per_row, os.path.abspath(base), processor, max_length, model_type, chat_template,
                     decode, caps)
    stricter = () if decode else (RowCheck(container, per_row, os.path.abspath(base), processor, max_length,
                                           model_type, chat_template, True, caps),)
    return Prepared(prepare(container, check, num_proc, stricter), layout, container.rows._fingerprint,
                    container.label)


def column(rows: datasets.Dataset, name: str) -> list:
    """Column ``name`` of ``rows`` as a list, read through Arrow at once (not row by row)."""
    return rows.with_format("arrow")[name].to_pylist()


def _clean_list(path: str | None, source, key_rows: str) -> set[int] | None:
    """The row indices ``mpipe-hf check-data --write-clean`` kept of ``source`` (``None``: no list)."""
    if path is None:
        return None
    try:
        with open(path) as f:
            listed = json.load(f)
    except (OSError, ValueError) as err:
        raise ValueError(f"data.clean_rows {path}: cannot read it ({type(err).__name__}: {err}); write it with "
                         f"mpipe-hf check-data RECIPE --write-clean {path}") from err
    if not isinstance(listed, dict) or not isinstance(listed.get("sources"), dict):
        raise ValueError(f"data.clean_rows {path} is not a row list of mpipe-hf check-data --write-clean (no "
                         f"'sources' mapping)")
    entry = listed["sources"].get(os.path.abspath(source.path))
    if entry is None:
        raise ValueError(f"data.clean_rows {path} has no row list for {source.path}; run mpipe-hf check-data again")
    if entry.get("rows_fingerprint") != key_rows:
        raise ValueError(f"{source.path} changed since mpipe-hf check-data wrote data.clean_rows {path}; run it "
                         f"again")
    return set(entry["keep"])


LEFT_OUT = ("over max_length", "over max_visual_tokens", "failed the data check", "failed to load")
"""Why a row is left out of a run, in the order the counts are given: too long for ``data.max_length`` (the cut
would go through an image's tokens, or leave no assistant token), its images and videos over
``data.max_visual_tokens`` even at the floors, failing the check at launch (a file that cannot be read, a row the
template cannot render, ...), or failing to load during training (a frame or image that does not decode)."""


def size_reason(error: str) -> str:
    """The :data:`LEFT_OUT` reason of a row dropped for its size, from its ``dropped`` text."""
    return LEFT_OUT[1] if error.startswith("max_visual_tokens=") else LEFT_OUT[0]


def left_out_counts(dropped: dict[str, str], bad: int = 0, failed_to_load: int = 0) -> dict[str, int]:
    """``{reason: rows}`` a run left out (:data:`LEFT_OUT`, in that order, each reason with at least one row): the
    rows ``dropped`` for their size (a :class:`ConversationDataset`'s ``{where: why}``), ``bad`` rows that failed
    the check at launch and ``failed_to_load`` rows that failed during training."""
    counts = dict.fromkeys(LEFT_OUT, 0)
    for error in dropped.values():
        counts[size_reason(error)] += 1
    counts[LEFT_OUT[2]] += bad
    counts[LEFT_OUT[3]] += failed_to_load
    return {reason: n for reason, n in counts.items() if n}


def counts_text(counts: dict[str, int]) -> str:
    """``"2 over max_length, 1 failed to load"``, or ``"none"``."""
    return ", ".join(f"{n} {reason}" for reason, n in counts.items()) or "none"


def _no_rows(label: str, bad: list, dropped: dict) -> ValueError:
    """The error for a source (or a mix) with no row left: the counts by reason, and the first bad (else dropped)
    row."""
    first = [f"{where}: {why}" for where, why in (bad or list(dropped.items()))[:1]]
    counts = counts_text(left_out_counts(dropped, len(bad)))
    return ValueError(f"{label}: no row left to train on (rows left out: {counts}"
                      + (f"; the first: {first[0]}" if first else "") + ")")


def load_sources(sources: Sequence, processor, max_length: int | None, model_type: str | None = None, *,
                 seed: int = 0, stopping: str = "first_exhausted", clean_rows: str | None = None,
                 num_proc: int | None = None, chat_template: str | None = None, caps=None) -> ConversationDataset:
    """The kept rows of ``sources`` (each :func:`read_source`, under ``caps``, the per-row visual caps of
    :class:`~.budgets.RowCaps`; with ``clean_rows``, only the rows that list keeps), mixed by weight when there
    are several (``interleave_datasets``, ``probabilities`` the weights normalised, seeded by ``seed``,
    ``stopping_strategy`` ``stopping``). Rows that fail the check are left out and
    listed in ``bad``; the caller decides what they cost (:func:`mpipe_hf.train.sources.load_data`).

    Raises:
        ValueError: a source cannot be read, or its weight is not a finite number > 0; sources of different
            layouts where one is ``text``; no row left (naming the first bad or dropped row).
    """
    parts, layouts, bad, dropped = [], set(), [], {}
    for source in sources:
        weight = source.weight
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight < math.inf:
            raise ValueError(f"{source.path}: a source's weight must be a finite number > 0, got {weight!r}")
        done = read_source(source, processor, max_length, model_type, chat_template=chat_template,
                           num_proc=num_proc, caps=caps)
        prepared = done.rows
        layouts.add("text" if done.layout == "text" else "conversation")
        listed = _clean_list(clean_rows, source, done.fingerprint)
        status, wheres, errors = (column(prepared, name) for name in ("status", "where", "error"))
        keep = [i for i, s in enumerate(status) if s in KEPT and (listed is None or i in listed)]
        own_bad = [(wheres[i], errors[i]) for i, s in enumerate(status)
                   if s == "bad" and (listed is None or i in listed)]
        own_dropped = {wheres[i]: errors[i] for i, s in enumerate(status) if s == "dropped"}
        if not keep and len(sources) > 1:  # interleave_datasets would refuse it naming only its index
            raise _no_rows(f"{source.path} (one of the data sources)", own_bad, own_dropped)
        bad, dropped = bad + own_bad, {**dropped, **own_dropped}
        parts.append(prepared.select(keep, keep_in_memory=True))
    if len(layouts) > 1:
        raise ValueError("data sources mix text rows with conversations; a run reads one or the other")
    weights = [float(s.weight) for s in sources]
    rows = parts[0] if len(parts) == 1 else datasets.interleave_datasets(
        parts, probabilities=[w / sum(weights) for w in weights], seed=seed, stopping_strategy=stopping)
    label = str(sources[0].path) if len(sources) == 1 and isinstance(sources[0].path, (str, os.PathLike)) else (
        "the dataset" if len(sources) == 1 else f"{len(sources)} sources")
    if len(rows) == 0:
        raise _no_rows(label, bad, dropped)
    return ConversationDataset(label, rows, column(rows, "num_tokens"), dropped, column(rows, "image_tokens"), bad,
                               "text" if layouts == {"text"} else "messages", column(rows, "video_tokens"))


def dropped_warning(dataset: ConversationDataset, max_length: int | None, limit: int = 20) -> str:
    """One line: how many rows were dropped for their size, by reason (over ``max_length``, over
    ``max_visual_tokens``: :func:`size_reason`), and where (at most ``limit`` named)."""
    shown = [f"{where} ({why})" for where, why in list(dataset.dropped.items())[:limit]]
    more = f", ... ({dataset.num_dropped - limit} more)" if dataset.num_dropped > limit else ""
    counts = {}
    for why in dataset.dropped.values():
        reason = size_reason(why) + (f"={max_length}" if size_reason(why) == LEFT_OUT[0] else "")
        counts[reason] = counts.get(reason, 0) + 1
    return (f"{dataset.path}: dropped {dataset.num_dropped} of {dataset.num_dropped + len(dataset)} rows "
            f"({counts_text(counts)}): {'; '.join(shown)}{more}")


def load_conversation_dataset(path: str, processor, max_length: int | None, chat_template: str | None = None,
                              model_type: str | None = None, format: str = "auto") -> ConversationDataset:
    """The rows of one file or folder (:func:`load_sources` of one :class:`Source`), refusing any bad row.

    Raises:
        ValueError: the first bad row's text (``file:LINE: reason``), with the count of the others; as
            :func:`load_sources`.
    """
    dataset = load_sources([Source(path, format)], processor, max_length, model_type, chat_template=chat_template)
    if dataset.dropped:
        warnings.warn(dropped_warning(dataset, max_length), stacklevel=2)
    if dataset.bad:
        where, reason = dataset.bad[0]
        more = f" (and {len(dataset.bad) - 1} more bad rows: mpipe-hf check-data lists them)" if len(
            dataset.bad) > 1 else ""
        raise ValueError(f"{where}: {reason}{more}")
    return dataset
