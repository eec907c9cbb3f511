"""The row layouts people bring from other tools, each turned into one conversation form (docs/data.md).

============  ===============================================================  ==================================
layout        a row                                                            written by
============  ===============================================================  ==================================
messages      ``messages`` [{role, content}] (+ ``images``)                    TRL vision SFT, LLaMA-Factory, swift
trl           ``prompt`` and ``completion`` (messages, or strings) + ``images``  TRL prompt-completion
llava         ``conversations`` [{from: human|gpt|system, value}] + ``image``  LLaVA-Instruct
sharegpt      ``conversations`` [{from, value}] (+ ``images``, ``system``)     ShareGPT, LLaMA-Factory
caption       ``image``, ``prompt``, ``caption``                               captioning sets
text          ``text``                                                         plain LM corpora (decoder-only LM)
============  ===============================================================  ==================================

A message's content is a string with ``<image>`` placeholders or a list of parts (``{"type": "image"}``,
``{"type": "text", "text": ...}``). Rows may hold videos too (``{"type": "video"}`` parts or ``<video>``
placeholders, the videos inside the parts or in a ``videos`` / ``video`` value; :func:`conversation_videos`,
docs/video.md). An image is a path (relative to the source's image folder), bytes, a PIL image,
or a ``{"bytes", "path"}`` mapping (a ``datasets.Image`` column read without decoding). Every image becomes a
reference ``{"bytes": bytes | None, "path": str | None}``: a file stays on disk until its micro-batch's owner opens
it (SPEC.md, "DATA_LOAD").
"""

from __future__ import annotations

import io
import os

import PIL.Image

LAYOUTS = {  # layout -> the keys that tell it, in the order auto-detection tries them
    "messages": ("messages",), "trl": ("prompt", "completion"), "llava": ("conversations", "image"),
    "sharegpt": ("conversations",), "caption": ("prompt", "caption"), "text": ("text",)}
FROM_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "model": "assistant",
              "system": "system"}


def known_layouts() -> str:
    """The layouts and the keys that tell each, for an error message."""
    return "; ".join(f"{name} ({' + '.join(keys)})" for name, keys in LAYOUTS.items())


def detect(row, where: str) -> str:
    """The layout of ``row`` (a mapping), from its keys (:data:`LAYOUTS`, first match).

    Raises:
        ValueError: ``row`` is not a mapping, or no layout's keys are all in it (naming ``where``, the keys and
            the layouts known).
    """
    if not isinstance(row, dict):
        raise ValueError(f"{where}: a row must be a JSON object (a mapping), got {type(row).__name__}")
    for name, keys in LAYOUTS.items():
        if all(row.get(k) is not None for k in keys):
            return name
    raise ValueError(f"{where}: no known row layout has the keys {sorted(row)}; the layouts are "
                     f"{known_layouts()} (data.format)")


def _listed(value) -> list:
    """``value`` as a list: ``None`` -> ``[]``, a list as it is, anything else -> ``[value]``."""
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _conversations(row: dict, where: str) -> tuple[list[dict], list]:
    turns = row.get("conversations")
    if not isinstance(turns, (list, tuple)) or not turns:
        raise ValueError(f"{where}: 'conversations' must be a non-empty list of turns")
    messages = []
    if isinstance(row.get("system"), str) and row["system"].strip():
        messages.append({"role": "system", "content": row["system"]})
    for turn in turns:  # {from, value}, or {role, content} (LLaMA-Factory's sharegpt tags set to those)
        speaker = turn.get("from", turn.get("role")) if isinstance(turn, dict) else None
        if speaker is None:
            raise ValueError(f"{where}: a turn must be an object with 'from' and 'value' (or 'role' and 'content'), "
                             f"got {turn!r:.80}")
        role = FROM_ROLES.get(speaker.lower() if isinstance(speaker, str) else speaker)
        if role is None:
            raise ValueError(f"{where}: unknown speaker 'from': {speaker!r}; speakers are {sorted(FROM_ROLES)}")
        messages.append({"role": role, "content": turn.get("value", turn.get("content"))})
    images = row.get("images") if row.get("images") is not None else row.get("image")
    return messages, _listed(images)


def _prompt_completion(row: dict, where: str) -> tuple[list[dict], list]:
    prompt, completion = row["prompt"], row["completion"]
    if isinstance(prompt, str) and isinstance(completion, str):
        return [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}], \
            _listed(row.get("images"))
    if not isinstance(prompt, (list, tuple)) or not isinstance(completion, (list, tuple)):
        raise ValueError(f"{where}: 'prompt' and 'completion' must both be lists of messages or both strings")
    if any(isinstance(m, dict) and m.get("role") == "assistant" for m in prompt):
        # TRL trains on the completion alone; here every assistant turn is trained: say so rather than differ
        raise ValueError(f"{where}: a prompt with an assistant turn; TRL trains on the completion alone, this "
                         f"loader on every assistant turn: write such a row in the messages layout")
    return list(prompt) + list(completion), _listed(row.get("images"))


def _caption(row: dict, where: str) -> tuple[list[dict], list]:
    prompt, caption = row["prompt"], row["caption"]
    if not isinstance(prompt, str) or not isinstance(caption, str):
        raise ValueError(f"{where}: 'prompt' and 'caption' must be strings")
    images = _listed(row.get("image"))
    if images and "<image>" not in prompt:
        prompt = "<image>" + prompt
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": caption}], images


INLINE_KEYS = ("image", "path", "url")  # an image part that names its image: {"type": "image", "image": ...}


def _inline_images(messages: list, images: list, where: str) -> tuple[list, list]:
    """Images named inside their parts (``{"type": "image", "image" | "path" | "url": ...}``, the form of
    ``apply_chat_template`` and Qwen's examples; a ``file://`` prefix is dropped), in order, when the row has no
    ``images``; the messages as they are otherwise.

    Raises:
        ValueError: a row that names images both inside its parts and in ``images``.
    """
    inline = [part.get(k) for m in messages if isinstance(m, dict) and isinstance(m.get("content"), list)
              for part in m["content"] if isinstance(part, dict) and part.get("type") == "image"
              for k in INLINE_KEYS if part.get(k) is not None]
    if not inline:
        return messages, images
    if images:
        raise ValueError(f"{where}: images named both inside the message parts and in 'images'; give them once")
    return messages, [v.removeprefix("file://") if isinstance(v, str) else v for v in inline]


VIDEO_KEYS = ("video", "path", "url", "frames")  # a video part that names its video: {"type": "video", "video": ...}
VIDEO_PARTS = ("video", "video_url")


def _video_parts(messages: list) -> list[dict]:
    """The video parts of ``messages`` (list contents only), in order."""
    return [part for m in messages if isinstance(m, dict) and isinstance(m.get("content"), list)
            for part in m["content"] if isinstance(part, dict) and part.get("type") in VIDEO_PARTS]


def has_videos(row: dict, messages: list) -> bool:
    """Whether a row holds a video: a video part, or a ``videos`` / ``video`` value."""
    return bool(_video_parts(messages)) or bool(_listed(row.get("videos"))) or bool(_listed(row.get("video")))


def _video_source(value, part: dict | None, where: str) -> tuple:
    """``(source, options)`` of one video: ``value`` (a path, a list of frame paths, or a mapping naming one of
    :data:`VIDEO_KEYS` with options beside it) and the options of its part (:func:`~.video.video_options`)."""
    from .video import video_options
    options = video_options(part or {}, where)
    if isinstance(value, dict):
        options.update(video_options(value, where))
        value = next((value[k] for k in VIDEO_KEYS if value.get(k) is not None), None)
    if isinstance(value, str):
        value = value.removeprefix("file://")
    return value, options


def conversation_videos(row: dict, messages: list, where: str) -> list[tuple]:
    """The videos of a row, in order, as ``(source, options)`` (:func:`_video_source`): named inside their parts
    (``{"type": "video", "video" | "path" | "url" | "frames": ..., "fps": ...}``, the form of
    ``apply_chat_template`` and qwen-vl-utils), else in the row's ``videos`` (TRL, LLaMA-Factory) or ``video``
    (LLaVA-Video, ShareGPT4Video) value, the k-th taking the options of the k-th video part where parts carry any.

    Raises:
        ValueError: a row that names videos both inside its parts and in ``videos``/``video``; an option that is
            not a positive number.
    """
    parts = _video_parts(messages)
    inline = [(next(p[k] for k in VIDEO_KEYS if p.get(k) is not None), p) for p in parts
              if any(p.get(k) is not None for k in VIDEO_KEYS)]
    listed = _listed(row.get("videos") if row.get("videos") is not None else row.get("video"))
    if inline and listed:
        raise ValueError(f"{where}: videos named both inside the message parts and in 'videos'/'video'; give them "
                         f"once")
    if inline:
        return [_video_source(value, part, where) for value, part in inline]
    return [_video_source(value, parts[k] if k < len(parts) else None, where) for k, value in enumerate(listed)]


def conversation(row, layout: str, where: str, videos: bool = False) -> tuple[list[dict], list]:
    """``(messages, images)`` of ``row`` in ``layout`` (not ``text``): messages ``{"role": system|user|assistant,
    "content": str | parts}`` as the row writes them, and the raw images in order. With ``videos`` the row may
    hold videos too (:func:`conversation_videos` reads them); without, a row with a video is refused rather than
    read without it.

    Raises:
        ValueError: the row lacks the layout's keys, or a value of the wrong kind (naming ``where``); a video
            where ``videos`` is false.
    """
    messages, images = _conversation(row, layout, where)
    if not videos and has_videos(row, messages):
        raise ValueError(f"{where}: the row holds a video, which this loader does not read yet (the collator does: "
                         f"docs/video.md)")
    return messages, images


def _conversation(row, layout: str, where: str) -> tuple[list[dict], list]:
    if not isinstance(row, dict):
        raise ValueError(f"{where}: a row must be a JSON object (a mapping), got {type(row).__name__}")
    missing = [k for k in LAYOUTS[layout] if row.get(k) is None and not (layout == "llava" and k == "image")]
    if missing:
        raise ValueError(f"{where}: a {layout} row needs {list(LAYOUTS[layout])}; it lacks {missing} (its keys: "
                         f"{sorted(row)}; data.format: auto tells the layout from the first row)")
    if layout == "messages":
        messages = row["messages"]
        if not isinstance(messages, (list, tuple)) or not messages:
            raise ValueError(f"{where}: 'messages' must be a non-empty list of messages")
        images = row.get("images") if row.get("images") is not None else row.get("image")
        return _inline_images(list(messages), _listed(images), where)
    if layout == "trl":
        return _inline_images(*_prompt_completion(row, where), where)
    if layout in ("llava", "sharegpt"):
        return _conversations(row, where)
    if layout == "caption":
        return _caption(row, where)
    raise ValueError(f"{where}: the {layout!r} layout has no conversation")


def image_ref(value, base: str, where: str) -> dict:
    """One image of a row as ``{"bytes": bytes | None, "path": str | None}``: a path (relative to ``base``) must
    name an existing file; bytes and PIL images (encoded as PNG) travel in the row.

    Raises:
        ValueError: a value of no image form, or a path that names no file.
    """
    if isinstance(value, dict) and ("bytes" in value or "path" in value):
        if value.get("bytes"):
            return {"bytes": bytes(value["bytes"]), "path": value.get("path")}
        value = value.get("path")
    if isinstance(value, (bytes, bytearray)) and value:
        return {"bytes": bytes(value), "path": None}
    if isinstance(value, PIL.Image.Image):
        buffer = io.BytesIO()
        value.save(buffer, format="PNG")
        return {"bytes": buffer.getvalue(), "path": None}
    if not isinstance(value, str) or not value:
        raise ValueError(f"{where}: an image must be a path, bytes, a PIL image or a {{'bytes', 'path'}} mapping, "
                         f"got {value!r:.80}")
    full = os.path.normpath(os.path.join(base, os.path.expanduser(value)))
    if not os.path.isfile(full):
        raise ValueError(f"{where}: image file {value!r} not found (looked for {full})")
    return {"bytes": None, "path": full}


def open_image(ref: dict):
    """``ref`` opened lazily (PIL reads the header; the pixels are decoded on first use): a path as its string
    (the collator opens it), bytes as a ``PIL.Image.Image``."""
    if ref.get("bytes"):
        return PIL.Image.open(io.BytesIO(ref["bytes"]))
    return ref["path"]


def read_image(ref: dict, where: str, decode: bool) -> tuple[int, int]:
    """``(height, width)`` of the image ``ref`` from its header; with ``decode``, every pixel is decoded too (a
    truncated file fails here, not only in training).

    Raises:
        ValueError: the header, or with ``decode`` the pixels, cannot be read (naming ``where`` and the file).
    """
    name = ref.get("path") or "<image bytes>"
    try:
        with PIL.Image.open(io.BytesIO(ref["bytes"]) if ref.get("bytes") else ref["path"]) as image:
            width, height = image.size
            if decode:
                image.load()
    except Exception as err:  # noqa: BLE001 - PIL raises several kinds (UnidentifiedImageError, OSError, ...)
        what = "decode" if decode else "read"
        raise ValueError(f"{where}: cannot {what} image {name}: {type(err).__name__}: {err}") from err
    return height, width
