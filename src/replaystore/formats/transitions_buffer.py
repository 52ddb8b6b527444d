"""The ``buffer.json`` of a memory-mapped transitions buffer, read without torch.

:class:`~replaystore.transitions.storage.MemmapStorage` keeps a buffer in a directory:
one raw little-endian column file per field (``<generation>-<i>.bin``, ``capacity``
rows each), ``priorities.bin`` (float64, one per row) for a prioritized sampler, and
``buffer.json`` (:data:`META_NAME`), replaced atomically on every flush, naming them:

* ``format`` (:data:`MEMMAP_FORMAT`), ``capacity``, ``size``, ``pointer``, ``generation``;
* ``fields``: ``name``, ``shape``, ``dtype`` and ``file`` of each column;
* ``priorities`` (prioritized buffers): ``file`` and ``max_priority``.

:func:`read_buffer_meta` is the one reader of that file (the buffer reopening its
directory, and the viewer); :func:`read_priorities` reads the priorities file;
:func:`read_summary` is what ``replaystore stats`` prints. The file names a summary
opens are confined to the buffer's directory
(:func:`~replaystore.formats.transitions_checkpoint.confine_name`). Nothing here writes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from replaystore.errors import CheckpointError
from replaystore.formats.transitions_checkpoint import confine_name

__all__ = [
    "MEMMAP_FORMAT",
    "META_NAME",
    "PRIORITIES_NAME",
    "read_buffer_meta",
    "read_priorities",
    "read_summary",
]

#: The ``format`` of every ``buffer.json`` replaystore writes.
MEMMAP_FORMAT = "replaystore.transitions.memmap/1"
#: The metadata file of a memory-mapped buffer's directory.
META_NAME = "buffer.json"
#: The priorities file of a prioritized buffer (float64, one per row of the ring).
PRIORITIES_NAME = "priorities.bin"


def read_buffer_meta(directory: Path) -> dict[str, Any] | None:
    """The committed ``buffer.json`` of a memmap directory, or None if there is none.

    Raises:
        CheckpointError: the file exists but is not ours or is malformed.
    """
    path = directory / META_NAME
    if not path.exists():
        return None
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from exc
    if not isinstance(meta, dict) or meta.get("format") != MEMMAP_FORMAT:
        raise CheckpointError(f"{path} is not a replaystore memmap buffer ({MEMMAP_FORMAT})")
    return meta


def read_priorities(directory: Path, capacity: int) -> NDArray[np.float64]:
    """The priorities file of a memmap directory (float64, ``capacity`` values).

    Raises:
        CheckpointError: the file holds another number of values.
        OSError: it cannot be read.
    """
    path = directory / PRIORITIES_NAME
    data = np.fromfile(path, dtype="<f8")
    if data.size != capacity:
        raise CheckpointError(f"{path} holds {data.size} priorities, expected {capacity}")
    return data


def read_summary(directory: Path) -> dict[str, Any]:
    """What ``replaystore stats`` shows of the buffer in ``directory``: ``path``,
    ``format``, ``buffer_size`` (capacity), ``data_size``, ``pointer``, ``prioritized``,
    ``fields`` (``name``, ``dtype``, ``shape``) and ``file_bytes`` (the column files').

    Raises:
        CheckpointError: ``buffer.json`` is not JSON, lacks ``capacity``, ``size`` or
            ``pointer``, or names a column file outside ``directory``.
        OSError: it cannot be read.

    Cost: one small JSON read and a ``stat`` per column file.
    """
    where = directory / META_NAME
    try:
        meta = json.loads(where.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{where} is not valid JSON: {exc}") from None
    if not isinstance(meta, dict) or not {"capacity", "size", "pointer"} <= meta.keys():
        raise CheckpointError(f"{where} is not a memory-mapped transitions buffer")
    fields = meta.get("fields") or []
    files = [
        confine_name(directory, f["file"], where, "column file") for f in fields if "file" in f
    ]
    return {
        "path": str(directory.resolve()),
        "format": meta.get("format"),
        "buffer_size": meta["capacity"],
        "data_size": meta["size"],
        "pointer": meta["pointer"],
        "prioritized": "priorities" in meta,
        "fields": [
            {"name": f.get("name"), "dtype": f.get("dtype"), "shape": f.get("shape")}
            for f in fields
        ],
        "file_bytes": sum(f.stat().st_size for f in files if f.is_file()),
    }
