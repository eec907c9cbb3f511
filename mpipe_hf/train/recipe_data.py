"""The recipe's ``data`` section (:class:`DataSection`): the JSONL files, the micro-batch size, image bounds,
truncation and what a bad sample does.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DataSection:
    """``data:`` what the model reads.

    Attributes:
        path: a JSONL file: ``{"image", "prompt", "caption"}`` rows for a vision-language model (image paths
            relative to the file), ``{"text"}`` rows for a decoder-only LM.
        micro_batch_size: rows per micro-batch.
        min_pixels, max_pixels: image resize bounds of the processor, in pixels.
        shuffle: read each epoch's rows in an order drawn from ``train.seed`` and the epoch (default); else in
            file order.
        max_length: the most tokens a row may take (text and image tokens); a longer row is cut at
            ``max_length``, or dropped with a counted warning when the cut would go through an image's tokens.
        on_bad_sample: ``skip`` (default): a step whose data load fails on any rank is skipped on every rank (no
            optimizer step), with a warning naming the rows and a count in the metrics; ``raise``: the run stops.
        max_bad_steps: with ``skip``, the run stops with the last error after this many skipped steps in a row
            (a step is skipped for a bad sample, or for a loss or gradient norm that is not finite).
        eval_path: a JSONL file of the same form as ``path``: ``train.eval_steps`` and the end of the run report
            ``eval_loss`` over every row of it (forward-only schedule, summed over the label tokens of the whole
            set and divided once); ``None``: no evaluation.

    Raises:
        ValueError: a count that is not an integer >= 1, ``min_pixels > max_pixels``, a ``shuffle`` that is not a
            boolean, an ``on_bad_sample`` other than ``skip``/``raise``, a ``path`` that is not a non-empty string, an
            ``eval_path`` that is not one or null (that the files exist is checked by
            :func:`mpipe_hf.train.trainer.check`: ``mpipe-hf plan`` needs no data).
    """

    path: str
    micro_batch_size: int = 1
    min_pixels: int = 56 * 56
    max_pixels: int = 112 * 112
    shuffle: bool = True
    max_length: int = 2048
    on_bad_sample: str = "skip"
    max_bad_steps: int = 3
    eval_path: str | None = None

    def __post_init__(self):
        for key in ("path", "eval_path"):
            value = getattr(self, key)
            if (not isinstance(value, str) or not value) and (key == "path" or value is not None):
                raise ValueError(f"data.{key} must be a JSONL file path{'' if key == 'path' else ' or null'}, got "
                                 f"{value!r}")
        for key in ("micro_batch_size", "min_pixels", "max_pixels", "max_length", "max_bad_steps"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"data.{key} must be an integer >= 1, got {value!r}")
        if not isinstance(self.shuffle, bool):
            raise ValueError(f"data.shuffle must be true or false, got {self.shuffle!r}")
        if self.on_bad_sample not in ("skip", "raise"):
            raise ValueError(f"data.on_bad_sample must be 'skip' or 'raise', got {self.on_bad_sample!r}")
        if self.min_pixels > self.max_pixels:
            raise ValueError(f"data.min_pixels ({self.min_pixels}) exceeds data.max_pixels ({self.max_pixels})")
