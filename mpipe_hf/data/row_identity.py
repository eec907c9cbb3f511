"""What a dataset row is, apart from its index: a digest of its content and of the files it names, so that a
remembered failed row (:meth:`~.owner.MicroBatchPlan.remember`) is recognised after a resume only when it is still
the same row, never when the data changed under the same index (another dataset, an edited file, another mixture,
a mended image).
"""

from __future__ import annotations

import hashlib
import json
import os


def row_digest(dataset, index: int) -> str:
    """A hex digest of row ``index`` of ``dataset``: its stored content where the dataset keeps its rows in a
    ``datasets.Dataset`` (``dataset.rows``: a :class:`~.conversation.ConversationDataset`, whose image paths are
    not opened for this), else of ``dataset[index]``; each string that names a file adds that file's size and
    modification time, so a mended image makes another row. A row that cannot be read is digested as the kind of
    error it raises (it stays the same row while it keeps failing that way)."""
    import datasets
    rows = getattr(dataset, "rows", None)
    digest = hashlib.sha256()
    try:
        _feed(digest, rows[int(index)] if isinstance(rows, datasets.Dataset) else dataset[index])
    except Exception as err:  # noqa: BLE001 - a row that cannot even be read is known by how it fails
        return hashlib.sha256(f"unreadable {type(err).__name__}".encode()).hexdigest()
    return digest.hexdigest()


def _feed(digest, value) -> None:
    """Add ``value`` to ``digest`` in a form that does not depend on the process (no object addresses)."""
    if isinstance(value, dict):
        digest.update(b"{")
        for key in sorted(value, key=str):
            _feed(digest, str(key))
            _feed(digest, value[key])
        digest.update(b"}")
    elif isinstance(value, (list, tuple)):
        digest.update(b"[")
        for item in value:
            _feed(digest, item)
        digest.update(b"]")
    elif isinstance(value, (bytes, bytearray)):
        digest.update(b"b%d:" % len(value) + bytes(value))
    elif isinstance(value, str):
        digest.update(json.dumps(value).encode())
        if len(value) < 4096 and os.path.isfile(value):
            stat = os.stat(value)
            digest.update(f"<file {stat.st_size} {stat.st_mtime_ns}>".encode())
    elif value is None or isinstance(value, (bool, int, float)):
        digest.update(json.dumps(value).encode())
    elif hasattr(value, "tobytes") and hasattr(value, "size"):  # a PIL image, a numpy array
        digest.update(f"<{type(value).__name__} {getattr(value, 'mode', '')} {value.size}>".encode())
        digest.update(value.tobytes())
    elif hasattr(value, "numpy") and hasattr(value, "shape"):  # a tensor
        _feed(digest, value.detach().cpu().numpy())
    else:  # an object of another kind: its type only (the row is then told apart by its other fields)
        digest.update(f"<{type(value).__module__}.{type(value).__qualname__}>".encode())
