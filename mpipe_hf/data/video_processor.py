"""Qwen2-VL's video processor without torchvision: :class:`QwenVideoProcessor` gives the outputs of
``transformers``' ``Qwen2VLVideoProcessor`` (``models/qwen2_vl/video_processing_qwen2_vl.py``, 5.25; also the
video processor of Qwen2.5-VL) bit for bit, with torch operations only.

The stock class derives from ``BaseVideoProcessor`` (``video_processing_utils.py``), whose module needs torchvision
for two steps, both rewritten here as the installed torchvision (0.28, the release paired with torch 2.13) does
them on a CPU tensor:

- the resize: ``torchvision.transforms.v2.functional.resize``, as :func:`~.image_torch_ops.resize_frames`
  reproduces it (shared with the torch-operation image processors, which resize the same way);
- the normalisation: ``normalize`` subtracts the mean and divides by the std, both scaled by ``1 / rescale_factor``
  (the backend's fused rescale and normalise), in ``float32``.

The rest (frame sampling, ``smart_resize`` under ``size``, the per-frame cap of ``cap_pixels_per_frame``,
patchify with the last frame repeated to a multiple of ``temporal_patch_size``) follows the stock code line by
line; ``group_videos_by_shape`` / ``reorder_videos`` are ``transformers.video_utils``' own. ``docs/video.md``
says how the outputs were compared with the stock class's.

It is the data layer's generic video machinery, not one group's: the family groups' torchvision-free video
processors (Qwen3-VL's, GLM-4.xV's, LLaVA-OneVision's) derive from :class:`QwenVideoProcessor` or borrow its
steps, and :func:`~.hub.load_checkpoint_processor` asks :func:`implied_by_image` whether a snapshot's video
processor is the default one.
"""

from __future__ import annotations

import json
import math

import numpy as np
import torch
from transformers.image_processing_utils import BatchFeature
from transformers.image_utils import (OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, ChannelDimension, PILImageResampling,
                                      SizeDict, infer_channel_dimension_format)
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize
from transformers.processing_utils import VideosKwargs
from transformers.video_processing_utils import VideoProcessorMixin
from transformers.video_utils import (VideoMetadata, convert_to_rgb, group_videos_by_shape, is_valid_video,
                                      make_batched_metadata, make_batched_videos, reorder_videos)

from .image_torch_ops import resize_frames
from .video import decode_video, read_frames


class QwenVideoKwargs(VideosKwargs, total=False):
    """The video processor's own settings, as ``Qwen2VLVideoProcessorInitKwargs``: ``min_pixels`` /
    ``max_pixels`` (``size``'s ``shortest_edge`` / ``longest_edge``, px per frame), ``patch_size``,
    ``temporal_patch_size``, ``merge_size``, ``min_frames`` / ``max_frames`` (the bounds of fps sampling),
    ``cap_pixels_per_frame`` and ``max_video_tokens`` (qwen-vl-utils' bound on a whole video's pixels)."""

    min_pixels: int
    max_pixels: int
    patch_size: int
    temporal_patch_size: int
    merge_size: int
    min_frames: int
    max_frames: int
    cap_pixels_per_frame: bool
    max_video_tokens: int


def frame_budget(size: SizeDict, frames: int, factor: int, temporal_factor: int, cap: bool | None,
                 max_video_tokens: int) -> int:
    """The most pixels a frame may keep (``smart_resize``'s ``max_pixels``): ``size.longest_edge``, with ``cap``
    bounded by an even share of ``0.9 * max_video_tokens`` tokens' pixels over the ``frames`` frames (at least
    ``1.05 * size.shortest_edge``), as the stock ``resize`` computes it."""
    budget = size.longest_edge
    if cap:
        total = int(max_video_tokens * factor * factor * 0.9)
        budget = max(min(budget, total * temporal_factor // frames), int(size.shortest_edge * 1.05))
    return budget


def patchify(videos: torch.Tensor, patch: int, merge: int, temporal: int) -> tuple[torch.Tensor, int, int, int]:
    """``videos`` ``(B, T, C, H, W)`` as ``(B, grid_t * grid_h * grid_w, C * temporal * patch * patch)`` patches in
    the merge order of the vision tower (the last frame repeated up to a multiple of ``temporal``), with the grid
    ``(grid_t, grid_h, grid_w)``; ``H`` and ``W`` must be multiples of ``patch * merge``."""
    batch, frames, channels, height, width = videos.shape
    pad = -frames % temporal
    if pad:
        videos = torch.cat((videos, videos[:, -1:].expand(-1, pad, -1, -1, -1)), dim=1)
        frames += pad
    grid_t, grid_h, grid_w = frames // temporal, height // patch, width // patch
    blocks = videos.view(batch, grid_t, temporal, channels, grid_h // merge, merge, patch, grid_w // merge, merge,
                         patch)
    blocks = blocks.permute(0, 1, 4, 7, 5, 8, 3, 2, 6, 9)
    return blocks.reshape(batch, grid_t * grid_h * grid_w, channels * temporal * patch * patch), grid_t, grid_h, grid_w


def stock_sample_indices(total: int, video_fps: float | None, temporal: int, min_frames: int, max_frames: int,
                         num_frames: int | None = None, fps: float | None = None) -> torch.Tensor:
    """The frames ``Qwen2VLVideoProcessor.sample_frames`` keeps of a ``total``-frame video at ``video_fps``:
    ``num_frames`` rounded to a multiple of ``temporal``, else ``fps`` frames a second clamped to
    ``[min_frames, min(max_frames, total)]`` and floored to a multiple of ``temporal``, spread evenly
    (``arange(0, total, total / n).int()``); every frame when neither is given. Returns int32 indices.

    Raises:
        ValueError: ``fps`` without ``video_fps``; more frames than the video has; a video too short to keep any
            frame (fewer than ``temporal`` frames).
    """
    if num_frames is not None:
        num_frames = round(num_frames / temporal) * temporal
    elif fps is not None:
        if video_fps is None:
            raise ValueError("sampling `fps` frames a second needs the video's own fps (its metadata)")
        max_frames = math.floor(min(max_frames, total) / temporal) * temporal
        num_frames = min(max(total / video_fps * fps, min_frames), max_frames, total)
        num_frames = math.floor(num_frames / temporal) * temporal
    if num_frames is not None and num_frames > total:
        raise ValueError(f"cannot sample num_frames={num_frames} of a video of {total} frames; lower num_frames or "
                         f"fps")
    if num_frames is None:
        return torch.arange(0, total).int()
    if num_frames <= 0:
        raise ValueError(f"a video of {total} frame(s) keeps none: it needs at least {temporal} (temporal_patch_size)")
    return torch.arange(0, total, total / num_frames).int()


class QwenVideoProcessor(VideoProcessorMixin):
    """``Qwen2VLVideoProcessor`` without torchvision (module docstring): the same settings, defaults, outputs
    (``pixel_values_videos`` ``(patches, C * temporal_patch_size * patch_size**2)`` float32, ``video_grid_thw``
    ``(videos, 3)``, with ``return_metadata`` the ``video_metadata``) and token counts. A video given as a path
    is decoded with PyAV (:func:`~.video.decode_video`), a list of frame paths read with PIL (and, unlike the
    stock class, sampled too when asked). ``to_dict`` names the stock class (``video_processor_type``), so a saved
    config loads as it. Rows sample their videos before the call (:func:`~.video.load_video`, at 2 fps unless told
    otherwise); the processor's own default, as the stock one's, samples nothing."""

    stock_class_name = "Qwen2VLVideoProcessor"
    resample = PILImageResampling.BICUBIC
    size = {"shortest_edge": 128 * 28 * 28, "longest_edge": 28 * 28 * 768}
    image_mean = OPENAI_CLIP_MEAN
    image_std = OPENAI_CLIP_STD
    do_resize = do_rescale = do_normalize = do_convert_rgb = True
    patch_size, temporal_patch_size, merge_size = 14, 2, 2
    min_frames, max_frames = 4, 768
    do_sample_frames = False
    cap_pixels_per_frame = None
    max_video_tokens = 128000
    valid_kwargs = QwenVideoKwargs
    model_input_names = ["pixel_values_videos", "video_grid_thw"]

    def __init__(self, **kwargs):
        size = dict(kwargs.pop("size", None) or self.size)
        if (min_pixels := kwargs.pop("min_pixels", None)) is not None:
            size["shortest_edge"] = min_pixels
        if (max_pixels := kwargs.pop("max_pixels", None)) is not None:
            size["longest_edge"] = max_pixels
        kwargs.pop("video_processor_type", None)
        super().__init__(size=size, **kwargs)
        self._set_attributes(size=size, **kwargs)

    def to_dict(self) -> dict:
        """The settings as the stock class saves them (``video_processor_type`` the stock class's name)."""
        out = super().to_dict()
        out["video_processor_type"] = self.stock_class_name
        return out

    def sample_frames(self, metadata: VideoMetadata, temporal_patch_size: int | None = None,
                      min_frames: int | None = None, max_frames: int | None = None, num_frames: int | None = None,
                      fps: float | None = None, **kwargs) -> torch.Tensor:
        """The frame indices the stock ``sample_frames`` keeps (:func:`stock_sample_indices`), each setting
        defaulting to the processor's (a ``num_frames`` set on the processor wins over ``fps``).

        Raises:
            ValueError: both ``num_frames`` and ``fps`` given; :func:`stock_sample_indices`'s.
        """
        if fps is not None and num_frames is not None:
            raise ValueError("`num_frames` and `fps` are mutually exclusive arguments, please use only one!")
        num_frames = num_frames if num_frames is not None else getattr(self, "num_frames", None)
        fps = fps if fps is not None else self.fps
        pick = [temporal_patch_size, min_frames, max_frames]
        temporal, low, high = [v if v is not None else d for v, d in
                               zip(pick, (self.temporal_patch_size, self.min_frames, self.max_frames))]
        return stock_sample_indices(metadata.total_num_frames, metadata.fps, temporal, low, high, num_frames, fps)

    def fetch_videos(self, video_url_or_urls, sample_indices_fn=None):
        """Decode a path (or a list of paths) with PyAV (:func:`~.video.decode_video`): ``(frames, metadata)``,
        or the two as tuples for a list."""
        if isinstance(video_url_or_urls, list):
            return tuple(zip(*[self.fetch_videos(x, sample_indices_fn) for x in video_url_or_urls]))
        return decode_video(video_url_or_urls, sample_indices_fn)

    def _decode_and_sample_videos(self, videos, video_metadata=None, do_sample_frames=None, sample_indices_fn=None):
        """Videos as 4-D arrays with their metadata, as ``BaseVideoProcessor`` gives them: arrays sampled with
        ``sample_indices_fn`` when ``do_sample_frames``, paths decoded (and sampled), frame-path lists read."""
        videos = make_batched_videos(videos)
        video_metadata = make_batched_metadata(videos, video_metadata=video_metadata)
        if is_valid_video(videos[0]) and do_sample_frames:
            for i, (video, metadata) in enumerate(zip(videos, video_metadata)):
                indices = sample_indices_fn(metadata=metadata)
                metadata.frames_indices = indices
                videos[i] = video[indices]
        elif not is_valid_video(videos[0]):
            if isinstance(videos[0], list):
                read = [read_frames(paths, None, sample_indices_fn) for paths in videos]
                videos, video_metadata = [v for v, _ in read], [m for _, m in read]
            else:
                videos, video_metadata = self.fetch_videos(videos, sample_indices_fn=sample_indices_fn)
        return list(videos), list(video_metadata)

    def _prepare_input_videos(self, videos, do_convert_rgb=None, input_data_format=None, device=None) -> list:
        """Each video as a ``(T, C, H, W)`` tensor (channels first, RGB), as the stock class prepares it."""
        prepared = []
        for video in videos:
            if isinstance(video, np.ndarray):
                video = torch.from_numpy(video).contiguous()
            if input_data_format is None:
                input_data_format = infer_channel_dimension_format(video)
            if input_data_format == ChannelDimension.LAST:
                video = video.permute(0, 3, 1, 2).contiguous()
            if do_convert_rgb:
                if video.shape[-3] == 1:
                    video = video.repeat([1] * (video.ndim - 3) + [3, 1, 1])
                video = convert_to_rgb(video, input_data_format=ChannelDimension.FIRST)
            prepared.append(video.to(device) if device is not None else video)
        return prepared

    def _normalize(self, videos: torch.Tensor, do_rescale: bool, rescale_factor: float, do_normalize: bool,
                   image_mean, image_std) -> torch.Tensor:
        """The backend's fused rescale and normalise (``(x - mean / f) / (std / f)`` in float32, ``f`` the
        rescale factor), or the rescale alone (``x * f``)."""
        if do_rescale and do_normalize:
            image_mean = torch.tensor(image_mean, device=videos.device) * (1.0 / rescale_factor)
            image_std = torch.tensor(image_std, device=videos.device) * (1.0 / rescale_factor)
        if do_normalize:
            videos = videos.to(torch.float32)
            mean = torch.as_tensor(image_mean, dtype=videos.dtype, device=videos.device).view(-1, 1, 1)
            std = torch.as_tensor(image_std, dtype=videos.dtype, device=videos.device).view(-1, 1, 1)
            return videos.sub(mean).div_(std)
        return videos * rescale_factor if do_rescale else videos

    def _resized_size(self, stacked: torch.Tensor, size: SizeDict, patch_size: int, merge_size: int,
                      temporal_patch_size: int, cap_pixels_per_frame, max_video_tokens: int) -> tuple[int, int]:
        """``(height, width)`` the stock ``resize`` gives the videos ``stacked`` ``(B, T, C, H, W)``:
        ``smart_resize`` per frame under :func:`frame_budget`."""
        factor = patch_size * merge_size
        budget = frame_budget(size, stacked.shape[1], factor, temporal_patch_size, cap_pixels_per_frame,
                              max_video_tokens)
        return smart_resize(stacked.shape[-2], stacked.shape[-1], factor=factor, min_pixels=size.shortest_edge,
                            max_pixels=budget)

    def _preprocess(self, videos: list, do_resize: bool, size: SizeDict, resample, do_rescale: bool,
                    rescale_factor: float, do_normalize: bool, image_mean, image_std, patch_size: int | None = None,
                    temporal_patch_size: int | None = None, merge_size: int | None = None,
                    cap_pixels_per_frame: bool | None = None, return_tensors=None, max_video_tokens: int | None = None,
                    **kwargs) -> BatchFeature:
        """Resize (grouped by shape, as the stock class), normalise and patchify every video: the stock
        ``_preprocess``'s outputs."""
        tokens = self.max_video_tokens if max_video_tokens is None else max_video_tokens
        grouped, index = group_videos_by_shape(videos)
        resized = {}
        for shape, stacked in grouped.items():
            if do_resize:
                height, width = self._resized_size(stacked, size, patch_size, merge_size, temporal_patch_size,
                                                   cap_pixels_per_frame, tokens)
                stacked = resize_frames(stacked, height, width, resample)
            resized[shape] = stacked
        grouped, index = group_videos_by_shape(reorder_videos(resized, index))
        patches, grids = {}, {}
        for shape, stacked in grouped.items():
            stacked = self._normalize(stacked, do_rescale, rescale_factor, do_normalize, image_mean, image_std)
            patches[shape], grid_t, grid_h, grid_w = patchify(stacked, patch_size, merge_size, temporal_patch_size)
            grids[shape] = [[grid_t, grid_h, grid_w]] * len(stacked)
        return BatchFeature(data={"pixel_values_videos": torch.cat(reorder_videos(patches, index), dim=0),
                                  "video_grid_thw": torch.tensor(reorder_videos(grids, index))},
                            tensor_type=return_tensors)

    def get_num_of_video_patches(self, num_frames: int, height: int, width: int, videos_kwargs=None) -> int:
        """Patches a ``num_frames``-frame ``height`` x ``width`` video takes, as the stock method counts them
        (``smart_resize`` under ``size``, without ``cap_pixels_per_frame``)."""
        kw = self._merge_and_standardize_kwargs(**(videos_kwargs or {}))
        patch, size = kw["patch_size"], kw["size"]
        height, width = smart_resize(height, width, patch * kw["merge_size"], min_pixels=size["shortest_edge"],
                                     max_pixels=size["longest_edge"])
        temporal = kw["temporal_patch_size"]
        return (num_frames + -num_frames % temporal) // temporal * (height // patch) * (width // patch)

    def tokens_for(self, num_frames: int, height: int, width: int) -> int:
        """Tokens (``<|video_pad|>``) a video of ``num_frames`` frames (as sampled) of ``height`` x ``width`` px
        takes with this processor's settings, ``cap_pixels_per_frame`` included: ``grid_t * grid_h * grid_w /
        merge_size**2``."""
        factor = self.patch_size * self.merge_size
        size = SizeDict(**self.size) if not isinstance(self.size, SizeDict) else self.size
        budget = frame_budget(size, num_frames, factor, self.temporal_patch_size, self.cap_pixels_per_frame,
                              self.max_video_tokens)
        height, width = smart_resize(height, width, factor, min_pixels=size.shortest_edge, max_pixels=budget)
        grid_t = -(-num_frames // self.temporal_patch_size)
        return grid_t * (height // self.patch_size) * (width // self.patch_size) // self.merge_size ** 2


# the image processor settings a Qwen2-VL / Qwen2.5-VL video processor takes over (transformers builds it from
# preprocessor_config.json where a snapshot has no video processor file)
IMAGE_KEYS = ("do_convert_rgb", "do_normalize", "do_rescale", "do_resize", "image_mean", "image_std", "merge_size",
              "patch_size", "resample", "rescale_factor", "size", "temporal_patch_size")


def video_processor_from_image(image_processor, settings: dict | None = None) -> QwenVideoProcessor:
    """The video processor ``AutoVideoProcessor`` builds for a Qwen2-VL / Qwen2.5-VL snapshot without a video
    processor file: ``image_processor``'s resize, normalisation and patch settings (:data:`IMAGE_KEYS`), with
    ``settings`` (a ``video_preprocessor_config.json``'s, e.g. :func:`~.hub.video_processor_config`) over them."""
    own = json.loads(image_processor.to_json_string())
    merged = {key: own[key] for key in IMAGE_KEYS if key in own}
    merged.update({k: v for k, v in (settings or {}).items() if k in QwenVideoKwargs.__annotations__ or
                   k in IMAGE_KEYS})
    return QwenVideoProcessor(**merged)


def implied_by_image(video_processor, image_processor) -> bool:
    """Whether ``video_processor`` is the one ``image_processor`` implies (:func:`video_processor_from_image`), so
    that a snapshot needs no video processor file for it (Qwen2-VL and Qwen2.5-VL snapshots have none)."""
    if not isinstance(video_processor, QwenVideoProcessor):
        return False
    derived = video_processor_from_image(image_processor)
    return json.loads(video_processor.to_json_string()) == json.loads(derived.to_json_string())
