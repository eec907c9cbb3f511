"""Nemotron-H Omni's image processor without torchvision: :class:`NemotronHOmniImageProcessorNoTV` gives the
outputs of ``transformers``' ``NemotronH_Omni_Reasoning_V3ImageProcessor``
(``models/nemotron_h_omni/image_processing_nemotron_h_omni.py``, 5.25; a torchvision class with no PIL twin) with
torch operations only.

The stock steps, per image: one patch budget for every image of the call (:func:`patch_budget`: the context length
in pre-shuffle patches, clamped to ``[min_num_patches, max_num_patches]``), the image's patch grid
(:func:`patch_grid`: its own grid scaled into ``[min_num_patches, budget]``, each side a multiple of the pixel
shuffle's ``1 / downsample_ratio``), the image turned to ``float32`` and resized to that grid's pixels where its
size differs (bicubic, antialiased, on the ``float32`` image so the overshoot is kept: ``resize_frames`` of
:mod:`mpipe_hf.data.image_torch_ops`, torchvision's float path), rescaled and normalised in ``float32`` (the
backend's fused step) and cut into patches. Outputs: ``pixel_values`` ``(patches, 3 * patch ** 2)`` (each image's
patches row by row, each laid out channel-major) and ``image_grid_hw`` ``(images, 2)`` (patch rows, patch columns).
``tests/test_stock_recorded.py`` compares them with the stock class's recorded outputs.
"""

from __future__ import annotations

import math

import torch
from transformers.image_processing_utils import BatchFeature
from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, PILImageResampling
from transformers.processing_utils import ImagesKwargs

from ...data.image_torch_ops import PilBackendAsStock, rescale_and_normalize, resize_frames


class NemotronHOmniNoTVKwargs(ImagesKwargs, total=False):
    """The stock class's own settings: ``patch_size`` (the tower's patch side, px), ``downsample_ratio`` (the
    pixel shuffle's), ``min_num_patches`` / ``max_num_patches`` (the patches an image is resized to; a maximum of
    0 lifts the cap) and ``max_model_len`` (the context length, which caps a call's budget)."""

    patch_size: int
    downsample_ratio: float
    min_num_patches: int
    max_num_patches: int
    max_model_len: int


def patch_grid(height: int, width: int, patch: int, merge: int, min_patches: int,
               max_patches: int) -> tuple[int, int]:
    """``(patch rows, patch columns)`` an image of ``height`` x ``width`` px is resized to, as the stock
    ``get_patch_grid_size``: the image's grid (each side ``round(side / patch + 0.5)``), shrunk to at most
    ``max_patches`` patches (sides floored), grown to at least ``min_patches`` where the two differ (sides
    ceiled), then each side moved to a multiple of ``merge`` (up where the total stays within ``max_patches``,
    else down, never under ``merge``)."""
    rows, cols = round(height / patch + 0.5), round(width / patch + 0.5)
    scale = min(math.sqrt(max_patches / (rows * cols)), 1.0)
    rows, cols = math.floor(scale * rows), math.floor(scale * cols)
    if max_patches > min_patches and rows * cols < min_patches:
        scale = math.sqrt(min_patches / (rows * cols))
        rows, cols = math.ceil(scale * rows), math.ceil(scale * cols)
    if rows % merge:
        up = rows + merge - rows % merge
        rows = up if up * cols <= max_patches else max(merge, rows - rows % merge)
    if cols % merge:
        up = cols + merge - cols % merge
        cols = up if rows * up <= max_patches else max(merge, cols - cols % merge)
    return rows, cols


def patch_budget(images: int, merge: int, min_patches: int, max_patches: int, max_model_len: int) -> int:
    """The patch budget each of a call's ``images`` images gets, as the stock ``get_num_patches_budget``:
    ``(max_model_len - 4) * merge ** 2`` (at least ``min_patches`` per image), capped at ``max_patches`` where that
    is not 0, and at least ``min_patches``."""
    budget = max((max_model_len - 4) * merge ** 2, min_patches * images)
    if max_patches:
        budget = min(budget, max_patches)
    return max(budget, min_patches)


class NemotronHOmniImageProcessorNoTV(PilBackendAsStock):
    """``NemotronH_Omni_Reasoning_V3ImageProcessor``'s outputs without torchvision (module docstring); its settings
    and defaults are the stock class's (the released checkpoints' ``norm_mean`` / ``norm_std`` read as the mean
    and std, as there), so a checkpoint's ``preprocessor_config.json`` applies unchanged."""

    stock_class_name = "NemotronH_Omni_Reasoning_V3ImageProcessor"
    valid_kwargs = NemotronHOmniNoTVKwargs
    resample = PILImageResampling.BICUBIC
    do_rescale = do_normalize = do_convert_rgb = True
    image_mean, image_std = OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
    patch_size, downsample_ratio = 16, 0.5
    min_num_patches, max_num_patches, max_model_len = 1024, 13312, 16384
    model_input_names = ["pixel_values", "image_grid_hw"]

    def __init__(self, **kwargs):
        if (mean := kwargs.pop("norm_mean", None)) is not None:
            kwargs.setdefault("image_mean", mean)
        if (std := kwargs.pop("norm_std", None)) is not None:
            kwargs.setdefault("image_std", std)
        kwargs.pop("_downsample_factor", None)
        super().__init__(**kwargs)

    def get_number_of_image_patches(self, height: int, width: int, images_kwargs: dict | None = None,
                                    num_images: int = 1) -> int:
        """Patches of an image of ``height`` x ``width`` px processed in a call of ``num_images`` images (the
        model writes one image token per ``(1 / downsample_ratio) ** 2`` of them)."""
        kwargs = self._merge_and_standardize_kwargs(**(images_kwargs or {}))
        merge = round(1 / kwargs["downsample_ratio"])
        budget = patch_budget(num_images, merge, kwargs["min_num_patches"], kwargs["max_num_patches"],
                              kwargs["max_model_len"])
        rows, cols = patch_grid(height, width, kwargs["patch_size"], merge, kwargs["min_num_patches"], budget)
        return rows * cols

    def _preprocess(self, images: list, resample, do_rescale: bool, rescale_factor: float, do_normalize: bool,
                    image_mean, image_std, patch_size: int, downsample_ratio: float, min_num_patches: int,
                    max_num_patches: int, max_model_len: int, return_tensors=None, **kwargs) -> BatchFeature:
        """``images`` (``uint8`` ``(3, H, W)`` arrays, the PIL backend's) -> ``pixel_values`` and
        ``image_grid_hw`` (module docstring)."""
        merge = round(1 / downsample_ratio)
        budget = patch_budget(len(images), merge, min_num_patches, max_num_patches, max_model_len)
        patches, grids = [], []
        for array in images:
            image = torch.from_numpy(array).to(torch.float32)
            rows, cols = patch_grid(*image.shape[-2:], patch_size, merge, min_num_patches, budget)
            image = resize_frames(image, rows * patch_size, cols * patch_size, resample)
            x = rescale_and_normalize(image, do_rescale, rescale_factor, do_normalize, image_mean, image_std)
            x = x.reshape(x.shape[0], rows, patch_size, cols, patch_size).permute(1, 3, 0, 2, 4)
            patches.append(x.reshape(rows * cols, -1))
            grids.append([rows, cols])
        return BatchFeature(data={"pixel_values": torch.cat(patches),
                                  "image_grid_hw": torch.tensor(grids, dtype=torch.long)},
                            tensor_type=return_tensors)
