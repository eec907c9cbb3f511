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
from dataclasses import dataclass

import datasets

JSON_COLUMN = "_json"
EXTENSIONS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".arrow": "arrow"}


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
    with open(path, encoding="utf-8") as f:
        rows = json.load(f)
    for row in rows:
        yield {JSON_COLUMN: json.dumps(row, ensure_ascii=False)}


def _first_char(path: str) -> str:
    """The first character of ``path`` that is not whitespace ("" for an empty file)."""
    with open(path, encoding="utf-8") as f:
        while True:
            chunk = f.read(4096)
            if not chunk:
                return ""
            stripped = chunk.lstrip()
            if stripped:
                return stripped[0]


def _read_json(path: str) -> Container:
    try:
        first = _first_char(path)
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text, so not JSON or JSONL ({err}); a parquet or arrow file needs the "
                         f"extension .parquet or .arrow") from err
    if first == "[":  # one JSON list, pretty-printed or not
        stat = os.stat(path)
        try:
            rows = datasets.Dataset.from_generator(_json_list, gen_kwargs={
                "path": path, "stamp": (stat.st_size, stat.st_mtime_ns)})
        except Exception as err:  # noqa: BLE001 - json's error, wrapped by datasets' generator
            cause = err.__cause__ or err
            raise ValueError(f"{path}: not a valid JSON list: {type(cause).__name__}: {cause}") from err
        return Container(rows, "json-list", path)
    rows = datasets.load_dataset("text", data_files=path, split="train", keep_linebreaks=False)
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
    if os.path.isfile(os.path.join(path, "state.json")) or os.path.isfile(os.path.join(path, "dataset_dict.json")):
        loaded, kind = datasets.load_from_disk(path), "disk"
    else:
        loaded, kind = datasets.load_dataset(path), "hub"
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise ValueError(f"{path}: no split {split!r}; it has {sorted(loaded)} (data.split)")
        loaded = loaded[split]
    return Container(_decode_free(loaded), kind, path)


def as_container(rows, label: str = "train_dataset") -> Container:
    """The rows of a dataset object as a container: a ``datasets.Dataset`` as it is (its image columns read
    without decoding), or a list of row mappings (or anything with ``len`` and indexing) as a dataset of its JSON
    texts, or, where a row holds images in memory, of the rows themselves.

    Raises:
        ValueError: a list whose rows hold images in memory and differ in their fields' types.
    """
    if isinstance(rows, datasets.Dataset):
        return Container(_decode_free(rows), "dataset", label)
    listed = [rows[i] for i in range(len(rows))]
    try:
        texts = [json.dumps(row, ensure_ascii=False) for row in listed]
    except TypeError:  # images in memory (PIL, bytes): the rows go into Arrow as they are
        try:
            return Container(_decode_free(datasets.Dataset.from_list(listed)), "dataset", label)
        except Exception as err:  # noqa: BLE001 - pyarrow's type errors
            raise ValueError(f"{label}: its rows differ in their fields' types ({err}); pass a datasets.Dataset or "
                             f"a file") from err
    return Container(datasets.Dataset.from_dict({JSON_COLUMN: texts}), "json-list", label)


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
    rows = datasets.load_dataset(kind, data_files=path, split="train")
    return Container(_decode_free(rows), kind, path)
