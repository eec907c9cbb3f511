"""What the tests of the torchvision-free video processors share: a stock ``transformers`` video
processor class compiled from its own source over a base whose two torchvision steps are
:mod:`mpipe_hf.data.video_processor`'s (checked against torchvision's recorded outputs in ``tests/test_video.py``),
and synthetic clips. These tests run the stock code under many settings; the stock classes themselves, with
torchvision, are compared on recorded outputs in ``tests/test_stock_recorded.py`` (every video processor shipped)."""

import ast

import numpy as np
import torch
from transformers.video_utils import VideoMetadata

from mpipe_hf.data.image_torch_ops import resize_frames
from mpipe_hf.data.video_processor import QwenVideoProcessor


class TorchvisionSteps(QwenVideoProcessor):
    """The base the stock class's code runs on: torchvision's resize and the fused normalisation as ours."""

    def resize(self, image, size, resample, **kwargs):
        return resize_frames(image, size.height, size.width, resample)

    def rescale_and_normalize(self, videos, do_rescale, rescale_factor, do_normalize, image_mean, image_std):
        return self._normalize(videos, do_rescale, rescale_factor, do_normalize, image_mean, image_std)


def stock_class(path: str, name: str, names: dict) -> type:
    """The class ``name`` as the installed transformers writes it in the file ``path``, undecorated and compiled
    with the module names ``names`` over :class:`TorchvisionSteps` as its ``BaseVideoProcessor``."""
    node = next(n for n in ast.walk(ast.parse(open(path).read())) if isinstance(n, ast.ClassDef) and n.name == name)
    node.decorator_list = []
    space = dict(names, BaseVideoProcessor=TorchvisionSteps)
    exec(compile(ast.Module([node], []), path, "exec"), space)  # noqa: S102 - transformers' own code
    return space[name]


def pan(frames: int, height: int, width: int, step: int = 5) -> np.ndarray:
    """``(frames, height, width, 3)`` uint8: a smooth pattern panning ``step`` pixels a frame."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    out = [np.stack([128 + 127 * np.sin((x + step * t) / 7.0 + y / 11.0), (3 * (x + step * t) + 2 * y) % 256,
                     128 + 127 * np.cos(y / 5.0)], -1) for t in range(frames)]
    return np.stack(out).round().clip(0, 255).astype(np.uint8)


def compare_with_stock(stock, ours, videos: list, call: dict):
    """``(stock's output, ours)`` for ``videos`` (``(frames, metadata)`` pairs, each call given fresh metadata)
    with the call's keywords ``call``, after asserting equal ``pixel_values_videos`` and ``video_grid_thw`` (dtype
    and every value) and, per video, equal sampled frame indices (where ours reports them) and fps."""
    kwargs = dict(videos=[v for v, _ in videos], video_metadata=[VideoMetadata(**vars(m)) for _, m in videos],
                  return_metadata=True, return_tensors="pt", **call)
    want = stock(**kwargs)
    kwargs["video_metadata"] = [VideoMetadata(**vars(m)) for _, m in videos]
    got = ours(**kwargs)
    for key in ("pixel_values_videos", "video_grid_thw"):
        assert got[key].dtype == want[key].dtype and torch.equal(got[key], want[key]), key
    for g, w in zip(got["video_metadata"], want["video_metadata"]):
        assert g.frames_indices is None or list(g.frames_indices) == list(w.frames_indices)
        assert g.fps == w.fps
    return want, got
