"""Conversation data as the HF fine-tuning tools write it (TRL's ``messages``, LLaMA-Factory's and ms-swift's
``messages`` + ``images``): loading and validating a JSONL, and the collator that renders each conversation with
the chat template and puts labels on the assistant turns only.

Accepted JSONL rows (one JSON object a line; blank lines are skipped, line numbers still count them):

- ``{"messages": [{"role": "system"|"user"|"assistant", "content": ...}, ...], "images": [path, ...]}``, where
  ``content`` is a string with ``<image>`` placeholders or a list of parts ``{"type": "image"}`` /
  ``{"type": "text", "text": str}``; the ``images`` (optional) fill the image placeholders in order;
- the older caption form ``{"image": path (optional), "prompt": str, "caption": str}``: one user turn with the image
  (where the prompt writes ``<image>``, else before the prompt) and the prompt, and one assistant turn with the
  caption.

Image paths are relative to the JSONL's directory (or absolute). Every row is normalised to one canonical form,
``{"line": int, "source": str, "messages": [{"role", "content": [parts]}], "images": [absolute paths]}``; images
stay on disk until the collator of the micro-batch that holds them opens them, so only a micro-batch's owner decodes
its images (SPEC.md, "DATA_LOAD").

This module loads a JSONL (:func:`load_conversation_dataset`); one row's parsing is :mod:`.conversation_rows`, the
rendering, tokens and labels :mod:`.conversation_encoder`, the micro-batch :mod:`.conversation_collator` (their
public names are importable from here too).
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass, field

import datasets
import PIL.Image

from .collate import IGNORE
from .conversation_collator import ConversationCollator
from .conversation_encoder import ConversationEncoder, Encoded
from .conversation_rows import PLACEHOLDER, ROLES, canonical_row, plain_messages

__all__ = ["FEATURES", "PLACEHOLDER", "ROLES", "ConversationCollator", "ConversationDataset", "ConversationEncoder",
           "Encoded", "load_conversation_dataset"]

FEATURES = datasets.Features({
    "line": datasets.Value("int64"),
    "source": datasets.Value("string"),
    "messages": datasets.List({"role": datasets.Value("string"),
                               "content": datasets.List({"type": datasets.Value("string"),
                                                         "text": datasets.Value("string")})}),
    "images": datasets.List(datasets.Value("string")),
})


@dataclass
class ConversationDataset:
    """The kept rows of a conversation JSONL (canonical form, module docstring) with what the loader dropped.

    ``rows`` is a ``datasets.Dataset``; ``dataset[i]`` gives row ``i`` with plain parts lists. ``num_tokens[i]``
    is row ``i``'s length in tokens before truncation (images expanded). ``dropped`` maps each dropped row's JSONL
    line to the reason (``"image"``: ``max_length`` falls inside an image's tokens; ``"assistant"``: every assistant
    token lies at or past ``max_length``). ``image_tokens[i]`` is the tokens row ``i``'s images take, counted from
    their sizes in the file headers (what the vision tower's work grows with; every rank has it without decoding
    an image, so every rank can balance the owners by it: :mod:`mpipe_hf.schedule.owners`)."""
    path: str
    rows: datasets.Dataset
    num_tokens: list[int]
    dropped: dict[int, str] = field(default_factory=dict)
    image_tokens: list[int] = field(default_factory=list)

    @property
    def num_dropped(self) -> int:
        return len(self.dropped)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        row = self.rows[int(index)]
        return {**row, "messages": plain_messages(row["messages"])}


def _image_size(path: str, where: str) -> tuple[int, int]:
    """``(height, width)`` of an image from its file header (nothing is decoded); ``ValueError`` when the header
    cannot be read."""
    try:
        with PIL.Image.open(path) as image:
            width, height = image.size
    except Exception as err:  # PIL raises several kinds (UnidentifiedImageError, OSError, SyntaxError)
        raise ValueError(f"{where}: cannot read image {path}: {err}") from err
    return height, width


def _lines(lines: list[int], limit: int = 20) -> str:
    shown = ", ".join(map(str, lines[:limit]))
    return shown + (f", ... ({len(lines) - limit} more)" if len(lines) > limit else "")


def load_conversation_dataset(jsonl_path: str, processor, max_length: int | None, chat_template: str | None = None,
                              model_type: str | None = None) -> ConversationDataset:
    """Read, validate and normalise a conversation JSONL (module docstring for the accepted rows) and count each
    row's tokens, without decoding any image.

    Each row is rendered with the chat template (as :class:`ConversationCollator` renders it) and tokenized; each
    image's tokens are counted from its size in the file header (:meth:`ConversationEncoder.image_tokens_for_sizes`).
    With ``max_length``, a row whose image tokens reach past position ``max_length`` (truncation would cut through
    an image) and a row whose assistant tokens all lie at or past it are dropped, with one ``UserWarning`` giving
    the count and the lines; a longer row that is neither is kept and cut by the collator.

    Args:
        jsonl_path: the JSONL; image paths are relative to its directory.
        processor: the HF processor, or a tokenizer (rows without images only).
        max_length: the collator's ``max_length``; ``None``: no row is dropped for length.
        chat_template, model_type: as :class:`ConversationEncoder`.

    Raises:
        ValueError: naming the file and line: malformed JSON; a row in neither form; an unknown role; an empty
            assistant turn or an empty text (whitespace only); no assistant turn; image placeholders that do not
            match the images; an image file missing or with an unreadable header; images given to a tokenizer.
            Also when no row is left.
    """
    path = os.path.abspath(jsonl_path)
    base = os.path.dirname(path)
    encoder = ConversationEncoder(processor, chat_template, model_type)
    rows, num_tokens, dropped, image_tokens = [], [], {}, []
    with open(path, encoding="utf-8") as f:
        for line_no, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            where = f"{jsonl_path}:{line_no}"
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError as err:
                raise ValueError(f"{where}: malformed JSON: {err}") from err
            row = canonical_row(obj, base, where)
            if row["images"] and not encoder.vision:
                raise ValueError(f"{where}: the row has images but {type(processor).__name__} is a tokenizer, not a "
                                 f"vision-language processor")
            try:
                counts = encoder.image_tokens_for_sizes([_image_size(p, where) for p in row["images"]])
            except ValueError as err:  # the processor's own limits (an aspect ratio past 200, say)
                if str(err).startswith(where):
                    raise
                raise ValueError(f"{where}: the image processor rejects an image: {err}") from err
            enc = encoder.encode(row["messages"], counts, where)
            if max_length is not None:
                if enc.image_spans and enc.image_spans[-1][1] > max_length:
                    dropped[line_no] = "image"
                    continue
                if all(label == IGNORE for label in enc.labels[:max_length]):
                    dropped[line_no] = "assistant"
                    continue
            rows.append({"line": line_no, "source": path, **row})
            num_tokens.append(len(enc.ids))
            image_tokens.append(sum(counts))
    if dropped:
        by_image = [line for line, why in dropped.items() if why == "image"]
        by_answer = [line for line, why in dropped.items() if why == "assistant"]
        warnings.warn(f"{jsonl_path}: dropped {len(dropped)} of {len(dropped) + len(rows)} rows that do not fit "
                      f"max_length={max_length}: {len(by_image)} where it would cut through an image's tokens "
                      f"(lines {_lines(by_image) or '-'}), {len(by_answer)} with every assistant token past it "
                      f"(lines {_lines(by_answer) or '-'})", stacklevel=2)
    if not rows:
        raise ValueError(f"{jsonl_path}: no row left to train on (rows dropped: {len(dropped)})")
    return ConversationDataset(jsonl_path, datasets.Dataset.from_list(rows, features=FEATURES), num_tokens, dropped,
                               image_tokens)
