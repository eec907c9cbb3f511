"""Muse Glimmer's image processor without torchvision: :class:`MuseGlimmerImageProcessorNoTV` gives the outputs
of ``transformers``' ``MuseGlimmerImageProcessor`` (``models/muse_glimmer/image_processing_muse_glimmer.py``,
5.25; a torchvision class with no PIL twin, also Muse Spark's image processor) with torch operations only.

The stock steps, per image: the grid of ``patch_size * merge_size`` px cells nearest the image's aspect ratio
within ``max_image_tokens`` cells (``smart_resize``; the stock module imports torchvision, so it is written again
here, :func:`token_grid`), the image resized to it with Lanczos (the class's default filter; torchvision 0.27 and
later resize a CPU ``uint8`` tensor with ``interpolate``'s antialiased ``lanczos`` mode, as ``resize_frames`` of
:mod:`~mpipe_hf.data.image_torch_ops` does), rescaled and normalised in ``float32`` (the backend's fused step), cut into
``patch_size`` px patches in raster order, each repeated ``temporal_patch_size`` times (a still image as a clip)
and flattened ``(time, channel, row, column)``. Outputs: ``pixel_values`` ``(sum of patches, temporal_patch_size *
3 * patch_size ** 2)`` and ``image_grid_thw`` ``(images, 3)`` (``1``, patch rows, patch columns).
``tests/test_stock_recorded.py`` compares them with the stock class's recorded outputs.
"""

from __future__ import annotations

import itertools
import math

import torch
from transformers.image_processing_utils import BatchFeature
from transformers.image_utils import IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD, PILImageResampling
from transformers.processing_utils import ImagesKwargs

from ...data.image_torch_ops import PilBackendAsStock, resize_frames
from .unified_image_processor import rescaled


class MuseGlimmerNoTVKwargs(ImagesKwargs, total=False):
    """The stock class's own settings: ``patch_size``, ``temporal_patch_size``, ``merge_size`` and
    ``max_image_tokens`` (merged tokens an image may give)."""

    patch_size: int
    temporal_patch_size: int
    merge_size: int
    max_image_tokens: int


def token_grid(height: int, width: int, cell: int, max_tokens: int) -> tuple[int, int]:
    """``(rows, columns)`` of ``cell`` px for an image of ``height`` x ``width`` px, as the stock
    ``smart_resize``: the image's size in cells, scaled down to ``max_tokens`` cells where it has more (the
    aspect kept), each side rounded down or up, the grid of at most ``max_tokens`` cells (at least one a side)
    whose aspect ratio is nearest the image's (else the rounded size)."""
    ideal_h, ideal_w = height / cell, width / cell
    ratio = ideal_w / ideal_h if ideal_h > 0 else 1.0
    if ideal_h * ideal_w > max_tokens:
        ideal_h = (max_tokens / ratio) ** 0.5
        ideal_w = ideal_h * ratio
    grids = set(itertools.product([math.floor(ideal_h), math.ceil(ideal_h)], [math.floor(ideal_w),
                                                                               math.ceil(ideal_w)]))
    grids = [(h, w) for h, w in grids if h >= 1 and w >= 1 and h * w <= max_tokens]
    if not grids:
        grids = [(max(1, round(ideal_h)), max(1, round(ideal_w)))]
    # the stock candidates come out of a set; ties (equal aspect error) go to the first in that set's order
    return min(list(grids), key=lambda grid: abs(grid[0] / grid[1] - height / width))


def temporal_patches(image: torch.Tensor, patch: int, temporal: int) -> torch.Tensor:
    """``image`` ``(C, H, W)`` -> ``(H / patch * W / patch, temporal * C * patch * patch)``: its ``patch`` px
    patches in raster order, each repeated ``temporal`` times and flattened ``(time, channel, row, column)``."""
    channels, height, width = image.shape
    rows, cols = height // patch, width // patch
    patches = image.view(channels, rows, patch, cols, patch).permute(1, 3, 0, 2, 4)
    return patches.unsqueeze(2).expand(-1, -1, temporal, -1, -1, -1).reshape(rows * cols, -1)


class MuseGlimmerImageProcessorNoTV(PilBackendAsStock):
    """``MuseGlimmerImageProcessor``'s outputs without torchvision (module docstring); its settings and defaults
    are the stock class's, so a checkpoint's ``preprocessor_config.json`` applies unchanged."""

    stock_class_name = "MuseGlimmerImageProcessor"
    valid_kwargs = MuseGlimmerNoTVKwargs
    model_input_names = ["pixel_values", "image_grid_thw"]
    resample = PILImageResampling.LANCZOS
    size = None
    default_to_square = False
    do_resize = do_rescale = do_normalize = do_convert_rgb = True
    rescale_factor = 1 / 255
    image_mean, image_std = IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD
    patch_size, temporal_patch_size, merge_size, max_image_tokens = 14, 2, 2, 4096

    def _validate_preprocess_kwargs(self, **kwargs):
        kwargs["do_resize"] = False  # the size comes from the token cap, not ``size`` (as the stock class)
        super()._validate_preprocess_kwargs(**kwargs)

    def _preprocess(self, images: list, do_resize: bool, resample, do_rescale: bool, rescale_factor: float,
                    do_normalize: bool, image_mean, image_std, return_tensors=None, patch_size: int = 14,
                    temporal_patch_size: int = 2, max_image_tokens: int = 4096, merge_size: int = 2,
                    **kwargs) -> BatchFeature:
        """``images`` (``uint8`` ``(3, H, W)`` arrays, the PIL backend's) -> ``pixel_values`` and
        ``image_grid_thw`` (module docstring)."""
        patches, grids = [], []
        for array in images:
            image = torch.from_numpy(array)
            if do_resize:
                cell = patch_size * merge_size
                rows, cols = token_grid(image.shape[-2], image.shape[-1], cell, max_image_tokens)
                image = resize_frames(image, rows * cell, cols * cell, resample)
            image = rescaled(image, do_rescale, rescale_factor, do_normalize, image_mean, image_std)
            patches.append(temporal_patches(image, patch_size, temporal_patch_size))
            grids.append([1, image.shape[-2] // patch_size, image.shape[-1] // patch_size])
        return BatchFeature(data={"pixel_values": torch.cat(patches), "image_grid_thw": torch.tensor(grids)},
                            tensor_type=return_tensors)

    def get_number_of_image_patches(self, height: int, width: int, images_kwargs=None) -> int:
        """Patches (``patch_size`` px, before merging) an image of ``height`` x ``width`` px gives, as the stock
        class counts them."""
        settings = self._merge_and_standardize_kwargs(**(images_kwargs or {}))
        cell = settings["patch_size"] * settings["merge_size"]
        rows, cols = token_grid(height, width, cell, settings["max_image_tokens"])
        return rows * cols * settings["merge_size"] ** 2
