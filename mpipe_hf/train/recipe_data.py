"""The recipe's ``data`` section (:class:`DataSection`): where the rows come from (one file or folder, or several
sources mixed by weight, each in any layout :mod:`mpipe_hf.data.layouts` knows), the micro-batch size, image
bounds, truncation and what a bad row does.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

from ..data.budgets import RowCaps
from ..data.video import DECODERS

FORMATS = ("auto", "messages", "trl", "llava", "sharegpt", "caption", "text")
STOPPING = ("first_exhausted", "all_exhausted")


@dataclass(frozen=True)
class DataSource:
    """One source of rows (``data.path``, or an item of ``data.sources``).

    Attributes:
        path: a JSON file (a list of rows, or one row per line), a JSONL, a parquet or arrow file, a folder written
            by ``Dataset.save_to_disk``, or a local folder in the hub's layout (``load_dataset(folder)``).
        format: the row layout (:data:`FORMATS`; ``auto``: detected from the first row's keys).
        images: the folder the rows' relative image paths are taken from; ``None``: the file's own folder.
        weight: the source's share of the mixed stream (``datasets.interleave_datasets`` probabilities, after
            normalising the weights to sum to 1).
        split: the split of a ``DatasetDict`` or hub folder.

    Raises:
        ValueError: a ``path`` or ``split`` that is not a non-empty string, a ``format`` outside :data:`FORMATS`,
            an ``images`` that is not a string or null, a ``weight`` that is not a number > 0.
    """

    path: str
    format: str = "auto"
    images: str | None = None
    weight: float = 1.0
    split: str = "train"

    def __post_init__(self):
        for key in ("path", "split"):
            if not isinstance(getattr(self, key), str) or not getattr(self, key):
                raise ValueError(f"data.{key} must be a non-empty string, got {getattr(self, key)!r}")
        if self.format not in FORMATS:
            raise ValueError(f"data.format must be one of {list(FORMATS)}, got {self.format!r}")
        if self.images is not None and (not isinstance(self.images, str) or not self.images):
            raise ValueError(f"data.images must be a folder path or null, got {self.images!r}")
        if isinstance(self.weight, bool) or not isinstance(self.weight, (int, float)) or not 0 < self.weight < math.inf:
            raise ValueError(f"data.sources[i].weight must be a finite number > 0, got {self.weight!r}")


@dataclass(frozen=True)
class DataSection:
    """``data:`` what the model reads.

    Attributes:
        path: one source (:class:`DataSource`'s ``path``), read with ``format``, ``images`` and ``split``; or
            ``None`` with ``sources``.
        sources: several sources, each a mapping with the keys of :class:`DataSource`, mixed by their weights
            with ``datasets.interleave_datasets`` (seeded by ``train.seed``); ``None``: ``path`` alone.
        format, images, split: as :class:`DataSource`, for ``path``.
        mix_stopping: ``first_exhausted`` (the mix ends when one source runs out) or ``all_exhausted`` (the
            smaller sources repeat until every source has been read once), as ``interleave_datasets``.
        clean_rows: a row list written by ``mpipe-hf check-data --write-clean``: only its rows are read.
        num_proc: processes for the data check and the tokenisation (``datasets.map``); ``None``: up to 8,
            at most the machine's cores.
        micro_batch_size: rows per micro-batch.
        min_pixels, max_pixels: image resize bounds of the processor, in pixels (video frames too, as the
            family's video processor takes its image processor's); check-data counts the rows with an image over
            ``max_pixels`` (resized down by the processor).
        video_max_pixels: the most pixels a video frame keeps, at least ``min_pixels``: a video over it gets it as
            its own ``max_pixels`` (:mod:`mpipe_hf.data.budgets`); ``None``: ``max_pixels``.
        max_frames: the most frames a video keeps, at least 2 (one temporal patch): a video sampled to more keeps
            this many; ``None``: the video processor's bound.
        video_decoder: what decodes the rows' video files when a micro-batch is collated (:data:`~mpipe_hf.data.
            video.DECODERS`): ``pyav`` (default, a dependency) or ``torchcodec`` (optional: the ``torchcodec`` extra
            and FFmpeg's shared libraries; docs/video.md, "Decoder"): the same metadata and frames (H.264 bit for
            bit). Token counts read the file's header with PyAV either way (the same fields).
        max_visual_tokens: the most image and video tokens a row takes: a row over it has its images and video
            frames resized down, then its videos' frames thinned, and is dropped (counted, with the reason) when it
            stays over at the smallest sizes; ``None``: no bound.
        shuffle: read each epoch's rows in an order drawn from ``train.seed`` and the epoch (default); else in
            file order.
        max_length: the most tokens a row may take (text and image tokens); a longer row is cut at
            ``max_length``, or dropped with a counted warning when the cut would go through an image's tokens.
        on_bad_sample: ``skip`` (default): a row that fails at run time (an image that does not decode) is
            dropped from its step, which trains on the rest, with a warning naming the file and line; a step with
            no row left, or a loss or gradient norm that is not finite, is skipped; ``raise``: the run stops.
        max_bad_rows: with ``skip``, the run stops with the last error once more than this many rows failed in
            all, or this many steps in a row were skipped. ``max_bad_steps`` is its old name (deprecated).
        eval_path: a file of the same layouts as ``path``: ``train.eval_steps`` and the end of the run report
            ``eval_loss`` over every row of it; ``None``: no evaluation.
        packing: pack rows into micro-batches of one sequence each, up to ``max_tokens_per_micro`` tokens, with
            no padding (:class:`~mpipe_hf.data.packing.PackedPlan`: best-fit over a window of rows, balanced by
            cost); ``micro_batch_size`` is then unused. Each row keeps its own positions and attends
            only to itself (:mod:`mpipe_hf.models.packed`).
        max_tokens_per_micro: the token budget of a packed micro-batch; ``None``: ``max_length``. Rows are cut or
            dropped at the smaller of the two by the ``max_length`` rules (:attr:`row_length`).

    Raises:
        ValueError: a count that is not an integer >= 1, ``min_pixels > max_pixels``, ``video_max_pixels`` below
            ``min_pixels``, ``max_frames`` below 2, a ``shuffle`` that is not a boolean, an ``on_bad_sample`` other
            than ``skip``/``raise``, neither or both of ``path`` and ``sources``, a bad source (:class:`DataSource`),
            a ``mix_stopping`` outside :data:`STOPPING`, a ``video_decoder`` outside ``DECODERS`` (that the files
            exist is checked when the data loads, that torchcodec loads when it first decodes a video: ``mpipe-hf
            plan`` needs neither).
    """

    path: str | None = None
    sources: tuple | None = None
    format: str = "auto"
    images: str | None = None
    split: str = "train"
    mix_stopping: str = "first_exhausted"
    clean_rows: str | None = None
    num_proc: int | None = None
    micro_batch_size: int = 1
    min_pixels: int = 56 * 56
    max_pixels: int = 112 * 112
    video_max_pixels: int | None = None
    max_frames: int | None = None
    max_visual_tokens: int | None = None
    shuffle: bool = True
    max_length: int = 2048
    on_bad_sample: str = "skip"
    max_bad_rows: int = 10
    max_bad_steps: int | None = None  # the old name of max_bad_rows
    eval_path: str | None = None
    packing: bool = False
    max_tokens_per_micro: int | None = None
    video_decoder: str = "pyav"

    def __post_init__(self):
        if self.max_bad_steps is not None:
            warnings.warn("data.max_bad_steps is deprecated: a bad row now costs that row, not its step; write "
                          "data.max_bad_rows", FutureWarning, stacklevel=3)
            object.__setattr__(self, "max_bad_rows", self.max_bad_steps)
            object.__setattr__(self, "max_bad_steps", None)
        if (self.path is None) == (self.sources is None):
            raise ValueError("section 'data' needs data.path (one source) or data.sources (several), not "
                             f"{'both' if self.path is not None else 'neither'}")
        if self.path is not None and (not isinstance(self.path, str) or not self.path):
            raise ValueError(f"data.path must be a file or folder path, got {self.path!r}")
        if self.sources is not None:
            object.__setattr__(self, "sources", self._parsed())
        self.all_sources  # noqa: B018 - validates format, images and split with path
        for key in ("eval_path", "clean_rows"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"data.{key} must be a path or null, got {value!r}")
        optional = ("num_proc", "max_tokens_per_micro", "video_max_pixels", "max_frames", "max_visual_tokens")
        for key in ("micro_batch_size", "min_pixels", "max_pixels", "max_length", "max_bad_rows") + optional:
            value = getattr(self, key)
            if key in optional and value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"data.{key} must be an integer >= 1, got {value!r}")
        for key in ("shuffle", "packing"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"data.{key} must be true or false, got {getattr(self, key)!r}")
        if self.max_tokens_per_micro is not None and not self.packing:
            raise ValueError("data.max_tokens_per_micro is the budget of a packed micro-batch: set data.packing: "
                             "true with it, or remove it")
        if self.on_bad_sample not in ("skip", "raise"):
            raise ValueError(f"data.on_bad_sample must be 'skip' or 'raise', got {self.on_bad_sample!r}")
        if self.mix_stopping not in STOPPING:
            raise ValueError(f"data.mix_stopping must be one of {list(STOPPING)}, got {self.mix_stopping!r}")
        if self.video_decoder not in DECODERS:
            raise ValueError(f"data.video_decoder must be one of {list(DECODERS)}, got {self.video_decoder!r}")
        if self.min_pixels > self.max_pixels:
            raise ValueError(f"data.min_pixels ({self.min_pixels}) exceeds data.max_pixels ({self.max_pixels})")
        self._check_caps()

    def _check_caps(self) -> None:
        if self.video_max_pixels is not None and self.video_max_pixels < self.min_pixels:
            raise ValueError(f"data.video_max_pixels ({self.video_max_pixels}) is below data.min_pixels "
                             f"({self.min_pixels}): frames are never resized below min_pixels; allowed: an integer "
                             f">= {self.min_pixels}, or null")
        if self.max_frames is not None and self.max_frames < 2:
            raise ValueError(f"data.max_frames must be an integer >= 2 (a video keeps at least one temporal patch "
                             f"of 2 frames), or null; got {self.max_frames!r}")

    @property
    def caps(self) -> RowCaps:
        """The per-row visual caps (:class:`~mpipe_hf.data.budgets.RowCaps`): ``max_pixels``,
        ``video_max_pixels``, ``max_frames``, ``max_visual_tokens``."""
        return RowCaps(self.max_pixels, self.video_max_pixels, self.max_frames, self.max_visual_tokens)

    @property
    def row_length(self) -> int:
        """The most tokens a row keeps: ``max_length``, and with ``packing`` at most ``max_tokens_per_micro`` (a
        packed micro-batch holds whole rows)."""
        if self.packing and self.max_tokens_per_micro is not None:
            return min(self.max_length, self.max_tokens_per_micro)
        return self.max_length

    @property
    def token_budget(self) -> int:
        """A packed micro-batch's token budget: ``max_tokens_per_micro``, else ``max_length``."""
        return self.max_tokens_per_micro if self.max_tokens_per_micro is not None else self.max_length

    @property
    def all_sources(self) -> tuple[DataSource, ...]:
        """The sources to read: ``sources``, or ``path`` with ``format``, ``images`` and ``split``."""
        if self.sources is not None:
            return self.sources
        return (DataSource(self.path, self.format, self.images, 1.0, self.split),)

    def _parsed(self) -> tuple[DataSource, ...]:
        if isinstance(self.sources, (list, tuple)) and self.sources and all(
                isinstance(s, DataSource) for s in self.sources):
            return tuple(self.sources)
        if not isinstance(self.sources, (list, tuple)) or not self.sources:
            raise ValueError(f"data.sources must be a non-empty list of sources (mappings with 'path'), got "
                             f"{self.sources!r}")
        keys = set(DataSource.__dataclass_fields__)
        out = []
        for i, item in enumerate(self.sources):
            if not isinstance(item, dict) or "path" not in item or set(item) - keys:
                raise ValueError(f"data.sources[{i}] must be a mapping with 'path' and any of {sorted(keys)}, got "
                                 f"{item!r}")
            try:
                out.append(DataSource(**item))
            except ValueError as err:
                raise ValueError(f"data.sources[{i}]: {err}") from None
        return tuple(out)
