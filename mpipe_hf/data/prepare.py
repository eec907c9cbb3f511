"""Every row checked, rendered and counted once, in parallel, and cached: the work between a source's raw rows
(:mod:`.containers`) and the rows a run trains on.

:func:`prepare` maps :class:`RowCheck` over the rows with ``datasets.map`` (``num_proc`` processes) and keeps the
result under the ``datasets`` cache (``HF_DATASETS_CACHE/mpipe_hf/<key>``), written to a temporary folder and
renamed: the key is a hash of the raw rows' ``datasets`` fingerprint, the settings (layout, image folder,
``max_length``, the processor's tokenizer, template and image processor, whether images are decoded) and this
package's data code and the family's folder (``mpipe_hf/families/<group>``), so a second run, or a second rank of
the node, reads the result at once. The key does not see the image files, so a cached row that failed for an image
is checked again on each read (:func:`_still_holds`). Each row gets:

- ``where``: the file and 1-based line, or the file and row index (:meth:`~.containers.Container.where`);
- ``status``: ``blank`` (a blank line), ``ok``, ``cut`` (longer than ``max_length``, cut there), ``dropped`` (the
  cut would go through an image's tokens, or leave no assistant token) or ``bad``, with ``error`` the reason;
- ``messages``, ``images`` (references, :func:`~.layouts.image_ref`), ``videos`` (each a video reference,
  :func:`~.video.video_ref`, as JSON), ``text`` (the ``text`` layout), and ``num_images``, ``num_videos``,
  ``num_tokens`` (before the cut, images and videos expanded), ``image_tokens`` (from the image headers) and
  ``video_tokens`` (from the video headers, :func:`~.video.video_tokens`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid

import datasets

from .budgets import RowCaps, cap_row
from .collate import IGNORE
from .containers import JSON_COLUMN, MEMORY_COLUMN, Container, restore_images
from .conversation_encoder import ConversationEncoder
from .conversation_rows import canonical_messages
from .layouts import conversation, conversation_videos, detect, image_ref, read_image
from .video import load_video, video_ref

FEATURES = datasets.Features({
    "where": datasets.Value("string"),
    "status": datasets.Value("string"),
    "error": datasets.Value("string"),
    "messages": datasets.List({"role": datasets.Value("string"),
                               "content": datasets.List({"type": datasets.Value("string"),
                                                         "text": datasets.Value("string")})}),
    # a plain struct, not datasets.Image: an Image column would copy every image file's bytes into the cache
    "images": datasets.List({"bytes": datasets.Value("binary"), "path": datasets.Value("string")}),
    "text": datasets.Value("string"),
    "num_images": datasets.Value("int64"),
    "num_tokens": datasets.Value("int64"),
    "image_tokens": datasets.Value("int64"),
    "videos": datasets.List(datasets.Value("string")),  # video references (.video.video_ref) as JSON: options vary
    "num_videos": datasets.Value("int64"),
    "video_tokens": datasets.Value("int64"),
    "visual": datasets.Value("string"),  # .budgets.RowBudget.metadata as JSON: per item tokens, resizes, caps over
})
CODE = ("layouts.py", "containers.py", "prepare.py", "conversation_rows.py", "conversation_encoder.py",
        "templates.py", "processor.py", "markers.py", "stock_classes.py", "family_data.py", "image_torch_ops.py",
        "video.py", "video_processor.py", "budgets.py")


def raw_row(container: Container, row: dict, index: int) -> dict:
    """Row ``index`` of ``container`` as a mapping (a JSON row parsed).

    Returns:
        the row, or ``None`` for a blank line.

    Raises:
        ValueError: a JSON row that does not parse (naming its line).
    """
    if JSON_COLUMN not in row:
        return {key: row[key] for key in row.keys()}  # datasets' map hands a lazy row, not a dict
    text = row[JSON_COLUMN].removeprefix("\ufeff")  # a byte order mark (a file's, or one of files joined)
    if not text.strip():
        return None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{container.where(index)}: malformed JSON: {err}") from err
    return restore_images(obj, row[MEMORY_COLUMN]) if MEMORY_COLUMN in row.keys() else obj


def detect_layout(container: Container, limit: int = 100) -> str:
    """The layout of the first row of ``container`` that parses (of the first ``limit``).

    Raises:
        ValueError: no such row, or its keys fit no layout (:func:`~.layouts.detect`).
    """
    last = None
    for index in range(min(limit, len(container.rows))):
        try:
            row = raw_row(container, container.rows[index], index)
        except ValueError as err:
            last = err
            continue
        if row is not None:
            return detect(row, container.where(index))
    raise ValueError(f"{container.label}: no row to tell the layout from" + (f" ({last})" if last else ""))


class RowCheck:
    """One row checked and counted (module docstring for the output), picklable for ``datasets.map``'s
    processes.

    Args:
        container: the rows' container (their names); layout: as :func:`~.layouts.conversation`, ``text``, or
            ``auto`` (each conversation row's own, :func:`~.layouts.detect`).
        base: the folder relative image paths are taken from.
        processor: the HF processor, or a tokenizer. max_length: the cut (``None``: none).
        model_type, chat_template: as :class:`~.conversation_encoder.ConversationEncoder`.
        decode: decode every image (``mpipe-hf check-data``), not only its header.
        caps: the per-row visual caps (:func:`~.budgets.cap_row`; ``None``: none but counting).
    """

    def __init__(self, container: Container, layout: str, base: str, processor, max_length: int | None,
                 model_type: str | None, chat_template: str | None = None, decode: bool = False,
                 caps: RowCaps | None = None):
        self.names, self.layout, self.base = Container(None, container.kind, container.label), layout, base
        self.processor, self.max_length, self.decode = processor, max_length, decode
        self.model_type, self.chat_template, self._encoder = model_type, chat_template, None
        self.caps = caps

    def __getstate__(self):
        return {**self.__dict__, "_encoder": None}

    def __call__(self, row: dict, index: int) -> dict:
        where = self.names.where(index)
        out = {"where": where, "status": "ok", "error": "", "messages": [], "images": [], "text": None,
               "num_images": 0, "num_tokens": 0, "image_tokens": 0, "videos": [], "num_videos": 0, "video_tokens": 0,
               "visual": ""}
        try:
            self._check(row, index, where, out)
        except ValueError as err:
            text = str(err)
            out.update(status="bad", error=text.removeprefix(f"{where}: "), messages=[], images=[], text=None,
                       videos=[])
        return out

    def _check(self, row: dict, index: int, where: str, out: dict) -> None:
        obj = raw_row(self.names, row, index)
        if obj is None:  # a blank line of a JSONL: no row
            out["status"] = "blank"
            return
        if self.layout == "text":
            text = obj.get("text") if isinstance(obj, dict) else None
            if not isinstance(text, str) or not text.strip():
                raise ValueError(f"{where}: a text row needs a non-empty string 'text'")
            out.update(text=text, num_tokens=len(self.processor(text)["input_ids"]))
            if self.max_length is not None and out["num_tokens"] > self.max_length:
                out["status"] = "cut"  # the text collator cuts it at max_length
            return
        layout = detect(obj, where) if self.layout == "auto" else self.layout
        if layout == "text":
            raise ValueError(f"{where}: a text row among conversations; a run reads one or the other")
        messages, images = conversation(obj, layout, where, videos=True)
        videos = conversation_videos(obj, messages, where)
        canonical = canonical_messages(messages, len(images), where, len(videos))
        refs = [image_ref(image, self.base, where) for image in images]
        clips = [video_ref(source, self.base, where, options) for source, options in videos]
        encoder = self._encoder or ConversationEncoder(self.processor, self.chat_template, self.model_type)
        self._encoder = encoder
        if (refs or clips) and not encoder.vision:
            raise ValueError(f"{where}: the row has images or videos but {type(self.processor).__name__} is a "
                             f"tokenizer, not a vision-language processor")
        budget, video_counts = self._capped(encoder, refs, clips, where)
        sizes, clips = budget.sizes, budget.clips
        try:
            expansions = encoder.image_replacements_for_sizes(sizes)
        except ValueError as err:  # the processor's own limits (an aspect ratio past 200, say)
            raise ValueError(f"{where}: the image processor rejects an image: {err}") from err
        enc = encoder.encode(canonical, expansions, where, video_counts)
        if not any(label != IGNORE for label in enc.labels):
            raise ValueError(f"{where}: the assistant turns render to no token (nothing to learn)")
        status, limit = "ok", self.max_length
        if limit is not None and len(enc.ids) > limit:
            status = "cut"
            if enc.image_spans and enc.image_spans[-1][1] > limit:
                status, out["error"] = "dropped", f"max_length={limit} would cut through an image's tokens"
            elif all(label == IGNORE for label in enc.labels[:limit]):
                status, out["error"] = "dropped", f"every assistant token lies past max_length={limit}"
        status, out["error"] = ("dropped", budget.error) if budget.error else (status, out["error"])
        parts = [{"role": m["role"], "content": [{"type": p["type"], "text": p.get("text")} for p in m["content"]]}
                 for m in canonical]
        visual = sum(end - start for start, end in enc.image_spans)
        video = sum(end - start for start, end in enc.video_spans)
        out.update(status=status, messages=parts, images=refs, num_images=len(refs), num_tokens=len(enc.ids),
                   image_tokens=visual - video, videos=[json.dumps(clip) for clip in clips],
                   num_videos=len(clips), video_tokens=video, visual=json.dumps(budget.metadata(enc)))

    def _capped(self, encoder: ConversationEncoder, refs: list[dict], clips: list[dict], where: str):
        """``(budget, video tokens)``: the row's images (read to their headers, or decoded) and videos under the
        caps (:func:`~.budgets.cap_row`), and each capped video's tokens (:meth:`_videos`)."""
        budget = cap_row(self.caps, encoder, [read_image(ref, where, self.decode) for ref in refs], clips, where)
        return budget, self._videos(encoder, budget.clips, where)

    def _videos(self, encoder: ConversationEncoder, clips: list[dict], where: str) -> list[int]:
        """Tokens each of a row's videos ``clips`` takes, from its header (with ``decode``, every sampled frame
        decoded too, as the collator decodes it).

        Raises:
            ValueError: naming ``where``: videos for a processor without a video processor
                (:meth:`~.conversation_encoder.ConversationEncoder.video_tokens_for`), a video that cannot be read
                or sampled.
        """
        if not clips:
            return []
        if encoder.video_token is None:
            raise ValueError(f"{where}: the row has {len(clips)} video(s) but {type(self.processor).__name__} takes "
                             f"no videos (docs/video.md lists the families that do)")
        try:
            counts = encoder.video_tokens_for(clips)
            for clip in clips if self.decode else []:
                load_video(clip, self.processor.video_processor)
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from err
        return counts


def _signature(processor, chat_template: str | None) -> dict:
    """What of the processor the rendered tokens depend on."""
    tokenizer = getattr(processor, "tokenizer", processor)
    image, video = getattr(processor, "image_processor", None), getattr(processor, "video_processor", None)
    return {"class": type(processor).__name__, "tokenizer": getattr(tokenizer, "name_or_path", ""),
            "vocab": len(tokenizer), "template": chat_template or getattr(processor, "chat_template", None),
            "image_processor": image.to_json_string() if image is not None else None,
            "video_processor": None if video is None else json.dumps(video.to_dict(), sort_keys=True, default=str)}


def cache_key(container: Container, check: RowCheck) -> str:
    """The cache key of ``check`` over ``container``'s rows (module docstring)."""
    from ..families.registry import group_of
    here = os.path.dirname(__file__)
    paths = [os.path.join(here, name) for name in CODE]
    group = group_of(check.model_type) if check.model_type else None
    if group is not None:  # the family's own data path: its group's folder
        folder = os.path.join(os.path.dirname(here), "families", group)
        paths += sorted(os.path.join(folder, name) for name in os.listdir(folder) if name.endswith(".py"))
    code = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            code.update(f.read())
    settings = {"rows": container.rows._fingerprint, "kind": container.kind, "label": container.label,
                "layout": check.layout, "base": check.base, "max_length": check.max_length,
                "model_type": check.model_type, "decode": check.decode, "code": code.hexdigest(), "caps": check.caps,
                "processor": _signature(check.processor, check.chat_template)}
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:32]


def cache_root() -> str:
    """Where prepared rows are kept: ``HF_DATASETS_CACHE/mpipe_hf``."""
    return os.path.join(str(datasets.config.HF_DATASETS_CACHE), "mpipe_hf")


IMAGE_ERRORS = ("image file ", "cannot decode image", "cannot read image", "the image processor rejects",
                "video file ", "cannot read video", "cannot decode video", "cannot read a video frame",
                "video frame ")


def _still_holds(container: Container, check: RowCheck, done: datasets.Dataset) -> bool:
    """Whether the cached rows ``done`` still hold: the key sees the rows, not their image files, so each row that
    failed for an image (a file missing, undecodable, rejected: since added or replaced, perhaps) is checked
    again and must fail the same way. Rows that passed are not read again (an image broken since costs its row
    at run time, :mod:`.owner`)."""
    table = done.with_format("arrow")
    status, errors = table["status"].to_pylist(), table["error"].to_pylist()
    for index, (state, error) in enumerate(zip(status, errors)):
        if state == "bad" and any(mark in error for mark in IMAGE_ERRORS):
            again = check(container.rows[index], index)
            if again["status"] != "bad" or again["error"] != error:
                return False
    return True


def as_checked(container: Container, check: RowCheck, done: datasets.Dataset) -> datasets.Dataset:
    """The rows ``done`` that a stricter check of the same rows cached (``mpipe-hf check-data``'s, every image
    decoded) as ``check`` gives them: each row that failed there for an image is checked again with ``check``
    and takes its result (a truncated file fails a decode, not a header read), so that a run keeps the same rows,
    in the same order, whether or not ``check-data`` ran first. Every other row is the same under
    either check. Returns ``done`` itself when no row changes, else the rows in memory."""
    table = done.with_format("arrow")
    status, errors = table["status"].to_pylist(), table["error"].to_pylist()
    changed = {}
    for index, (state, error) in enumerate(zip(status, errors)):
        if state == "bad" and any(mark in error for mark in IMAGE_ERRORS):
            again = check(container.rows[index], index)
            if again["status"] != "bad" or again["error"] != error:
                changed[index] = again
    if not changed:
        return done
    return done.map(lambda row, index: changed.get(index, row), with_indices=True, features=FEATURES,
                    keep_in_memory=True, desc="rows of the decoded check")


def prepare(container: Container, check: RowCheck, num_proc: int | None = None, reuse: tuple[RowCheck, ...] = ()
            ) -> datasets.Dataset:
    """Every row of ``container`` through ``check`` (module docstring), read from the cache when it is there
    (under ``check``'s key when it still holds, :func:`_still_holds`; else under the key of a check in
    ``reuse``, a stricter check of the same rows, whose rows :func:`as_checked` gives as ``check`` would), else
    computed with ``num_proc`` processes (``None``: up to 8, at most the machine's cores) and cached.

    Returns:
        a ``datasets.Dataset`` with the columns of :data:`FEATURES`, one row per raw row, in order.
    """
    key = cache_key(container, check)
    folder = os.path.join(cache_root(), key)
    for checker in (check,) + tuple(reuse):
        cached = os.path.join(cache_root(), cache_key(container, checker))
        if os.path.isfile(os.path.join(cached, "state.json")):
            done = datasets.load_from_disk(cached)
            if checker is not check:  # a stricter check's rows, as this check gives them
                return as_checked(container, check, done)
            if _still_holds(container, checker, done):
                return done
            _set_aside(folder)  # out of date: set aside, so that the new rows can take its place
    procs = num_proc or max(1, min(8, os.cpu_count() or 1))
    procs = max(1, min(procs, len(container.rows) // 256 or 1))  # at least 256 rows a process
    staging = f"{folder}.tmp-{uuid.uuid4().hex}"
    on_disk = bool(container.rows.cache_files)  # else rows in memory (a list given to the trainer): no cache
    try:
        with _quiet():  # on disk, the map writes its shards into the staging folder, not into memory
            done = container.rows.map(
                check, with_indices=True, num_proc=procs if procs > 1 else None, features=FEATURES,
                remove_columns=container.rows.column_names, keep_in_memory=not on_disk,
                cache_file_name=os.path.join(staging, "map", "rows.arrow") if on_disk else None,
                desc=f"checking {os.path.basename(container.label)}")
        if not on_disk:
            return done
        done.save_to_disk(os.path.join(staging, "rows"))
        try:
            os.replace(os.path.join(staging, "rows"), folder)
        except OSError:  # another process of the node wrote it first: theirs is the same
            pass
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return datasets.load_from_disk(folder)


def _set_aside(folder: str) -> None:
    """Remove the cache ``folder`` (renamed first, so that no process finds it half removed)."""
    trash = f"{folder}.old-{uuid.uuid4().hex}"
    try:
        os.replace(folder, trash)
    except OSError:  # another process set it aside first
        return
    shutil.rmtree(trash, ignore_errors=True)


class _quiet:
    """A context in which ``datasets`` shows no progress bars on processes other than the first of a node."""

    def __enter__(self):
        self.was = datasets.utils.logging.is_progress_bar_enabled()
        if int(os.environ.get("LOCAL_RANK", 0)) != 0:
            datasets.utils.logging.disable_progress_bar()

    def __exit__(self, *exc):
        if self.was:
            datasets.utils.logging.enable_progress_bar()
