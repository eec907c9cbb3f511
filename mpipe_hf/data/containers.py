"""The files and folders rows come in, each read with ``datasets`` (and cached by it): JSON (a list of rows, or one
row per line), JSONL, parquet, arrow, a ``Dataset.save_to_disk`` folder, and a local folder in the hub's layout.

A JSON or JSONL file is read as its text, one string per row (column :data:`JSON_COLUMN`), and each row is parsed
later, in the check (:mod:`.prepare`): one malformed line is then one bad row, named by its 1-based line, not a
failed load, and rows whose fields differ in type (a content that is a string in one row and a list of parts in the
next) never meet in one Arrow schema.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass

import datasets
import PIL.Image

JSON_COLUMN = "_json"
MEMORY_COLUMN = "_images_in_memory"  # a list of rows' in-memory images, each {"bytes", "path"} (as_container)
MEMORY_KEY = "_mpipe_image"  # {MEMORY_KEY: k} in a row's JSON text stands for the k-th of its MEMORY_COLUMN
EXTENSIONS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".arrow": "arrow"}


class EmptyFile(ValueError):
    """A JSON file with no row (an empty list)."""


@dataclass
class Container:
    """The raw rows of one source: ``rows`` (a ``datasets.Dataset``), its ``kind`` (``json``, ``json-list``,
    ``parquet``, ``arrow``, ``disk``, ``hub``) and the ``label`` rows are named by."""

    rows: datasets.Dataset
    kind: str
    label: str

    def where(self, index: int) -> str:
        """Row ``index`` (0-based) as a user finds it: ``file:LINE`` (1-based) in a JSONL (or a JSON file of one
        row per line), else ``file row INDEX`` (0-based, as ``datasets`` numbers rows)."""
        return f"{self.label}:{index + 1}" if self.kind == "json" else f"{self.label} row {index}"


def _json_list(path: str, stamp: tuple):
    """Rows of a JSON file holding one list, each as its JSON text (``stamp``, the file's size and mtime, is in
    the arguments so that ``datasets``' cache key changes with the file)."""
    del stamp
    with open(path, encoding="utf-8-sig") as f:  # utf-8-sig: a byte order mark is read as none
        rows = json.load(f)
    if not rows:
        raise EmptyFile("an empty JSON list (no row)")
    for row in rows:
        yield {JSON_COLUMN: json.dumps(row, ensure_ascii=False)}


def _first_char(path: str) -> str:
    """The first character of ``path`` that is not whitespace nor a byte order mark ("" for an empty file)."""
    with open(path, encoding="utf-8-sig") as f:
        while True:
            chunk = f.read(4096)
            if not chunk:
                return ""
            stripped = chunk.lstrip()
            if stripped:
                return stripped[0]


def _one_object(path: str) -> None:
    """Refuse a JSON file that holds one object over several lines (not a list, not one row per line), which
    would otherwise be read line by line as rows of JSON fragments.

    Raises:
        ValueError: the file's first line is not JSON but the whole file is one object (naming its keys).
    """
    with open(path, encoding="utf-8-sig") as f:
        first = f.readline()
    try:
        json.loads(first)
        return
    except json.JSONDecodeError:
        pass
    try:
        with open(path, encoding="utf-8-sig") as f:
            whole = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return  # a JSONL with a malformed first line: that line is one bad row
    if isinstance(whole, dict):
        lists = [key for key, value in whole.items() if isinstance(value, list)]
        hint = f"; its list-valued keys: {lists}, write the rows of one as a list" if lists else ""
        raise ValueError(f"{path}: one JSON object over several lines (keys {sorted(whole)[:10]}); a JSON file "
                         f"holds a list of rows ([...]) or one row per line{hint}")


def _undecodable_line(path: str) -> str:
    """The first line of ``path`` (1-based) that is not UTF-8, as ``line N``, or "" when none is."""
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as err:
                return f"line {number} ({err})"
    return ""


def _read_json(path: str) -> Container:
    try:
        first = _first_char(path)
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text, so not JSON or JSONL ({err}); a parquet or arrow file needs the "
                         f"extension .parquet or .arrow") from err
    if first == "":
        raise ValueError(f"{path}: the file is empty (no row)")
    if first == "[":  # one JSON list, pretty-printed or not
        stat = os.stat(path)
        try:
            rows = datasets.Dataset.from_generator(_json_list, features=datasets.Features(
                {JSON_COLUMN: datasets.Value("string")}), gen_kwargs={
                "path": path, "stamp": (stat.st_size, stat.st_mtime_ns)})
        except Exception as err:  # noqa: BLE001 - json's error, wrapped by datasets' generator
            cause = err.__cause__ or err
            if isinstance(cause, EmptyFile):
                raise ValueError(f"{path}: {cause}") from err
            raise ValueError(f"{path}: not a valid JSON list: {type(cause).__name__}: {cause}") from err
        return Container(rows, "json-list", path)
    if first == "{":
        _one_object(path)
    try:
        rows = datasets.load_dataset("text", data_files=path, split="train", keep_linebreaks=False)
    except Exception as err:  # noqa: BLE001 - datasets wraps the reader's error (a byte that is not UTF-8)
        cause = err.__cause__ or err
        line = _undecodable_line(path) if isinstance(cause, UnicodeDecodeError) else ""
        raise ValueError(f"{path}: cannot read it as JSONL" + (f": {line} is not UTF-8 text" if line else
                                                               f": {type(cause).__name__}: {cause}")) from err
    return Container(rows.rename_column("text", JSON_COLUMN), "json", path)


def _decode_free(rows: datasets.Dataset) -> datasets.Dataset:
    """``rows`` with every image column (``datasets.Image``, alone or in a list) read as ``{"bytes", "path"}``:
    nothing is decoded until a micro-batch's owner opens it."""
    for name, feature in rows.features.items():
        inner = getattr(feature, "feature", None)
        if isinstance(feature, datasets.Image) and feature.decode:
            rows = rows.cast_column(name, datasets.Image(decode=False))
        elif isinstance(inner, datasets.Image) and inner.decode:
            rows = rows.cast_column(name, datasets.List(datasets.Image(decode=False)))
    return rows


def _read_folder(path: str, split: str) -> Container:
    kind = "disk" if any(os.path.isfile(os.path.join(path, name)) for name in ("state.json", "dataset_dict.json")) \
        else "hub"
    try:
        loaded = datasets.load_from_disk(path) if kind == "disk" else datasets.load_dataset(path)
    except Exception as err:  # noqa: BLE001 - datasets' errors name neither the folder's role nor the fix
        cause = err.__cause__ or err
        raise ValueError(f"{path}: cannot read it as a {'save_to_disk' if kind == 'disk' else 'hub-layout'} "
                         f"folder: {type(cause).__name__}: {cause}") from err
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise ValueError(f"{path}: no split {split!r}; it has {sorted(loaded)} (data.split)")
        loaded = loaded[split]
    return Container(_decode_free(loaded), kind, path)


def _lift_images(value, images: list):
    """``value`` (a row, or a part of one) with each image held in memory (a PIL image, bytes, or a
    ``{"bytes", "path"}`` mapping with bytes) replaced by ``{MEMORY_KEY: k}``, the image appended to ``images`` as
    ``{"bytes", "path"}`` (``datasets.Image``'s encoding: a PIL image opened from a file keeps its path)."""
    if isinstance(value, (PIL.Image.Image, bytes, bytearray)) or (
            isinstance(value, Mapping) and isinstance(value.get("bytes"), (bytes, bytearray))):
        encoded = datasets.Image().encode_example(bytes(value) if isinstance(value, bytearray) else value)
        images.append({"bytes": encoded.get("bytes"), "path": encoded.get("path")})
        return {MEMORY_KEY: len(images) - 1}
    if isinstance(value, Mapping):
        return {key: _lift_images(item, images) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_lift_images(item, images) for item in value]
    return value


def restore_images(value, images: list):
    """``value`` (a row parsed from its JSON text) with each ``{MEMORY_KEY: k}`` back as ``images[k]``."""
    if isinstance(value, dict):
        if len(value) == 1 and MEMORY_KEY in value:
            return images[value[MEMORY_KEY]]
        return {key: restore_images(item, images) for key, item in value.items()}
    if isinstance(value, list):
        return [restore_images(item, images) for item in value]
    return value


def _object_rows(rows, label: str) -> list:
    """The rows of a dataset object that is not a ``datasets.Dataset``, as a list.

    Raises:
        ValueError: an ``IterableDataset``, a ``DatasetDict``, a mapping of columns, or an object without ``len``
            and integer indexing.
    """
    if isinstance(rows, (datasets.IterableDataset, datasets.IterableDatasetDict)):
        raise ValueError(f"{label}: an IterableDataset (streaming) has no length; load it with streaming=False or "
                         f"pass its file")
    if isinstance(rows, (datasets.DatasetDict, Mapping)):
        raise ValueError(f"{label}: a DatasetDict or mapping, not rows; pass one split (dataset['train']), a "
                         f"datasets.Dataset or a list of rows")
    if not hasattr(rows, "__len__") or not hasattr(rows, "__getitem__"):
        raise ValueError(f"{label}: {type(rows).__name__} is not a dataset; pass a datasets.Dataset, a list of "
                         f"rows (mappings), or a file or folder path")
    return [rows[i] for i in range(len(rows))]


def _plain(value):
    """A numpy (or torch) scalar or array as the Python value JSON writes (a pandas frame's rows hold them).

    Raises:
        TypeError: ``value`` has no ``tolist``.
    """
    if callable(getattr(value, "tolist", None)):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def as_container(rows, label: str = "train_dataset") -> Container:
    """The rows of a dataset object as a container: a ``datasets.Dataset`` as it is (its image columns read
    without decoding), or a list of row mappings (or anything with ``len`` and indexing) as a dataset of their
    JSON texts, each image held in memory (PIL, bytes) set apart in a column of its own (:func:`_lift_images`),
    so rows whose fields differ in type (a content that is a string in one message and a list of parts in
    another) never meet in one Arrow schema.

    Raises:
        ValueError: an object that holds no rows (:func:`_object_rows`); rows with values JSON cannot write
            (other than images) that also differ in their fields' types.
    """
    if isinstance(rows, datasets.Dataset):
        return Container(_decode_free(rows), "dataset", label)
    listed = _object_rows(rows, label)
    images = [[] for _ in listed]
    try:
        texts = [json.dumps(_lift_images(row, images[i]), ensure_ascii=False, default=_plain)
                 for i, row in enumerate(listed)]
    except TypeError:  # values JSON cannot write (dates, ...): the rows go into Arrow as they are
        try:
            return Container(_decode_free(datasets.Dataset.from_list(listed)), "dataset", label)
        except Exception as err:  # noqa: BLE001 - pyarrow's type errors
            raise ValueError(f"{label}: its rows differ in their fields' types ({err}); pass a datasets.Dataset or "
                             f"a file") from err
    columns, features = {JSON_COLUMN: texts}, {JSON_COLUMN: datasets.Value("string")}
    if any(images):
        columns[MEMORY_COLUMN] = images
        features[MEMORY_COLUMN] = datasets.List({"bytes": datasets.Value("binary"), "path": datasets.Value("string")})
    return Container(datasets.Dataset.from_dict(columns, features=datasets.Features(features)), "json-list", label)


def read_container(path: str, split: str = "train") -> Container:
    """The raw rows of ``path`` (module docstring for the forms).

    Raises:
        ValueError: ``path`` does not exist, a file of no known extension (:data:`EXTENSIONS`), a JSON file that is
            not UTF-8 or not a valid list, a folder without the split.
    """
    if os.path.isdir(path):
        return _read_folder(path, split)
    if not os.path.isfile(path):
        raise ValueError(f"data file {path!r} not found")
    kind = EXTENSIONS.get(os.path.splitext(path)[1].lower())
    if kind is None:
        raise ValueError(f"{path}: unknown data file type; known: {sorted(EXTENSIONS)}, a save_to_disk folder or a "
                         f"hub-layout folder")
    if kind == "json":
        return _read_json(path)
    try:
        rows = datasets.load_dataset(kind, data_files=path, split="train")
    except Exception as err:  # noqa: BLE001 - datasets wraps pyarrow's error on a damaged file
        cause = err.__cause__ or err
        raise ValueError(f"{path}: cannot read it as {kind}: {type(cause).__name__}: {cause}") from err
    return Container(_decode_free(rows), kind, path)
