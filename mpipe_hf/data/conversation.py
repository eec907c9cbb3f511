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
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass, field

import datasets
import PIL.Image
import torch
from transformers import LlavaProcessor

from .collate import IGNORE
from .processor import QWEN_PROCESSORS
from .templates import chat_template_for

ROLES = ("system", "user", "assistant")
PLACEHOLDER = "<image>"
FEATURES = datasets.Features({
    "line": datasets.Value("int64"),
    "source": datasets.Value("string"),
    "messages": datasets.List({"role": datasets.Value("string"),
                               "content": datasets.List({"type": datasets.Value("string"),
                                                         "text": datasets.Value("string")})}),
    "images": datasets.List(datasets.Value("string")),
})


# ----------------------------------------------------------------------------------------------------------------
# Rows: parse, validate, normalise


def _parts(content, role: str, where: str) -> list[dict]:
    """A message's ``content`` (a string with ``<image>`` placeholders, or a list of parts) as a list of parts
    ``{"type": "image"}`` / ``{"type": "text", "text": str}``, in order; empty strings between placeholders are left
    out, other text is kept verbatim.

    Raises:
        ValueError: a content that is neither, a part of no known type, a text part that is not a string or writes
            ``<image>``, or a message with no image and no text but whitespace.
    """
    if isinstance(content, str):
        parts = []
        for i, piece in enumerate(content.split(PLACEHOLDER)):
            if i > 0:
                parts.append({"type": "image"})
            if piece:
                parts.append({"type": "text", "text": piece})
    elif isinstance(content, list):
        parts = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in ("image", "image_url"):
                parts.append({"type": "image"})
            elif kind == "text":
                text = part.get("text")
                if not isinstance(text, str):
                    raise ValueError(f"{where}: a {role} text part has no string 'text': {part!r}")
                if PLACEHOLDER in text:
                    raise ValueError(f"{where}: a {role} text part writes {PLACEHOLDER!r}; in a list of parts an "
                                     f"image is a part {{'type': 'image'}}")
                parts.append({"type": "text", "text": text})
            else:
                raise ValueError(f"{where}: a {role} content part must be {{'type': 'text', 'text': ...}} or "
                                 f"{{'type': 'image'}}, got {part!r}")
    else:
        raise ValueError(f"{where}: a {role} message's content must be a string or a list of parts, "
                         f"got {type(content).__name__}")
    has_image = any(p["type"] == "image" for p in parts)
    if not has_image and not "".join(p["text"] for p in parts if p["type"] == "text").strip():
        what = "an empty assistant turn" if role == "assistant" else f"an empty {role} text"
        raise ValueError(f"{where}: {what} (no text but whitespace)")
    return parts


def _resolve(paths, base: str, where: str) -> list[str]:
    """Absolute paths of a row's images (relative ones are taken from ``base``; PIL images pass through); raises
    ``ValueError`` on a path that is not a string or a file that does not exist."""
    out = []
    for path in paths:
        if isinstance(path, PIL.Image.Image):  # an image in memory (a datasets.Image column), kept as it is
            out.append(path)
            continue
        if not isinstance(path, str) or not path:
            raise ValueError(f"{where}: an image path must be a non-empty string, got {path!r}")
        full = os.path.normpath(os.path.join(base, path))
        if not os.path.isfile(full):
            raise ValueError(f"{where}: image file {path!r} not found (looked for {full})")
        out.append(full)
    return out


def _canonical_row(obj, base: str, where: str) -> dict:
    """One parsed JSONL object (either accepted form, module docstring) as ``{"messages": [...], "images": [...]}``
    with every content a list of parts and every image path absolute.

    Raises:
        ValueError: any of the load-time checks of :func:`load_conversation_dataset` fails (the message starts with
            ``where``, the file and line).
    """
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: a row must be a JSON object, got {type(obj).__name__}")
    if "messages" in obj:
        messages = obj["messages"]
        images = obj.get("images") or []
        if isinstance(images, str):
            images = [images]
        if not isinstance(messages, list) or not messages:
            raise ValueError(f"{where}: 'messages' must be a non-empty list of messages")
        if not isinstance(images, list):
            raise ValueError(f"{where}: 'images' must be a list of paths, got {type(images).__name__}")
        canonical = []
        for message in messages:
            if not isinstance(message, dict) or "role" not in message or "content" not in message:
                raise ValueError(f"{where}: a message must be an object with 'role' and 'content', got {message!r}")
            role = message["role"]
            if role not in ROLES:
                raise ValueError(f"{where}: unknown role {role!r}; roles are {list(ROLES)}")
            canonical.append({"role": role, "content": _parts(message["content"], role, where)})
    elif "prompt" in obj and "caption" in obj:
        image = obj.get("image")
        images = [] if image is None else [image]
        prompt, caption = obj["prompt"], obj["caption"]
        if not isinstance(prompt, str) or not isinstance(caption, str):
            raise ValueError(f"{where}: 'prompt' and 'caption' must be strings")
        if images and PLACEHOLDER not in prompt:
            prompt = PLACEHOLDER + prompt
        canonical = [{"role": "user", "content": _parts(prompt, "user", where)},
                     {"role": "assistant", "content": _parts(caption, "assistant", where)}]
    else:
        raise ValueError(f"{where}: a row needs 'messages' (and optional 'images') or the caption form 'image', "
                         f"'prompt', 'caption'; got the keys {sorted(obj)}")
    roles = [m["role"] for m in canonical]
    if "assistant" not in roles:
        raise ValueError(f"{where}: the conversation has no assistant turn (nothing to learn)")
    if [r for r in roles if r != "system"][0] != "user":
        raise ValueError(f"{where}: the conversation must open with a user turn (after an optional system turn)")
    for message in canonical:
        if message["role"] == "assistant" and any(p["type"] == "image" for p in message["content"]):
            raise ValueError(f"{where}: an image in an assistant turn is not supported")
    placeholders = sum(p["type"] == "image" for m in canonical for p in m["content"])
    if placeholders != len(images):
        raise ValueError(f"{where}: {placeholders} image placeholder(s) but {len(images)} image(s)")
    return {"messages": canonical, "images": _resolve(images, base, where)}


def _clean(messages) -> list[dict]:
    """Messages as read back from the Arrow table (image parts carry ``"text": None``) -> plain parts lists."""
    out = []
    for message in messages:
        parts = [{"type": "image"} if p["type"] == "image" else {"type": "text", "text": p["text"]}
                 for p in message["content"]]
        out.append({"role": message["role"], "content": parts})
    return out


# ----------------------------------------------------------------------------------------------------------------
# Encoding: the rendered text, the expanded token ids and the labels


def _model_type_of(processor) -> str | None:
    """The family of a processor built by :mod:`.processor` (``None`` for a bare tokenizer)."""
    for cls in type(processor).__mro__:
        for model_type, qwen in QWEN_PROCESSORS.items():
            if cls is qwen:
                return model_type
        if cls is LlavaProcessor:
            return "llava"
    return None


@dataclass
class Encoded:
    """One conversation as the model sees it, before truncation: ``ids`` and ``labels`` (each ``L`` ints, the
    image placeholders expanded to the image's tokens), ``image_spans`` (``[start, end)`` of each image's tokens)
    and the rendered ``text``."""
    ids: list[int]
    labels: list[int]
    image_spans: list[tuple[int, int]]
    text: str


class ConversationEncoder:
    """Renders a conversation with the chat template and finds its assistant tokens, shared by the loader (token
    counts at load) and the collator.

    Args:
        processor: an HF processor (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, LLaVA), or a tokenizer for a decoder-only LM
            (rows without images).
        chat_template: a Jinja template; ``None``: :func:`chat_template_for` (the checkpoint's own template, else
            the family default).
        model_type: the family for the default template; ``None``: from the processor's class (a bare tokenizer
            gets ChatML with the default system message, ``qwen2_vl``'s).

    Raises:
        ValueError: no template given, none in the checkpoint, and the family cannot be told.
    """

    def __init__(self, processor, chat_template: str | None = None, model_type: str | None = None):
        self.processor = processor
        self.vision = hasattr(processor, "image_processor")
        self.tokenizer = processor.tokenizer if self.vision else processor
        if chat_template is None:
            if model_type is None:
                model_type = _model_type_of(processor) or ("qwen2_vl" if not self.vision else None)
            try:
                chat_template = chat_template_for(processor, model_type or "")
            except ValueError as err:
                raise ValueError(f"{type(processor).__name__} has no chat template and its model family cannot be "
                                 f"told; pass chat_template or model_type ({err})") from err
        self.chat_template = chat_template
        self.image_token_id = processor.image_token_id if self.vision else None
        tok = self.tokenizer
        self.special_ids = set(tok.all_special_ids) | {i for i, t in tok.added_tokens_decoder.items() if t.special}

    # -- rendering --

    def render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        """``apply_chat_template(messages, tokenize=False)`` of the processor (or tokenizer) with the template."""
        return self.processor.apply_chat_template(messages, chat_template=self.chat_template, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt)

    def add_special_tokens(self, text: str) -> bool:
        """Whether tokenizing ``text`` adds the tokenizer's special tokens (as the processor does by default): not
        when the template already wrote the BOS."""
        bos = self.tokenizer.bos_token
        return not (bos and text.startswith(bos))

    def assistant_spans(self, messages: list[dict], text: str, where: str) -> list[tuple[int, int, int]]:
        """Character spans ``(content_start, content_end, turn_end)`` in ``text`` of every assistant turn.

        The turn of assistant message ``k`` is what rendering ``messages[:k + 1]`` adds to rendering
        ``messages[:k]`` with the generation prompt (so the template's assistant header is not in it); within it
        the content is where the message's text is written (as it is, else stripped of outer whitespace), else,
        for a template that rewrites the content, the turn less its outer whitespace.

        Raises:
            ValueError: the template does not render a conversation's prefixes as prefixes of its text.
        """
        spans = []
        for k, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            head = self.render(messages[:k], add_generation_prompt=True)
            turn = self.render(messages[:k + 1])
            if not (turn.startswith(head) and text.startswith(turn)):
                raise ValueError(f"{where}: the chat template does not render the conversation up to assistant turn "
                                 f"{k} as a prefix of the whole (it rewrites earlier turns), so the assistant tokens "
                                 f"cannot be found")
            segment = turn[len(head):]
            content = "".join(p["text"] for p in message["content"] if p["type"] == "text")
            for written in (content, content.strip()):
                at = segment.find(written)
                if at >= 0:
                    start, end = at, at + len(written)
                    break
            else:
                start = len(segment) - len(segment.lstrip())
                end = len(segment.rstrip())
            spans.append((len(head) + start, len(head) + end, len(turn)))
        return spans

    def encode(self, messages: list[dict], image_tokens: list[int], where: str) -> Encoded:
        """Render ``messages`` (parts lists), tokenize with offsets, mark the assistant tokens and expand each
        image token to ``image_tokens[j]`` copies, as the processor expands image ``j``.

        ``labels`` is ``ids`` on every token that overlaps an assistant content span or the end-of-turn token
        after it (the first token after the content that is not whitespace, when it is a special token:
        ``<|im_end|>`` for ChatML, the eos for LLaVA), with whatever whitespace lies between; ``-100`` elsewhere.
        Character spans become token spans through the fast tokenizer's offsets of the whole text, so a BPE token
        that joins the template's text and the content (LLaVA's ``": "`` and the answer's first word) is labelled.

        Raises:
            ValueError: the template's prefixes are not prefixes (:meth:`assistant_spans`), or the rendered text has
                a different number of image tokens than ``image_tokens`` has images.
        """
        text = self.render(messages)
        spans = self.assistant_spans(messages, text, where)
        enc = self.tokenizer(text, add_special_tokens=self.add_special_tokens(text), return_offsets_mapping=True)
        ids, offsets = enc["input_ids"], enc["offset_mapping"]
        labelled = [False] * len(ids)
        for start, end, turn_end in spans:
            after = next((i for i, (s, e) in enumerate(offsets) if s >= end and e > s and text[s:e].strip()), None)
            if after is not None and offsets[after][0] < turn_end and ids[after] in self.special_ids:
                end = offsets[after][1]  # the end-of-turn token, and any whitespace before it
            for i, (s, e) in enumerate(offsets):
                if e > s and s < end and e > start:
                    labelled[i] = True
        found = sum(t == self.image_token_id for t in ids) if self.image_token_id is not None else 0
        if found != len(image_tokens):
            raise ValueError(f"{where}: the chat template wrote {found} image token(s) for {len(image_tokens)} "
                             f"image(s); it must render each image part as the family's image placeholder")
        out_ids, out_labels, image_spans = [], [], []
        for token, lab in zip(ids, labelled):
            if self.image_token_id is not None and token == self.image_token_id:
                n = image_tokens[len(image_spans)]
                image_spans.append((len(out_ids), len(out_ids) + n))
                out_ids += [token] * n
                out_labels += [IGNORE] * n
            else:
                out_ids.append(token)
                out_labels.append(token if lab else IGNORE)
        return Encoded(out_ids, out_labels, image_spans, text)

    def image_tokens_for_sizes(self, sizes: list[tuple[int, int]]) -> list[int]:
        """Tokens each image of size ``(height, width)`` takes, without decoding it: the processor's
        ``_get_num_multimodal_tokens`` (Qwen: the image processor's ``smart_resize`` patch grid over
        ``merge_size**2``; LLaVA: the crop's patches, fixed)."""
        if not sizes:
            return []
        return [int(n) for n in self.processor._get_num_multimodal_tokens(image_sizes=sizes).num_image_tokens]


# ----------------------------------------------------------------------------------------------------------------
# Loading


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
        return {**row, "messages": _clean(row["messages"])}


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
            row = _canonical_row(obj, base, where)
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


# ----------------------------------------------------------------------------------------------------------------
# Collating


class ConversationCollator:
    """Rows -> a micro-batch. Rows from :func:`load_conversation_dataset` are used as they are; other rows (a
    user's ``datasets.Dataset`` of either accepted form, images as paths relative to the working directory or as PIL
    images) are checked and normalised here, as the loader does. The micro-batch has the keys of
    the model's forward: ``input_ids``, ``attention_mask``, ``labels`` ``(B, L)`` and the processor's
    other outputs (Qwen: ``mm_token_type_ids`` ``(B, L)``, and when some row has images ``pixel_values``
    ``(patches, C*T*p*p)`` and ``image_grid_thw`` ``(images, 3)``; LLaVA: ``pixel_values`` ``(images, C, h, w)``).

    Each row is rendered with ``apply_chat_template`` and the template of :func:`chat_template_for`, its images are
    opened here (the owner of the micro-batch is the only one that decodes them), and the processor tokenizes and
    expands the images, padding on the right to the longest row. ``labels`` is ``-100`` except on every assistant
    turn's content and its end-of-turn token (:meth:`ConversationEncoder.encode`); rows are cut at ``max_length``
    tokens (``L <= max_length``).

    Args:
        processor: the HF processor, or a tokenizer for a decoder-only LM (rows without images).
        max_length: the most tokens a row keeps; ``None``: no cut.
        chat_template, model_type: as :class:`ConversationEncoder`.

    Raises (on call):
        ValueError: naming the JSONL line: an image that cannot be decoded, a cut through an image's tokens (a row
            the loader did not check), or token ids that differ from the processor's (a template or processor this
            module does not handle).
    """

    def __init__(self, processor, max_length: int | None, chat_template: str | None = None,
                 model_type: str | None = None):
        self.encoder = ConversationEncoder(processor, chat_template, model_type)
        self.processor, self.max_length = processor, max_length

    def _open(self, row: dict, where: str) -> list:
        """The row's images as RGB PIL images: each path opened and decoded here (an image already in memory, a
        ``PIL.Image.Image``, is used as it is)."""
        images = []
        for path in row.get("images") or []:
            if isinstance(path, PIL.Image.Image):
                images.append(path.convert("RGB"))
                continue
            try:
                with PIL.Image.open(path) as image:
                    images.append(image.convert("RGB"))
            except Exception as err:  # a corrupt file fails only here, when it is decoded
                raise ValueError(f"{where}: cannot decode image {path}: {err}") from err
        return images

    def _image_tokens(self, batch, rows: list[dict], ids: torch.Tensor) -> list[list[int]]:
        """Tokens each row's images took in ``batch``: from ``image_grid_thw`` (``t*h*w / merge_size**2``) for the
        Qwen families, else the row's image tokens shared equally among its images (LLaVA's fixed count)."""
        counts = [len(r.get("images") or []) for r in rows]
        if "image_grid_thw" in batch:
            merge = self.processor.image_processor.merge_size
            flat = (batch["image_grid_thw"].prod(-1) // merge ** 2).tolist()
            out, at = [], 0
            for n in counts:
                out.append(flat[at:at + n])
                at += n
            return out
        out = []
        for i, n in enumerate(counts):
            total = int((ids[i] == self.encoder.image_token_id).sum()) if n else 0
            out.append([total // n] * n if n else [])
        return out

    def __call__(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        rows = [{**r, "messages": _clean(r["messages"])} if "source" in r
                else _canonical_row(r, os.getcwd(), f"row {i} of the micro-batch") for i, r in enumerate(rows)]
        wheres = [f"{r.get('source', '?')}:{r.get('line', '?')}" for r in rows]
        texts = [self.encoder.render(r["messages"]) for r in rows]
        images = [im for r, where in zip(rows, wheres) for im in self._open(r, where)]
        special = self.encoder.add_special_tokens(texts[0])
        kwargs = dict(padding=True, padding_side="right", add_special_tokens=special, return_tensors="pt")
        if self.encoder.vision:
            batch = self.processor(text=texts, images=images or None, **kwargs)
        else:
            batch = self.processor(texts, **kwargs)
        ids, mask = batch["input_ids"], batch["attention_mask"]
        per_row = self._image_tokens(batch, rows, ids)
        length = ids.shape[1] if self.max_length is None else min(ids.shape[1], self.max_length)
        labels = torch.full((ids.shape[0], length), IGNORE, dtype=ids.dtype)
        for i, (row, where) in enumerate(zip(rows, wheres)):
            enc = self.encoder.encode(row["messages"], per_row[i], where)
            n = int(mask[i].sum())
            if enc.ids != ids[i, :n].tolist() or not bool(mask[i, :n].all()):
                raise ValueError(f"{where}: the processor's token ids differ from the rendered conversation's; "
                                 f"cannot place the labels")
            if any(start < length < end for start, end in enc.image_spans):
                raise ValueError(f"{where}: max_length={length} cuts through an image's tokens (load the rows with "
                                 f"load_conversation_dataset, which drops such rows)")
            keep = min(n, length)
            labels[i, :keep] = torch.tensor(enc.labels[:keep], dtype=ids.dtype)
        out = {k: (v[:, :length] if v.shape == ids.shape else v) for k, v in batch.items()
               if isinstance(v, torch.Tensor)}
        out["labels"] = labels
        return out
