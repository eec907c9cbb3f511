"""LLaVA-OneVision's video processor without torchvision: :class:`OnevisionVideoProcessor` gives the outputs of
``transformers``' ``LlavaOnevisionVideoProcessor`` (``models/llava_onevision/video_processing_llava_onevision.py``,
5.25) bit for bit, with torch operations only.

The stock class sets defaults only (384 x 384 px, bicubic, OpenAI CLIP's mean and std, no frame sampling by
default); what it does is ``BaseVideoProcessor``'s (``video_processing_utils.py``) over ``TorchvisionBackend``
(``image_processing_backends.py``), read from their code:

- sampling (``sample_frames``): ``transformers.video_utils.default_sample_indices_fn`` itself, ``num_frames``
  and ``fps`` defaulting to the processor's (``num_frames`` evenly, ``arange(n) * total // n``; else
  ``max(1, int(total / video_fps * fps))`` frames; else every frame);
- each group of same-shaped videos resized to ``size``'s ``height`` x ``width`` (the only ``size`` the class
  uses) with torchvision's resize, which :func:`~mpipe_hf.data.image_torch_ops.resize_frames` reproduces
  (``uint8`` bicubic natively, antialiased);
- the fused rescale and normalise in float32 (``QwenVideoProcessor._normalize``, the backend's arithmetic);
- ``pixel_values_videos``: one ``(T, C, H, W)`` float32 tensor a video, stacked to ``(videos, T, C, H, W)`` by
  ``return_tensors`` (so a call's videos must have one frame count, as the model's ``get_video_features``
  takes them).

Decoding, frame lists and RGB conversion are :class:`~mpipe_hf.data.video_processor.QwenVideoProcessor`'s (the
same as the stock base's for arrays; a path is decoded with PyAV). ``do_center_crop`` (``None`` in the stock class) is
refused rather than reproduced. The processor (``LlavaOnevisionProcessor``) writes a video as
``frames * ceil(sqrt(num_image_tokens) / 2) ** 2 + 1`` video tokens (each frame's features pooled 2 x 2, then
``image_newline``): :meth:`OnevisionVideoProcessor.tokens_for` with ``frame_tokens`` set
(:func:`onevision_video_processor`). ``tests/test_video_onevision.py`` compares the outputs with the stock code's.
"""

from __future__ import annotations

import math

from transformers.image_processing_utils import BatchFeature
from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, PILImageResampling, SizeDict
from transformers.processing_utils import VideosKwargs
from transformers.video_processing_utils import VideoProcessorMixin
from transformers.video_utils import VideoMetadata, default_sample_indices_fn, group_videos_by_shape, reorder_videos

from ...data.image_torch_ops import resize_frames
from ...data.video_processor import QwenVideoProcessor

NUM_FRAMES = 8  # frames a video keeps by default here (evenly spread), so that a micro-batch's videos stack


class OnevisionVideoProcessor(VideoProcessorMixin):
    """``LlavaOnevisionVideoProcessor`` without torchvision (module docstring): the same settings, defaults and
    outputs (``pixel_values_videos`` float32 ``(videos, T, C, height, width)``, with ``return_metadata`` the
    ``video_metadata``). ``to_dict`` names the stock class, so a saved config loads as it. ``frame_tokens``: the
    tokens one frame takes in the model (not a stock setting, not saved; ``None``: :meth:`tokens_for` cannot
    count)."""

    stock_class_name = "LlavaOnevisionVideoProcessor"
    resample = PILImageResampling.BICUBIC
    image_mean, image_std = OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
    size = {"height": 384, "width": 384}
    rescale_factor = 1 / 255
    default_to_square = False
    crop_size = None
    do_resize = do_rescale = do_normalize = do_convert_rgb = True
    do_center_crop = None
    do_sample_frames = False
    valid_kwargs = VideosKwargs
    model_input_names = ["pixel_values_videos"]
    temporal_patch_size = 1  # a frame is its own group (the row budgets' unit, .budgets)

    fetch_videos = QwenVideoProcessor.fetch_videos
    _decode_and_sample_videos = QwenVideoProcessor._decode_and_sample_videos
    _prepare_input_videos = QwenVideoProcessor._prepare_input_videos
    _normalize = QwenVideoProcessor._normalize

    def __init__(self, frame_tokens: int | None = None, **kwargs):
        kwargs.pop("video_processor_type", None)
        super().__init__(**kwargs)
        self._set_attributes(**kwargs)
        self.frame_tokens = frame_tokens

    def to_dict(self) -> dict:
        """The settings as the stock class saves them (``video_processor_type`` the stock class's name)."""
        out = super().to_dict()
        out.pop("frame_tokens", None)
        out["video_processor_type"] = self.stock_class_name
        return out

    def sample_frames(self, metadata: VideoMetadata, num_frames: int | None = None, fps: float | None = None,
                      **kwargs):
        """The frame indices the stock ``sample_frames`` keeps: ``default_sample_indices_fn`` with ``num_frames``
        and ``fps`` defaulting to the processor's (the processor's ``num_frames`` wins over a given ``fps``).

        Raises:
            ValueError: both ``num_frames`` and ``fps`` given; more frames asked for than the video has; ``fps``
                without the video's own fps.
        """
        if fps is not None and num_frames is not None:
            raise ValueError("`num_frames` and `fps` are mutually exclusive arguments, please use only one!")
        num_frames = num_frames if num_frames is not None else self.num_frames
        fps = fps if fps is not None else self.fps
        return default_sample_indices_fn(metadata=metadata, num_frames=num_frames, fps=fps)

    def _preprocess(self, videos: list, do_resize: bool, size: SizeDict, resample, do_rescale: bool,
                    rescale_factor: float, do_normalize: bool, image_mean, image_std, do_center_crop=None,
                    return_tensors=None, **kwargs) -> BatchFeature:
        """Resize (grouped by shape, as the stock class), rescale and normalise every video: the stock
        ``_preprocess``'s outputs.

        Raises:
            ValueError: ``do_center_crop``, or a ``size`` without ``height`` and ``width`` (not reproduced here);
                videos of different frame counts with ``return_tensors`` (they cannot stack).
        """
        if do_center_crop:
            raise ValueError("do_center_crop is not reproduced without torchvision (LLaVA-OneVision's is None)")
        if do_resize and not (size.height and size.width):
            raise ValueError(f"size must give 'height' and 'width' (LLaVA-OneVision's fixed frame size), got {size}")
        if return_tensors and len({video.shape[0] for video in videos}) > 1:
            raise ValueError(f"LLaVA-OneVision stacks a call's videos: they must have one frame count, got "
                             f"{[video.shape[0] for video in videos]} (give their rows one num_frames)")
        grouped, index = group_videos_by_shape(videos)
        resized = {shape: resize_frames(stacked, size.height, size.width, resample) if do_resize else stacked
                   for shape, stacked in grouped.items()}
        grouped, index = group_videos_by_shape(reorder_videos(resized, index))
        done = {shape: self._normalize(stacked, do_rescale, rescale_factor, do_normalize, image_mean, image_std)
                for shape, stacked in grouped.items()}
        return BatchFeature(data={"pixel_values_videos": reorder_videos(done, index)}, tensor_type=return_tensors)

    def tokens_for(self, num_frames: int, height: int, width: int) -> int:
        """Video tokens a video of ``num_frames`` sampled frames takes (any size: frames are resized to ``size``):
        ``num_frames * frame_tokens + 1`` (the ``image_newline`` after the frames), as the stock processor's
        ``replace_video_token`` counts them.

        Raises:
            ValueError: ``frame_tokens`` is not set.
        """
        if self.frame_tokens is None:
            raise ValueError("this video processor does not know a frame's tokens (build it with "
                             "onevision_video_processor)")
        return num_frames * self.frame_tokens + 1


def onevision_video_processor(config, num_frames: int | None = NUM_FRAMES) -> OnevisionVideoProcessor:
    """The video processor of a LLaVA-OneVision ``config``: frames resized to the tower's side
    (``vision_config.image_size``, as the hub's 384 px), ``num_frames`` kept (``None``: the stock default, no count;
    rows then sample at :data:`~mpipe_hf.data.video.FPS`), and ``frame_tokens`` as the stock processor counts a frame
    (its ``num_image_tokens = (image_size // patch_size) ** 2`` patches pooled 2 x 2:
    ``ceil(sqrt(num_image_tokens) / 2) ** 2``)."""
    vision = config.vision_config
    side = vision.image_size
    pooled = math.ceil(int(math.sqrt((side // vision.patch_size) ** 2)) / 2)
    return OnevisionVideoProcessor(size={"height": side, "width": side}, num_frames=num_frames,
                                   frame_tokens=pooled * pooled)

