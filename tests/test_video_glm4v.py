"""GLM-4.xV's video processor without torchvision (issue 39): :class:`Glm4vVideoProcessorNoTV` against the stock
``Glm4vVideoProcessor``'s own code, and its timestamps against the stock processor's prompt.

As in ``tests/test_video_qwen3.py``, the stock class's source (``sample_frames``, ``resize``, ``patchify``,
``_preprocess``, ``get_num_of_video_patches``, its defaults) is compiled over a base whose two torchvision steps
are :mod:`mpipe_hf.data.video_processor`'s (checked against torchvision's recorded outputs in
``tests/test_video.py``); what differs from Qwen's class (sampling by time, the whole-video budget, the defaults)
is the stock code on one side and ours on the other, compared with ``torch.equal``. GLM-4.6V's class (its own
sampling and prompt) is compiled the same way from its module's source (the module imports torchvision).
"""

import importlib
import os
import types

import numpy as np
import pytest
import torch
from transformers.video_utils import VideoMetadata

from mpipe_hf.data.video_processor_glm4v import (Glm4vVideoProcessorNoTV, Glm46vVideoProcessorNoTV,
                                                 glm_video_processor_from_image)
from stock_video_code import compare_with_stock, pan, stock_class

stock_module = importlib.import_module("transformers.models.glm4v.video_processing_glm4v")
stock_processor = importlib.import_module("transformers.models.glm4v.processing_glm4v")
glm46v_processor = importlib.import_module("transformers.models.glm46v.processing_glm46v")


GLM46V_PATH = os.path.join(os.path.dirname(os.path.dirname(stock_module.__file__)), "glm46v",
                           "video_processing_glm46v.py")
# GLM-4.6V's module imports torchvision: its class is compiled with GLM-4.1V's module's names (the same names, its
# kwargs class GLM-4.1V's under another name)
NAMES = dict(vars(stock_module), Glm46VVideoProcessorInitKwargs=stock_module.Glm4vVideoProcessorInitKwargs)
STOCK = stock_class(stock_module.__file__, "Glm4vVideoProcessor", NAMES)
STOCK46 = stock_class(GLM46V_PATH, "Glm46VVideoProcessor", NAMES)
PAIRS = {"glm4v": (STOCK, Glm4vVideoProcessorNoTV), "glm46v": (STOCK46, Glm46vVideoProcessorNoTV)}


def _videos(seed):
    rng = np.random.default_rng(seed)
    noise = rng.integers(0, 256, (9, 70, 110, 3), dtype=np.uint8)
    return [(noise, VideoMetadata(total_num_frames=9, fps=3.0, duration=3.0)),
            (pan(13, 48, 40), VideoMetadata(total_num_frames=13, fps=25.0, duration=13 / 25)),
            (pan(12, 200, 120, 3), VideoMetadata(total_num_frames=12, fps=4.0, duration=None))]


SETTINGS = [
    ({"size": {"shortest_edge": 56 * 56, "longest_edge": 8 * 112 * 112}}, {}),
    ({"size": {"shortest_edge": 32 * 32, "longest_edge": 6 * 64 * 64}}, {"fps": 4}),
    ({"size": {"shortest_edge": 4 * 64 * 64, "longest_edge": 20 * 96 * 96}}, {"fps": 1}),  # upscaling
    ({}, {}),
    ({"size": {"shortest_edge": 2048, "longest_edge": 100000}, "do_normalize": False}, {"do_sample_frames": False}),
]


@pytest.mark.parametrize("family", sorted(PAIRS))
@pytest.mark.parametrize("settings, call", SETTINGS, ids=range(len(SETTINGS)))
def test_outputs_equal_the_stock_code(settings, call, family):
    stock, ours = PAIRS[family][0](**settings), PAIRS[family][1](**settings)
    videos = _videos(len(settings))
    want, got = compare_with_stock(stock, ours, videos, call)
    for (video, meta), grid, m in zip(videos, want["video_grid_thw"], want["video_metadata"]):
        frames = len(m.frames_indices) if call.get("do_sample_frames", True) else meta.total_num_frames
        size = (video.shape[1], video.shape[2])
        assert ours.tokens_for(frames, *size) == int(grid.prod()) // 4
        assert ours.get_num_of_video_patches(frames, *size) == stock.get_num_of_video_patches(frames, *size)


@pytest.mark.parametrize("family", sorted(PAIRS))
def test_sampling_equals_the_stock_method(family):
    compared, (stock_class, our_class) = 0, PAIRS[family]
    for max_duration in (300, 3):
        stock, ours = stock_class(max_duration=max_duration), our_class(max_duration=max_duration)
        for total in (1, 2, 3, 5, 8, 31, 100, 1001, 9000):
            for video_fps in (1.0, 2.5, 29.97, 60.0):
                for duration in (None, total / video_fps, 0.0):
                    for kw in ({}, {"fps": 0.5}, {"fps": 8.0}):
                        meta = dict(total_num_frames=total, fps=video_fps, duration=duration)
                        want = stock.sample_frames(VideoMetadata(**meta), **kw)
                        assert np.array_equal(ours.sample_frames(VideoMetadata(**meta), **kw), want), (meta, kw)
                        compared += 1
    assert compared > 500
    with pytest.raises(ValueError, match="fps"):
        our_class().sample_frames(VideoMetadata(total_num_frames=4, fps=None))


@pytest.mark.parametrize("family", sorted(PAIRS))
def test_timestamps_equal_the_stock_prompt(family):
    """The seconds after each temporal patch, as the stock ``replace_video_token`` writes them."""
    ours = PAIRS[family][1]()
    stock = stock_processor.Glm4vProcessor if family == "glm4v" else glm46v_processor.Glm46VProcessor
    frame = stock.replace_frame_token_id
    fake = types.SimpleNamespace(video_processor=ours, image_token="<|image|>")
    fake.replace_frame_token_id = lambda t, num_image_tokens: frame(fake, t, num_image_tokens)
    for indices, fps, grid_t in (([0, 2, 5, 7], 2.0, 2), ([0, 3, 6, 6], 30.0, 2), ([4, 4], 24.0, 1),
                                 (list(range(0, 40, 3)), 29.97, 7), ([0, 5, 9, 14], None, 2), ([0, 2], 1.0, 3)):
        meta = VideoMetadata(total_num_frames=50, fps=fps, frames_indices=list(indices))
        inputs = {"video_grid_thw": torch.tensor([[grid_t, 4, 6]]), "video_metadata": [meta]}
        want = stock.replace_video_token(fake, inputs, 0)
        stamps = ours.timestamps(indices, fps)
        stamps = (stamps + [stamps[-1]] * grid_t)[:grid_t]
        assert "".join(f"<|begin_of_image|>{'<|image|>' * 6}<|end_of_image|>{ours.frame_text(t)}"
                       for t in stamps) == want, (indices, fps)


@pytest.mark.parametrize("model_type, cls", [("glm4v", Glm4vVideoProcessorNoTV), ("glm46v", Glm46vVideoProcessorNoTV)])
def test_built_from_the_image_processor(model_type, cls):
    """Without a snapshot: the image processor's patch settings, a whole-video budget of 8 images' (as Qwen3-VL's),
    a snapshot's ``video_preprocessor_config.json`` over them; saved under the stock class's name."""
    from transformers.models.glm4v.image_processing_pil_glm4v import Glm4vImageProcessorPil
    image = Glm4vImageProcessorPil(size={"shortest_edge": 56 * 56, "longest_edge": 112 * 112})
    video = glm_video_processor_from_image(image, model_type, {"fps": 1, "unknown": 3})
    assert type(video) is cls and video.fps == 1 and video.patch_size == image.patch_size
    assert dict(video.size) == {"shortest_edge": 56 * 56, "longest_edge": 8 * 112 * 112}
    assert video.to_dict()["video_processor_type"] == cls.stock_class_name
