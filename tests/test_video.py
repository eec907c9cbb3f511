"""The data side of video rows for Qwen2-VL / Qwen2.5-VL (docs/video.md): decoding, the stock frame
sampling, the torchvision-free video processor against the stock one's recorded outputs, the placeholder
expansion, every row layout that carries videos, and rows mixing images and videos collated."""

import ast
import json
import math
import os
import runpy
import sys
import textwrap
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image
from transformers.video_utils import VideoMetadata, read_video_pyav

from mpipe_hf.data import ConversationCollator, ConversationEncoder, build_processor, qwen2_tokenizer
from mpipe_hf.data.conversation_rows import canonical_row
from mpipe_hf.data.hub import load_checkpoint_processor, save_processor_files
from mpipe_hf.data.layouts import conversation
from mpipe_hf.data.templates import default_chat_template
from mpipe_hf.data.video import decode_video, list_frames, load_video, read_frames, video_tokens
from mpipe_hf.data.video_processor import QwenVideoProcessor, stock_sample_indices
from mpipe_hf.families.qwen import tiny as qwen_tiny

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECK = runpy.run_path(os.path.join(ROOT, "scripts", "check", "video_stock_check.py"))


@pytest.fixture(scope="module")
def tokenizer():
    return qwen2_tokenizer(5120)


@pytest.fixture(scope="module")
def processor(tokenizer):
    return build_processor(qwen_tiny.tiny_qwen2_5_vl_config(tokenizer), tokenizer)


@pytest.fixture(scope="module")
def data(demo):
    return os.path.join(demo, "data")


def every(name):
    return lambda metadata: list(range(metadata.total_num_frames))[::2] if name == "even" else [1, 4, 5]


@pytest.mark.parametrize("pick", ["even", "some"])
def test_decoding_matches_transformers_pyav_reader(data, pick):
    path = os.path.join(data, "videos", "astronaut_pan.mp4")
    frames, meta = decode_video(path, every(pick))
    want, want_meta = read_video_pyav(path, every(pick))
    assert frames.dtype == np.uint8 and frames.shape == want.shape and frames.shape[1:] == (72, 96, 3)
    assert np.array_equal(frames, want)
    for key in ("total_num_frames", "fps", "duration", "height", "width", "frames_indices"):
        assert meta[key] == want_meta[key], key
    assert (meta.total_num_frames, meta.fps) == (12, 4.0)


def test_frame_folders_read_in_natural_order(tmp_path):
    for i in (1, 2, 10, 3):  # f10 after f3: natural order, not the characters'
        Image.new("RGB", (28, 20), (i * 20, 0, 0)).save(tmp_path / f"f{i}.png")
    (tmp_path / "notes.txt").write_text("not a frame")
    paths = list_frames(str(tmp_path))
    assert [os.path.basename(p) for p in paths] == ["f1.png", "f2.png", "f3.png", "f10.png"]
    frames, meta = read_frames(paths, 4.0)
    assert frames.shape == (4, 20, 28, 3) and list(frames[:, 0, 0, 0]) == [20, 40, 60, 200]
    assert (meta.total_num_frames, meta.fps, meta.duration) == (4, 4.0, 1.0)
    Image.new("RGB", (30, 20)).save(tmp_path / "f11.png")
    with pytest.raises(ValueError, match="must have one size"):
        read_frames(list_frames(str(tmp_path)))


def _stock_sample_frames():
    """``Qwen2VLVideoProcessor.sample_frames`` as the installed transformers writes it (its module needs
    torchvision, so the method's source is compiled on its own)."""
    import transformers.models.qwen2_vl as package
    path = os.path.join(os.path.dirname(package.__file__), "video_processing_qwen2_vl.py")
    tree = ast.parse(open(path).read())
    method = next(node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
                  and node.name == "sample_frames")
    source = textwrap.dedent(ast.get_source_segment(open(path).read(), method))
    space = {"math": math, "torch": torch, "VideoMetadata": VideoMetadata}
    exec(compile(source, "<stock sample_frames>", "exec"), space)  # noqa: S102 - transformers' own code
    return space["sample_frames"]


class _Defaults:  # the stock class's sampling defaults
    num_frames, fps, temporal_patch_size, min_frames, max_frames = None, None, 2, 4, 768


def test_sampling_equals_the_stock_method():
    stock, ours = _stock_sample_frames(), QwenVideoProcessor()
    compared = 0
    for total in (2, 3, 5, 8, 12, 31, 100, 1001):
        for video_fps in (1.0, 2.5, 4.0, 29.97, 60.0):
            meta = VideoMetadata(total_num_frames=total, fps=video_fps)
            for kw in ({"fps": 2.0}, {"fps": 0.5}, {"fps": 8.0, "max_frames": 16}, {"fps": 1.0, "min_frames": 8},
                       {"num_frames": 4}, {"num_frames": 7}, {}):
                try:
                    want = stock(_Defaults(), meta, **kw)
                except TypeError:  # neither fps nor num_frames: the stock method compares None with an int
                    assert not kw and ours.sample_frames(meta, **kw).tolist() == list(range(total))
                    continue
                except ValueError as err:
                    assert "exceeds" in str(err)
                    with pytest.raises(ValueError, match="cannot sample"):
                        ours.sample_frames(meta, **kw)
                    continue
                got = ours.sample_frames(meta, **kw)
                assert got.dtype == want.dtype and torch.equal(got, want), (total, video_fps, kw)
                compared += 1
    assert compared > 200
    assert stock_sample_indices(12, 4.0, 2, 4, 768, fps=2.0).tolist() == [0, 2, 4, 6, 8, 10]


def test_outputs_equal_the_recorded_stock_outputs():
    """The cases of scripts/check/video_stock_check.py against the stock classes' outputs recorded with torchvision
    (scripts/check/record_stock_processors.py -> tests/stock_processor_outputs.npz), replayed here without it, bit for bit
    on any CPU (why no tolerance: tests/test_stock_recorded.py's docstring)."""
    record = runpy.run_path(os.path.join(ROOT, "scripts", "check", "record_stock_processors.py"))
    meta, arrays = record["load"](os.path.join(ROOT, "tests", "stock_processor_outputs.npz"))
    names = sorted(n for n in meta["cases"] if n.startswith("qwen2_case/"))
    assert [n.split("/", 1)[1] for n in names] == sorted(case["name"] for case in CHECK["cases"]())
    ours = record["Ours"](meta, arrays)
    for name in names:
        got, unit = ours.run(name)
        outputs = meta["cases"][name]["outputs"]
        assert sorted(got) == sorted(outputs), name
        for key, info in outputs.items():
            verdict = record["compare_tensor"](info, arrays[info["key"]], got[key], unit)
            assert verdict["exact"], (name, key, verdict)


def test_the_resize_rounding_path_matters():
    """What makes the recorded comparison able to fail: resizing through float32 and rounding (torchvision's path
    without a native uint8 kernel) changes pixels that the native uint8 kernel gives."""
    from mpipe_hf.data.image_torch_ops import resize_frames
    frames = torch.from_numpy(CHECK["_pan"](3, 70, 90)).permute(0, 3, 1, 2).contiguous()
    native = resize_frames(frames, 56, 84)
    through_float = torch.nn.functional.interpolate(frames.float(), size=[56, 84], mode="bicubic",
                                                    align_corners=False, antialias=True)
    through_float = through_float.clamp(0, 255).round().to(torch.uint8)
    assert native.dtype == torch.uint8 and native.shape == (3, 3, 56, 84)
    assert not torch.equal(native, through_float)


def test_placeholders_expand_to_the_grid(processor, tokenizer):
    rng = np.random.default_rng(0)
    videos = [rng.integers(0, 256, (8, 70, 90, 3), dtype=np.uint8), rng.integers(0, 256, (5, 40, 120, 3),
                                                                                 dtype=np.uint8)]
    text = ["<|vision_start|><|video_pad|><|vision_end|>a<|vision_start|><|video_pad|><|vision_end|>"]
    out = processor(text=text, videos=videos, video_metadata=[{"total_num_frames": 8, "fps": 4.0},
                                                              {"total_num_frames": 5, "fps": 2.0}],
                    do_sample_frames=False, return_tensors="pt")
    grid, merge = out["video_grid_thw"], processor.video_processor.merge_size
    assert grid.tolist() == [[4, 4, 6], [3, 2, 8]]
    assert int((out["input_ids"] == processor.video_token_id).sum()) == int(grid.prod(-1).sum()) // merge ** 2
    assert out["pixel_values_videos"].shape == (int(grid.prod(-1).sum()), 3 * 2 * 14 * 14)
    assert out["second_per_grid_ts"].tolist() == [0.5, 1.0]  # temporal patch 2 / the video's fps
    counted = processor._get_num_multimodal_tokens(video_sizes=[(8, 70, 90), (5, 40, 120)]).num_video_tokens
    assert counted == [24, 12] == [processor.video_processor.tokens_for(*s) for s in [(8, 70, 90), (5, 40, 120)]]
    assert set(out["mm_token_type_ids"][0][out["input_ids"][0] == processor.video_token_id].tolist()) == {2}


def test_every_layout_reads_its_videos(data):
    clip = os.path.join(data, "videos", "coffee_zoom.mp4")
    folder = os.path.join(data, "videos", "chelsea_pan")
    answer = {"role": "assistant", "content": "In one word: food."}
    ask = {"type": "text", "text": "What is it?"}
    layouts = {
        "parts": {"messages": [{"role": "user", "content": [{"type": "video", "video": "file://" + clip, "fps": 4,
                                                             "max_pixels": 3136}, ask]}, answer]},
        "trl": {"messages": [{"role": "user", "content": [{"type": "video", "nframes": 4}, ask]}, answer],
                "videos": [clip]},
        "llava_video": {"video": "videos/coffee_zoom.mp4", "conversations": [
            {"from": "human", "value": "<video>\nWhat is it?"}, {"from": "gpt", "value": "In one word: food."}]},
        "sharegpt_dict": {"conversations": [{"from": "human", "value": "<video>What is it?"},
                                            {"from": "gpt", "value": "x"}],
                          "videos": [{"path": "videos/coffee_zoom.mp4", "max_frames": 6}]},
        "frame_folder": {"messages": [{"role": "user", "content": [{"type": "video", "video": folder,
                                                                    "sample_fps": 5}, ask]}, answer]},
        "frame_list": {"messages": [{"role": "user", "content": [{"type": "video", "video": list_frames(folder)[:4]},
                                                                 ask]}, answer]},
    }
    got = {name: canonical_row(row, data, name) for name, row in layouts.items()}
    assert got["parts"]["videos"] == [{"path": clip, "fps": 4.0, "max_pixels": 3136}]
    assert got["trl"]["videos"] == [{"path": clip, "num_frames": 4}]
    assert got["llava_video"]["videos"] == [{"path": clip}]
    assert got["llava_video"]["messages"][0]["content"] == [{"type": "video"},
                                                            {"type": "text", "text": "\nWhat is it?"}]
    assert got["sharegpt_dict"]["videos"] == [{"path": clip, "max_frames": 6}]
    assert got["frame_folder"]["videos"] == [{"frames": list_frames(folder), "frames_fps": 5.0}]
    assert got["frame_list"]["videos"] == [{"frames": list_frames(folder)[:4]}]
    for row in got.values():
        assert row["images"] == [] and [p["type"] for p in row["messages"][0]["content"]][0] == "video"


def test_bad_video_rows_name_the_cause(data):
    ask = [{"type": "video", "video": "videos/nothing.mp4"}, {"type": "text", "text": "?"}]
    row = {"messages": [{"role": "user", "content": ask}, {"role": "assistant", "content": "x"}]}
    with pytest.raises(ValueError, match="r1: video file 'videos/nothing.mp4' not found"):
        canonical_row(row, data, "r1")
    both = dict(row, videos=["videos/astronaut_pan.mp4"])
    with pytest.raises(ValueError, match="both inside the message parts and in 'videos'"):
        canonical_row(both, data, "r2")
    ask[0] = {"type": "video", "video": "videos/astronaut_pan.mp4", "fps": -1}
    with pytest.raises(ValueError, match="'fps' must be a number > 0"):
        canonical_row(row, data, "r3")
    ask[0] = {"type": "video"}
    with pytest.raises(ValueError, match="1 video placeholder\\(s\\) but 0 video\\(s\\)"):
        canonical_row(row, data, "r4")
    with pytest.raises(ValueError, match="r5: the row holds a video, which this loader does not read yet"):
        conversation({"video": "a.mp4", "conversations": [{"from": "human", "value": "<video>"}]}, "sharegpt", "r5")
    text_only = {"messages": [{"role": "user", "content": "a <video> tag"}, {"role": "assistant", "content": "x"}]}
    assert canonical_row(text_only, data, "r6")["messages"][0]["content"] == [{"type": "text", "text": "a <video> tag"}]


def test_rows_mixing_images_and_videos_collate_as_the_processor_call(demo, data):
    processor = load_checkpoint_processor(os.path.join(demo, "model"))
    rows = [canonical_row(json.loads(line), data, f"video.jsonl:{i + 1}")
            for i, line in enumerate(open(os.path.join(data, "video.jsonl")))]
    assert [len(r["videos"]) for r in rows] == [1, 1, 1, 1, 1, 2] and sum(len(r["images"]) for r in rows) == 2
    collate, encoder = ConversationCollator(processor, None), ConversationEncoder(processor)
    batch = collate(rows[:4])
    video = processor.video_processor
    loaded = [load_video(ref, video) for r in rows[:4] for ref in r["videos"]]
    direct = processor(text=[encoder.render(r["messages"]) for r in rows[:4]],
                       images=[[Image.open(p).convert("RGB") for p in r["images"]] for r in rows[:4]],
                       videos=[f for f, _ in loaded], video_metadata=[m for _, m in loaded], do_sample_frames=False,
                       padding=True, padding_side="right", return_tensors="pt")
    for key, value in direct.items():
        assert torch.equal(batch[key], value), key
    assert {"pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw",
            "second_per_grid_ts"} <= set(batch)
    assert [len(f) for f, _ in loaded] == [6, 8, 8, 4]  # 2 fps; fps 4 capped at 8; all 8 at 2 fps; min_frames 4
    is_video = batch["input_ids"] == processor.video_token_id
    assert int(is_video.sum()) == int(batch["video_grid_thw"].prod(-1).sum()) // video.merge_size ** 2
    assert (batch["labels"][is_video] == -100).all()
    for i, row in enumerate(rows[:4]):  # the loader's count, without decoding a frame: the collated row
        sizes = [Image.open(p).size[::-1] for p in row["images"]]
        enc = encoder.encode(row["messages"], encoder.image_tokens_for_sizes(sizes), "row",
                             encoder.video_tokens_for(row["videos"]))
        n = int(batch["attention_mask"][i].sum())
        assert enc.ids == batch["input_ids"][i, :n].tolist() and enc.labels == batch["labels"][i, :n].tolist()
        assert len(enc.video_spans) == len(row["videos"])
    assert video_tokens(rows[5]["videos"][1], video) == 2 * 6 * 8 // 4  # num_frames 4 of coffee_zoom (84 x 112)


def test_a_video_for_a_processor_without_videos_is_refused(data, tokenizer):
    from mpipe_hf.families.internvl.tiny import tiny_internvl_config
    internvl = build_processor(tiny_internvl_config(tokenizer), tokenizer)  # InternVL: no video processor
    row = canonical_row(json.loads(open(os.path.join(data, "video.jsonl")).readline()), data, "video.jsonl:1")
    row["where"] = "video.jsonl:1"
    with pytest.raises(ValueError, match="video.jsonl:1: the row has a video but .* takes no videos"):
        ConversationCollator(internvl, None)([row])


def test_the_recipes_decoder_reaches_the_collator(demo, data, monkeypatch):
    from mpipe_hf.train.recipe_data import DataSection
    from mpipe_hf.train.sources import row_collator
    processor = load_checkpoint_processor(os.path.join(demo, "model"))
    row = canonical_row(json.loads(open(os.path.join(data, "video.jsonl")).readline()), data, "video.jsonl:1")
    section = DataSection(path="video.jsonl", video_decoder="torchcodec")
    collate = row_collator("conversation", processor, section, SimpleNamespace(model_type=None))
    assert collate.video_decoder == "torchcodec"
    monkeypatch.setitem(sys.modules, "torchcodec", None)  # torchcodec cannot load: the error names the field
    monkeypatch.setitem(sys.modules, "torchcodec.decoders", None)
    with pytest.raises(ImportError, match=r"data\.video_decoder is 'torchcodec'"):
        collate([row])
    default = row_collator("conversation", processor, DataSection(path="video.jsonl"), SimpleNamespace(model_type=None))
    assert default.video_decoder == "pyav"


def test_snapshots_keep_the_video_settings_only_where_they_differ(tokenizer, tmp_path):
    config = qwen_tiny.tiny_qwen2_vl_config(tokenizer)
    processor = build_processor(config, tokenizer)
    assert type(processor.video_processor) is QwenVideoProcessor
    assert processor.video_processor.size == processor.image_processor.size
    template = default_chat_template("qwen2_vl")
    config.save_pretrained(tmp_path / "same")
    assert "video_preprocessor_config.json" not in save_processor_files(str(tmp_path / "same"), config, processor,
                                                                         template)
    processor.video_processor.size = {"shortest_edge": 28 * 28, "longest_edge": 56 * 56}
    config.save_pretrained(tmp_path / "own")
    assert "video_preprocessor_config.json" in save_processor_files(str(tmp_path / "own"), config, processor, template)
    with open(tmp_path / "own" / "video_preprocessor_config.json") as f:
        assert json.load(f)["video_processor_type"] == "Qwen2VLVideoProcessor"
    loaded = load_checkpoint_processor(str(tmp_path / "own"))
    assert (loaded.video_processor.size.shortest_edge, loaded.video_processor.size.longest_edge) == (784, 3136)
    assert load_checkpoint_processor(str(tmp_path / "same")).video_processor.size == processor.image_processor.size
