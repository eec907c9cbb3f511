"""MiniMax-M3-VL's image processor without torchvision: :class:`MiniMaxM3VLImageProcessorNoTV` gives the outputs
of ``transformers``' ``MiniMaxM3VLImageProcessor`` (``models/minimax_m3_vl/image_processing_minimax_m3_vl.py``,
5.25; a torchvision class with no PIL twin, whose module does not import without torchvision) with torch
operations only.

The stock steps, per image (Qwen2-VL's): the size ``smart_resize`` gives (multiples of ``patch_size *
merge_size``, between ``size``'s ``shortest_edge`` and ``longest_edge`` px; the stock function is Qwen2-VL's,
used here from its PIL module), the resize to it (``resize_frames`` of :mod:`mpipe_hf.data.image_torch_ops`:
torchvision's antialiased bicubic ``interpolate`` on the ``uint8`` image), rescale and normalisation in ``float32`` (the
backend's fused step), and the patches in ``merge_size`` x ``merge_size`` windows, each repeated over
``temporal_patch_size`` frames. Outputs: ``pixel_values`` ``(patches, 3 * T * p * p)`` and ``image_grid_thw``
``(images, 3)``. ``tests/test_stock_recorded.py`` compares them with the stock class's recorded outputs.
"""

from __future__ import annotations

import torch
from transformers.image_processing_utils import BatchFeature
from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, PILImageResampling, SizeDict
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize
from transformers.processing_utils import ImagesKwargs

from ...data.image_torch_ops import PilBackendAsStock, rescale_and_normalize, resize_frames
from ...data.video_processor import patchify


class MiniMaxM3VLNoTVKwargs(ImagesKwargs, total=False):
    """The stock class's own settings: ``min_pixels`` / ``max_pixels`` (``size``'s ``shortest_edge`` /
    ``longest_edge``), ``patch_size``, ``temporal_patch_size`` and ``merge_size``."""

    min_pixels: int
    max_pixels: int
    patch_size: int
    temporal_patch_size: int
    merge_size: int


class MiniMaxM3VLImageProcessorNoTV(PilBackendAsStock):
    """``MiniMaxM3VLImageProcessor``'s outputs without torchvision (module docstring); its settings and defaults
    are the stock class's, so a checkpoint's ``preprocessor_config.json`` applies unchanged."""

    stock_class_name = "MiniMaxM3VLImageProcessor"
    valid_kwargs = MiniMaxM3VLNoTVKwargs
    model_input_names = ["pixel_values", "image_grid_thw"]
    resample = PILImageResampling.BICUBIC
    size = {"shortest_edge": 4 * 28 * 28, "longest_edge": 451584}
    default_to_square = False
    do_resize = do_rescale = do_normalize = do_convert_rgb = True
    image_mean, image_std = OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
    patch_size, temporal_patch_size, merge_size = 14, 2, 2

    def __init__(self, **kwargs):
        """The stock constructor's settings: ``min_pixels`` / ``max_pixels`` put into ``size``, the hub's stale
        ``[672, 672]`` replaced by the default."""
        size = kwargs.pop("size", None)
        size = dict(self.size) if size is None or size == [672, 672] else dict(size)
        if (least := kwargs.pop("min_pixels", None)) is not None:
            size["shortest_edge"] = least
        if (most := kwargs.pop("max_pixels", None)) is not None:
            size["longest_edge"] = most
        super().__init__(size=size, **kwargs)

    def get_number_of_image_patches(self, height: int, width: int, images_kwargs: dict | None = None) -> int:
        """Patches of an image of ``height`` x ``width`` px (``MiniMaxM3VLProcessor`` divides by ``merge_size **
        2`` for its tokens)."""
        kwargs = self._merge_and_standardize_kwargs(**(images_kwargs or {}))
        patch = kwargs["patch_size"]
        new_h, new_w = smart_resize(height, width, patch * kwargs["merge_size"], kwargs["size"].shortest_edge,
                                    kwargs["size"].longest_edge)
        return (new_h // patch) * (new_w // patch)

    def _preprocess(self, images: list, do_resize: bool, size: SizeDict, resample, do_rescale: bool,
                    rescale_factor: float, do_normalize: bool, image_mean, image_std, patch_size: int = 14,
                    temporal_patch_size: int = 2, merge_size: int = 2, return_tensors=None,
                    **kwargs) -> BatchFeature:
        """``images`` (``uint8`` ``(3, H, W)`` arrays, the PIL backend's) -> ``pixel_values`` and
        ``image_grid_thw`` (module docstring).

        Raises:
            ValueError: ``size`` lacks ``shortest_edge`` or ``longest_edge`` (as the stock class), or an image's
                aspect ratio is over 200 (``smart_resize``).
        """
        if do_resize and not (size.shortest_edge and size.longest_edge):
            raise ValueError(f"`size` dict must contain 'shortest_edge' and 'longest_edge' keys but got {size}.")
        patches, grids = [], []
        for array in images:
            image = torch.from_numpy(array)
            if do_resize:
                new_h, new_w = smart_resize(image.shape[-2], image.shape[-1], patch_size * merge_size,
                                            size.shortest_edge, size.longest_edge)
                image = resize_frames(image, new_h, new_w, resample)
            normalized = rescale_and_normalize(image, do_rescale, rescale_factor, do_normalize, image_mean, image_std)
            # one frame repeated temporal_patch_size times: Qwen2-VL's video patches of a one-frame clip
            clip = normalized[None, None].expand(-1, temporal_patch_size, -1, -1, -1)
            patches.append(patchify(clip, patch_size, merge_size, temporal_patch_size)[0][0])
            grids.append([1, image.shape[-2] // patch_size, image.shape[-1] // patch_size])
        return BatchFeature(data={"pixel_values": torch.cat(patches), "image_grid_thw": torch.tensor(grids)},
                            tensor_type=return_tensors)
