"""Conversation rows: check and normalise one conversation (of any layout, :mod:`.layouts`) to the canonical form
``{"messages": [{"role", "content": [parts]}], "images": [...]}``, and turn the messages read back from the Arrow
table into plain parts lists.
"""

from __future__ import annotations

import PIL.Image

from .layouts import conversation, detect, image_ref, open_image

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


def canonical_messages(messages, num_images: int, where: str) -> list[dict]:
    """``messages`` (each ``{"role", "content": str | parts}``, :mod:`.layouts`) checked and with every content a
    list of parts (:func:`_parts`).

    Raises:
        ValueError: naming ``where``: a message that is not ``{role, content}``, an unknown role, an empty text, no
            assistant turn, a conversation that does not open with a user turn (after an optional system turn), an
            image in an assistant turn, or image placeholders that differ from ``num_images``.
    """
    canonical = []
    for message in messages:
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise ValueError(f"{where}: a message must be an object with 'role' and 'content', got {message!r:.80}")
        role = message["role"]
        if role not in ROLES:
            raise ValueError(f"{where}: unknown role {role!r}; roles are {list(ROLES)}")
        canonical.append({"role": role, "content": _parts(message["content"], role, where)})
    roles = [m["role"] for m in canonical]
    if "assistant" not in roles:
        raise ValueError(f"{where}: the conversation has no assistant turn (nothing to learn)")
    if [r for r in roles if r != "system"][0] != "user":
        raise ValueError(f"{where}: the conversation must open with a user turn (after an optional system turn)")
    for message in canonical:
        if message["role"] == "assistant" and any(p["type"] == "image" for p in message["content"]):
            raise ValueError(f"{where}: an image in an assistant turn is not supported")
    placeholders = sum(p["type"] == "image" for m in canonical for p in m["content"])
    if placeholders != num_images:
        raise ValueError(f"{where}: {placeholders} image placeholder(s) but {num_images} image(s)")
    return canonical


def canonical_row(obj, base: str, where: str, layout: str = "auto") -> dict:
    """One row of any layout (:mod:`.layouts`; ``auto``: detected from its keys) as ``{"messages": [...],
    "images": [...]}`` with every content a list of parts; each image a path (absolute) or a lazily opened
    ``PIL.Image.Image`` (one given as bytes or in memory).

    Raises:
        ValueError: the row's layout is unknown, or a check of :func:`canonical_messages` or
            :func:`~.layouts.image_ref` fails (the message starts with ``where``).
    """
    layout = detect(obj, where) if layout == "auto" else layout
    messages, images = conversation(obj, layout, where)
    canonical = canonical_messages(messages, len(images), where)
    return {"messages": canonical, "images": [im if isinstance(im, PIL.Image.Image)  # in memory: as it is
                                              else open_image(image_ref(im, base, where)) for im in images]}


def plain_messages(messages) -> list[dict]:
    """Messages as read back from the Arrow table (image parts carry ``"text": None``) -> plain parts lists."""
    out = []
    for message in messages:
        parts = [{"type": "image"} if p["type"] == "image" else {"type": "text", "text": p["text"]}
                 for p in message["content"]]
        out.append({"role": message["role"], "content": parts})
    return out
