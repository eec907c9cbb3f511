"""Step3p7's image processor without torchvision: :class:`Step3p7ImageProcessorNoTV` gives the outputs of
``transformers``' ``Step3p7ImageProcessor`` (``models/step3p7/image_processing_step3p7.py``, 5.25; a torchvision
class with no PIL twin) with torch operations only.

The stock steps, per image: the sliding-window plan (the stock ``_plan_patches``, used here as it is: its module
imports without torchvision): an image of extreme aspect (short side under 32 px, over 4:1) padded with zeros to
a square (the original top left), one larger than ``max_image_size`` scaled down; the global view resized to the
plan's size and then to ``size`` (two resizes, each back to ``uint8``); where the plan has windows, the image
resized to the snapped crop size and cut into ``window``-px patches row by row, each resized to ``patch_size``;
every view rescaled and normalised in ``float32`` (the backend's fused step). Each resize is torchvision's
(``resize_frames`` of :mod:`mpipe_hf.data.image_torch_ops`: antialiased ``interpolate`` on the ``uint8`` image,
bilinear). Outputs: ``pixel_values`` ``(images, 3, size, size)``, ``num_local_patches`` ``(images,)`` and, where any
image has windows, ``pixel_values_local`` ``(windows, 3, patch_size, patch_size)`` and ``patch_newline_masks`` (a list
per image, padded with ``False``: a newline after each row of windows but the last).
``tests/test_stock_recorded.py`` compares them with the stock class's recorded outputs.
"""

from __future__ import annotations

import torch
from transformers.image_processing_utils import BatchFeature
from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, PILImageResampling
from transformers.models.step3p7.image_processing_step3p7 import Step3p7ImageProcessor, Step3p7ImageProcessorKwargs

from ...data.image_torch_ops import PilBackendAsStock, rescale_and_normalize, resize_frames


class Step3p7ImageProcessorNoTV(PilBackendAsStock):
    """``Step3p7ImageProcessor``'s outputs without torchvision (module docstring); its settings and defaults are
    the stock class's, so a checkpoint's ``preprocessor_config.json`` applies unchanged."""

    stock_class_name = "Step3p7ImageProcessor"
    valid_kwargs = Step3p7ImageProcessorKwargs
    model_input_names = ["pixel_values", "pixel_values_local", "num_local_patches"]
    resample = PILImageResampling.BILINEAR
    size = {"height": 728, "width": 728}
    patch_size, max_image_size = 504, 3024
    do_rescale = do_normalize = do_convert_rgb = True
    image_mean, image_std = OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
    vision_patch_size, downsampler_stride = 14, 4  # read by Step3p7Processor (tokens per view)
    _is_extreme_aspect = staticmethod(Step3p7ImageProcessor._is_extreme_aspect)
    _plan_patches = Step3p7ImageProcessor._plan_patches
    get_number_of_image_patches = Step3p7ImageProcessor.get_number_of_image_patches

    def _views(self, image: torch.Tensor, side: int, patch_size: int, resample) -> tuple[torch.Tensor, list, int,
                                                                                         int]:
        """One ``uint8`` ``(3, H, W)`` image -> its global view ``(3, side, side)``, its windows (``uint8``, not
        yet resized to ``patch_size``) and the windows' columns and rows."""
        height, width = image.shape[-2:]
        (glob_w, glob_h), (crop_w, crop_h), window, cols, rows, square = self._plan_patches(width, height, side,
                                                                                            patch_size)
        if square:
            edge = max(width, height)
            image = torch.nn.functional.pad(image, [0, edge - width, 0, edge - height])
        glob = resize_frames(resize_frames(image, glob_h, glob_w, resample), side, side, resample)
        if window == 0:
            return glob, [], cols, rows
        grown = resize_frames(image, crop_h, crop_w, resample)
        windows = [grown[:, r:r + window, c:c + window] for r in range(0, crop_h, window)
                   for c in range(0, crop_w, window)]
        return glob, windows, cols, rows

    def _preprocess(self, images: list, do_rescale: bool, rescale_factor: float, do_normalize: bool, image_mean,
                    image_std, resample, size, patch_size: int, return_tensors=None, **kwargs) -> BatchFeature:
        """``images`` (``uint8`` ``(3, H, W)`` arrays, the PIL backend's) -> the outputs of the module docstring
        (every image is resized, as the stock class does whatever ``do_resize`` says)."""
        def normalize(x):
            return rescale_and_normalize(x, do_rescale, rescale_factor, do_normalize, image_mean, image_std)
        globs, local, counts, masks = [], [], [], []
        for array in images:
            glob, windows, cols, rows = self._views(torch.from_numpy(array), size.height, patch_size, resample)
            globs.append(glob)
            local += [normalize(resize_frames(w, patch_size, patch_size, resample)) for w in windows]
            counts.append(len(windows))
            masks.append([c == cols - 1 and r < rows - 1 for r in range(rows) for c in range(cols)])
        result = BatchFeature(data={"pixel_values": normalize(torch.stack(globs)), "num_local_patches": counts},
                              tensor_type=return_tensors)
        most = max(counts, default=0)
        if most:  # set after the BatchFeature is built, as the stock class: no tensor conversion of these two
            result["pixel_values_local"] = torch.stack(local)
            result["patch_newline_masks"] = [mask + [False] * (most - len(mask)) for mask in masks]
        return result
