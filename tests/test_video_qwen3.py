"""Qwen3-VL's video path without torchvision: :class:`Qwen3VideoProcessor` against the stock
``Qwen3VLVideoProcessor``'s own code, the timestamp prompts against the stock processor's, and the loader's
count against the collator's.

The stock class cannot be built here (its module's class needs torchvision), so its source (``sample_frames``,
``resize``, ``patchify``, ``_preprocess``, ``get_num_of_video_patches`` and its defaults) is compiled over a base
whose two torchvision steps are ours (``resize_frames`` of :mod:`mpipe_hf.data.image_torch_ops` and the fused
normalisation of :mod:`mpipe_hf.data.video_processor`), the steps ``tests/test_video.py`` checks against
torchvision's recorded outputs. What differs between Qwen3-VL's class and Qwen2-VL's (sampling, the whole-video
budget, the cap, defaults) is then the stock code itself on one side and ours on the other, compared with
``torch.equal``. The stock class itself, with torchvision, is compared on recorded outputs in ``tests/test_stock_recorded.py``.
"""

import importlib
import os
import sys

import numpy as np
import pytest
from transformers import Qwen3VLProcessor
from transformers.video_utils import VideoMetadata

from mpipe_hf.data import qwen2_tokenizer
from mpipe_hf.data.processor import build_processor
from mpipe_hf.data.video import video_ref
from mpipe_hf.families.qwen.qwen3_video_processor import Qwen3VideoProcessor
from mpipe_hf.families.qwen import tiny as qwen_tiny
from stock_video_code import compare_with_stock, pan, stock_class

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "dist"))
stock_module = importlib.import_module("transformers.models.qwen3_vl.video_processing_qwen3_vl")


STOCK = stock_class(stock_module.__file__, "Qwen3VLVideoProcessor", vars(stock_module))


def _videos(seed):
    rng = np.random.default_rng(seed)
    noise = rng.integers(0, 256, (9, 70, 110, 3), dtype=np.uint8)
    return [(noise, VideoMetadata(total_num_frames=9, fps=3.0, duration=3.0)),
            (pan(13, 48, 40), VideoMetadata(total_num_frames=13, fps=25.0, duration=13 / 25)),
            (pan(6, 200, 120, 3), VideoMetadata(total_num_frames=6, fps=None, duration=0.0))]


SETTINGS = [
    ({"size": {"shortest_edge": 56 * 56, "longest_edge": 8 * 112 * 112}}, {}),
    ({"size": {"shortest_edge": 32 * 32, "longest_edge": 6 * 64 * 64}}, {"fps": 4}),
    ({"size": {"shortest_edge": 4 * 64 * 64, "longest_edge": 20 * 96 * 96}}, {"num_frames": 5, "fps": None}),  # upscaling
    ({"cap_pixels_per_frame": True, "max_video_tokens": 4}, {}),
    ({"size": {"shortest_edge": 2048, "longest_edge": 100000}, "do_normalize": False}, {"do_sample_frames": False}),
]


@pytest.mark.parametrize("settings, call", SETTINGS, ids=range(len(SETTINGS)))
def test_outputs_equal_the_stock_code(settings, call):
    stock, ours = STOCK(**settings), Qwen3VideoProcessor(**settings)
    videos = _videos(len(settings))
    want, got = compare_with_stock(stock, ours, videos, call)
    for g, w in zip(got["video_metadata"], want["video_metadata"]):  # ours reports indices where the stock does
        assert [None if m.frames_indices is None else list(m.frames_indices) for m in (g, w)].count(None) != 1
    for (video, meta), grid in zip(videos, want["video_grid_thw"]):
        frames = len(ours.sample_frames(VideoMetadata(**vars(meta)), **{k: v for k, v in call.items()
                                                                         if k in ("fps", "num_frames")}))
        frames = frames if call.get("do_sample_frames", True) else meta.total_num_frames
        size = (video.shape[1], video.shape[2])
        assert ours.tokens_for(frames, *size) == int(grid.prod()) // 4
        assert ours.get_num_of_video_patches(frames, *size) == STOCK(**settings).get_num_of_video_patches(
            frames, *size)


def test_sampling_equals_the_stock_method():
    stock, ours, compared = STOCK(), Qwen3VideoProcessor(), 0
    for total in (1, 2, 3, 5, 8, 31, 100, 1001):
        for video_fps in (None, 1.0, 2.5, 29.97, 60.0):
            for kw in ({}, {"fps": 0.5}, {"fps": 8.0}, {"num_frames": 3}, {"num_frames": 16}):
                if "num_frames" in kw and kw["num_frames"] > total:
                    continue
                want = stock.sample_frames(VideoMetadata(total_num_frames=total, fps=video_fps), **kw)
                got = ours.sample_frames(VideoMetadata(total_num_frames=total, fps=video_fps), **kw)
                assert np.array_equal(got, want), (total, video_fps, kw)
                compared += 1
    assert compared > 150


def test_timestamps_equal_the_stock_processor():
    ours = Qwen3VideoProcessor()
    for indices, fps in (([0, 2, 5, 7], 2.0), ([0, 3, 6], 30.0), ([4], 24.0), (list(range(0, 40, 3)), 29.97)):
        want = Qwen3VLProcessor._calculate_timestamps(None, list(indices), fps, 2)
        assert ours.timestamps(indices, fps) == want


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    from common import collator, write_clips
    tokenizer = qwen2_tokenizer(4096)
    config = qwen_tiny.tiny_qwen3_vl_config(tokenizer, num_layers=2)
    return collator(config, tokenizer), write_clips(str(tmp_path_factory.mktemp("clips")))


def test_rows_expand_to_timestamped_frames_counted_at_load(qwen3):
    """A row's video as the collator gets it from the stock processor (``<t seconds>`` then each temporal patch's
    tokens between its own markers) is the text the loader computes from the file's header alone, and the M-RoPE
    of the row places each frame after its timestamp."""
    from common import video_row
    collate, clips = qwen3
    row = video_row([("image", 1), ("video", 0), ("video", 2)], 1, 1, clips)
    batch = collate([row])
    text = collate.processor.tokenizer.decode(batch["input_ids"][0])
    refs = [video_ref(p["video"], "/", "t", {k: v for k, v in p.items() if k not in ("type", "video")})
            for p in (clips[0], clips[2])]
    expansions = collate.encoder.video_tokens_for(refs)
    assert all(e in text for e in expansions) and "<0.5 seconds>" in expansions[0], expansions
    grids = batch["video_grid_thw"]
    assert [e.count("seconds>") for e in expansions] == grids[:, 0].tolist()
    assert int((batch["input_ids"] == collate.processor.video_token_id).sum()) == int(grids.prod(-1).sum()) // 4


def test_qwen3_5_processor_takes_videos():
    tokenizer = qwen2_tokenizer(4096)
    processor = build_processor(qwen_tiny.tiny_qwen3_5_config(tokenizer, num_layers=2), tokenizer)
    assert isinstance(processor.video_processor, Qwen3VideoProcessor)
    assert processor.video_processor.to_dict()["video_processor_type"] == "Qwen3VLVideoProcessor"
