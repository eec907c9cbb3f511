"""Write the demo's video clips and video conversations, made from the photos bundled with scikit-image.

Each clip moves a window over one photo (a pan or a zoom), 8 to 16 frames of 64 to 112 px at a few frames a
second, encoded with PyAV (H.264 where the wheel's FFmpeg has libx264, else MPEG-4 Part 2) as
``OUT_DIR/videos/<name>.mp4``; one more is written as a folder of PNG frames (``OUT_DIR/videos/chelsea_pan/
frame_<i>.png``).
``OUT_DIR/video.jsonl`` holds ``messages`` rows that use them (docs/video.md): a video alone, a video and a photo
in one turn, per-video options (``fps``, ``max_frames``, ``max_pixels``), two videos, the frame folder (its rate
``frames_fps``), answered in the one-word form of the image rows (``In one word: <word>.``). Paths are relative
to OUT_DIR, which must hold ``images/`` (``make_demo_data.py``). Deterministic; runs in well under a second.

Usage::

    python scripts/make/make_demo_videos.py OUT_DIR
"""

import argparse
import json
import time
from pathlib import Path

import av
import numpy as np
import skimage.data
from PIL import Image

# (name, skimage loader, the demo's one-word answer, motion, frames, (width, height), fps)
CLIPS = [("astronaut_pan", "astronaut", "person", "pan", 12, (96, 72), 4),
         ("coffee_zoom", "coffee", "food", "zoom", 16, (112, 84), 8),
         ("rocket_tilt", "rocket", "space", "tilt", 8, (64, 112), 2),
         ("chelsea_pan", "chelsea", "face", "pan", 10, (80, 64), 5)]
FRAMES = "chelsea_pan"  # written as a frame folder, not a file
ANSWER = "In one word: {}."


def _rgb(array) -> Image.Image:
    array = np.asarray(array)
    if array.ndim == 2:
        array = np.stack([array] * 3, -1)
    return Image.fromarray(array[..., :3].astype(np.uint8))


def frames_of(photo: Image.Image, motion: str, count: int, size: tuple[int, int]) -> list[Image.Image]:
    """``count`` frames of ``size`` (w, h): a window of the frame's aspect moving over ``photo`` left to right
    (``pan``), top to bottom (``tilt``) or shrinking towards the centre (``zoom``)."""
    width, height = photo.size
    aspect = size[0] / size[1]
    win_h = min(height, int(width / aspect)) * 3 // 4
    win_w = int(win_h * aspect)
    out = []
    for t in range(count):
        f = t / max(count - 1, 1)
        if motion == "zoom":
            w, h = int(win_w * (1 - 0.5 * f)), int(win_h * (1 - 0.5 * f))
            left, top = (width - w) // 2, (height - h) // 2
        else:
            w, h = win_w, win_h
            left = int((width - w) * f) if motion == "pan" else (width - w) // 2
            top = int((height - h) * f) if motion == "tilt" else (height - h) // 2
        out.append(photo.crop((left, top, left + w, top + h)).resize(size, Image.BICUBIC))
    return out


def encode(path: Path, frames: list[Image.Image], fps: int) -> str:
    """Write ``frames`` as an MP4 at ``fps``; returns the codec used."""
    codec = "libx264" if "libx264" in av.codecs_available else "mpeg4"
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height = frames[0].size
        stream.pix_fmt = "yuv420p"
        if codec == "libx264":
            stream.options = {"crf": "18", "preset": "fast", "threads": "1"}
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_image(frame)):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return codec


def rows(words: dict[str, str]) -> list[dict]:
    """The video conversations (module docstring)."""
    def video(name, **options):
        where = f"videos/{name}" + ("" if name == FRAMES else ".mp4")
        return {"type": "video", "video": where, **options}

    def row(parts, answer, system=False):
        messages = [{"role": "user", "content": parts}, {"role": "assistant", "content": answer}]
        if system:
            messages.insert(0, {"role": "system", "content": "You name what a clip or photo shows in one word."})
        return {"messages": messages}

    text = {"type": "text", "text": "What does the clip show?"}
    return [
        row([video("astronaut_pan"), text], ANSWER.format(words["astronaut_pan"]), system=True),
        row([video("coffee_zoom", fps=4, max_frames=8), {"type": "image", "image": "images/rocket.png"},
             {"type": "text", "text": "Name the clip, then the photo."}],
            f"In order: {words['coffee_zoom']}, space."),
        row([video("rocket_tilt", max_pixels=56 * 56), text], ANSWER.format(words["rocket_tilt"])),
        row([{"type": "image", "image": "images/coffee.png"}, video("astronaut_pan", fps=1),
             {"type": "text", "text": "Name the photo, then the clip."}], f"In order: food, {words['astronaut_pan']}."),
        row([video(FRAMES, frames_fps=5), text], ANSWER.format(words[FRAMES])),
        row([video("rocket_tilt"), video("coffee_zoom", num_frames=4), {"type": "text", "text": "Name both clips."}],
            f"In order: {words['rocket_tilt']}, {words['coffee_zoom']}."),
    ]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", nargs="?", default="demo/data", type=Path,
                        help="the demo's data folder, holding images/ (default: demo/data)")
    out = parser.parse_args(argv).out_dir
    start = time.perf_counter()
    folder = out / "videos"
    folder.mkdir(parents=True, exist_ok=True)
    words, codec = {}, None
    for name, loader, word, motion, count, size, fps in CLIPS:
        frames = frames_of(_rgb(getattr(skimage.data, loader)()), motion, count, size)
        words[name] = word
        if name == FRAMES:
            (folder / name).mkdir(exist_ok=True)
            for i, frame in enumerate(frames):
                frame.save(folder / name / f"frame_{i + 1}.png")
        else:
            codec = encode(folder / f"{name}.mp4", frames, fps)
    table = rows(words)
    with open(out / "video.jsonl", "w", encoding="utf-8") as f:
        for row in table:
            f.write(json.dumps(row) + "\n")
    print(f"wrote {len(CLIPS) - 1} clips ({codec}) and a frame folder to {folder}, {len(table)} video rows to "
          f"{out / 'video.jsonl'} in {time.perf_counter() - start:.2f}s")


if __name__ == "__main__":
    main()
