"""Decoding a video file with torchcodec, the optional alternative to PyAV (``data.video_decoder: torchcodec``;
docs/video.md, "Decoder").

torchcodec decodes with the FFmpeg shared libraries installed on the machine (``libavcodec`` and the rest: FFmpeg
4 to 8) and must match the torch build: on Linux x86-64 PyPI's torchcodec 0.14 and later are CUDA builds that do
not load under a CPU torch, 0.12 and 0.13 CPU builds that do (the ``torchcodec`` extra pins them).
The frames and metadata are those of :func:`~.video.decode_video`: the same header fields (the stream's frame
count, counted from the file's packets when the container does not say; its average rate) and the frames at the
same indices in presentation order, RGB ``uint8``.
"""

from __future__ import annotations

import numpy as np
from transformers.video_utils import VideoMetadata

FIELD = "data.video_decoder"  # the recipe field that chooses torchcodec (mpipe_hf.train.recipe_data.DataSection)


def video_decoder_class():
    """torchcodec's ``VideoDecoder`` class.

    Raises:
        ImportError: torchcodec is not installed or does not load here (its FFmpeg libraries missing, a build for
            another torch): naming :data:`FIELD` and the cause. Not a ``ValueError``, so a run stops on it rather
            than count every video row bad.
    """
    try:
        from torchcodec.decoders import VideoDecoder
    except (ImportError, OSError, RuntimeError) as err:  # RuntimeError: torchcodec finds no FFmpeg libraries
        cause = f"{type(err).__name__}: {err}"
        if isinstance(err.__cause__, OSError):  # a library that does not load: say which file it misses
            cause += f" ({err.__cause__})"
        raise ImportError(
            f"{FIELD} is 'torchcodec', but torchcodec does not load here ({cause[:400]}); install the torchcodec "
            f"extra (`pip install -e '.[torchcodec]'`) and FFmpeg's shared libraries (Debian: `apt-get install "
            f"ffmpeg`), or set {FIELD}: pyav (the default)") from err
    return VideoDecoder


def _open(path: str, exact: bool):
    """``VideoDecoder`` over ``path``: ``exact`` scans every packet first (frame-accurate indices), else reads the
    header alone. Raises ``ValueError`` naming the file when it cannot be opened."""
    decoder_class = video_decoder_class()
    try:
        return decoder_class(path, seek_mode="exact" if exact else "approximate", dimension_order="NHWC",
                             num_ffmpeg_threads=0)
    except (RuntimeError, ValueError, OSError) as err:
        raise ValueError(f"cannot read video file {path}: {type(err).__name__}: {err}") from err


def _metadata(decoder) -> VideoMetadata | None:
    """The stream's metadata as :func:`~.video.probe_video` reads it (``None``: no frame count without a scan)."""
    meta = decoder.metadata
    total = meta.num_frames_from_header or meta.num_frames_from_content
    if not total:
        return None
    fps = float(meta.average_fps_from_header) if meta.average_fps_from_header else None
    return VideoMetadata(total_num_frames=int(total), fps=fps, duration=total / fps if fps else 0.0,
                         video_backend="torchcodec", height=meta.height, width=meta.width)


def probe_torchcodec(path: str) -> VideoMetadata:
    """A video file's metadata read by torchcodec, as :func:`~.video.probe_video` reads it with PyAV: frames (the
    header's count, else the packets counted), ``fps`` (the stream's average rate), ``duration`` (frames / fps,
    s), height and width (px); ``video_backend`` ``"torchcodec"``.

    Raises:
        ImportError: torchcodec does not load (:func:`video_decoder_class`).
        ValueError: the file cannot be opened or has no video stream (naming the file).
    """
    metadata = _metadata(_open(path, exact=False))
    return metadata if metadata is not None else _metadata(_open(path, exact=True))


def decode_torchcodec(path: str, indices: list[int]) -> np.ndarray:
    """The frames of a video file at ``indices`` (presentation order, any order, repeats kept), decoded by
    torchcodec to RGB: ``uint8`` ``(len(indices), H, W, 3)``.

    Raises:
        ImportError: torchcodec does not load (:func:`video_decoder_class`).
        ValueError: the file cannot be opened, or a frame asked for cannot be decoded (naming the file).
    """
    decoder = _open(path, exact=True)
    try:
        frames = decoder.get_frames_at([int(i) for i in indices]).data
    except (RuntimeError, ValueError, IndexError) as err:
        raise ValueError(f"cannot decode video file {path} at frames {indices}: {type(err).__name__}: {err}"
                         ) from err
    return np.ascontiguousarray(frames.numpy())
