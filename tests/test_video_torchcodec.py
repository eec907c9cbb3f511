"""Torchcodec, the optional second video decoder (``data.video_decoder: torchcodec``; docs/video.md,
"Decoder"). Where torchcodec loads, it gives PyAV's frames (RGB ``uint8``, the same indices) and metadata on the
numerics tests' H.264 clips, and on MPEG-4 Part 2 clips (whose decoders may round differently between FFmpeg
releases: equal when torchcodec's FFmpeg is PyAV's release, else within 2 levels); skipped where it does not load
(CI installs no torchcodec). Always: choosing it without torchcodec names the field, and the recipe refuses a
decoder it does not know."""

import os
import runpy
import sys

import av
import numpy as np
import pytest

from mpipe_hf.data.video import decode_video, load_video, probe_video
from mpipe_hf.data.video_torchcodec import video_decoder_class
from mpipe_hf.train.recipe_data import DataSection

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "dist"))  # common.py: the numerics tests' clips, photos
from common import photo, write_clips  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEYS = ("total_num_frames", "fps", "duration", "height", "width", "frames_indices")
# MPEG-4 Part 2 clips (photo, motion, frames, (width, height), fps): long enough for P-frames to drift
MPEG4 = [("astronaut", "pan", 12, (96, 72), 4), ("astronaut", "tilt", 30, (64, 48), 30)]


def _mpeg4(path: str, frames: list, fps: int) -> None:
    with av.open(path, mode="w") as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width, stream.height = frames[0].size
        stream.pix_fmt = "yuv420p"
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_image(frame)))
        container.mux(stream.encode())


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """``{path: codec}``: the numerics tests' clip files (H.264 where PyAV's FFmpeg has libx264) and
    :data:`MPEG4`'s."""
    folder = str(tmp_path_factory.mktemp("clips"))
    codec = "h264" if "libx264" in av.codecs_available else "mpeg4"
    out = {part["video"]: codec for part in write_clips(folder) if os.path.isfile(part["video"])}
    frames_of = runpy.run_path(os.path.join(ROOT, "scripts", "make", "make_demo_videos.py"))["frames_of"]
    for name, motion, count, size, fps in MPEG4:
        path = os.path.join(folder, f"{name}_{motion}_mpeg4.mp4")
        _mpeg4(path, frames_of(photo(name, 512), motion, count, size), fps)
        out[path] = "mpeg4"
    return out


def _loads() -> None:
    try:
        video_decoder_class()
    except ImportError as err:
        pytest.skip(f"torchcodec does not load here: {str(err)[:200]}")


def _same_release() -> bool:
    """Whether torchcodec's FFmpeg has PyAV's ``libavcodec`` (major and minor)."""
    from torchcodec._core import get_ffmpeg_library_versions
    return tuple(get_ffmpeg_library_versions()["libavcodec"][:2]) == tuple(av.library_versions["libavcodec"][:2])


@pytest.mark.parametrize("pick", ["every", "some"])
def test_torchcodec_decodes_as_pyav(clips, pick):
    _loads()
    sampler = None if pick == "every" else (lambda metadata: [3, 0, 0, metadata.total_num_frames - 1])
    for path, codec in clips.items():
        want, want_meta = decode_video(path, sampler)
        got, meta = decode_video(path, sampler, decoder="torchcodec")
        header = probe_video(path, decoder="torchcodec")
        for key in KEYS:
            assert meta[key] == want_meta[key], (path, key)
            assert key == "frames_indices" or header[key] == want_meta[key], (path, key)
        assert (meta.video_backend, want_meta.video_backend) == ("torchcodec", "pyav")
        assert got.dtype == np.uint8 and got.shape == want.shape and got.flags["C_CONTIGUOUS"], path
        if codec == "h264" or _same_release():
            assert np.array_equal(got, want), path
        else:  # MPEG-4 Part 2's inverse transform is not bit-exact between FFmpeg releases
            gap = np.abs(got.astype(np.int16) - want)
            assert gap.max() <= 2 and (gap > 0).mean() < 0.01, (path, gap.max(), (gap > 0).mean())


def test_load_video_takes_the_decoder(clips):
    _loads()

    class Processor:  # what load_video reads of a video processor: its rates and its sampler
        fps = num_frames = None

        def sample_frames(self, metadata, num_frames=None, **_):
            return np.linspace(0, metadata.total_num_frames - 1, num_frames).round().astype(int)

    h264 = [path for path, codec in clips.items() if codec == "h264"]
    if not h264:
        pytest.skip("PyAV's FFmpeg has no libx264 here")
    ref = {"path": h264[0], "num_frames": 4}
    want, want_meta = load_video(ref, Processor())
    got, meta = load_video(ref, Processor(), decoder="torchcodec")
    assert np.array_equal(got, want) and got.shape[0] == 4
    assert meta.frames_indices == want_meta.frames_indices and meta.video_backend == "torchcodec"


def test_choosing_torchcodec_without_it_names_the_field(clips, monkeypatch):
    monkeypatch.setitem(sys.modules, "torchcodec", None)  # `import torchcodec...` now raises ImportError
    monkeypatch.setitem(sys.modules, "torchcodec.decoders", None)
    path = next(iter(clips))
    for call in (lambda: decode_video(path, decoder="torchcodec"), lambda: probe_video(path, decoder="torchcodec")):
        with pytest.raises(ImportError, match=r"data\.video_decoder is 'torchcodec', but torchcodec does not load"):
            call()
    assert decode_video(path)[0].ndim == 4  # PyAV, the default, needs none of it


def test_the_recipe_names_the_decoders():
    assert DataSection(path="rows.jsonl").video_decoder == "pyav"
    assert DataSection(path="rows.jsonl", video_decoder="torchcodec").video_decoder == "torchcodec"
    with pytest.raises(ValueError, match=r"data\.video_decoder must be one of \['pyav', 'torchcodec'\], got 'decord'"):
        DataSection(path="rows.jsonl", video_decoder="decord")
