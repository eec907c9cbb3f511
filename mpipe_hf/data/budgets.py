"""Visual-token budgets of one row (docs/data.md, "Visual-token budgets"): the caps a recipe's
``data`` section sets (:class:`RowCaps`) applied to a row's images and videos before it is encoded
(:func:`cap_row`), so that a row over a cap is resized or sampled down, and counted, and never cut through an
image's or a video's tokens.

- ``max_pixels`` (images): the image processor's own budget; an image above it is resized down by the processor,
  and the row is counted;
- ``video_max_pixels``: each video frame's budget; a video whose frames, as its processor sizes them, hold more
  pixels gets this budget as its own ``max_pixels`` option (:mod:`.video`: ``smart_resize`` under it, as
  qwen-vl-utils' ``fetch_video``);
- ``max_frames``: the most frames a video keeps; a video sampled to more gets it as its ``max_frames`` option
  (``num_frames`` lowered to it where the row gives a count), sampled as ``Qwen2VLVideoProcessor.sample_frames``;
- ``max_visual_tokens``: the most image and video tokens a row takes. A row over it has every image's and
  video frame's pixel budget scaled down together (by 0.9 a round, each image through its family's own
  ``smart_resize``, to the processor's ``min_pixels`` at least), as qwen-vl-utils shares ``total_pixels`` among
  frames; at those floors its videos' frames are thinned (by 0.8 a round, to one temporal patch at least); a row
  still over is dropped, with the reason.

The token counts are the processor's own for the resized input (:meth:`~.conversation_encoder.ConversationEncoder.
image_tokens_for_sizes`, :meth:`~.video_processor.QwenVideoProcessor.tokens_for`): the collator resizes a capped
image to its stored size before the processor (:func:`resize_images`), and a capped video's options travel in its
reference, so the tokens a row was counted for are the tokens it trains with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import PIL.Image

from .video import _own_size, _sampler, video_metadata

CAPS = ("max_pixels", "video_max_pixels", "max_frames", "max_visual_tokens")
PIXEL_STEP, FRAME_STEP, ROUNDS = 0.9, 0.8, 80  # the shrink per round of max_visual_tokens, and the most rounds
MIN_PIXELS = 32 * 32  # the smallest image of a family that does not resize by smart_resize


@dataclass(frozen=True)
class RowCaps:
    """The per-row caps (module docstring), each ``None`` when not set. Built from a recipe by
    :attr:`~mpipe_hf.train.recipe_data.DataSection.caps`, which checks them (``ValueError`` naming the field).

    Attributes:
        max_pixels: an image's pixels (``data.max_pixels``, the image processor's budget): counted only.
        video_max_pixels: a video frame's pixels after resizing.
        max_frames: a video's sampled frames.
        max_visual_tokens: a row's image and video tokens together.
    """

    max_pixels: int | None = None
    video_max_pixels: int | None = None
    max_frames: int | None = None
    max_visual_tokens: int | None = None


@dataclass
class RowBudget:
    """One row's images and videos after :func:`cap_row`.

    Attributes:
        sizes: each image's ``(height, width)`` px as the processor gets it (the stored size where resized).
        resize: per image, ``[height, width]`` the collator resizes it to first, or ``None`` (as it is).
        clips: the video references with their capped options.
        video_groups: each video's temporal patches (``ceil(frames / temporal_patch_size)``), the groups of
            frames its tower attends within.
        over: the caps (:data:`CAPS`) the row was over before capping, in that order.
        error: why the row is dropped (still over ``max_visual_tokens`` at the floors), else ``None``.
        visual_tokens: the row's image and video tokens as counted while shrinking (``None``: not counted).
    """

    sizes: list[tuple[int, int]]
    resize: list[list[int] | None]
    clips: list[dict]
    video_groups: list[int] = field(default_factory=list)
    over: list[str] = field(default_factory=list)
    error: str | None = None
    visual_tokens: int | None = None

    def metadata(self, encoded) -> dict:
        """What the prepared row keeps (its ``visual`` column, as JSON), ``encoded`` the row's
        :class:`~.conversation_encoder.Encoded`: ``resize``, ``image_tokens`` and ``video_tokens`` (each image's
        and video's tokens, in the row's order), ``video_groups`` and ``over``."""
        videos, images = list(encoded.video_spans), []
        for span in encoded.image_spans:  # images and videos in the text's order; the videos' spans in theirs
            if videos and span == videos[0]:
                videos.pop(0)
            else:
                images.append(span[1] - span[0])
        return {"resize": self.resize, "over": self.over, "video_groups": self.video_groups, "image_tokens": images,
                "video_tokens": [b - a for a, b in encoded.video_spans]}


def _edge(size, name: str) -> int | None:
    value = size.get(name) if isinstance(size, dict) else getattr(size, name, None)
    return int(value) if value else None


def smart_factor(image_processor) -> int | None:
    """``patch_size * merge_size`` of an image processor that resizes by Qwen2-VL's ``smart_resize`` (between
    ``size.shortest_edge`` and ``size.longest_edge`` px, sides in multiples of the factor), else ``None``."""
    size = getattr(image_processor, "size", None)
    patch, merge = getattr(image_processor, "patch_size", None), getattr(image_processor, "merge_size", None)
    if not (patch and merge and size is not None and _edge(size, "shortest_edge") and _edge(size, "longest_edge")):
        return None
    return int(patch) * int(merge)


def processed_size(image_processor, height: int, width: int, max_pixels: int | None = None) -> tuple[int, int]:
    """``(height, width)`` px an image of ``height`` x ``width`` gets under a pixel budget ``max_pixels``
    (``None``: the processor's ``longest_edge``): the family's ``smart_resize`` (Qwen2-VL, its factor and
    ``shortest_edge`` floor) where the processor resizes by it, else the sides scaled by ``sqrt(budget / pixels)``
    (at least 1 px), an image within the budget as it is.

    Raises:
        ValueError: ``smart_resize``'s (an aspect ratio over 200).
    """
    factor = smart_factor(image_processor)
    if factor is not None:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize
        size = image_processor.size
        budget = max_pixels or _edge(size, "longest_edge")
        return tuple(smart_resize(height, width, factor, min_pixels=_edge(size, "shortest_edge"), max_pixels=budget))
    if max_pixels is None or height * width <= max_pixels:
        return height, width
    scale = math.sqrt(max_pixels / (height * width))
    return max(1, int(height * scale)), max(1, int(width * scale))


def image_counts(encoder, sizes: list[tuple[int, int]]) -> list[int]:
    """Tokens the processor of ``encoder`` gives images of ``sizes``: its own count (a family whose image is its
    placeholder repeated), else the tokens of the text it expands each placeholder to.

    Raises:
        ValueError: the processor rejects a size.
    """
    from .conversation_encoder import repeated
    if not sizes:
        return []
    try:
        if repeated(encoder.model_type):
            return encoder.image_tokens_for_sizes(sizes)
        return [len(encoder.tokenizer(text, add_special_tokens=False)["input_ids"])
                for text in encoder.image_replacements_for_sizes(sizes)]
    except ValueError as err:  # the processor's own limits (an aspect ratio past 200, say), as the row check words it
        raise ValueError(f"the image processor rejects an image: {err}") from err


class _Video:
    """One video of a row while it is capped: its reference, metadata (read once) and video processor."""

    def __init__(self, ref: dict, video_processor):
        self.ref, self.processor, self.meta = dict(ref), video_processor, video_metadata(ref)

    def frames(self) -> int:
        return len(_sampler(self.ref, self.processor)(metadata=self.meta))

    def tokens(self) -> int:
        return self.processor.tokens_for(self.frames(), *_own_size(self.ref, self.processor, self.meta.height,
                                                                   self.meta.width))

    def groups(self) -> int:
        return -(-self.frames() // self.processor.temporal_patch_size)

    def frame_pixels(self) -> int:
        """Pixels of a frame as the processor sizes it: tokens * merge**2 * patch**2 / temporal patches."""
        p = self.processor
        return self.tokens() * p.merge_size ** 2 * p.patch_size ** 2 // self.groups()

    def floor(self) -> int:
        return _edge(self.processor.size, "shortest_edge") or 1

    def cap_frames(self, most: int) -> None:
        """Keep at most ``most`` frames (floored to a multiple of the temporal patch, one patch at least)."""
        temporal = self.processor.temporal_patch_size
        most = max(temporal, most // temporal * temporal)
        if "num_frames" in self.ref:
            self.ref["num_frames"] = min(self.ref["num_frames"], most)
        else:
            self.ref["max_frames"] = min(self.ref.get("max_frames") or self.processor.max_frames, most)
        if self.frames() > most:  # a processor-wide num_frames wins over fps: give the count itself
            self.ref.pop("fps", None)
            self.ref["num_frames"] = most

    def cap_pixels(self, most: int) -> None:
        """Resize its frames to at most ``most`` px (its own ``max_pixels`` option, ``min_pixels`` below it)."""
        most = max(self.floor(), int(most))
        self.ref["max_pixels"] = min(self.ref.get("max_pixels") or most, most)
        if self.ref.get("min_pixels") and self.ref["min_pixels"] > self.ref["max_pixels"]:
            self.ref["min_pixels"] = self.ref["max_pixels"]


def cap_row(caps: RowCaps | None, encoder, sizes: list[tuple[int, int]], clips: list[dict],
            where: str) -> RowBudget:
    """``caps`` applied to one row's images (``sizes``, ``(height, width)`` px from their headers) and videos
    (``clips``, :func:`~.video.video_ref` references) for the processor of ``encoder`` (module docstring).

    Returns:
        a :class:`RowBudget`: the sizes and references to encode and load, each video's temporal patches, the caps
        the row was over, and ``error`` when it stays over ``max_visual_tokens`` (the caller drops it).

    Raises:
        ValueError: naming ``where``: a video whose header cannot be read or that cannot be sampled; an image the
            processor rejects; ``video_max_pixels`` or ``max_visual_tokens`` for videos whose processor resizes
            every frame to one size (LLaVA-OneVision).
    """
    caps = caps or RowCaps()
    over = [] if caps.max_pixels is None or all(h * w <= caps.max_pixels for h, w in sizes) else ["max_pixels"]
    processor = getattr(encoder.processor, "video_processor", None)
    try:
        videos = [_Video(ref, processor) for ref in clips] if processor is not None else []
        fixed = videos and not hasattr(processor, "merge_size")  # frames resized to one size (LLaVA-OneVision)
        named = [k for k in ("video_max_pixels", "max_visual_tokens") if getattr(caps, k) is not None]
        if fixed and named:
            raise ValueError(f"data.{named[0]} cannot cap these videos: {type(processor).__name__} resizes every "
                             f"frame to one size; use data.max_frames, or leave data.{named[0]} unset")
        if caps.max_frames is not None and any(v.frames() > caps.max_frames for v in videos):
            over.append("max_frames")
            for video in videos:
                video.cap_frames(caps.max_frames)
        if caps.video_max_pixels is not None and any(v.frame_pixels() > caps.video_max_pixels for v in videos):
            over.append("video_max_pixels")
            for video in videos:
                video.cap_pixels(caps.video_max_pixels)
        budget = RowBudget(list(sizes), [None] * len(sizes), [v.ref for v in videos] or list(clips),
                           [v.groups() for v in videos], over)
        if caps.max_visual_tokens is not None:
            budget.visual_tokens = sum(image_counts(encoder, sizes)) + sum(v.tokens() for v in videos)
            if budget.visual_tokens > caps.max_visual_tokens:
                over.append("max_visual_tokens")
                budget = _shrink(encoder, sizes, videos, caps.max_visual_tokens, over)
    except ValueError as err:
        raise ValueError(f"{where}: {str(err).removeprefix(f'{where}: ')}") from err
    return budget


def _counted(encoder, sizes, resize, videos: list[_Video], over: list[str]) -> RowBudget:
    """The budget of images resized to ``resize`` (``None``: as ``sizes``) and ``videos``, counted."""
    shown = [tuple(r) if r else s for s, r in zip(sizes, resize)]
    tokens = sum(image_counts(encoder, shown)) + sum(v.tokens() for v in videos)
    return RowBudget(shown, list(resize), [dict(v.ref) for v in videos], [v.groups() for v in videos], over,
                     visual_tokens=tokens)


def _shrink(encoder, sizes, videos: list[_Video], cap: int, over: list[str]) -> RowBudget:
    """Scale every image's and video frame's pixel budget by :data:`PIXEL_STEP` a round until all are at their
    floors, then thin the videos' frames by :data:`FRAME_STEP` a round down to one temporal patch, until the row
    takes at most ``cap`` visual tokens (else ``error`` is set)."""
    image_processor = encoder.processor.image_processor if sizes else None
    natural = [processed_size(image_processor, h, w) for h, w in sizes]
    areas, floor = [h * w for h, w in natural], image_floor(image_processor)
    frame_areas, frames = [v.frame_pixels() for v in videos], [v.frames() for v in videos]
    budget = _counted(encoder, sizes, [None] * len(sizes), videos, over)
    for k in range(1, ROUNDS + 1):
        if budget.visual_tokens <= cap:
            return budget
        scale = PIXEL_STEP ** k
        resize = [processed_size(image_processor, h, w, max(floor, int(a * scale))) for (h, w), a in zip(sizes, areas)]
        resize = [list(r) if r != n else None for r, n in zip(resize, natural)]
        for video, area in zip(videos, frame_areas):
            video.cap_pixels(area * scale)
        budget = _counted(encoder, sizes, resize, videos, over)
        if all(a * scale <= floor for a in areas) and all(a * scale <= v.floor() for v, a in zip(videos, frame_areas)):
            break
    for k in range(1, ROUNDS + 1):
        if budget.visual_tokens <= cap or all(v.frames() <= v.processor.temporal_patch_size for v in videos):
            break
        for video, n in zip(videos, frames):
            video.cap_frames(int(n * FRAME_STEP ** k))
        budget = _counted(encoder, sizes, budget.resize, videos, over)
    if budget.visual_tokens > cap:
        budget.error = (f"max_visual_tokens={cap}: its images and videos take {budget.visual_tokens} tokens at the "
                        f"smallest sizes and fewest frames they may have (the processor's min_pixels, one temporal "
                        f"patch of frames)")
    return budget


def image_floor(image_processor) -> int:
    """The fewest pixels :func:`cap_row` shrinks an image to: the processor's ``size.shortest_edge`` (its
    ``min_pixels``) for a ``smart_resize`` family, else :data:`MIN_PIXELS`."""
    if image_processor is not None and smart_factor(image_processor) is not None:
        return _edge(image_processor.size, "shortest_edge")
    return MIN_PIXELS


def resize_images(images: list, targets: list | None, image_processor) -> list:
    """``images`` (PIL) each resized to its ``targets`` entry ``[height, width]`` (``None``: as it is) with the
    image processor's resampling filter (bicubic when it names none): what a row capped by :func:`cap_row` was
    counted for."""
    if not targets:
        return images
    resample = getattr(image_processor, "resample", None)
    resample = PIL.Image.Resampling(int(resample)) if resample is not None else PIL.Image.Resampling.BICUBIC
    return [image.resize((int(t[1]), int(t[0])), resample) if t else image for image, t in zip(images, targets)]
