"""LLaVA-OneVision's video path without torchvision: :class:`OnevisionVideoProcessor` against the stock
``LlavaOnevisionVideoProcessor``'s own code, the loader's token count against the stock processor's expansion, and
the split's load-time check.

The stock class cannot be built here (its bases need torchvision), so its code is compiled from the installed
transformers' source: ``LlavaOnevisionVideoProcessor`` over ``BaseVideoProcessor`` (``video_processing_utils.py``)
over ``TorchvisionBackend`` (``image_processing_backends.py``), each undecorated, with the three torchvision
functions their code calls (``tvF.resize``, ``tvF.normalize``, ``tvF.grayscale_to_rgb``, and the interpolation
enum) given as :mod:`mpipe_hf.data.image_torch_ops`' ``resize_frames`` (checked against torchvision's recorded
outputs in ``tests/test_video.py``) and torchvision's own arithmetic. Everything else on the stock side (sampling,
the size, grouping, the fused normalisation, the outputs) is the stock code, compared with ``torch.equal``. The
stock class itself, with torchvision, is compared on recorded outputs in ``tests/test_stock_recorded.py``.
"""

import ast
import enum
import importlib
import os
import sys

import numpy as np
import pytest
import torch
from transformers import AutoModelForImageTextToText
from transformers.image_utils import PILImageResampling
from transformers.video_utils import VideoMetadata

from mpipe_hf.data import build_processor, qwen2_tokenizer
from mpipe_hf.data.video import video_ref
from mpipe_hf.data.image_torch_ops import resize_frames
from mpipe_hf.families.llava.video_processor_onevision import NUM_FRAMES, OnevisionVideoProcessor
from mpipe_hf.models import split
from mpipe_hf.families.llava.tiny import tiny_llava_onevision_config
from mpipe_hf.schedule import ScheduleConfig
from stock_video_code import pan

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "dist"))


class _Mode(enum.Enum):
    """``torchvision.transforms.v2.InterpolationMode``'s members the stock code names."""
    NEAREST, NEAREST_EXACT, BILINEAR, BICUBIC, BOX, HAMMING, LANCZOS = (
        "nearest", "nearest-exact", "bilinear", "bicubic", "box", "hamming", "lanczos")


_PIL = {_Mode.BILINEAR: PILImageResampling.BILINEAR, _Mode.BICUBIC: PILImageResampling.BICUBIC}


class _TorchvisionFunctional:
    """The ``tvF`` functions the stock code calls: the resize as ours, the others as torchvision 0.28 writes them."""
    InterpolationMode = _Mode

    @staticmethod
    def resize(image, size, interpolation=_Mode.BILINEAR, antialias=True):
        assert antialias
        return resize_frames(image, size[0], size[1], _PIL[interpolation])

    @staticmethod
    def normalize(image, mean, std, inplace=False):
        mean = torch.as_tensor(mean, dtype=image.dtype, device=image.device).view(-1, 1, 1)
        std = torch.as_tensor(std, dtype=image.dtype, device=image.device).view(-1, 1, 1)
        return (image.sub_(mean) if inplace else image.sub(mean)).div_(std)

    @staticmethod
    def grayscale_to_rgb(image):
        return image if image.shape[-3] >= 3 else image.repeat([1] * (image.ndim - 3) + [3, 1, 1])


def _compiled(module_name: str, name: str, **names) -> type:
    """Class ``name`` of the installed transformers module ``module_name``, undecorated, compiled with the module's
    names, ``tvF`` and the interpolation mapping as above, and ``names`` over them."""
    module = importlib.import_module(module_name)
    tree = ast.parse(open(module.__file__).read())
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)
    node.decorator_list = []
    space = dict(vars(module), tvF=_TorchvisionFunctional, pil_torch_interpolation_mapping={
        PILImageResampling.BILINEAR: _Mode.BILINEAR, PILImageResampling.BICUBIC: _Mode.BICUBIC}, **names)
    exec(compile(ast.Module([node], []), module.__file__, "exec"), space)  # noqa: S102 - transformers' own code
    return space[name]


_BACKEND = _compiled("transformers.image_processing_backends", "TorchvisionBackend")
_BASE = _compiled("transformers.video_processing_utils", "BaseVideoProcessor", TorchvisionBackend=_BACKEND)
STOCK = _compiled("transformers.models.llava_onevision.video_processing_llava_onevision",
                  "LlavaOnevisionVideoProcessor", BaseVideoProcessor=_BASE)


def _videos(seed: int) -> list:
    """Three 3-second videos of three shapes and rates (noise, smooth pans), and a grey one (one channel)."""
    rng = np.random.default_rng(seed)
    noise = rng.integers(0, 256, (9, 70, 110, 3), dtype=np.uint8)
    grey = rng.integers(0, 256, (6, 40, 52, 1), dtype=np.uint8)
    return [(noise, VideoMetadata(total_num_frames=9, fps=3.0, duration=3.0)),
            (pan(12, 48, 40), VideoMetadata(total_num_frames=12, fps=4.0, duration=3.0)),
            (pan(30, 200, 120, 3), VideoMetadata(total_num_frames=30, fps=10.0, duration=3.0)),
            (grey, VideoMetadata(total_num_frames=6, fps=2.0, duration=3.0))]


SETTINGS = [
    ({}, {"do_sample_frames": True, "num_frames": 3}),  # 384 px: up-scaling
    ({"size": {"height": 56, "width": 56}}, {"do_sample_frames": True, "fps": 1}),
    ({"size": {"height": 30, "width": 42}, "num_frames": 4}, {"do_sample_frames": True}),  # down-scaling
    ({"size": {"height": 28, "width": 28}, "do_normalize": False}, {"do_sample_frames": True, "num_frames": 5}),
    ({"size": {"height": 36, "width": 28}, "resample": PILImageResampling.BILINEAR, "fps": 2},
     {"do_sample_frames": True}),
    ({"size": {"height": 28, "width": 28}, "do_rescale": False, "do_normalize": False},
     {"do_sample_frames": True, "num_frames": 2}),
]


@pytest.mark.parametrize("settings, call", SETTINGS, ids=range(len(SETTINGS)))
def test_outputs_equal_the_stock_code(settings, call):
    stock, ours = STOCK(**settings), OnevisionVideoProcessor(**settings)
    videos = _videos(len(settings))

    def run(processor):
        return processor(videos=[v for v, _ in videos], video_metadata=[VideoMetadata(**vars(m)) for _, m in videos],
                         return_metadata=True, return_tensors="pt", **call)
    want, got = run(stock), run(ours)
    assert got["pixel_values_videos"].dtype == want["pixel_values_videos"].dtype
    assert torch.equal(got["pixel_values_videos"], want["pixel_values_videos"])
    assert [list(m.frames_indices) for m in got["video_metadata"]] == [
        list(m.frames_indices) for m in want["video_metadata"]]
    assert ours.to_dict() == {**stock.to_dict(), "video_processor_type": "LlavaOnevisionVideoProcessor"}


def test_unsampled_videos_equal_the_stock_code():
    videos = [np.ascontiguousarray(v[:6]) for v, _ in _videos(7)]
    for settings in ({"size": {"height": 42, "width": 28}}, {"size": {"height": 56, "width": 70}}):
        want = STOCK(**settings)(videos=videos, return_tensors="pt")["pixel_values_videos"]
        assert torch.equal(OnevisionVideoProcessor(**settings)(videos=videos, return_tensors="pt")[
            "pixel_values_videos"], want)


def test_sampling_equals_the_stock_method():
    compared = 0
    for own in ({}, {"num_frames": 4}, {"fps": 1.5}):
        stock, ours = STOCK(**own), OnevisionVideoProcessor(**own)
        for total in (1, 2, 3, 5, 8, 31, 100, 1001):
            for video_fps in (None, 1.0, 2.5, 29.97, 60.0):
                for kw in ({}, {"fps": 0.5}, {"fps": 8.0}, {"num_frames": 3}, {"num_frames": 16}):
                    meta = VideoMetadata(total_num_frames=total, fps=video_fps)
                    try:
                        want = stock.sample_frames(meta, **kw)
                    except ValueError as err:
                        with pytest.raises(ValueError, match=str(err)[:30]):
                            ours.sample_frames(VideoMetadata(total_num_frames=total, fps=video_fps), **kw)
                        continue
                    got = ours.sample_frames(VideoMetadata(total_num_frames=total, fps=video_fps), **kw)
                    assert np.array_equal(got, want), (own, total, video_fps, kw)
                    compared += 1
    assert compared > 200


def test_frame_counts_that_cannot_stack_are_named():
    videos = [pan(4, 28, 28), pan(5, 28, 28)]
    with pytest.raises(ValueError, match="one frame count"):
        OnevisionVideoProcessor(size={"height": 28, "width": 28})(videos=videos, return_tensors="pt")


@pytest.fixture(scope="module")
def onevision(tmp_path_factory):
    """The tiny LLaVA-OneVision model, its collator and the shared clips, each sampled to 4 frames."""
    from common import collator, write_clips
    tokenizer = qwen2_tokenizer(4096)
    config = tiny_llava_onevision_config(tokenizer, num_layers=2)
    clips = write_clips(str(tmp_path_factory.mktemp("clips")))
    clips = [{**{k: v for k, v in clip.items() if k != "fps"}, "num_frames": 4} for clip in clips]
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config)
    return config, collator(config, tokenizer), clips, model


def test_rows_expand_as_counted_at_load_and_as_the_model_takes_them(onevision):
    """A row's videos as the collator gets them from the stock processor (``frames * pooled + 1`` video tokens
    after the row's images) are what the loader counts from the files' headers and what the stock processor's
    ``_get_num_multimodal_tokens`` says; the unsplit model takes the micro-batch (its own placeholder check), and
    so does the split's load-time check, which names a wrong image or video count."""
    from common import video_row
    config, collate, clips, model = onevision
    rows = [video_row([("image", 1), ("video", 0)], 1, 1, clips), video_row([("video", 1), ("video", 2)], 2, 0, clips),
            video_row([("image", 2), ("image", 3)], 3, 0, clips)]
    batch = collate(rows)
    assert tuple(batch["pixel_values_videos"].shape) == (3, 4, 3, 28, 28)
    refs = [[video_ref(p["video"], "/", "t", {"num_frames": 4}) for p in r["messages"][0]["content"]
             if p["type"] == "video"] for r in rows]
    counted = [sum(collate.encoder.video_tokens_for(r)) for r in refs]
    stock = collate.processor._get_num_multimodal_tokens(video_sizes=[(4, 28, 28)]).num_video_tokens[0]
    assert counted == [stock, 2 * stock, 0] and stock == 4 * 1 + 1
    assert [int(n) for n in (batch["input_ids"] == config.video_token_id).sum(1)] == counted
    assert torch.isfinite(model(**batch).loss)
    validate = split(model, ScheduleConfig(1, 2, 1, "identity"), 0).validate_micro
    validate(batch)
    for token_id, kind in ((config.video_token_id, "video"), (config.image_token_id, "image")):
        broken = batch["input_ids"].clone()
        broken[tuple((broken == token_id).nonzero()[0])] = 0
        with pytest.raises(ValueError, match=f"{kind}-token count"):
            validate({**batch, "input_ids": broken})


@pytest.mark.parametrize("aspect, sizes", [  # anyres_max_1 shrinks the grids of more than one tile's patches
    ("anyres_max_9", [(28, 28)]), ("anyres_max_9", [(100, 30)]), ("anyres_max_9", [(30, 90), (56, 28)]),
    ("anyres_max_1", [(200, 190)]), ("anyres_max_1", [(40, 300)]), ("anyres_max_1", [(100, 30), (28, 28)])])
def test_image_count_equals_the_model(aspect, sizes):
    """The load-time image count (``get_image_features``' anyres packing) on images of several sizes and aspects,
    alone and two to a row: the stock model's features are as many as the image tokens, and the split's check
    takes the batch."""
    import PIL.Image
    from common import collator
    tokenizer = qwen2_tokenizer(4096)
    config = tiny_llava_onevision_config(tokenizer, num_layers=2)
    config.vision_aspect_ratio = aspect
    collate, model = collator(config, tokenizer), AutoModelForImageTextToText.from_config(config)
    content = [{"type": "image"} for _ in sizes] + [{"type": "text", "text": "What is it?"}]
    row = {"messages": [{"role": "user", "content": content},
                        {"role": "assistant", "content": [{"type": "text", "text": "A test card."}]}],
           "images": [PIL.Image.fromarray(pan(1, h, w)[0]) for h, w in sizes]}
    batch = collate([row, {**row, "images": row["images"][:1], "messages": [
        {"role": "user", "content": content[len(sizes) - 1:]}, row["messages"][1]]}])
    feats = model.model.get_image_features(batch["pixel_values"], batch["image_sizes"],
                                           batch_num_images=batch["batch_num_images"]).pooler_output
    assert sum(f.shape[0] for f in feats) == int((batch["input_ids"] == config.image_token_id).sum())
    split(model, ScheduleConfig(1, 2, 1, "identity"), 0).validate_micro(batch)


def test_the_family_processor_carries_the_video_processor():
    tokenizer = qwen2_tokenizer(4096)
    processor = build_processor(tiny_llava_onevision_config(tokenizer, num_layers=2), tokenizer)
    video = processor.video_processor
    assert isinstance(video, OnevisionVideoProcessor) and video.num_frames == NUM_FRAMES
    assert video.to_dict()["video_processor_type"] == "LlavaOnevisionVideoProcessor"
    assert "frame_tokens" not in video.to_dict() and dict(video.size) == {"height": 28, "width": 28}


def test_pixel_caps_on_fixed_size_frames_are_refused_by_name(onevision):
    """``video_max_pixels`` and ``max_visual_tokens`` cannot shrink frames the processor resizes to one size: the
    row is refused naming the field (not an ``AttributeError``); ``max_frames`` samples them down."""
    from mpipe_hf.data.budgets import RowCaps, cap_row
    _, collate, clips, _ = onevision
    refs = [video_ref(clips[0]["video"], "/", "t", {"num_frames": 4})]
    for field in ("video_max_pixels", "max_visual_tokens"):
        with pytest.raises(ValueError, match=f"row 7: data.{field} cannot cap these videos"):
            cap_row(RowCaps(**{field: 1000}), collate.encoder, [], refs, "row 7")
    assert cap_row(RowCaps(max_frames=2), collate.encoder, [], refs, "row 7").over == ["max_frames"]
