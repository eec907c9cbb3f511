"""Qwen3-VL's video processor without torchvision: :class:`Qwen3VideoProcessor` gives the outputs of
``transformers``' ``Qwen3VLVideoProcessor`` (``models/qwen3_vl/video_processing_qwen3_vl.py``, 5.25; also the
video processor of Qwen3-VL-MoE, Qwen3.5 and Qwen3.5-MoE) with torch operations only.

It is :class:`~mpipe_hf.data.video_processor.QwenVideoProcessor` (the resize, normalisation and patchify that
torchvision 0.28 computes, compared bit for bit with the stock Qwen2-VL class: docs/video.md) with what the
Qwen3-VL class does otherwise, read from its code:

- defaults: 16-px patches, ImageNet's standard mean and std (0.5), ``size`` ``[128, 768] x 32 x 32`` px, frames
  sampled at 2 fps by default (``do_sample_frames``), ``max_video_tokens`` 768 a frame;
- sampling: ``n = int(total / video_fps * fps)`` (``video_fps`` 24 where the metadata has none) clamped to
  ``[min_frames, min(max_frames, total)]``, or ``num_frames`` as given, spread with
  ``linspace(0, total - 1, n).round()`` (no multiple of ``temporal_patch_size``: patchify repeats the last frame);
- the resize budget is the whole video's: its ``smart_resize`` bounds ``round(T / 2) * 2 * H * W`` by ``size``
  (``[shortest_edge, longest_edge]``), and ``cap_pixels_per_frame`` bounds each frame by
  ``min(max_video_tokens * 32 * 32, longest_edge // T)`` px (at least ``1.05 * shortest_edge``) times ``T``.

The processor (``Qwen3VLProcessor``) writes each temporal patch as ``<t seconds>`` then its tokens between
``<|vision_start|>`` and ``<|vision_end|>``, ``t`` the mean time of the patch's frames (the stock
``_calculate_timestamps``, from ``frames_indices`` and the video's fps): what :meth:`timestamps` gives.
"""

from __future__ import annotations

import math

import numpy as np
from transformers.image_utils import IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD, SizeDict
from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize as video_smart_resize
from transformers.video_utils import VideoMetadata

from ...data.video_processor import QwenVideoProcessor

UNKNOWN_FPS = 24  # the rate the stock class assumes for a video whose metadata has none


def qwen3_sample_indices(total: int, video_fps: float | None, min_frames: int, max_frames: int,
                         num_frames: int | None = None, fps: float | None = None) -> np.ndarray:
    """The frames ``Qwen3VLVideoProcessor.sample_frames`` keeps of a ``total``-frame video at ``video_fps``
    (module docstring): ``num_frames`` as given, else ``int(total / video_fps * fps)`` clamped to
    ``[min_frames, min(max_frames, total)]``, else every frame within ``[min_frames, max_frames]``; spread with
    ``linspace(0, total - 1, n).round()``. Returns int64 indices.

    Raises:
        ValueError: both ``num_frames`` and ``fps``; a video with no frame.
    """
    if fps is not None and num_frames is not None:
        raise ValueError("`num_frames` and `fps` are mutually exclusive arguments, please use only one!")
    if total < 1:
        raise ValueError("a video with no frame cannot be sampled")
    if num_frames is None and fps is not None:
        num_frames = int(total / (UNKNOWN_FPS if video_fps is None else video_fps) * fps)
        num_frames = min(max(num_frames, min_frames), max_frames, total)
    if num_frames is None:
        num_frames = min(max(total, min_frames), max_frames)
    return np.linspace(0, total - 1, num_frames).round().astype(int)


def video_budget(size: SizeDict, frames: int, factor: int, cap: bool | None, max_video_tokens: int) -> int:
    """The most pixels the whole video keeps (``T * H * W``, Qwen3-VL's ``smart_resize`` ``max_pixels``):
    ``size.longest_edge``, or with ``cap`` the per-frame cap times ``frames`` (module docstring)."""
    if not cap:
        return size.longest_edge
    per_frame = max(min(max_video_tokens * factor * factor, size.longest_edge // frames),
                    int(size.shortest_edge * 1.05))
    return per_frame * frames


class Qwen3VideoProcessor(QwenVideoProcessor):
    """``Qwen3VLVideoProcessor`` without torchvision (module docstring): the same settings, defaults, outputs
    (``pixel_values_videos`` ``(patches, C * temporal_patch_size * patch_size**2)`` float32, ``video_grid_thw``
    ``(videos, 3)``, ``video_metadata``) and token counts; ``cap_pixels_per_frame`` unset means ``False``, as the
    stock class takes it (without its warning)."""

    stock_class_name = "Qwen3VLVideoProcessor"
    size = {"shortest_edge": 128 * 32 * 32, "longest_edge": 32 * 32 * 768}
    image_mean, image_std = IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD
    patch_size = 16
    do_sample_frames = True
    max_video_tokens = 768
    fps = 2
    num_frames = None

    def sample_frames(self, metadata: VideoMetadata, num_frames: int | None = None, fps: float | None = None,
                      min_frames: int | None = None, max_frames: int | None = None, **kwargs) -> np.ndarray:
        """The frame indices the stock ``sample_frames`` keeps (:func:`qwen3_sample_indices`), ``fps`` and the
        bounds defaulting to the processor's (the stock method reads the bounds from the processor only; a row's
        own ``min_frames`` / ``max_frames`` options are taken here). Sets ``metadata.fps`` to 24 where it is
        unknown and ``fps`` samples, as the stock method does.

        Raises:
            ValueError: :func:`qwen3_sample_indices`'s.
        """
        if num_frames is None:
            num_frames = self.num_frames
        fps = fps if fps is not None else (self.fps if num_frames is None else None)
        if num_frames is None and fps is not None and metadata.fps is None:
            metadata.fps = UNKNOWN_FPS
        low = self.min_frames if min_frames is None else min_frames
        high = self.max_frames if max_frames is None else max_frames
        return qwen3_sample_indices(metadata.total_num_frames, metadata.fps, low, high, num_frames, fps)

    def frame_size(self, frames: int, height: int, width: int, size=None, patch_size=None, merge_size=None,
                   temporal_patch_size=None, cap_pixels_per_frame=None, max_video_tokens=None) -> tuple[int, int]:
        """``(height, width)`` px the stock ``resize`` gives a ``frames``-frame video of ``height`` x ``width``
        (Qwen3-VL's ``smart_resize`` over the whole video under :func:`video_budget`); each setting defaults to
        the processor's."""
        size = size or self.size
        size = size if isinstance(size, SizeDict) else SizeDict(**size)
        if not size.shortest_edge or not size.longest_edge:
            raise ValueError(f"`size` dict must contain 'shortest_edge' and 'longest_edge' keys but got {size}.")
        factor = (patch_size or self.patch_size) * (merge_size or self.merge_size)
        cap = self.cap_pixels_per_frame if cap_pixels_per_frame is None else cap_pixels_per_frame
        tokens = self.max_video_tokens if max_video_tokens is None else max_video_tokens
        return video_smart_resize(frames, height, width, temporal_patch_size or self.temporal_patch_size, factor,
                                  size.shortest_edge, video_budget(size, frames, factor, cap, tokens))

    def _resized_size(self, stacked, size: SizeDict, patch_size: int, merge_size: int, temporal_patch_size: int,
                      cap_pixels_per_frame, max_video_tokens) -> tuple[int, int]:
        return self.frame_size(stacked.shape[1], stacked.shape[-2], stacked.shape[-1], size, patch_size, merge_size,
                               temporal_patch_size, cap_pixels_per_frame, max_video_tokens)

    def get_num_of_video_patches(self, num_frames: int, height: int, width: int, videos_kwargs=None) -> int:
        """Patches a ``num_frames``-frame ``height`` x ``width`` video takes, as the stock method counts them."""
        kw = self._merge_and_standardize_kwargs(**(videos_kwargs or {}))
        patch, temporal = kw["patch_size"], kw["temporal_patch_size"]
        height, width = self.frame_size(num_frames, height, width, kw["size"], patch, kw["merge_size"], temporal,
                                        kw.get("cap_pixels_per_frame"), kw.get("max_video_tokens"))
        return (num_frames + -num_frames % temporal) // temporal * (height // patch) * (width // patch)

    def grid_for(self, num_frames: int, height: int, width: int) -> tuple[int, int, int]:
        """``(grid_t, grid_h, grid_w)`` of a video of ``num_frames`` sampled frames of ``height`` x ``width`` px
        with this processor's settings."""
        height, width = self.frame_size(num_frames, height, width)
        return -(-num_frames // self.temporal_patch_size), height // self.patch_size, width // self.patch_size

    def tokens_for(self, num_frames: int, height: int, width: int) -> int:
        """Tokens (``<|video_pad|>``) such a video takes: ``grid_t * grid_h * grid_w / merge_size**2``."""
        return math.prod(self.grid_for(num_frames, height, width)) // self.merge_size ** 2

    def timestamps(self, indices, video_fps: float | None) -> list[float]:
        """Seconds of each temporal patch (the mean of its first and last frame's times, the last frame repeated
        to a whole patch), as ``Qwen3VLProcessor._calculate_timestamps`` computes them (24 fps where unknown)."""
        indices = [int(i) for i in indices]
        merge, fps = self.temporal_patch_size, UNKNOWN_FPS if video_fps is None else video_fps
        indices += [indices[-1]] * (-len(indices) % merge)
        times = [i / fps for i in indices]
        return [(times[i] + times[i + merge - 1]) / 2 for i in range(0, len(times), merge)]


# the image processor settings a Qwen3-VL video processor built without a snapshot takes over
QWEN3_IMAGE_KEYS = ("do_convert_rgb", "do_normalize", "do_rescale", "do_resize", "image_mean", "image_std",
                    "merge_size", "patch_size", "resample", "rescale_factor", "temporal_patch_size")
FRAMES_PER_BUDGET = 8  # a whole video's default budget: this many frames at the image processor's budget


def qwen3_video_processor_from_image(image_processor, settings: dict | None = None) -> Qwen3VideoProcessor:
    """The video processor of a Qwen3-VL-like processor built without a snapshot (a recipe's ``min_pixels`` /
    ``max_pixels``): :func:`whole_video_processor` of :class:`Qwen3VideoProcessor`. Qwen3-VL snapshots ship a
    ``video_preprocessor_config.json``, whose own ``size`` wins."""
    return whole_video_processor(Qwen3VideoProcessor, image_processor, settings)


def whole_video_processor(cls, image_processor, settings: dict | None = None):
    """``cls`` (a video processor with a whole-video pixel budget: Qwen3-VL's, GLM-4.xV's) built from
    ``image_processor``'s patch and normalisation settings, the whole-video budget ``[shortest_edge,
    FRAMES_PER_BUDGET * longest_edge]`` of the image's, ``settings`` (a snapshot's
    ``video_preprocessor_config.json``) over them."""
    import json
    own = json.loads(image_processor.to_json_string())
    merged = {key: own[key] for key in QWEN3_IMAGE_KEYS if key in own}
    size = own.get("size") or {}
    if size.get("shortest_edge") and size.get("longest_edge"):
        merged["size"] = {"shortest_edge": size["shortest_edge"],
                          "longest_edge": size["longest_edge"] * FRAMES_PER_BUDGET}
    allowed = set(cls.valid_kwargs.__annotations__) | set(QWEN3_IMAGE_KEYS) | {"size", "fps", "num_frames"}
    merged.update({k: v for k, v in (settings or {}).items() if k in allowed})
    return cls(**merged)
