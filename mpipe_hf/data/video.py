"""Videos of the conversation rows: decoding a file with PyAV, frame folders and lists of frames, a row's video
reference and its per-video options, and one video loaded as its processor takes it (docs/video.md).

A video is given as a file (decoded with PyAV: ``av``, which ``transformers``' own ``read_video_pyav`` uses too;
or with torchcodec where ``data.video_decoder`` says so: :data:`DECODERS`, :mod:`.video_torchcodec`), a folder of
frame images (every image in it, in natural name order: ``f2`` before ``f10``) or a list of frame paths. A row's
video becomes a *reference*, a JSON-able mapping ``{"path": str}`` (a file) or ``{"frames": [str]}`` (frames),
absolute paths, with the options the row gives for it (:data:`OPTIONS`):

- ``fps``: frames a second to sample (the processor's ``fps`` or ``num_frames`` otherwise, else :data:`FPS`),
  or ``num_frames``: frames to keep; both bounded by ``min_frames`` / ``max_frames`` as
  ``Qwen2VLVideoProcessor.sample_frames`` bounds them;
- ``min_pixels`` / ``max_pixels``: this video's frame budget in px; its frames are resized to it first (as
  qwen-vl-utils' ``fetch_video`` does), then the processor resizes them under its own ``size`` (so a budget above
  the processor's is capped by the processor's);
- ``frames_fps`` (frames only): the rate the frames were taken at (default :data:`FRAMES_FPS`), which fps
  sampling and Qwen2.5-VL's ``second_per_grid_ts`` read.
"""

from __future__ import annotations

import os
import re

import numpy as np
import PIL.Image
import torch
from transformers.video_utils import VideoMetadata

from .image_torch_ops import resize_frames

FRAME_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff")
FPS = 2.0  # frames a second a row's video is sampled at unless it or the processor says otherwise (qwen-vl-utils')
FRAMES_FPS = 2.0  # the rate of a frame folder or list that names none (qwen-vl-utils' default for frame lists)
OPTIONS = {"fps": float, "num_frames": int, "min_frames": int, "max_frames": int, "min_pixels": int,
           "max_pixels": int, "frames_fps": float}
ALIASES = {"nframes": "num_frames", "sample_fps": "frames_fps"}  # qwen-vl-utils' names
SAMPLING = ("fps", "num_frames", "min_frames", "max_frames")
DECODERS = ("pyav", "torchcodec")  # data.video_decoder: PyAV (a dependency, the default) or torchcodec (optional)


def _natural(name: str) -> list:
    """Sort key of a file name: its digit runs compared as numbers (``f2`` < ``f10``)."""
    return [int(piece) if piece.isdigit() else piece.lower() for piece in re.split(r"(\d+)", name)]


def list_frames(folder: str) -> list[str]:
    """The frame images of ``folder`` (extensions :data:`FRAME_EXTENSIONS`, hidden files left out), in natural name
    order, as paths.

    Raises:
        ValueError: the folder holds no frame image.
    """
    names = [n for n in os.listdir(folder) if not n.startswith(".") and n.lower().endswith(FRAME_EXTENSIONS)
             and os.path.isfile(os.path.join(folder, n))]
    if not names:
        raise ValueError(f"video folder {folder} holds no frame image ({', '.join(FRAME_EXTENSIONS)})")
    return [os.path.join(folder, n) for n in sorted(names, key=_natural)]


def _indices(sample_indices_fn, metadata: VideoMetadata) -> list[int]:
    if sample_indices_fn is None:
        return list(range(metadata.total_num_frames))
    return [int(i) for i in sample_indices_fn(metadata=metadata)]


def _decoder(decoder: str) -> str:
    if decoder not in DECODERS:
        raise ValueError(f"video decoder must be one of {list(DECODERS)}, got {decoder!r}")
    return decoder


def probe_video(path: str, decoder: str = "pyav") -> VideoMetadata:
    """A video file's metadata from its header, as ``transformers``' ``read_video_pyav`` reads it: frames
    (``stream.frames``; counted by decoding when the container does not say), ``fps`` (``average_rate``),
    ``duration`` (frames / fps, s), height and width (px). ``decoder``: :data:`DECODERS` (torchcodec reads the
    same header fields, :func:`~.video_torchcodec.probe_torchcodec`).

    Raises:
        ValueError: the file cannot be opened or has no video stream (naming the file); an unknown ``decoder``.
        ImportError: ``decoder`` is ``torchcodec`` and it does not load (naming ``data.video_decoder``).
    """
    if _decoder(decoder) == "torchcodec":
        from .video_torchcodec import probe_torchcodec
        return probe_torchcodec(path)
    import av
    try:
        with av.open(path) as container:
            if not container.streams.video:
                raise ValueError(f"video file {path} has no video stream")
            stream = container.streams.video[0]
            total = int(stream.frames) or sum(1 for _ in container.decode(video=0))
            fps = float(stream.average_rate) if stream.average_rate else None
            height, width = stream.height, stream.width
    except (av.FFmpegError, OSError) as err:
        raise ValueError(f"cannot read video file {path}: {type(err).__name__}: {err}") from err
    return VideoMetadata(total_num_frames=total, fps=fps, duration=total / fps if fps else 0.0,
                         video_backend="pyav", height=height, width=width)


def decode_video(path: str, sample_indices_fn=None, decoder: str = "pyav") -> tuple[np.ndarray, VideoMetadata]:
    """The frames of a video file at ``sample_indices_fn(metadata=...)`` (every frame when ``None``), decoded in
    order with PyAV to RGB as ``read_video_pyav`` decodes them (or by torchcodec, ``decoder``: :data:`DECODERS`,
    the same frames: :func:`~.video_torchcodec.decode_torchcodec`): ``uint8`` ``(T, H, W, 3)``, and the metadata
    of :func:`probe_video` with ``frames_indices`` set.

    Raises:
        ValueError: the file cannot be opened or decoded, or holds fewer frames than the indices need; an unknown
            ``decoder``.
        ImportError: ``decoder`` is ``torchcodec`` and it does not load (naming ``data.video_decoder``).
    """
    metadata = probe_video(path, decoder)
    wanted = _indices(sample_indices_fn, metadata)
    if decoder == "torchcodec":
        from .video_torchcodec import decode_torchcodec
        frames = decode_torchcodec(path, wanted)
        metadata.frames_indices = wanted
        return frames, metadata
    import av
    keep, frames = set(wanted), []
    try:
        with av.open(path) as container:
            for i, frame in enumerate(container.decode(video=0)):
                if i > max(wanted, default=-1):
                    break
                if i in keep:
                    frames.append(frame.to_ndarray(format="rgb24"))
    except (av.FFmpegError, OSError) as err:
        raise ValueError(f"cannot decode video file {path}: {type(err).__name__}: {err}") from err
    if len(frames) != len(keep):
        raise ValueError(f"video file {path}: decoded {len(frames)} of the {len(keep)} frames asked for (its header "
                         f"says {metadata.total_num_frames})")
    metadata.frames_indices = wanted
    return np.stack(frames)[[sorted(keep).index(i) for i in wanted]], metadata


def _rgb(path: str) -> np.ndarray:
    with PIL.Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


def read_frames(paths: list[str], fps: float | None = None, sample_indices_fn=None
                ) -> tuple[np.ndarray, VideoMetadata]:
    """A video given as frame images: those at ``sample_indices_fn(metadata=...)`` (all when ``None``) read with
    PIL as RGB, ``uint8`` ``(T, H, W, 3)``, and metadata (``len(paths)`` frames at ``fps``, default
    :data:`FRAMES_FPS`; the first frame's size).

    Raises:
        ValueError: no path, a frame that cannot be read, or frames of different sizes (naming the file).
    """
    if not paths:
        raise ValueError("a video given as frames needs at least one frame")
    fps = FRAMES_FPS if fps is None else float(fps)
    try:
        with PIL.Image.open(paths[0]) as first:
            width, height = first.size
        metadata = VideoMetadata(total_num_frames=len(paths), fps=fps, duration=len(paths) / fps,
                                 video_backend="frames", height=height, width=width)
        wanted = _indices(sample_indices_fn, metadata)
        frames = [_rgb(paths[i]) for i in wanted]
    except (OSError, PIL.UnidentifiedImageError) as err:
        raise ValueError(f"cannot read a video frame: {type(err).__name__}: {err}") from err
    for i, frame in zip(wanted, frames):
        if frame.shape[:2] != (height, width):
            raise ValueError(f"video frame {paths[i]} is {frame.shape[1]}x{frame.shape[0]} px, the first frame "
                             f"{width}x{height}: a video's frames must have one size")
    metadata.frames_indices = wanted
    return np.stack(frames), metadata


def video_options(part: dict, where: str) -> dict:
    """The per-video options a row part (or row) gives (:data:`OPTIONS`, qwen-vl-utils' :data:`ALIASES`
    accepted), as numbers.

    Raises:
        ValueError: an option that is not a positive number, or both ``fps`` and ``num_frames``.
    """
    out = {}
    for key, value in part.items():
        name = ALIASES.get(key, key)
        if name not in OPTIONS or value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{where}: video option {key!r} must be a number > 0, got {value!r}")
        out[name] = OPTIONS[name](value)
    if "fps" in out and "num_frames" in out:
        raise ValueError(f"{where}: a video sets both 'fps' and 'num_frames'; give one")
    return out


def video_ref(value, base: str, where: str, options: dict | None = None) -> dict:
    """One video of a row as a reference (module docstring): a path (``file://`` dropped, relative to ``base``) to
    a file or a frame folder, or a list of frame paths; ``options`` as :func:`video_options` gives them.

    Raises:
        ValueError: a value of no video form, a path that names nothing, a folder without frames.
    """
    def full(path: str) -> str:
        return os.path.normpath(os.path.join(base, os.path.expanduser(path.removeprefix("file://"))))

    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) and v for v in value):
        frames = [full(v) for v in value]
        missing = [v for v, f in zip(value, frames) if not os.path.isfile(f)]
        if missing:
            raise ValueError(f"{where}: video frame {missing[0]!r} not found (looked for {full(missing[0])})")
        return {"frames": frames, **(options or {})}
    if not isinstance(value, str) or not value:
        raise ValueError(f"{where}: a video must be a file or folder path or a list of frame paths, got "
                         f"{value!r:.80}")
    path = full(value)
    if os.path.isdir(path):
        try:
            return {"frames": list_frames(path), **(options or {})}
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from err
    if not os.path.isfile(path):
        raise ValueError(f"{where}: video file {value!r} not found (looked for {path})")
    return {"path": path, **(options or {})}


def _sampler(ref: dict, video_processor):
    """``sample_indices_fn(metadata=...)`` of ``ref``: the processor's ``sample_frames`` with the ref's sampling
    options over the processor's defaults, at :data:`FPS` frames a second where none sets a rate or a count."""
    chosen = {k: ref[k] for k in SAMPLING if ref.get(k) is not None}
    if not any(x is not None for x in (chosen.get("fps"), chosen.get("num_frames"), video_processor.fps,
                                       getattr(video_processor, "num_frames", None))):
        chosen["fps"] = FPS
    return lambda metadata: video_processor.sample_frames(metadata, **chosen)


def _own_size(ref: dict, video_processor, height: int, width: int) -> tuple[int, int]:
    """The frame size ``(height, width)`` px after ``ref``'s own pixel budget (``smart_resize`` between its
    ``min_pixels`` and ``max_pixels``, each defaulting to the processor's ``size``); as it is without one."""
    if not (ref.get("min_pixels") or ref.get("max_pixels")):
        return height, width
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize
    size = video_processor.size
    return smart_resize(height, width, video_processor.patch_size * video_processor.merge_size,
                        min_pixels=ref.get("min_pixels") or size["shortest_edge"],
                        max_pixels=ref.get("max_pixels") or size["longest_edge"])


def load_video(ref: dict, video_processor, decoder: str = "pyav") -> tuple[np.ndarray, VideoMetadata]:
    """The video ``ref`` as its processor takes it (with ``do_sample_frames=False``): the sampled frames, ``uint8``
    ``(T, H, W, 3)``, resized to the ref's own pixel budget where it sets one (module docstring), and its metadata
    (the whole video's frames and fps, ``frames_indices`` the sampled ones). A file is decoded by ``decoder``
    (:data:`DECODERS`; ``data.video_decoder``), frames read with PIL.

    Raises:
        ValueError: the video cannot be decoded or sampled (naming the file).
        ImportError: ``decoder`` is ``torchcodec`` and it does not load (naming ``data.video_decoder``).
    """
    sampler = _sampler(ref, video_processor)
    if "frames" in ref:
        frames, metadata = read_frames(ref["frames"], ref.get("frames_fps"), sampler)
    else:
        frames, metadata = decode_video(ref["path"], sampler, decoder)
    height, width = _own_size(ref, video_processor, frames.shape[1], frames.shape[2])
    if (height, width) != frames.shape[1:3]:
        moved = torch.from_numpy(frames).permute(0, 3, 1, 2).contiguous()
        frames = resize_frames(moved, height, width, video_processor.resample).permute(0, 2, 3, 1).numpy()
    return np.ascontiguousarray(frames), metadata


def video_metadata(ref: dict) -> VideoMetadata:
    """``ref``'s metadata without decoding a frame: the file's header (:func:`probe_video`), or the frame count and
    the first frame's size.

    Raises:
        ValueError: the header or the first frame cannot be read.
    """
    if "path" in ref:
        return probe_video(ref["path"])
    fps = float(ref.get("frames_fps") or FRAMES_FPS)
    try:
        with PIL.Image.open(ref["frames"][0]) as first:
            width, height = first.size
    except (OSError, PIL.UnidentifiedImageError) as err:
        raise ValueError(f"cannot read video frame {ref['frames'][0]}: {err}") from err
    return VideoMetadata(total_num_frames=len(ref["frames"]), fps=fps, duration=len(ref["frames"]) / fps,
                         video_backend="frames", height=height, width=width)


def video_tokens(ref: dict, video_processor) -> int:
    """Tokens the video ``ref`` takes (``<|video_pad|>`` count) without decoding it: its frames sampled as
    :func:`load_video` samples them, sized by its own budget then the processor's
    (:meth:`~.video_processor.QwenVideoProcessor.tokens_for`).

    Raises:
        ValueError: :func:`video_metadata`'s, or the sampling's.
    """
    metadata = video_metadata(ref)
    frames = len(_sampler(ref, video_processor)(metadata))
    return video_processor.tokens_for(frames, *_own_size(ref, video_processor, metadata.height, metadata.width))


def video_layout(ref: dict, video_processor) -> tuple[tuple[int, int, int], VideoMetadata]:
    """``ref``'s grid ``(grid_t, grid_h, grid_w)`` and metadata (``frames_indices`` the sampled frames) without
    decoding it, as :func:`load_video` then the processor would give them (a processor with ``grid_for``:
    :class:`~mpipe_hf.families.qwen.qwen3_video_processor.Qwen3VideoProcessor`).

    Raises:
        ValueError: :func:`video_metadata`'s, or the sampling's.
    """
    metadata = video_metadata(ref)
    indices = [int(i) for i in _sampler(ref, video_processor)(metadata)]
    metadata.frames_indices = indices
    size = _own_size(ref, video_processor, metadata.height, metadata.width)
    return video_processor.grid_for(len(indices), *size), metadata
