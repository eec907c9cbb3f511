"""GLM-4.xV's video processor without torchvision: :class:`Glm4vVideoProcessorNoTV` against the stock
``Glm4vVideoProcessor``'s own code, and its timestamps against the stock processor's prompt; GLM video rows as
collated here against the stock processors' call, and the load-time refusal of micro-batches holding both images
and videos.

As in ``tests/test_video_qwen3.py``, the stock class's source (``sample_frames``, ``resize``, ``patchify``,
``_preprocess``, ``get_num_of_video_patches``, its defaults) is compiled over a base whose two torchvision steps
are :mod:`mpipe_hf.data.video_processor`'s (checked against torchvision's recorded outputs in
``tests/test_video.py``); what differs from Qwen's class (sampling by time, the whole-video budget, the defaults)
is the stock code on one side and ours on the other, compared with ``torch.equal``. GLM-4.6V's class (its own
sampling and prompt) is compiled the same way from its module's source (the module imports torchvision). Both
stock classes themselves, with torchvision, are compared on recorded outputs in ``tests/test_stock_recorded.py``.
"""

import importlib
import os
import sys
import types

import numpy as np
import pytest
import torch
from transformers.video_utils import VideoMetadata

from mpipe_hf.families.glm.video_processor import (Glm4vVideoProcessorNoTV, Glm46vVideoProcessorNoTV,
                                                 glm_video_processor_from_image)
from stock_video_code import compare_with_stock, pan, stock_class

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "dist"))  # common.py: the numerics tests' clips and rows

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


# -- the row path: GLM video rows as the stock processors write them, and the micro-batch rule --

GLM_HUB_TOKENS = {"image_token_id": "<|image|>", "video_token_id": "<|video|>",
                  "image_start_token_id": "<|begin_of_image|>", "image_end_token_id": "<|end_of_image|>",
                  "video_start_token_id": "<|begin_of_video|>", "video_end_token_id": "<|end_of_video|>"}
STOCK_PROCESSORS = {"glm4v": stock_processor.Glm4vProcessor, "glm46v": glm46v_processor.Glm46VProcessor}


def _tiny_config(model_type, tokenizer):
    from mpipe_hf.families.glm import tiny as glm_tiny
    return (glm_tiny.tiny_glm4v_config if model_type == "glm4v" else glm_tiny.tiny_glm46v_config)(tokenizer)


@pytest.fixture(scope="module")
def tokenizer():
    from mpipe_hf.data import qwen2_tokenizer
    return qwen2_tokenizer(5120)


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """The numerics tests' clips (``tests/dist/common.py``): 8 frames at 2 fps sampled at 1 fps, 4 frames at 4
    fps, a folder of 4 PNG frames at 4 fps."""
    from common import write_clips
    return write_clips(str(tmp_path_factory.mktemp("clips")))


def _stock(model_type, ours):
    """The stock processor class over our processor's tokenizer, image processor and video processor (the stock
    video processor needs torchvision; ours gives its outputs, tests above)."""
    base = STOCK_PROCESSORS[model_type]

    class Stock(base):
        def check_argument_for_proper_class(self, name, argument):
            # transformers names VideoProcessorMixin as the video processor's class only with torchvision
            return type(argument) if name == "video_processor" else base.check_argument_for_proper_class(
                self, name, argument)
    return Stock(image_processor=ours.image_processor, tokenizer=ours.tokenizer, video_processor=ours.video_processor)


def _whole_video(ref):
    """Every frame of a video reference and its metadata, as a user hands a video to the stock processor."""
    from mpipe_hf.data.video import decode_video, read_frames
    return read_frames(ref["frames"], ref.get("frames_fps")) if "frames" in ref else decode_video(ref["path"])


@pytest.mark.parametrize("vocabulary", ["glm", "qwen2"])
@pytest.mark.parametrize("model_type", sorted(STOCK_PROCESSORS))
def test_video_rows_equal_the_stock_processor(model_type, vocabulary, tokenizer, clips):
    """A GLM video row collated here (sampled, counted and expanded by our code) against the stock ``Glm4vProcessor``
    / ``Glm46VProcessor`` called on the whole video (its own sampling, ``replace_video_token`` and
    ``create_mm_token_type_ids``): ``input_ids``, ``mm_token_type_ids``, ``video_grid_thw`` and the pixels equal.
    With GLM's markers in the vocabulary (``glm``: the tiny config's ids pointing at them) every tensor is the
    stock one; over the Qwen2 vocabulary (the tiny models') the stock class finds no ``<|begin_of_video|>`` and
    types every video token an image's (1), where ours, given the stand-in's id, types them 2 (what
    ``get_rope_index`` needs). The loader's count from the file headers gives the same ids."""
    import copy
    from mpipe_hf.data import ConversationCollator, build_processor
    from mpipe_hf.data.conversation_rows import canonical_row
    tok = tokenizer
    if vocabulary == "glm":
        tok = copy.deepcopy(tokenizer)
        tok.add_tokens(list(GLM_HUB_TOKENS.values()), special_tokens=True)
    config = _tiny_config(model_type, tok)
    if vocabulary == "glm":
        for attr, token in GLM_HUB_TOKENS.items():
            setattr(config, attr, tok.convert_tokens_to_ids(token))
    ours = build_processor(config, tok)
    collate, stock = ConversationCollator(ours, None), _stock(model_type, ours)
    for parts in ([clips[0]], [clips[1], clips[2]]):  # a clip sampled at 1 fps; a clip and a frame folder
        messages = [{"role": "user", "content": [*map(dict, parts), {"type": "text", "text": "What happens?"}]},
                    {"role": "assistant", "content": [{"type": "text", "text": "The camera moves."}]}]
        row = canonical_row({"messages": messages}, os.getcwd(), "row")
        got = collate([row])
        text = collate.encoder.render(row["messages"])
        whole = [_whole_video(ref) for ref in row["videos"]]
        want = stock(text=[text], videos=[v for v, _ in whole], video_metadata=[m for _, m in whole],
                     return_tensors="pt", **{k: parts[0][k] for k in ("fps",) if k in parts[0]})
        types = want["mm_token_type_ids"]
        assert (types == 1).any() == (vocabulary == "qwen2") and (types == 2).any() == (vocabulary == "glm")
        types = types.masked_fill(types == 1, 2)  # video rows: no image token is an image's
        assert torch.equal(got["mm_token_type_ids"], types)
        for key in ("input_ids", "attention_mask", "video_grid_thw", "pixel_values_videos"):
            assert torch.equal(got[key], want[key]), key
        enc = collate.encoder.encode(row["messages"], [], "row", collate.encoder.video_tokens_for(row["videos"]))
        assert enc.ids == want["input_ids"][0].tolist()


def test_a_micro_batch_of_images_and_videos_is_refused_at_load(tokenizer, clips):
    """GLM's model finds video tokens with the image tokens' mask, so the unsplit model cannot take a micro-batch
    holding both (one row or two): the load-time check refuses it naming the family and the reason; videos alone
    and images alone pass, and a video token missing is refused as a count."""
    from common import video_row
    from mpipe_hf.data import ConversationCollator, build_processor
    from mpipe_hf.models import get_family
    from mpipe_hf.models.generic import micro_check
    from mpipe_hf.models.materialize import meta_model, model_class
    config = _tiny_config("glm4v", tokenizer)
    check = micro_check(get_family("glm4v"), meta_model(config))
    collate = ConversationCollator(build_processor(config, tokenizer), None)
    videos = collate([video_row([("video", 1)], 0, 0, clips)])
    images = collate([video_row([("image", 2)], 1, 0, clips)])
    check(videos)
    check(images)
    for rows in ([[("image", 2), ("video", 1)]], [[("video", 1)], [("image", 2)]]):
        mixed = collate([video_row(parts, 0, 0, clips) for parts in rows])
        with pytest.raises(ValueError, match="glm4v: a micro-batch holds both images and videos; .* put images "
                                             "and videos in different micro-batches"):
            check(mixed)
    torch.manual_seed(0)
    with pytest.raises(Exception, match="Image features and image tokens do not match"):
        model_class(config).from_config(config)(**mixed)  # the reason: the stock model refuses it too
    ids = videos["input_ids"].clone()
    ids[tuple((videos["mm_token_type_ids"] == 2).nonzero()[0])] = 0
    with pytest.raises(ValueError, match="video-token count"):
        check({**videos, "input_ids": ids})


def test_a_snapshot_keeps_the_video_settings(tokenizer, tmp_path):
    """A GLM-4.1V checkpoint's processor files hold its video processor (``video_preprocessor_config.json``, the
    stock class's name, as GLM's hub snapshots ship one), and loading them back gives the same video processor."""
    import json
    from mpipe_hf.data import build_processor
    from mpipe_hf.data.hub import load_checkpoint_processor, save_processor_files
    from mpipe_hf.data.templates import chat_template_for
    config = _tiny_config("glm4v", tokenizer)
    processor = build_processor(config, tokenizer)
    processor.video_processor.fps = 1
    processor.video_processor.size = {"shortest_edge": 28 * 28, "longest_edge": 4 * 56 * 56}
    config.save_pretrained(tmp_path)
    save_processor_files(str(tmp_path), config, processor, chat_template_for(processor, "glm4v"))
    with open(tmp_path / "video_preprocessor_config.json") as f:
        assert json.load(f)["video_processor_type"] == "Glm4vVideoProcessor"
    loaded = load_checkpoint_processor(str(tmp_path))
    assert type(loaded.video_processor) is Glm4vVideoProcessorNoTV and loaded.video_processor.fps == 1
    assert dict(loaded.video_processor.size) == {"shortest_edge": 28 * 28, "longest_edge": 4 * 56 * 56}
    assert (loaded.video_start_id, loaded.video_end_id) == (processor.video_start_id, processor.video_end_id)
