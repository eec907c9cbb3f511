"""Compare mpipe_hf's torchvision-free Qwen video processing with the stock ``transformers`` classes, bit for bit.

The stock ``Qwen2VLVideoProcessor`` needs torchvision, which the project's environment lacks, so the comparison
runs in two environments over the same inputs (:func:`cases`, made here from seeded numpy arrays, no file read):

    python scripts/check/video_stock_check.py tokenizer DIR   # project venv: saves the Qwen2 tokenizer to DIR/tokenizer
    python scripts/check/video_stock_check.py stock DIR       # a venv with torchvision + transformers (no mpipe_hf):
                                                        # the stock classes' outputs -> DIR/stock.pt
    python scripts/check/video_stock_check.py compare DIR     # project venv: ours vs DIR/stock.pt, every tensor
                                                        # compared with torch.equal

Each case is a video processor call (``Qwen2VLVideoProcessor`` vs :class:`mpipe_hf.data.video_processor.
QwenVideoProcessor`) or a processor call with text, images and videos (``Qwen2VLProcessor`` /
``Qwen2_5_VLProcessor`` over ``Qwen2VLImageProcessorPil`` and each video processor). The same cases' stock outputs
are recorded in ``tests/stock_processor_outputs.npz`` by ``scripts/check/record_stock_processors.py`` (one environment
with torchvision and mpipe_hf, no tokenizer hand-over), which ``tests/test_video.py`` replays without torchvision on
any CPU (docs/design.md, "Against the stock processor").
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch

SMALL = {"shortest_edge": 56 * 56, "longest_edge": 112 * 112}
VIDEO = "<|vision_start|><|video_pad|><|vision_end|>"
IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"


def _noise(rng, frames: int, height: int, width: int) -> np.ndarray:
    return rng.integers(0, 256, (frames, height, width, 3), dtype=np.uint8)


def _pan(frames: int, height: int, width: int, step: int = 5) -> np.ndarray:
    """A smooth colour pattern panned ``step`` px a frame (what resampling filters show their rounding on)."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    out = []
    for t in range(frames):
        u = x + step * t
        rgb = [128 + 127 * np.sin(u / 7.0 + y / 11.0), 128 + 127 * np.cos(u / 5.0 - y / 13.0),
               (u * 3 + y * 2) % 256]
        out.append(np.stack(rgb, -1).round().clip(0, 255).astype(np.uint8))
    return np.stack(out)


def _meta(frames: int, fps: float) -> dict:
    return {"total_num_frames": frames, "fps": fps, "duration": frames / fps}


def cases() -> list[dict]:
    """The compared calls: ``settings`` (the video processor's), ``videos`` (``uint8`` ``(T, H, W, 3)``),
    ``metadata``, ``call`` (keyword arguments) and, for processor cases, ``family``, ``texts`` and ``images``."""
    rng = np.random.default_rng(39)
    sample = {"do_sample_frames": True, "fps": 2.0}
    whole = {"do_sample_frames": False}
    noise, pan, tiny = _noise(rng, 12, 70, 90), _pan(9, 120, 160), _pan(5, 30, 40, step=2)
    out = [
        {"name": "noise_fps2_down", "settings": {"size": SMALL}, "videos": [noise], "metadata": [_meta(12, 4.0)],
         "call": sample},
        {"name": "pan_odd_frames_down", "settings": {"size": SMALL}, "videos": [pan], "metadata": [_meta(9, 3.0)],
         "call": whole},
        {"name": "tiny_up_min_pixels", "settings": {"size": SMALL}, "videos": [tiny], "metadata": [_meta(5, 5.0)],
         "call": whole},
        {"name": "batch_two_shapes", "settings": {"size": SMALL}, "videos": [noise, pan[:8, :70, :90], pan],
         "metadata": [_meta(12, 4.0), _meta(8, 3.0), _meta(9, 3.0)], "call": sample},
        {"name": "num_frames_4", "settings": {"size": SMALL}, "videos": [pan], "metadata": [_meta(9, 3.0)],
         "call": {"do_sample_frames": True, "num_frames": 4}},
        {"name": "cap_pixels", "settings": {"size": {"shortest_edge": 28 * 28, "longest_edge": 224 * 224},
                                            "cap_pixels_per_frame": True, "max_video_tokens": 64},
         "videos": [pan], "metadata": [_meta(9, 3.0)], "call": whole},
        {"name": "patch16_default_size", "settings": {"patch_size": 16, "size": {
            "shortest_edge": 32 * 32, "longest_edge": 160 * 160}}, "videos": [_pan(6, 200, 150)],
         "metadata": [_meta(6, 2.0)], "call": {"do_sample_frames": True, "fps": 1.0, "min_frames": 2}},
        {"name": "no_normalize_rescale_only", "settings": {"size": SMALL, "do_normalize": False}, "videos": [noise],
         "metadata": [_meta(12, 4.0)], "call": sample},
    ]
    photo = _pan(1, 90, 120, step=0)[0]
    texts = [f"<|im_start|>user\n{VIDEO}{IMAGE}Compare them.<|im_end|>\n<|im_start|>assistant\nThe same.<|im_end|>\n",
             f"<|im_start|>user\nNothing here.<|im_end|>\n<|im_start|>assistant\n{VIDEO}<|im_end|>\n"]
    for family in ("qwen2_vl", "qwen2_5_vl"):
        out.append({"name": f"processor_{family}", "family": family, "settings": {"size": SMALL},
                    "videos": [noise, pan], "metadata": [_meta(12, 4.0), _meta(9, 3.0)], "call": sample,
                    "texts": texts, "images": [photo]})
    return out


def _image_processor():
    from transformers import Qwen2VLImageProcessorPil
    return Qwen2VLImageProcessorPil(size=SMALL)


def run(case: dict, video_cls, processor_of=None) -> dict:
    """One case through ``video_cls`` (a video processor class), or for a processor case through
    ``processor_of(family, video_processor)``; returns the output tensors (``video_metadata`` left out)."""
    from PIL import Image
    video = video_cls(**case["settings"])
    videos = [v.copy() for v in case["videos"]]
    if "family" not in case:
        out = video(videos=videos, video_metadata=[dict(m) for m in case["metadata"]], return_tensors="pt",
                    **case["call"])
    else:
        processor = processor_of(case["family"], video)
        out = processor(text=list(case["texts"]), images=[Image.fromarray(i) for i in case["images"]],
                        videos=videos, video_metadata=[dict(m) for m in case["metadata"]], padding=True,
                        return_tensors="pt", **case["call"])
    return {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}


def stock(folder: str) -> None:
    """The stock classes' outputs of every case -> ``folder/stock.pt`` (needs torchvision)."""
    import torchvision
    import transformers
    from transformers import AutoTokenizer, Qwen2_5_VLProcessor, Qwen2VLProcessor, Qwen2VLVideoProcessor
    tokenizer = AutoTokenizer.from_pretrained(os.path.join(folder, "tokenizer"))
    classes = {"qwen2_vl": Qwen2VLProcessor, "qwen2_5_vl": Qwen2_5_VLProcessor}

    def processor_of(family, video):
        return classes[family](image_processor=_image_processor(), tokenizer=tokenizer, video_processor=video)
    outputs = {case["name"]: run(case, Qwen2VLVideoProcessor, processor_of) for case in cases()}
    versions = {"torch": str(torch.__version__), "torchvision": str(torchvision.__version__),
                "transformers": transformers.__version__, "cpu": torch.backends.cpu.get_cpu_capability()}
    torch.save({"outputs": outputs, "versions": versions}, os.path.join(folder, "stock.pt"))
    print(f"wrote {os.path.join(folder, 'stock.pt')}: {len(outputs)} cases, {versions}")


def ours(tokenizer=None) -> dict:
    """mpipe_hf's outputs of every case (the tokenizer: the full Qwen2 one unless given)."""
    import transformers
    from mpipe_hf.data import qwen2_tokenizer
    from mpipe_hf.data.stock_classes import conversation_class
    from mpipe_hf.data.video_processor import QwenVideoProcessor
    from mpipe_hf.families.qwen.data import STOCK
    tokenizer = tokenizer or qwen2_tokenizer()

    def processor_of(family, video):
        cls = conversation_class(getattr(transformers, STOCK[family]), family)
        return cls(image_processor=_image_processor(), tokenizer=tokenizer, video_processor=video)
    return {case["name"]: run(case, QwenVideoProcessor, processor_of) for case in cases()}


def compare(folder: str) -> int:
    """Ours against ``folder/stock.pt``: prints each case's verdict. Returns the number of tensors that differ."""
    saved = torch.load(os.path.join(folder, "stock.pt"), map_location="cpu")
    mine, bad = ours(), 0
    for name, expected in saved["outputs"].items():
        got = mine[name]
        for key in sorted(set(expected) | set(got)):
            same = key in got and key in expected and got[key].dtype == expected[key].dtype and torch.equal(
                got[key], expected[key])
            bad += not same
            shape = tuple(expected[key].shape) if key in expected else None
            print(f"{name:28s} {key:22s} {shape!s:18s} {'equal' if same else 'DIFFERS'}")
    print(f"{bad} tensor(s) differ; stock run: {saved['versions']}")
    return bad


def main(argv: list[str]) -> int:
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    if len(argv) < 2 or argv[0] not in ("tokenizer", "stock", "compare"):
        print(__doc__)
        return 2
    command, folder = argv[0], argv[1]
    os.makedirs(folder, exist_ok=True)
    if command == "tokenizer":
        from mpipe_hf.data import qwen2_tokenizer
        qwen2_tokenizer().save_pretrained(os.path.join(folder, "tokenizer"))
        return 0
    if command == "stock":
        stock(folder)
        return 0
    return 1 if compare(folder) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
