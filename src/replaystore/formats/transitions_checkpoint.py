"""The metadata of a transitions checkpoint, read without torch, its file names confined.

``ReplayBuffer.save(prefix)`` (:mod:`replaystore.transitions.checkpoint`) writes
``<prefix>.metadata`` (JSON) and the data directory it names,
``<prefix>.data-<32 hex digits>/``, holding one ``<n>.bin`` column file per field
and ``priorities.bin`` for a prioritized sampler. ObjectRL's ``save`` writes a
metadata-only file: three counters (``buffer_size``, ``data_size``,
``pointer``), as JSON or ``torch.save`` (a zip archive; read by
:func:`~replaystore.transitions.checkpoint.read_objectrl_metadata`).

:func:`read_checkpoint_meta` is the one reader of that JSON for ``replaystore
stats`` and the viewer. The names it joins onto the checkpoint's directory come
from the file, so they are confined: no absolute path, no ``..``, no directory
separator, and the resolved path (symlinks followed) must lie inside the
checkpoint's directory; anything else is refused with a
:class:`~replaystore.errors.CheckpointError`, so a crafted checkpoint cannot make
a reader open another file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replaystore.errors import CheckpointError

__all__ = [
    "FORMAT_PREFIX",
    "OBJECTRL_KEYS",
    "CheckpointFile",
    "CheckpointMeta",
    "confine_name",
    "is_zip_archive",
    "read_checkpoint_meta",
]

#: Every replaystore checkpoint's ``format`` starts with this (then the version).
FORMAT_PREFIX = "replaystore.transitions.checkpoint/"

#: The three counters of ObjectRL's metadata, which every checkpoint file holds.
OBJECTRL_KEYS = ("buffer_size", "data_size", "pointer")


@dataclass(frozen=True, slots=True)
class CheckpointFile:
    """One data file of a checkpoint.

    Attributes:
        name: the field's name (``"priorities"`` for the priorities file).
        dtype: its dtype name as the checkpoint records it (``"float32"``, ...).
        shape: the shape of one item.
        path: the file, inside the checkpoint's data directory.
        nbytes: its size as recorded: ``data_size`` items.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    path: Path
    nbytes: int


@dataclass(frozen=True, slots=True)
class CheckpointMeta:
    """What a checkpoint's metadata file says.

    Attributes:
        path: the metadata file.
        format: the format tag; None for ObjectRL's metadata-only JSON.
        buffer_size, data_size, pointer: capacity, items stored, next position.
        sampler: the sampler's settings (``kind``, ...), without its priorities.
        data_dir: the data directory (None for a metadata-only file).
        columns: one :class:`CheckpointFile` per field, in the buffer's order.
        priorities: the priorities file of a prioritized sampler, else None.
    """

    path: Path
    format: str | None
    buffer_size: int
    data_size: int
    pointer: int
    sampler: dict[str, Any] = field(default_factory=dict)
    data_dir: Path | None = None
    columns: list[CheckpointFile] = field(default_factory=list)
    priorities: CheckpointFile | None = None

    @property
    def metadata_only(self) -> bool:
        """True for ObjectRL's metadata-only checkpoint: counters, no transitions."""
        return self.format is None

    def files(self) -> list[CheckpointFile]:
        """Every data file: the columns, then the priorities (when stored)."""
        return self.columns + ([self.priorities] if self.priorities is not None else [])

    def complete(self) -> bool:
        """Whether every data file exists with its recorded size."""
        return all(f.path.is_file() and f.path.stat().st_size == f.nbytes for f in self.files())


def is_zip_archive(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` starts as a zip archive does (what ``torch.save`` writes).

    False when it cannot be read (missing, a directory): the caller's reader then
    reports what is wrong with it.
    """
    try:
        with open(path, "rb") as handle:
            return handle.read(4) == b"PK\x03\x04"
    except OSError:
        return False


def confine_name(directory: Path, name: Any, where: Path, what: str) -> Path:
    """``directory / name`` when ``name`` (read from the file ``where``) is one plain
    file name that stays inside ``directory``.

    Every reader that joins a name read from a file onto a directory calls this: the
    checkpoint's data directory and column files, a memory-mapped buffer's column
    files (``buffer.json``).

    Raises:
        CheckpointError: an absolute path, ``..``, a separator, or a path that
            resolves (symlinks followed) outside ``directory``.
    """
    text = str(name)
    if (
        not isinstance(name, str)
        or text in ("", ".", "..")
        or "/" in text
        or "\\" in text
        or "\x00" in text
        or os.path.isabs(text)
    ):
        raise CheckpointError(
            f"{where} names {what} {text!r}: only a plain file name inside {directory} "
            "is allowed (no absolute path, no '..', no separator)"
        )
    path = directory / text
    if not path.resolve().is_relative_to(directory.resolve()):
        raise CheckpointError(
            f"{where} names {what} {text!r}, which resolves outside {directory} (a symlink)"
        )
    return path


def _int(meta: dict[str, Any], key: str, where: Path) -> int:
    value = meta[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise CheckpointError(f"{where}: {key} must be an integer, got {value!r}")
    return value


def read_checkpoint_meta(meta_path: str | os.PathLike[str]) -> CheckpointMeta:
    """Read the JSON metadata file of a checkpoint (``<prefix>.metadata``).

    Args:
        meta_path: the metadata file (not the prefix).

    Returns:
        Its contents; for ObjectRL's metadata-only JSON, only the counters
        (``format`` None). Data files are named, not opened: see
        :meth:`CheckpointMeta.complete`.

    Raises:
        CheckpointError: not JSON (a ``torch.save`` file: check
            :func:`is_zip_archive` first), no ``buffer_size``/``data_size``/``pointer``,
            an unknown format, malformed fields, or a data directory or file name
            that is not a plain name inside the checkpoint's directory.
        OSError: the file cannot be read.

    Cost: one small JSON file read; no data file is opened.
    """
    meta_path = Path(meta_path)
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{meta_path} is not valid JSON: {exc}") from None
    if not isinstance(meta, dict) or not set(OBJECTRL_KEYS) <= meta.keys():
        raise CheckpointError(
            f"{meta_path} is not a transitions checkpoint (no buffer_size/data_size/pointer)"
        )
    size, used, pointer = (_int(meta, key, meta_path) for key in OBJECTRL_KEYS)
    fmt = meta.get("format")
    if fmt is None:
        return CheckpointMeta(meta_path, None, size, used, pointer)
    if not str(fmt).startswith(FORMAT_PREFIX):
        raise CheckpointError(f"{meta_path} has an unknown checkpoint format {fmt!r}")
    data_dir = confine_name(meta_path.parent, meta.get("data_dir"), meta_path, "data directory")
    try:
        columns = [
            CheckpointFile(
                str(f["name"]),
                str(f["dtype"]),
                tuple(int(d) for d in f["shape"]),
                confine_name(data_dir, f["file"], meta_path, "column file"),
                int(f["nbytes"]),
            )
            for f in meta.get("fields") or []
        ]
        sampler = dict(meta.get("sampler") or {})
        stored = sampler.pop("priorities", None)
        priorities = None
        if stored:
            file = confine_name(data_dir, stored["file"], meta_path, "priorities file")
            priorities = CheckpointFile("priorities", "float64", (), file, int(stored["nbytes"]))
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, CheckpointError):
            raise
        raise CheckpointError(f"malformed checkpoint {meta_path}: {exc!r}") from None
    return CheckpointMeta(
        meta_path, str(fmt), size, used, pointer, sampler, data_dir, columns, priorities
    )
