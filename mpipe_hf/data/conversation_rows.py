"""Conversation rows (the accepted JSONL forms: :mod:`.conversation`): parse, validate and normalise one row to
the canonical form ``{"messages": [{"role", "content": [parts]}], "images": [absolute paths]}``, and turn the
messages read back from the Arrow table into plain parts lists.
"""

from __future__ import annotations

import os

import PIL.Image

ROLES = ("system", "user", "assistant")
PLACEHOLDER = "<image>"


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


def canonical_row(obj, base: str, where: str) -> dict:
    """One parsed JSONL object (either accepted form, :mod:`.conversation`) as ``{"messages": [...], "images":
    [...]}`` with every content a list of parts and every image path absolute.

    Raises:
        ValueError: any of the load-time checks of :func:`~.conversation.load_conversation_dataset` fails (the
            message starts with ``where``, the file and line).
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


def plain_messages(messages) -> list[dict]:
    """Messages as read back from the Arrow table (image parts carry ``"text": None``) -> plain parts lists."""
    out = []
    for message in messages:
        parts = [{"type": "image"} if p["type"] == "image" else {"type": "text", "text": p["text"]}
                 for p in message["content"]]
        out.append({"role": message["role"], "content": parts})
    return out
