"""Gemma 4 Unified's image processor without torchvision: :class:`Gemma4UnifiedImageProcessorNoTV` gives the
outputs of ``transformers``' ``Gemma4UnifiedImageProcessor`` (``models/gemma4_unified/
image_processing_gemma4_unified.py``, 5.25; a torchvision class with no PIL twin) with torch operations only.

What it shares with Gemma 4's image processor: the target size (the largest of whole ``pooling_kernel_size *
patch_size`` px sides within ``max_soft_tokens * pooling_kernel_size ** 2`` patches, the aspect kept:
``get_aspect_ratio_preserving_size``, imported from Gemma 4's PIL module, the same function), the bicubic
resize and the rescale to ``[0, 1]`` without normalisation. What differs: the model has no vision encoder, so the
processor hands it the pooled patches themselves: ``patch_size`` patches merged ``k x k`` (``k =
pooling_kernel_size``) into one row each. The stock ``patches_merge`` reorders ``patch_size`` patches into kernel
order and joins them; that is the image cut straight into ``k * patch_size`` px patches, each flattened row by
row then channel last (:func:`merged_patches`), at the kernel grid's ``(x, y)`` positions. Rows are padded with
zeros (positions ``-1``) to ``max_soft_tokens``.

The resize is torchvision's (``resize_frames`` of :mod:`~mpipe_hf.data.image_torch_ops`: antialiased bicubic ``interpolate`` on
the ``uint8`` image, torchvision's path on every CPU), the rescale the backend's ``x * rescale_factor`` in
``float32``. Outputs: ``pixel_values`` ``(images, max_soft_tokens, (k * patch_size) ** 2 * 3)``,
``image_position_ids`` ``(images, max_soft_tokens, 2)`` and ``num_soft_tokens_per_image`` ``(images,)``.
``tests/test_stock_recorded.py`` compares them with the stock class's recorded outputs.
"""

from __future__ import annotations

import torch
from transformers.image_processing_utils import BatchFeature
from transformers.image_utils import PILImageResampling
from transformers.models.gemma4.image_processing_pil_gemma4 import get_aspect_ratio_preserving_size
from transformers.processing_utils import ImagesKwargs

from ...data.image_torch_ops import PilBackendAsStock, resize_frames

SOFT_TOKEN_BUDGETS = (70, 140, 280, 560, 1120)  # the stock class's allowed max_soft_tokens


class Gemma4UnifiedNoTVKwargs(ImagesKwargs, total=False):
    """The stock class's own settings: ``patch_size`` (px), ``max_soft_tokens`` (one of
    :data:`SOFT_TOKEN_BUDGETS`) and ``pooling_kernel_size``."""

    patch_size: int
    max_soft_tokens: int
    pooling_kernel_size: int


def merged_patches(image: torch.Tensor, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``image`` ``(C, H, W)`` (``H``, ``W`` multiples of ``side``) -> its ``side`` px patches in raster order,
    each flattened ``(row, column, channel)``: ``(H / side * W / side, side * side * C)``, and their ``(x, y)``
    grid positions ``(n, 2)`` ``int64``."""
    channels, height, width = image.shape
    rows, cols = height // side, width // side
    patches = image.reshape(channels, rows, side, cols, side).permute(1, 3, 2, 4, 0).reshape(rows * cols, -1)
    y, x = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    return patches, torch.stack([x, y], dim=-1).reshape(-1, 2)


def rescaled(image: torch.Tensor, do_rescale: bool, rescale_factor: float, do_normalize: bool, image_mean,
             image_std) -> torch.Tensor:
    """``image`` ``(C, H, W)`` as the torchvision backend's ``rescale_and_normalize`` gives it: normalised in
    ``float32`` (the mean and std scaled by ``1 / rescale_factor`` where it also rescales), else ``image *
    rescale_factor``, else unchanged."""
    if do_normalize:
        scale = 1.0 / rescale_factor if do_rescale else 1.0
        mean, std = torch.tensor(image_mean) * scale, torch.tensor(image_std) * scale
        return image.to(torch.float32).sub(mean.view(-1, 1, 1)).div_(std.view(-1, 1, 1))
    return image * rescale_factor if do_rescale else image


class Gemma4UnifiedImageProcessorNoTV(PilBackendAsStock):
    """``Gemma4UnifiedImageProcessor``'s outputs without torchvision (module docstring); its settings and defaults
    are the stock class's, so a checkpoint's ``preprocessor_config.json`` applies unchanged.

    Raises:
        ValueError: ``max_soft_tokens`` is not one of :data:`SOFT_TOKEN_BUDGETS` (as the stock class).
    """

    stock_class_name = "Gemma4UnifiedImageProcessor"
    valid_kwargs = Gemma4UnifiedNoTVKwargs
    model_input_names = ["pixel_values", "image_position_ids", "num_soft_tokens_per_image"]
    resample = PILImageResampling.BICUBIC
    image_mean, image_std = [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]
    size = None
    default_to_square = do_convert_rgb = do_resize = do_rescale = True
    do_normalize = False
    patch_size, max_soft_tokens, pooling_kernel_size = 16, 280, 3

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        if self.max_soft_tokens not in SOFT_TOKEN_BUDGETS:
            raise ValueError(f"`max_soft_tokens` must be one of {SOFT_TOKEN_BUDGETS}, got {self.max_soft_tokens}.")

    def _validate_preprocess_kwargs(self, **kwargs):
        kwargs["do_resize"] = False  # the size comes from the patch budget, not ``size`` (as the stock class)
        super()._validate_preprocess_kwargs(**kwargs)

    def _preprocess(self, images: list, do_resize: bool, resample, do_rescale: bool, rescale_factor: float,
                    do_normalize: bool, image_mean, image_std, return_tensors=None, patch_size: int = 16,
                    max_soft_tokens: int = 280, pooling_kernel_size: int = 3, **kwargs) -> BatchFeature:
        """``images`` (``uint8`` ``(3, H, W)`` arrays, the PIL backend's) -> ``pixel_values``,
        ``image_position_ids`` and ``num_soft_tokens_per_image`` (module docstring).

        Raises:
            ValueError: ``max_soft_tokens`` is not one of :data:`SOFT_TOKEN_BUDGETS`, or the image is too narrow
                for one merged patch (``get_aspect_ratio_preserving_size``'s errors).
        """
        if max_soft_tokens not in SOFT_TOKEN_BUDGETS:
            raise ValueError(f"`max_soft_tokens` must be one of {SOFT_TOKEN_BUDGETS}, got {max_soft_tokens}.")
        side = pooling_kernel_size * patch_size
        pixels, positions, counts = [], [], []
        for array in images:
            image = torch.from_numpy(array)
            if do_resize:
                height, width = get_aspect_ratio_preserving_size(image.shape[-2], image.shape[-1], patch_size,
                                                                 max_soft_tokens * pooling_kernel_size ** 2,
                                                                 pooling_kernel_size)
                image = resize_frames(image, height, width, resample)
            patches, where = merged_patches(rescaled(image, do_rescale, rescale_factor, do_normalize, image_mean,
                                                     image_std), side)
            counts.append(patches.shape[0])
            pad = max_soft_tokens - patches.shape[0]
            pixels.append(torch.nn.functional.pad(patches, [0, 0, 0, max(pad, 0)]))
            positions.append(torch.nn.functional.pad(where, [0, 0, 0, max(pad, 0)], value=-1))
        data = {"pixel_values": torch.stack(pixels), "image_position_ids": torch.stack(positions),
                "num_soft_tokens_per_image": counts}
        return BatchFeature(data=data, tensor_type=return_tensors)
