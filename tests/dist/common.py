"""Shared by the distributed test workers and the tests that launch them: real-data fixtures and torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import torch
from PIL import Image
from skimage import data as skdata

from mpipe_hf.data import ConversationCollator, build_processor, qwen2_tokenizer
from mpipe_hf.families.llava.tiny import tiny_llava_config
from mpipe_hf.families.glm import tiny as glm_tiny
from mpipe_hf.families.qwen import tiny as qwen_tiny
from mpipe_hf.families.text import tiny as text_tiny

PHOTOS = ["astronaut", "coffee", "chelsea", "rocket", "camera", "coins", "horse", "clock"]
CAPTIONS = ["An astronaut in an orange suit.", "A cup of coffee on a saucer.", "A tabby cat looks at the camera.",
            "A rocket on its launch pad.", "A man with a camera on a tripod.", "Old coins on a dark cloth.",
            "A white horse shape.", "A small clock on a table."]
SENTENCES = ["The pipeline splits the model into stages.", "Each rank loads only its own micro-batches.",
             "A bubble is time a rank spends waiting.", "Warm-up fills the pipeline; cooldown drains it.",
             "The visual tower turns patches into features.", "Gradients flow back through every stage.",
             "Interleaving gives each rank several chunks.", "One forward, one backward, in steady state."]
PACKED_CONFIGS = ("vl", "qwen3_vl", "qwen3_5", "llava", "gemma3",  # the packed pools' families
                  "nemotron_h_omni")  # and Nemotron-H's Mamba-2 layers, whose state must restart at each row
TURNS_CONFIGS = ("qwen3_vl", "gemma3")  # two-turn pools: image tokens in both halves (the context-parallel cases)
NUM_LAYERS = 12  # enough for R * V = 12 stages
# The Qwen2 BPE cut to its first 5,120 ranks, the Qwen2 special tokens right after them (as scripts/make/make_demo.py
# cuts it): with all 151,643 ranks the embedding and the LM head were 19 M of a tiny model's 20 M parameters
# and most of every case's time, and the numerics do not depend on the vocabulary's size.
VOCAB_RANKS = 5120


def photo(name: str, side: int) -> Image.Image:
    array = getattr(skdata, name)()
    if array.ndim == 2:
        array = np.stack([array] * 3, -1)
    image = Image.fromarray(array[..., :3].astype(np.uint8))
    image.thumbnail((side, side))
    return image


def caption_row(i: int, side: int, with_image: bool, prompt_repeat: int) -> dict:
    """A one-turn conversation about photo ``i`` (shrunk to ``side`` px), in the canonical form the conversation
    collator reads (parts lists; the image in memory)."""
    prompt = [{"type": "text", "text": "Describe the image." + " Briefly." * prompt_repeat}]
    return {"messages": [{"role": "user", "content": ([{"type": "image"}] if with_image else []) + prompt},
                         {"role": "assistant", "content": [{"type": "text", "text": CAPTIONS[i]}]}],
            "images": [photo(PHOTOS[i], side)] if with_image else []}


def collator(config, tokenizer) -> ConversationCollator:
    return ConversationCollator(build_processor(config, tokenizer), None, model_type=config.model_type)


def family_collator(config, tokenizer):
    """The collator of a family's ragged pool: its processor's, or, for a family whose stock image processor
    needs torchvision, its vision inputs built directly (:mod:`pools_without_processor`)."""
    import direct_llava_like
    from pools_without_processor import BUILDERS, direct_collator
    if config.model_type in direct_llava_like.TYPES:
        return direct_llava_like.direct_collator(config, tokenizer)
    if config.model_type in BUILDERS:
        return direct_collator(config, tokenizer)
    return collator(config, tokenizer)


def make_ragged_pool(collate) -> list[dict[str, torch.Tensor]]:
    """Micro-batches of real photos and captions: images, rows without an image next to rows with one, and
    micro-batches without any image."""
    ragged = []
    for m in range(8):
        kind = m % 3  # 0: one image per row, 1: one row with and one without, 2: no image
        rows = [caption_row((m + j) % 8, 56 + 28 * ((m + 2 * j) % 3), kind == 0 or (kind == 1 and j == 0), (m + j) % 3)
                for j in range(1 + (m + 1) % 2 if kind != 1 else 2)]
        ragged.append(collate(rows))
    return ragged


def multi_image_row(i: int, side: int, num_images: int, prompt_repeat: int) -> dict:
    """A one-turn conversation about ``num_images`` photos from ``i`` on (0: a text-only row)."""
    text = [{"type": "text", "text": "Compare the images." + " Briefly." * prompt_repeat}]
    answer = " ".join(CAPTIONS[(i + k) % 8] for k in range(max(1, num_images)))
    return {"messages": [{"role": "user", "content": [{"type": "image"}] * num_images + text},
                         {"role": "assistant", "content": [{"type": "text", "text": answer}]}],
            "images": [photo(PHOTOS[(i + k) % 8], side + 28 * k) for k in range(num_images)]}


def make_packed_pool(collate) -> list[dict[str, torch.Tensor]]:
    """Padded micro-batches of 2-3 rows for packing: a text-only row next to rows of two images and of
    one image, in differing orders and lengths; the pipeline packs each into one sequence."""
    pool = []
    for m in range(6):
        counts = [(2, 0, 1), (0, 1, 2), (1, 2), (2, 0), (0, 2, 0), (1, 0, 1)][m]
        pool.append(collate([multi_image_row(m + j, 56, n, (m + j) % 3) for j, n in enumerate(counts)]))
    return pool


def two_turn_row(i: int, prompt_repeat: int, answers: int) -> dict:
    """A two-turn conversation, a photo in each user turn (photos ``i`` and ``i + 1``, 56 and 84 px), the second
    answer ``answers`` captions long: its second image lies near the middle of the row."""
    turns = []
    for k in range(2):
        prompt = "Describe the image." + " Briefly." * (prompt_repeat if k == 0 else 0)
        answer = " ".join(CAPTIONS[(i + k + a) % 8] for a in range(answers if k else 1))
        turns += [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]},
                  {"role": "assistant", "content": [{"type": "text", "text": answer}]}]
    return {"messages": turns, "images": [photo(PHOTOS[(i + k) % 8], 56 + 28 * k) for k in range(2)]}


def make_turns_pool(collate) -> list[dict[str, torch.Tensor]]:
    """Micro-batches of two-turn rows (:func:`two_turn_row`) whose image tokens lie in both halves of the sequence,
    the second image of some rows across the middle, and a text-only row before one with images: what the
    context-parallel cases cut in two (each CP rank's slice holds image tokens, per row)."""
    rows = [[two_turn_row(0, 0, 2)], [two_turn_row(1, 0, 2), two_turn_row(2, 0, 2)], [two_turn_row(3, 1, 2)],
            [caption_row(5, 56, False, 2), two_turn_row(6, 1, 2)]]
    return [collate(r) for r in rows]


# (photo, motion, frames, (width, height), fps, options of its video parts, as a frame folder): each samples 4
# frames, at sampled rates that make Qwen2.5-VL's second_per_grid_ts differ (2.0 s, 0.5 s and 0.5 s a temporal
# patch), which space the videos' temporal M-RoPE positions
CLIPS = [("astronaut", "pan", 8, (56, 56), 2, {"fps": 1}, False), ("coffee", "zoom", 4, (84, 56), 4, {}, False),
         ("rocket", "tilt", 4, (56, 84), 4, {"frames_fps": 4}, True)]


def write_clips(folder: str) -> list[dict]:
    """Short real clips made from the scikit-image photos as the demo makes its own
    (``scripts/make/make_demo_videos.py``: a window panning, tilting or zooming over the photo, encoded with PyAV), 4
    to 8 frames of 56 to 84 px each (:data:`CLIPS`); the last as a folder of PNG frames. Returns a video part of
    each (``{"type": "video", "video": path, **options}``)."""
    import runpy
    demo = runpy.run_path(os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "make", "make_demo_videos.py"))
    os.makedirs(folder, exist_ok=True)
    paths = []
    for name, motion, count, size, fps, options, as_frames in CLIPS:
        frames = demo["frames_of"](photo(name, 512), motion, count, size)
        path = os.path.join(folder, f"{name}_{motion}" + ("" if as_frames else ".mp4"))
        if as_frames:
            os.makedirs(path, exist_ok=True)
            for i, frame in enumerate(frames):
                frame.save(os.path.join(path, f"frame_{i + 1}.png"))
        else:
            demo["encode"](path, frames, fps)
        paths.append({"type": "video", "video": path, **options})
    return paths


def video_row(parts: list, answer: int, prompt_repeat: int, clips: list[dict]) -> dict:
    """A one-turn conversation whose user turn holds ``parts`` in order: ``("video", k)`` clip ``k`` of ``clips``
    (:func:`write_clips`),
    ``("image", i)`` photo ``i`` (56 px), the prompt after them; answered with caption ``answer``."""
    content, images = [], []
    for kind, k in parts:
        if kind == "video":
            content.append(dict(clips[k]))
        else:
            content.append({"type": "image"})
            images.append(photo(PHOTOS[k], 56))
    content.append({"type": "text", "text": "What does it show?" + " Briefly." * prompt_repeat})
    return {"messages": [{"role": "user", "content": content},
                         {"role": "assistant", "content": [{"type": "text", "text": CAPTIONS[answer]}]}],
            "images": images}


# families whose model cannot take images and videos in one micro-batch (GLM-4.xV: they share the image token)
VIDEO_APART = ("glm4v", "glm4v_moe", "glm46v")
# families whose model stacks a micro-batch's videos (LLaVA-OneVision): every clip sampled to this many frames
VIDEO_FRAMES = {"llava_onevision": 4}


def frames_of(clips: list[dict], count: int) -> list[dict]:
    """``clips`` (:func:`write_clips`' parts) each sampled to ``count`` frames (``num_frames``, no ``fps``)."""
    return [{**{k: v for k, v in clip.items() if k != "fps"}, "num_frames": count} for clip in clips]


def make_video_pool(collate, clips: list[dict], apart: bool = False) -> list[dict[str, torch.Tensor]]:
    """Micro-batches of rows mixing images and videos: a video alone, an image before a video and a
    video before an image, two videos in one row, a frame-folder video, rows of one image or text only beside
    them, and a micro-batch with no video. ``apart``: no micro-batch holds both an image and a video (GLM-4.xV,
    :data:`VIDEO_APART`): a video alone, two videos in a row, a frame folder beside a clip, video or image rows
    beside text-only ones, micro-batches of images alone between them."""
    V, I = "video", "image"  # noqa: E741
    micros = [[[(V, 0)]], [[(I, 1), (V, 1)], []], [[(V, 2)], [(I, 3)]], [[(V, 0), (V, 1)]],
              [[(V, 1), (I, 4)], [(V, 2)]], [[(I, 5)], []]]
    if apart:
        micros = [[[(V, 0)]], [[(I, 1)], []], [[(V, 2)], [(V, 1)]], [[(V, 0), (V, 1)]], [[(I, 4)], [(I, 3)]],
                  [[(V, 1)], []]]
    return [collate([video_row(parts, (m + j) % 8, (m + j) % 3, clips) for j, parts in enumerate(rows)])
            for m, rows in enumerate(micros)]


def make_vl_pools(collate) -> dict[str, list[dict[str, torch.Tensor]]]:
    """Micro-batches of real photos and captions, in three pools:

    - ``images``: 1-2 photos each, differing in image size and text length;
    - ``ragged``: see :func:`make_ragged_pool`;
    - ``noimage``: no image anywhere (a whole step without images).
    """
    images, noimage = [], []
    for m in range(8):
        images.append(collate([caption_row((m * 2 + j) % 8, 56 + 28 * ((m + j) % 3), True, m % 3)
                               for j in range(1 + m % 2)]))
    for m in range(6):
        noimage.append(collate([caption_row((m + j) % 8, 56, False, (m + j) % 3) for j in range(1 + m % 2)]))
    return {"images": images, "ragged": make_ragged_pool(collate), "noimage": noimage}


def make_text_pool(tokenizer, rows=lambda m: 1 + m % 2) -> list[dict[str, torch.Tensor]]:
    """Padded text micro-batches of ``rows(m)`` rows (1-2; the packed pool's 2-3) of 1-3 sentences each (labels
    -100 on padding), differing in length."""
    out = []
    for m in range(8):
        texts = [" ".join(SENTENCES[(m + j + k) % 8] for k in range(1 + (m + j) % 3)) for j in range(rows(m))]
        batch = tokenizer(texts, padding=True, return_tensors="pt")
        labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        out.append({"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"], "labels": labels})
    return out


def tiny_configs(tokenizer, only: list[str] | None = None) -> dict:
    """Every model the numerics tests run, by name: scaled-down real HF configs with ``tokenizer``'s vocabulary
    (``only``: the generic splitter's families of these names alone, beside the older ones)."""
    n = NUM_LAYERS
    return {
        "vl": qwen_tiny.tiny_qwen2_5_vl_config(tokenizer, num_layers=n),
        "qwen2_vl": qwen_tiny.tiny_qwen2_vl_config(tokenizer, num_layers=n),
        "qwen3_vl": qwen_tiny.tiny_qwen3_vl_config(tokenizer, num_layers=n),
        "llava": tiny_llava_config(tokenizer, num_layers=n),
        "llava-full": tiny_llava_config(tokenizer, num_layers=n, vision_feature_layer=[-3, -1], strategy="full"),
        "llama": text_tiny.tiny_causal_lm_config(tokenizer, "llama", num_layers=n),
        "qwen2": text_tiny.tiny_causal_lm_config(tokenizer, "qwen2", num_layers=n),
        "qwen3-tied": text_tiny.tiny_causal_lm_config(tokenizer, "qwen3", num_layers=n, tie_word_embeddings=True),
        **new_family_configs(tokenizer, only),
    }


# the types tiny_configs builds under names of their own ("vl" is Qwen2.5-VL; "qwen3-tied", "llava-full")
NAMED_CONFIGS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "llava", "llama", "qwen2", "qwen3")
TIMM_TOWERS = ("fast_vlm", "perception_lm", "gemma3n")  # their towers are timm models: building one needs timm


def family_builders(timm: bool = False) -> dict:
    """``{model_type: tiny config builder}`` of every declared family (the registry's tiny configs) but
    :data:`NAMED_CONFIGS`; the :data:`TIMM_TOWERS` types only with ``timm``."""
    from mpipe_hf.families.registry import all_tiny
    return {t: build for t, build in sorted(all_tiny().items())
            if t not in NAMED_CONFIGS and (timm or t not in TIMM_TOWERS)}


def new_family_configs(tokenizer, only: list[str] | None = None) -> dict:
    """The generic splitter's families (their declarations), by model type, at :data:`NUM_LAYERS`."""
    return {name: build(tokenizer, num_layers=NUM_LAYERS) for name, build in family_builders().items()
            if not only or name in only}


def build_fixture(path: str, packed: tuple[str, ...] = PACKED_CONFIGS, only: list[str] | None = None,
                  videos: tuple[str, ...] = ()) -> None:
    """Configs (real HF classes, the Qwen2 vocabulary cut to :data:`VOCAB_RANKS` ranks) and micro-batch pools,
    built once and shared with the workers. Each VL family's pool is made by its own processor
    (``ragged-<config name>``), and so is the packed pool of each of ``packed`` (``packed-<config name>``;
    ``packed-text`` for the decoder-only LMs) and the video pool of each of ``videos`` (``video-<config name>``,
    :func:`make_video_pool`, its clips written beside ``path``). ``only``: the family pools of these configs
    alone."""
    tokenizer = qwen2_tokenizer(VOCAB_RANKS)
    configs = tiny_configs(tokenizer, only)
    pools = make_vl_pools(collator(configs["vl"], tokenizer))
    pools["text"] = make_text_pool(tokenizer)
    for name in ("qwen2_vl", "qwen3_vl", "llava", "llava-full", *new_family_configs(tokenizer)):
        if (only and name not in only) or not hasattr(configs[name], "vision_config"):
            continue  # a decoder-only LM (mistral4) runs on the text pool
        pools[f"ragged-{name}"] = make_ragged_pool(family_collator(configs[name], tokenizer))
    for name in packed:
        if only and name not in only:
            continue
        pools[f"packed-{name}"] = make_packed_pool(family_collator(configs[name], tokenizer))
    pools["packed-text"] = make_text_pool(tokenizer, rows=lambda m: 2 + m % 2)
    for name in TURNS_CONFIGS:
        if not only or name in only:
            pools[f"turns-{name}"] = make_turns_pool(family_collator(configs[name], tokenizer))
    if videos:
        clips = write_clips(os.path.join(os.path.dirname(path), "clips"))
        for name in videos:
            own = frames_of(clips, VIDEO_FRAMES[name]) if name in VIDEO_FRAMES else clips
            pools[f"video-{name}"] = make_video_pool(collator(configs[name], tokenizer), own,
                                                     apart=name in VIDEO_APART)
    torch.save({"configs": {k: c.to_dict() for k, c in configs.items()}, "pools": pools}, path)


def case_freeze(model: torch.nn.Module, case: dict, frozen=(), tied=()) -> None:
    """Freeze ``model`` as ``case["freeze"]`` (a :class:`~mpipe_hf.models.freeze.Trainable`'s keywords) says: a
    split's share (``frozen``, ``tied``: its :attr:`frozen` and :attr:`tied`) or the unsplit reference."""
    from mpipe_hf.models import get_family
    from mpipe_hf.models.freeze import Trainable, apply_trainable
    spec = Trainable(**case.get("freeze", {}))
    if spec.freezes():
        apply_trainable(model, get_family(model.config.model_type), spec, frozen, tied, strict=False)


def run_torchrun(worker: str, nproc: int, args: list[str], timeout: int) -> None:
    """Run ``worker`` under torchrun on ``nproc`` CPU processes; raise with its output when it fails."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", worker, *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd[:6])} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n"
                             f"{proc.stderr[-8000:]}")


def read_results(out_dir: str, nproc: int) -> list[dict]:
    return [json.load(open(os.path.join(out_dir, f"rank{r}.json"))) for r in range(nproc)]


def run_cases(cases: list[dict], run, out_dir: str, rank: int) -> None:
    """In a worker: ``run(case)`` for every case, timed (``wall_s``; rank 0 prints each), then this rank's
    results as ``OUT_DIR/rank<rank>.json`` (``{case name: result}``), which :func:`read_results` reads."""
    import time
    results = {}
    for case in cases:
        start = time.perf_counter()
        results[case["name"]] = run(case)
        results[case["name"]]["wall_s"] = time.perf_counter() - start
        if rank == 0:
            print(f"{case['name']}: {results[case['name']]['wall_s']:.1f}s", flush=True)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
