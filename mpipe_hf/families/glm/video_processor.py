"""GLM-4.xV's video processors without torchvision: :class:`Glm4vVideoProcessorNoTV` gives the outputs of
``transformers``' ``Glm4vVideoProcessor`` (``models/glm4v/video_processing_glm4v.py``, 5.25; GLM-4.5V (glm4v_moe)
uses it) and :class:`Glm46vVideoProcessorNoTV` those of GLM-4.6V's ``Glm46VVideoProcessor`` (the same class but
its sampling, :func:`glm46v_sample_indices`) with torch operations only.

It is :class:`~mpipe_hf.data.video_processor.QwenVideoProcessor` (the resize, normalisation and patchify that
torchvision 0.28 computes, compared bit for bit with the stock Qwen2-VL class: docs/video.md) with what the GLM
class does otherwise, read from its code:

- defaults: 14-px patches, OpenAI CLIP's mean and std, ``size`` ``[112 * 112, 28 * 28 * 2 * 30000]`` px for the
  whole video, frames sampled at 2 fps by default (``do_sample_frames``), at most ``max_duration`` 300 s;
- sampling (the video's fps is required): a video of ``d`` s (``duration``, else ``round((total - 1) / fps) + 1``)
  keeps frame ``min(total - 1, ceil(i * video_fps / fps))`` for ``i < max(floor(d * fps), 1)``; a longer one
  ``int(max_duration * fps)`` frames at ``linspace(0, d, n)`` s (every frame when that is not fewer); repeated
  indices are dropped, and the last one repeated to an even count;
- the resize budget is the whole video's: GLM's ``smart_resize`` bounds ``round(T / 2) * 2 * H * W`` by ``size``
  and scales ``T * H * W`` to it.

The processor (``Glm4vProcessor``) writes each temporal patch as ``<|begin_of_image|>`` + its tokens (the image
token: GLM-4.1V's model finds video tokens as image tokens) + ``<|end_of_image|>`` then its first frame's time
(:meth:`Glm4vVideoProcessorNoTV.timestamps`), written by :meth:`~Glm4vVideoProcessorNoTV.frame_text`: whole
seconds (GLM-4.1V / 4.5V), ``{:.1f} seconds`` (``Glm46VProcessor``).
"""

from __future__ import annotations

import math

import numpy as np
from transformers.image_utils import SizeDict
from transformers.models.glm4v.video_processing_glm4v import smart_resize as glm_smart_resize
from transformers.video_utils import VideoMetadata

from ...data.video_processor import QwenVideoKwargs, QwenVideoProcessor


class GlmVideoKwargs(QwenVideoKwargs, total=False):
    """The stock class's own settings beside Qwen's: ``max_duration`` (s), ``max_image_size`` (kept, unused, as
    the stock class keeps it)."""

    max_duration: int
    max_image_size: dict


def glm_sample_indices(total: int, video_fps: float | None, duration: float | None, fps: float,
                       max_duration: int) -> np.ndarray:
    """The frames ``Glm4vVideoProcessor.sample_frames`` keeps (module docstring). Returns int64 indices, an even
    count.

    Raises:
        ValueError: the video's fps unknown (the stock method's refusal).
    """
    if video_fps is None:
        raise ValueError("GLM-4.xV samples frames by time and needs the video's fps (`VideoMetadata.fps`); "
                         "pass the metadata or `do_sample_frames=False`")
    last = total - 1
    seconds = duration or round(last / video_fps) + 1
    if seconds <= max_duration:
        count = max(int(math.floor(seconds * fps)), 1)
        picked = [min(last, int(math.ceil(k * video_fps / fps))) for k in range(count)]
    elif int(max_duration * fps) >= total:
        picked = list(range(total))
    else:
        picked = [min(last, int(math.ceil(t * video_fps)))
                  for t in np.linspace(0, seconds, int(max_duration * fps), endpoint=True)]
    kept = list(dict.fromkeys(picked))
    if len(kept) % 2:
        kept.append(kept[-1])
    return np.array(kept, dtype=int)


class Glm4vVideoProcessorNoTV(QwenVideoProcessor):
    """``Glm4vVideoProcessor`` without torchvision (module docstring): the same settings, defaults, outputs
    (``pixel_values_videos`` ``(patches, C * temporal_patch_size * patch_size**2)`` float32, ``video_grid_thw``
    ``(videos, 3)``, ``video_metadata``) and token counts."""

    stock_class_name = "Glm4vVideoProcessor"
    size = {"shortest_edge": 112 * 112, "longest_edge": 28 * 28 * 2 * 30000}
    max_image_size = {"longest_edge": 28 * 28 * 2 * 30000}
    do_sample_frames = True
    max_duration = 300
    num_frames = 16
    fps = 2
    valid_kwargs = GlmVideoKwargs

    def sample_frames(self, metadata: VideoMetadata, fps: float | None = None, **kwargs) -> np.ndarray:
        """The frame indices the stock ``sample_frames`` keeps (:func:`glm_sample_indices`); ``fps`` defaults to
        the processor's, other keywords are ignored as the stock method ignores them.

        Raises:
            ValueError: :func:`glm_sample_indices`'s.
        """
        if metadata is None:
            raise ValueError("GLM-4.xV samples frames by time and needs the video's metadata")
        return glm_sample_indices(metadata.total_num_frames, metadata.fps, metadata.duration,
                                  self.fps if fps is None else fps, self.max_duration)

    def frame_size(self, frames: int, height: int, width: int, size=None, patch_size=None, merge_size=None,
                   temporal_patch_size=None) -> tuple[int, int]:
        """``(height, width)`` px the stock ``resize`` gives a ``frames``-frame video of ``height`` x ``width``
        (GLM's ``smart_resize`` over the whole video); each setting defaults to the processor's.

        Raises:
            ValueError: ``size`` without both edges; ``smart_resize``'s (fewer frames than a temporal patch).
        """
        size = size or self.size
        size = size if isinstance(size, SizeDict) else SizeDict(**size)
        if not size.shortest_edge or not size.longest_edge:
            raise ValueError(f"`size` dict must contain 'shortest_edge' and 'longest_edge' keys but got {size}.")
        factor = (patch_size or self.patch_size) * (merge_size or self.merge_size)
        return glm_smart_resize(frames, height, width, temporal_factor=temporal_patch_size or self.temporal_patch_size,
                                factor=factor, min_pixels=size.shortest_edge, max_pixels=size.longest_edge)

    def _resized_size(self, stacked, size: SizeDict, patch_size: int, merge_size: int, temporal_patch_size: int,
                      cap_pixels_per_frame, max_video_tokens) -> tuple[int, int]:
        return self.frame_size(stacked.shape[1], stacked.shape[-2], stacked.shape[-1], size, patch_size, merge_size,
                               temporal_patch_size)

    def get_num_of_video_patches(self, num_frames: int, height: int, width: int, videos_kwargs=None) -> int:
        """Patches a ``num_frames``-frame ``height`` x ``width`` video takes, as the stock method counts them."""
        kw = self._merge_and_standardize_kwargs(**(videos_kwargs or {}))
        patch, temporal = kw["patch_size"], kw["temporal_patch_size"]
        height, width = self.frame_size(num_frames, height, width, kw["size"], patch, kw["merge_size"], temporal)
        return (num_frames + -num_frames % temporal) // temporal * (height // patch) * (width // patch)

    def grid_for(self, num_frames: int, height: int, width: int) -> tuple[int, int, int]:
        """``(grid_t, grid_h, grid_w)`` of a video of ``num_frames`` sampled frames of ``height`` x ``width``."""
        height, width = self.frame_size(num_frames, height, width)
        return -(-num_frames // self.temporal_patch_size), height // self.patch_size, width // self.patch_size

    def tokens_for(self, num_frames: int, height: int, width: int) -> int:
        """Image tokens such a video takes in all: ``grid_t * grid_h * grid_w / merge_size**2``."""
        return math.prod(self.grid_for(num_frames, height, width)) // self.merge_size ** 2

    def timestamps(self, indices, video_fps: float | None) -> list[float]:
        """Seconds of each temporal patch: its first frame's time (``frames_indices`` over the video's fps, 24
        where unknown), as ``Glm4vProcessor.replace_video_token`` takes them (``metadata.timestamps[::2]``)."""
        fps = 24 if video_fps is None else video_fps
        return [int(i) / fps for i in indices][::self.temporal_patch_size]

    def frame_text(self, seconds: float) -> str:
        """The text the stock processor writes after a temporal patch's ``<|end_of_image|>``: whole seconds."""
        return str(int(seconds))


# GLM-4.6V's sampling constants (``Glm46VVideoProcessor.sample_frames``): the frame rate by the video's length
# (up to 30 s, 300 s, longer), at most this many frames, at most this many seconds
GLM46V_RATES = ((30, 3), (300, 1), (2400, 0.5))
GLM46V_MAX_FRAMES, GLM46V_MAX_SECONDS = 640, 2400


def glm46v_sample_indices(total: int, video_fps: float | None, duration: float | None,
                          temporal: int) -> np.ndarray:
    """The frames ``Glm46VVideoProcessor.sample_frames`` keeps: ``temporal * rate`` frames a second (the rate by
    the length, :data:`GLM46V_RATES`), at most :data:`GLM46V_MAX_FRAMES`, picked as the first frame at or after
    each step of ``1 / (temporal * rate)`` s, respread with ``linspace`` where that gives a count other than the
    target; repeated indices dropped, the last repeated to an even count. Returns int64 indices.

    Raises:
        ValueError: the video's fps unknown (the stock method's refusal).
    """
    if video_fps is None:
        raise ValueError("GLM-4.6V samples frames by time and needs the video's fps (`VideoMetadata.fps`); "
                         "pass the metadata or `do_sample_frames=False`")
    seconds = duration or round((total - 1) / video_fps) + 1
    span = min(seconds, GLM46V_MAX_SECONDS)
    rate = next((r for limit, r in GLM46V_RATES if span <= limit), GLM46V_RATES[-1][1])
    target = min(int(span * rate * temporal), GLM46V_MAX_FRAMES)
    step, frame_time = 1 / (temporal * rate), 1 / video_fps
    picked = []
    if total >= target:
        due = 0
        for index in range(total):
            if index * frame_time >= due:
                due += step
                picked.append(index)
                if due >= int(seconds):
                    break
    else:
        picked = np.linspace(0, total - 1, target, dtype=int).tolist()
    if len(picked) < target:
        first, last = (picked[0], picked[-1]) if picked else (0, max(total - 1, 0))
        picked = np.linspace(first, last, target, dtype=int).tolist()
    elif len(picked) > target:
        picked = np.linspace(0, total - 1, target, dtype=int).tolist()
    kept = list(dict.fromkeys(picked))
    if len(kept) % 2:
        kept.append(kept[-1])
    return np.array(kept, dtype=int)


class Glm46vVideoProcessorNoTV(Glm4vVideoProcessorNoTV):
    """``Glm46VVideoProcessor`` without torchvision: GLM-4.1V's class with GLM-4.6V's sampling
    (:func:`glm46v_sample_indices`, which ignores ``fps``) and its prompt's ``{seconds:.1f} seconds``."""

    stock_class_name = "Glm46VVideoProcessor"

    def sample_frames(self, metadata: VideoMetadata, fps: float | None = None, **kwargs) -> np.ndarray:
        """The frame indices the stock ``sample_frames`` keeps (:func:`glm46v_sample_indices`).

        Raises:
            ValueError: :func:`glm46v_sample_indices`'s.
        """
        if metadata is None:
            raise ValueError("GLM-4.6V samples frames by time and needs the video's metadata")
        return glm46v_sample_indices(metadata.total_num_frames, metadata.fps, metadata.duration,
                                     self.temporal_patch_size)

    def frame_text(self, seconds: float) -> str:
        """The text the stock processor writes after a temporal patch's ``<|end_of_image|>``."""
        return f"{seconds:.1f} seconds"


def glm_video_processor_from_image(image_processor, model_type: str = "glm4v",
                                   settings: dict | None = None) -> Glm4vVideoProcessorNoTV:
    """The video processor of a GLM-4.xV processor built without a snapshot (``model_type`` ``glm46v``:
    GLM-4.6V's class, else GLM-4.1V's): ``image_processor``'s patch and normalisation settings, the whole-video
    budget ``[shortest_edge, FRAMES_PER_BUDGET * longest_edge]`` of the image's (as for Qwen3-VL), ``settings``
    (a snapshot's ``video_preprocessor_config.json``, whose own ``size`` wins) over them."""
    from ..qwen.qwen3_video_processor import whole_video_processor
    cls = Glm46vVideoProcessorNoTV if model_type == "glm46v" else Glm4vVideoProcessorNoTV
    return whole_video_processor(cls, image_processor, settings)
