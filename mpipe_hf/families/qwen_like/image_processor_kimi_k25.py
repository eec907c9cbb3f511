"""Kimi K2.5's image processor without torchvision: :class:`KimiK25ImageProcessorNoTV` gives the outputs of
``transformers``' ``Kimi_K25ImageProcessor`` (``models/kimi_k25/image_processing_kimi_k25.py``, 5.25; a
torchvision class with no PIL twin) with torch operations only.

The stock steps, per image: the NaViT size (:func:`navit_size`: shrunk, never grown, to at most ``max_patches``
patches and ``size["max_height"]`` patches a side, floored to whole pixels), the image resized to it (bicubic,
torchvision's: ``resize_frames`` of :mod:`mpipe_hf.data.image_torch_ops`, on the ``uint8`` image) and padded at
the bottom and right with zeros to whole ``patch_size * merge_size`` blocks, rescaled and normalised in
``float32`` (the backend's fused step), and cut into patches. Outputs: ``pixel_values`` ``(patches, 3, patch,
patch)`` (each image's patches row by row) and ``image_grid_thw`` ``(images, 3)`` (``1``, patch rows, patch columns).
``tests/test_stock_recorded.py`` compares them with the stock class's recorded outputs.
"""

from __future__ import annotations

import math

import torch
from transformers.image_processing_utils import BatchFeature
from transformers.image_utils import IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD, PILImageResampling
from transformers.processing_utils import ImagesKwargs

from ...data.image_torch_ops import PilBackendAsStock, pad_bottom_right, rescale_and_normalize, resize_frames


class KimiK25NoTVKwargs(ImagesKwargs, total=False):
    """The stock class's own settings: ``max_patches`` (patches an image may keep), ``patch_size`` and
    ``merge_size`` (the tower's patch and merge kernel sides)."""

    max_patches: int
    patch_size: int
    merge_size: int


def navit_size(height: int, width: int, patch: int, merge: int, max_patches: int,
               max_side: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """``((height, width), (padded height, padded width))`` in px of an image of ``height`` x ``width`` px, as the
    stock ``navit_resize``: one scale (at most 1) that keeps the whole-patch count within ``max_patches`` and each
    side within ``max_side`` patches, the sides floored (at least 1 px), then padded up to multiples of
    ``patch * merge``."""
    count = max(1.0, height // patch) * max(1.0, width // patch)
    scale = min(1.0, math.sqrt(max_patches / count), max_side * patch / height, max_side * patch / width)
    new_h = min(max(1, int(height * scale)), max_side * patch)
    new_w = min(max(1, int(width * scale)), max_side * patch)
    block = patch * merge
    return (new_h, new_w), (-(-new_h // block) * block, -(-new_w // block) * block)


class KimiK25ImageProcessorNoTV(PilBackendAsStock):
    """``Kimi_K25ImageProcessor``'s outputs without torchvision (module docstring); its settings and defaults are
    the stock class's, so a checkpoint's ``preprocessor_config.json`` applies unchanged."""

    stock_class_name = "Kimi_K25ImageProcessor"
    valid_kwargs = KimiK25NoTVKwargs
    resample = PILImageResampling.BICUBIC
    size = {"max_height": 512, "max_width": 512}
    max_patches, patch_size, merge_size = 16384, 14, 2
    do_resize = do_rescale = do_normalize = do_convert_rgb = True
    image_mean, image_std = IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD
    model_input_names = ["pixel_values", "image_grid_thw"]

    def get_number_of_image_patches(self, height: int, width: int, images_kwargs: dict | None = None) -> int:
        """Patches of an image of ``height`` x ``width`` px after padding (the processor writes one image token
        per ``merge_size ** 2`` of them)."""
        kwargs = self._merge_and_standardize_kwargs(**(images_kwargs or {}))
        patch = kwargs["patch_size"]
        _, (pad_h, pad_w) = navit_size(height, width, patch, kwargs["merge_size"], kwargs["max_patches"],
                                       kwargs["size"]["max_height"])
        return (pad_h // patch) * (pad_w // patch)

    def _preprocess(self, images: list, do_resize: bool, size, resample, do_rescale: bool, rescale_factor: float,
                    do_normalize: bool, image_mean, image_std, patch_size: int, merge_size: int, max_patches: int,
                    return_tensors=None, **kwargs) -> BatchFeature:
        """``images`` (``uint8`` ``(3, H, W)`` arrays, the PIL backend's) -> ``pixel_values`` and
        ``image_grid_thw`` (module docstring).

        Raises:
            ValueError: ``size``'s ``max_height`` and ``max_width`` are missing or differ (as the stock class).
        """
        if size.max_height is None or size.max_height != size.max_width:
            raise ValueError(f"size must contain 'max_height' and 'max_width' keys with identical values, got {size}")
        patches, grids = [], []
        for array in images:
            image = torch.from_numpy(array)
            if do_resize:
                (new_h, new_w), (pad_h, pad_w) = navit_size(*image.shape[-2:], patch_size, merge_size, max_patches,
                                                            size.max_height)
                image = pad_bottom_right(resize_frames(image, new_h, new_w, resample), pad_h, pad_w)
            x = rescale_and_normalize(image, do_rescale, rescale_factor, do_normalize, image_mean, image_std)
            channels, height, width = x.shape
            rows, cols = height // patch_size, width // patch_size
            x = x.reshape(channels, rows, patch_size, cols, patch_size).permute(1, 3, 0, 2, 4)
            patches.append(x.reshape(rows * cols, channels, patch_size, patch_size))
            grids.append([1, rows, cols])
        return BatchFeature(data={"pixel_values": torch.cat(patches),
                                  "image_grid_thw": torch.tensor(grids, dtype=torch.long)},
                            tensor_type=return_tensors)
