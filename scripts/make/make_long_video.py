"""Write long video conversations for context parallelism (``recipes/qwen2_5_vl_long_video.yaml``,
``scripts/bench/context_parallel_memory.py``): clips that pan over the photos bundled with scikit-image, long enough
that one row holds thousands to tens of thousands of video tokens.

Each clip is ``--frames`` frames of ``--size`` px square at 2 frames a second (the rate Qwen2.5-VL's video processor
samples, so every frame is kept), encoded with PyAV as ``OUT_DIR/videos/long_<photo>.mp4`` (the frames of the demo's
clips, :func:`make_demo_videos.frames_of`). ``OUT_DIR/long_video.jsonl`` holds one ``messages`` row per clip: the
clip with ``max_pixels`` set to its frame size (so the processor keeps it whole), a question, and the demo's
one-word answer form. A Qwen2.5-VL row then holds ``frames / 2 * (size / 28) ** 2`` video tokens (temporal patches
of 2 frames, 2 x 2 merged 14 px patches), plus about 20 text tokens: the defaults, 16 frames of 448 px, give 2048;
``--frames 64 --size 896`` gives 32768. Deterministic.

Usage::

    python scripts/make/make_long_video.py OUT_DIR [--frames 16] [--size 448] [--rows 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import skimage.data

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_demo_videos import ANSWER, _rgb, encode, frames_of  # noqa: E402

# (skimage loader, the demo's one-word answer, motion)
PHOTOS = [("astronaut", "person", "pan"), ("coffee", "food", "zoom"), ("rocket", "space", "tilt"),
          ("chelsea", "face", "pan")]
FPS = 2  # Qwen2.5-VL's video processor samples 2 frames a second: every frame is kept


def video_tokens(frames: int, size: int) -> int:
    """Qwen2.5-VL's video tokens for ``frames`` frames of ``size`` px square (``size`` a multiple of 28, ``frames``
    even): temporal patches of 2 frames, each ``(size / 28) ** 2`` merged tokens."""
    return frames // 2 * (size // 28) ** 2


def write(out: Path, frames: int, size: int, rows: int) -> Path:
    """Write ``rows`` clips and their conversations under ``out``; returns the JSONL path. Raises ValueError for a
    ``size`` that is not a multiple of 28, an odd ``frames`` or ``rows`` outside 1 to the photos."""
    if size % 28 or frames % 2 or frames < 2 or not 1 <= rows <= len(PHOTOS):
        raise ValueError(f"--size must be a multiple of 28, --frames even (>= 2) and --rows 1 to {len(PHOTOS)}; got "
                         f"{size}, {frames}, {rows}")
    (out / "videos").mkdir(parents=True, exist_ok=True)
    lines = []
    for loader, word, motion in PHOTOS[:rows]:
        clip = frames_of(_rgb(getattr(skimage.data, loader)()), motion, frames, (size, size))
        encode(out / "videos" / f"long_{loader}.mp4", clip, FPS)
        video = {"type": "video", "video": f"videos/long_{loader}.mp4", "max_pixels": size * size}
        parts = [video, {"type": "text", "text": "What does the clip show?"}]
        lines.append({"messages": [{"role": "user", "content": parts},
                                   {"role": "assistant", "content": ANSWER.format(word)}]})
    path = out / "long_video.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in lines), encoding="utf-8")
    return path


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", nargs="?", default="demo/data", type=Path, help="where to write (default: demo/data)")
    parser.add_argument("--frames", type=int, default=16, help="frames per clip (even; 2 a second)")
    parser.add_argument("--size", type=int, default=448, help="frame side in px (a multiple of 28)")
    parser.add_argument("--rows", type=int, default=3, help=f"clips and rows, 1 to {len(PHOTOS)}")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    path = write(args.out_dir, args.frames, args.size, args.rows)
    print(f"wrote {args.rows} rows of {video_tokens(args.frames, args.size)} video tokens each ({args.frames} frames "
          f"of {args.size} px) to {path} in {time.perf_counter() - start:.1f}s")


if __name__ == "__main__":
    main()
