"""mpipe_hf's torchvision-free image and video processors against the stock ``transformers`` classes' outputs,
recorded with torchvision by ``scripts/check/record_stock_processors.py`` into ``tests/stock_processor_outputs.npz``
and compared here without torchvision, on any CPU (docs/design.md, "Against the stock processor").

Differences are counted in ``uint8`` levels of the output (one level: ``rescale_factor / min(image_std)``, the
smallest step a one-level change of an input pixel makes after normalisation). The record keeps floats as
``float16``, and ours is cast the same way before comparing, so equal outputs differ by 0 and a one-level
difference reads as 1 +- :data:`SLACK`.

Video processors (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5, GLM-4.1V, GLM-4.6V, LLaVA-OneVision): bit for bit, no
tolerance. Both sides resize with ``torch.nn.functional.interpolate`` on the ``uint8`` frames (torchvision's path
for bicubic; ours reproduces it, ``mpipe_hf/data/video_processor.py``), and that kernel gave the same bits in every
setting measured: the stock classes under torch 2.13.0 + torchvision 0.28 on an AVX-512 CPU (the digests this
record replaced) and under torch 2.14.1 + torchvision 0.29.1 on an AVX2 CPU (this record), ours under torch 2.13.0
with ``ATEN_CPU_CAPABILITY`` ``avx2`` and ``default`` (no vector kernel): 0 of 84 recorded video tensors differ.

Image processors: the project uses each family's ``*ImageProcessorPil`` where transformers builds the torchvision
class by default; the two resize with different kernels (Pillow's fixed-point resampling against torch's), so
values may differ by rounding: see :data:`IMAGE_MAX` and :data:`IMAGE_MEAN`. Shapes, dtypes and integer outputs
(grids, patch counts) must be equal.
"""

import copy
import os
import runpy

import pytest
import torch

import mpipe_hf.data.image_torch_ops as image_torch_ops
from mpipe_hf.data.processor import PROCESSOR_TYPES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORD = os.path.join(ROOT, "tests", "stock_processor_outputs.npz")
SCRIPT = runpy.run_path(os.path.join(ROOT, "scripts", "check", "record_stock_processors.py"))

SLACK = 0.25  # float16 keeps values below 4 to 0.002 (0.001 below 2): at most 0.25 of the smallest level, 0.0078
# Pillow and torch resize a uint8 image with different fixed-point weights and round once each: at most one level
# apart per resize (measured: 1 level at 0.01-20 % of the values, 0 elsewhere, over 3 images x 49 families).
IMAGE_MAX = 1 + SLACK
IMAGE_MAX_FOR = {
    # two levels at a handful of values: Idefics3 / SmolVLM resample with Lanczos (6 taps a side, so more
    # fixed-point weights to round: 3 values of an image at 2 levels, mean 0.02); DeepSeek-OCR-2 and
    # DeepSeek-VL-Hybrid at the border row of an image grown 2.1 x (weights renormalised over the taps inside the
    # image: 1 to 2 values at 2 levels, mean 0.005). Measured on the 3 images; never more than 2.
    **{family: 2 + SLACK for family in ("idefics3", "smolvlm", "deepseek_vl_hybrid", "deepseek_ocr2")},
    # a 33 x 75 image of hard 255 -> 0 edges that the GLM processors shrink in height and grow in width (28 x 84):
    # Pillow resizes the vertical pass first, torch the horizontal, and each clips its uint8 intermediate, so
    # bicubic's overshoot at an edge is clipped at a different place. Measured: 14 levels at 96 of 14112 values
    # (mean 0.08); Pillow's own resize in the two orders differs by the same 14 (torch's order matches Pillow's
    # horizontal-first resize within 1 level). Photos stay within one level.
    **{(family, "pattern_33x75"): 14 + SLACK for family in ("glm4v", "glm4v_moe", "glm46v", "glm_ocr", "glmga")},
}
# The mean difference over a tensor, in levels: the share of values one level apart. Measured worst: 0.20
# (MiniCPM-V 4.6 / PaliGemma's SigLIP on the 60 x 40 photo grown to 56 x 56); a processor off by one level
# everywhere (a shifted mean, the wrong resampling filter) reads about 1.
IMAGE_MEAN = 0.3
VIDEO_CALLS = [name for name, _, _ in SCRIPT["video_calls"]()]


@pytest.fixture(scope="module")
def record():
    meta, arrays = SCRIPT["load"](RECORD)
    return meta, arrays, SCRIPT["Ours"](meta, arrays)


def _verdicts(record, name: str, case: dict | None = None) -> dict:
    meta, arrays, ours = record
    got, unit = ours.run(name, case)
    recorded = meta["cases"][name]["outputs"]
    assert sorted(got) == sorted(recorded), name
    return {key: SCRIPT["compare_tensor"](info, arrays[info["key"]], got[key], unit) for key, info in recorded.items()}


def _image_failures(record, family: str, names: list[str], cases: dict | None = None) -> list[str]:
    """What breaks the stated tolerances among ``names`` (``cases``: descriptions put in place of the record's)."""
    bad = []
    for name in names:
        image = record[0]["cases"][name]["image"]
        bound = IMAGE_MAX_FOR.get((family, image), IMAGE_MAX_FOR.get(family, IMAGE_MAX))
        for key, v in _verdicts(record, name, (cases or {}).get(name)).items():
            if not v["shape"] or v["max"] > bound or v["mean"] > IMAGE_MEAN:
                bad.append(f"{name} {key}: {v} (bounds {bound}, mean {IMAGE_MEAN})")
    return bad


def _image_cases(record, family: str) -> list[str]:
    return sorted(n for n, c in record[0]["cases"].items() if c["kind"] == "image" and c["family"] == family
                  and "error" not in c)


def test_the_record_covers_every_replaced_processor(record):
    """Every video processor the project ships under every call, and every family's image processor; small enough
    for the repository; and each family's data path still builds the class the record compared."""
    from mpipe_hf.data import qwen2_tokenizer
    from mpipe_hf.data.processor import image_processor_for
    meta, _, _ = record
    # 2.63 MB with the 14 torch-operation image processors (each at its tiny tower's settings and variants); a cap,
    # so that a new entry keeping a large tensor in full instead of a sample shows up here
    assert os.path.getsize(RECORD) < 3_000_000
    cases = meta["cases"]
    tokenizer = qwen2_tokenizer(5120)
    for family in SCRIPT["VIDEO_TYPES"]:
        ours = SCRIPT["our_video_processor"](family, tokenizer)
        for call in VIDEO_CALLS:
            case = cases[f"video/{family}/{call}"]
            assert "error" not in case and case["stock"] == ours.stock_class_name, (family, call)
            assert case["ours"] == SCRIPT["described"](ours)["ours"], (family, call)
    for family in PROCESSOR_TYPES:
        ours = SCRIPT["described"](image_processor_for(SCRIPT["tiny_config"](family, tokenizer)))["ours"]
        if family == "video_llava":  # the stock VideoLlavaImageProcessor itself: nothing replaced
            assert "error" in cases["image/video_llava"] and cases["image/video_llava"]["ours"] == ours
            continue
        names = _image_cases(record, family)
        assert len(names) == 3 and all(cases[n]["ours"] == ours for n in names), (
            f"{family}'s image processor ({ours}) is not in the record: run scripts/check/record_stock_processors.py "
            "record in the environment with torchvision (its docstring)")
    assert [n for n, c in cases.items() if "error" in c] == ["image/video_llava"]
    for family, (name, _) in SCRIPT["STOCK_ONLY"].items():  # torchvision-only stock classes, kept for a PIL version
        assert [cases[f"stock_only/{family}/{image}"]["stock"] for image in ("astronaut_48x64", "chelsea_60x40",
                                                                             "pattern_33x75")] == [name] * 3


@pytest.mark.parametrize("family", SCRIPT["VIDEO_TYPES"])
def test_video_outputs_equal_the_stock_record(record, family):
    for call in VIDEO_CALLS:
        name = f"video/{family}/{call}"
        for key, v in _verdicts(record, name).items():
            assert v["exact"], (name, key, v)


def test_a_video_resize_rounded_through_float_differs_from_the_record(record, monkeypatch):
    """The video check's teeth: the resize through float32 and rounding (torchvision's path where it has no
    native uint8 kernel; a bilinear video resize without AVX2) instead of the native uint8 kernel."""
    monkeypatch.setattr(image_torch_ops, "_native_uint8", lambda mode: False)
    verdict = _verdicts(record, "video/qwen2_5_vl/whole_two")
    assert not verdict["pixel_values_videos"]["exact"] and verdict["pixel_values_videos"]["shape"]
    assert verdict["video_grid_thw"]["exact"]


@pytest.mark.parametrize("family", sorted(set(PROCESSOR_TYPES) - {"video_llava"}))
def test_image_outputs_match_the_stock_record(record, family):
    if family in SCRIPT["NO_TV"]:  # torch operations as torchvision's: bit for bit (FLOAT_PATH_MAX)
        names = _image_cases(record, family)
        assert len(names) == 3 and not [f for n in names for f in _torch_op_failures(_verdicts(record, n), family)]
        return
    assert not _image_failures(record, family, _image_cases(record, family))


@pytest.mark.parametrize("change, family", [("mean", "qwen2_vl"), ("filter", "qwen2_5_vl"), ("filter", "gemma3"),
                                            ("filter", "llava"), ("filter", "idefics3")])
def test_a_changed_image_processor_breaks_the_tolerances(record, change, family):
    """The image check's teeth: the mean shifted by one level, or the other filter of bilinear and bicubic, is
    caught for each family tried (Idefics3's under its wider two-resize bound)."""
    names = _image_cases(record, family)
    cases = {}
    for name in names:
        cases[name] = copy.deepcopy(record[0]["cases"][name])
        settings = cases[name]["settings"]
        if change == "mean":
            settings["image_mean"] = [settings["image_mean"][0] + 1 / 255, *settings["image_mean"][1:]]
        else:
            settings["resample"] = 2 if settings["resample"] == 3 else 3
    assert _image_failures(record, family, names, cases)


def test_the_recording_script_starts_and_compares():
    """``scripts/check/record_stock_processors.py --help`` starts without torchvision, and its ``compare`` gives the
    verdicts the tests above read (two cases: one video, one image)."""
    import subprocess
    import sys
    script = os.path.join(ROOT, "scripts", "check", "record_stock_processors.py")
    run = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "usage:" in run.stdout and "compare" in run.stdout
    verdicts = SCRIPT["compare"](RECORD, ["video/qwen3_vl/sampled", "image/llava/astronaut_48x64"])
    assert all(v["exact"] for v in verdicts["video/qwen3_vl/sampled"].values())
    assert verdicts["image/llava/astronaut_48x64"]["pixel_values"]["max"] <= IMAGE_MAX


# Llama 4 and LFM2-VL resize bilinearly. torchvision (and ours, ``resize_frames``) resize a CPU uint8 image with
# torch's native uint8 kernel only where the CPU has AVX2 / AVX-512 or is ARM, elsewhere through float32 and
# rounding; the record was made on AVX2. Where the kernel is native ours is bit for bit; elsewhere (measured with
# ATEN_CPU_CAPABILITY=default) values are one level apart at 4-10 % of them (mean 0.04-0.10 levels), and
# Llama 4's bfloat16 output rounds that level to 1.49 (bfloat16's spacing below 1 is one level, 2 ** -7).
# Cohere2-Vision resizes bicubically: always the native kernel, always bit for bit. Step3p7 resizes bilinearly too
# (twice for an image it scales down first): without AVX2 one level apart per resize at up to 25 % of the values
# (mean 0.25; max 1.04, and 2.0 where the global view took two resizes).
# Molmo2 resizes through float32 without antialiasing on every CPU, but the kernel without AVX2 rounds a few values
# (0.02-0.2 %) to the other side of .5: one level there (mean 0.002). MiniMax-M3-VL's bicubic: always bit for bit.
# Gemma 4 Unified's bicubic and Muse's Lanczos (torchvision's native uint8 kernel for both on every CPU): bit for bit
# under ATEN_CPU_CAPABILITY=default too. Nemotron-H Omni resizes the float32 image (bicubic): torch's float kernel
# without AVX2 sums its taps in another order, float32 rounding apart (measured: at most 0.065 levels, mean 2e-5).
FLOAT_PATH_MAX = {"llama4": 1.5 + SLACK, "lfm2_vl": 1 + SLACK, "step3p7": 2 + SLACK, "molmo2": 1 + SLACK,
                  "nemotron_h_omni": SLACK}


def _bit_for_bit_here(family: str) -> bool:
    return family not in FLOAT_PATH_MAX or image_torch_ops._native_uint8("bilinear")


def _torch_op_failures(verdicts: dict, family: str) -> list:
    """What breaks the torch-operation processors' bounds: bit for bit, or on a CPU that resizes through float32
    (:data:`FLOAT_PATH_MAX`) within its measured bound, integer outputs still equal."""
    if _bit_for_bit_here(family):
        return [(k, v) for k, v in verdicts.items() if not v["exact"]]
    return [(k, v) for k, v in verdicts.items() if not v["exact"] and (
        not v["shape"] or v["max"] > FLOAT_PATH_MAX[family] or v["mean"] > IMAGE_MEAN)]


def _stock_only_cases(record, family: str) -> list[str]:
    return sorted(n for n, c in record[0]["cases"].items() if c["kind"] == "stock_only" and c["family"] == family)


@pytest.mark.parametrize("family", sorted(SCRIPT["NO_TV"]))
def test_torch_op_image_processors_equal_the_stock_record(record, family):
    """Llama 4's, LFM2-VL's and Cohere2-Vision's image processors, whose stock classes exist only with torchvision,
    are rewritten with torch operations (the same antialiased ``interpolate`` on ``uint8`` as torchvision, the same
    ``bfloat16`` or ``float32`` normalisation), so they equal the stock outputs bit for bit, no tolerance, where
    the CPU resizes uint8 natively (:data:`FLOAT_PATH_MAX` elsewhere): every recorded setting (the tiny towers'
    and the tiling variants) on every photo."""
    names = _stock_only_cases(record, family)
    assert len(names) >= 6, names  # two settings x three photos
    for name in names:
        assert not _torch_op_failures(_verdicts(record, name), family), name


@pytest.mark.parametrize("family", sorted(SCRIPT["NO_TV"]))
def test_a_changed_torch_op_image_processor_differs_from_the_record(record, family, monkeypatch):
    """The check's teeth, bit for bit or under :data:`FLOAT_PATH_MAX`: the mean one level off (every channel) is
    caught on every case, the other filter (bicubic for bilinear, bilinear for bicubic) on every
    case that resizes (LFM2-VL keeps a 48 x 64 photo that fits its budget as it is), and Llama 4's normalisation
    in ``float32`` instead of the stock ``bfloat16``."""
    resized = []
    for name in _stock_only_cases(record, family):
        shifted, bicubic = copy.deepcopy(record[0]["cases"][name]), copy.deepcopy(record[0]["cases"][name])
        shifted["settings"]["do_normalize"] = True  # a processor that only rescales (Gemma 4 Unified) shifts too
        built = SCRIPT["rebuilt"]({"ours": SCRIPT["NO_TV"][family], "settings": shifted["settings"]})
        shifted["settings"]["image_mean"] = [m + 1 / 255 for m in built.image_mean]  # every channel one level off
        assert _torch_op_failures(_verdicts(record, name, shifted), family), name
        bicubic["settings"]["resample"] = 2 if int(built.resample) == 3 else 3  # the filter it does not use
        resized.append(bool(_torch_op_failures(_verdicts(record, name, bicubic), family)))
    # LFM2-VL keeps one photo as it is; Inkling's tiny tower's setting cuts all three as they are (no resize)
    assert sum(resized) >= len(resized) - (3 if family == "inkling_mm_model" else 1), resized
    if family == "llama4":
        from mpipe_hf.families.llava.image_processor_llama4 import Llama4ImageProcessorNoTV

        def in_float32(image, rescale, mean, std):
            out = image.float() * rescale
            return out.sub_(torch.tensor(mean).view(-1, 1, 1)).div_(torch.tensor(std).view(-1, 1, 1)).bfloat16()
        monkeypatch.setattr(Llama4ImageProcessorNoTV, "_bf16_normalize", staticmethod(in_float32))
        record[2].processors.clear()
        assert any(_torch_op_failures(_verdicts(record, n), family) for n in _stock_only_cases(record, family))
        record[2].processors.clear()
