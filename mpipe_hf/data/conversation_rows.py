"""Conversation rows: check and normalise one conversation (of any layout, :mod:`.layouts`) to the canonical form
``{"messages": [{"role", "content": [parts]}], "images": [...], "videos": [...]}``, and turn the messages read
back from the Arrow table into plain parts lists.
"""

from __future__ import annotations

import re

import PIL.Image

from .layouts import VIDEO_PARTS, conversation, conversation_videos, detect, image_ref, open_image
from .video import video_ref

ROLES = ("system", "user", "assistant")
PLACEHOLDER = "<image>"
VIDEO_PLACEHOLDER = "<video>"  # LLaVA-Video's, ShareGPT4Video's and LLaMA-Factory's, in a string content


def _split(content: str, videos: bool) -> list[dict]:
    """A string content as parts: each ``<image>`` (and, with ``videos``, ``<video>``) an image (video) part, the
    text between them text parts (empty ones left out)."""
    marks = "|".join(re.escape(m) for m in (PLACEHOLDER, VIDEO_PLACEHOLDER if videos else None) if m)
    parts = []
    for piece in re.split(f"({marks})", content):
        if piece in (PLACEHOLDER, VIDEO_PLACEHOLDER) and (videos or piece == PLACEHOLDER):
            parts.append({"type": "image" if piece == PLACEHOLDER else "video"})
        elif piece:
            parts.append({"type": "text", "text": piece})
    return parts


def _parts(content, role: str, where: str, videos: bool = False) -> list[dict]:
    """A message's ``content`` (a string with ``<image>`` placeholders, and ``<video>`` ones where the row has
    ``videos``, or a list of parts) as a list of parts ``{"type": "image"}`` / ``{"type": "video"}`` /
    ``{"type": "text", "text": str}``, in order; empty strings between placeholders are left out, other text is
    kept verbatim.

    Raises:
        ValueError: a content that is neither, a part of no known type, a text part that is not a string or writes
            ``<image>``, or a message with no image, video and text but whitespace.
    """
    if isinstance(content, str):
        parts = _split(content, videos)
    elif isinstance(content, list):
        parts = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in ("image", "image_url"):
                parts.append({"type": "image"})
            elif kind in VIDEO_PARTS:
                parts.append({"type": "video"})
            elif kind == "text":
                text = part.get("text")
                if not isinstance(text, str):
                    raise ValueError(f"{where}: a {role} text part has no string 'text': {part!r}")
                if PLACEHOLDER in text:
                    raise ValueError(f"{where}: a {role} text part writes {PLACEHOLDER!r}; in a list of parts an "
                                     f"image is a part {{'type': 'image'}}")
                parts.append({"type": "text", "text": text})
            else:
                raise ValueError(f"{where}: a {role} content part must be {{'type': 'text', 'text': ...}}, "
                                 f"{{'type': 'image'}} or {{'type': 'video'}}, got {part!r:.200}")
    else:
        raise ValueError(f"{where}: a {role} message's content must be a string or a list of parts, "
                         f"got {type(content).__name__}")
    has_image = any(p["type"] != "text" for p in parts)
    if not has_image and not "".join(p["text"] for p in parts if p["type"] == "text").strip():
        what = "an empty assistant turn" if role == "assistant" else f"an empty {role} text"
        raise ValueError(f"{where}: {what} (no text but whitespace)")
    return parts


def canonical_messages(messages, num_images: int, where: str, num_videos: int = 0) -> list[dict]:
    """``messages`` (each ``{"role", "content": str | parts}``, :mod:`.layouts`) checked and with every content a
    list of parts (:func:`_parts`; ``<video>`` in a string is a video only where ``num_videos`` > 0).

    Raises:
        ValueError: naming ``where``: a message that is not ``{role, content}``, an unknown role, an empty text, no
            assistant turn, a conversation that does not open with a user turn (after an optional system turn), an
            image or video in an assistant turn, or image (video) placeholders that differ from ``num_images``
            (``num_videos``).
    """
    canonical = []
    for message in messages:
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise ValueError(f"{where}: a message must be an object with 'role' and 'content', got {message!r:.80}")
        role = message["role"]
        if role not in ROLES:
            raise ValueError(f"{where}: unknown role {role!r}; roles are {list(ROLES)}")
        canonical.append({"role": role, "content": _parts(message["content"], role, where, num_videos > 0)})
    roles = [m["role"] for m in canonical]
    if "assistant" not in roles:
        raise ValueError(f"{where}: the conversation has no assistant turn (nothing to learn)")
    if [r for r in roles if r != "system"][0] != "user":
        raise ValueError(f"{where}: the conversation must open with a user turn (after an optional system turn)")
    for message in canonical:
        if message["role"] == "assistant" and any(p["type"] != "text" for p in message["content"]):
            raise ValueError(f"{where}: an image or video in an assistant turn is not supported")
    for kind, count in (("image", num_images), ("video", num_videos)):
        placeholders = sum(p["type"] == kind for m in canonical for p in m["content"])
        if placeholders != count:
            raise ValueError(f"{where}: {placeholders} {kind} placeholder(s) but {count} {kind}(s)")
    return canonical


def canonical_row(obj, base: str, where: str, layout: str = "auto") -> dict:
    """One row of any layout (:mod:`.layouts`; ``auto``: detected from its keys) as ``{"messages": [...],
    "images": [...], "videos": [...]}`` with every content a list of parts; each image a path (absolute) or a
    lazily opened ``PIL.Image.Image`` (one given as bytes or in memory); each video a reference
    (:func:`~.video.video_ref`: absolute paths and the video's options), none decoded.

    Raises:
        ValueError: the row's layout is unknown, or a check of :func:`canonical_messages`,
            :func:`~.layouts.image_ref` or :func:`~.video.video_ref` fails (the message starts with ``where``).
    """
    layout = detect(obj, where) if layout == "auto" else layout
    messages, images = conversation(obj, layout, where, videos=True)
    videos = conversation_videos(obj, messages, where)
    canonical = canonical_messages(messages, len(images), where, len(videos))
    return {"messages": canonical, "images": [im if isinstance(im, PIL.Image.Image)  # in memory: as it is
                                              else open_image(image_ref(im, base, where)) for im in images],
            "videos": [video_ref(source, base, where, options) for source, options in videos]}


def plain_messages(messages) -> list[dict]:
    """Messages as read back from the Arrow table (image parts carry ``"text": None``) -> plain parts lists."""
    out = []
    for message in messages:
        parts = [{"type": p["type"]} if p["type"] in ("image", "video") else {"type": "text", "text": p["text"]}
                 for p in message["content"]]
        out.append({"role": message["role"], "content": parts})
    return out
