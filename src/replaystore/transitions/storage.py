"""Where transitions live: preallocated columns in RAM, in memory-mapped files, or on CUDA.

A storage owns one tensor per field, ``capacity`` rows each, allocated up front
when the schema is known. It knows nothing about the ring pointer or sampling;
the buffer writes rows and gathers them with ``index_select``, which costs the
same for every storage kind (a memory map is an ordinary CPU tensor whose pages
the kernel backs with a file).

* :class:`TensorStorage`: ``torch.empty`` columns on a device (RAM or CUDA).
* :class:`MemmapStorage`: one raw little-endian file per column in a directory,
  mapped with ``numpy.memmap`` and wrapped with ``torch.from_numpy``. ``flush``
  writes the dirty pages back and then atomically replaces ``buffer.json`` (the
  schema, the pointer and the number of stored items), so a process that
  reopens the directory after a crash sees every item flushed before it.
  The file's read side (its names and its reader) lives in
  :mod:`replaystore.formats.transitions_buffer`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import sys
import tempfile
import uuid
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from replaystore.atomic import atomic_write_bytes, atomic_write_json, fsync_dir
from replaystore.errors import CheckpointError, StorageError
from replaystore.formats import transitions_buffer
from replaystore.formats.transitions_buffer import MEMMAP_FORMAT, META_NAME, PRIORITIES_NAME
from replaystore.transitions.schema import FieldSpec, dtype_from_name, dtype_name, numpy_dtype

__all__ = ["MEMMAP_FORMAT", "MemmapState", "MemmapStorage", "TensorStorage"]

logger = logging.getLogger(__name__)

_COLUMN_FILE = re.compile(r"[0-9a-f]{12}-[0-9]+\.bin")


def _column_files(directory: Path) -> list[Path]:
    return [p for p in directory.glob("*.bin") if _COLUMN_FILE.fullmatch(p.name)]


class TensorStorage:
    """Columns allocated with ``torch.empty`` on ``device`` (CPU RAM or a CUDA device).

    Args:
        fields: the schema, one spec per column.
        capacity: rows per column.
        device: where the columns live.
    """

    kind = "memory"

    def __init__(self, fields: list[FieldSpec], capacity: int, device: torch.device) -> None:
        self.fields = fields
        self.capacity = capacity
        self.device = device
        self.columns: dict[str, torch.Tensor] = {
            f.name: torch.empty((capacity, *f.shape), dtype=f.dtype, device=device) for f in fields
        }
        # NumPy views of CPU columns make single-row writes cheap (a few hundred ns).
        self.arrays: dict[str, np.ndarray | None] = {
            name: col.numpy() if device.type == "cpu" and numpy_dtype(col.dtype) else None
            for name, col in self.columns.items()
        }

    def flush(self, state: MemmapState) -> None:
        """Nothing to do: RAM and GPU memory do not survive the process."""

    def close(self) -> None:
        self.columns = {}
        self.arrays = {}


class MemmapState:
    """What ``buffer.json`` records besides the schema: ring state and priorities."""

    __slots__ = ("max_priority", "pointer", "priorities", "size")

    def __init__(
        self,
        size: int,
        pointer: int,
        priorities: np.ndarray | None = None,
        max_priority: float | None = None,
    ) -> None:
        self.size = size
        self.pointer = pointer
        self.priorities = priorities
        self.max_priority = max_priority


class MemmapStorage:
    """Columns in memory-mapped files under ``directory``.

    Each column is a raw file ``<generation>-<i>.bin`` of ``capacity`` rows; the
    generation (a random hex string) changes when the schema is recreated, so an
    old layout is never overwritten in place: the new files are written, then
    ``buffer.json`` is replaced atomically to name them, then the old files go.

    Args:
        directory: an existing directory owned by this buffer.
        fields: the schema.
        capacity: rows per column.
        generation: reuse the files of this generation (reopening), or None to
            create fresh files.

    Raises:
        StorageError: a column file is missing or has the wrong size.
    """

    kind = "memmap"

    def __init__(
        self,
        directory: Path,
        fields: list[FieldSpec],
        capacity: int,
        generation: str | None = None,
    ) -> None:
        if sys.byteorder != "little":  # pragma: no cover - big-endian hosts
            raise StorageError("memory-mapped transition storage needs a little-endian host")
        self.directory = directory
        self.fields = fields
        self.capacity = capacity
        create = generation is None
        self.generation = generation or uuid.uuid4().hex[:12]
        self._maps: list[np.memmap] = []
        self.columns: dict[str, torch.Tensor] = {}
        self.arrays: dict[str, np.ndarray | None] = {}
        for i, spec in enumerate(fields):
            self.columns[spec.name], self.arrays[spec.name] = self._map(i, spec, create)
        if create:
            for m in self._maps:
                m.flush()
            fsync_dir(directory)

    def file_name(self, i: int) -> str:
        return f"{self.generation}-{i}.bin"

    def _map(self, i: int, spec: FieldSpec, create: bool) -> tuple[torch.Tensor, np.ndarray | None]:
        nbytes = spec.item_nbytes * self.capacity
        shape = (self.capacity, *spec.shape)
        npd = numpy_dtype(spec.dtype)
        path = self.directory / self.file_name(i)
        if nbytes == 0:
            col = torch.empty(shape, dtype=spec.dtype)
            return col, col.numpy() if npd else None
        if not create:
            if not path.is_file():
                raise StorageError(f"column file {path} for key {spec.name!r} is missing")
            if path.stat().st_size != nbytes:
                raise StorageError(
                    f"column file {path} for key {spec.name!r} has {path.stat().st_size} "
                    f"bytes, expected {nbytes}"
                )
        mm = np.memmap(path, dtype=np.uint8, mode="w+" if create else "r+", shape=(nbytes,))
        self._maps.append(mm)
        raw = mm.view(np.ndarray)
        col = torch.from_numpy(raw).view(spec.dtype).reshape(shape)
        return col, raw.view(npd).reshape(shape) if npd else None

    def flush(self, state: MemmapState) -> None:
        """Write dirty pages to the files, then commit ``state`` in ``buffer.json``.

        Cost: one ``msync`` per column (proportional to the pages written since
        the last flush) plus a small JSON write and fsync.
        """
        for m in self._maps:
            m.flush()
        meta: dict[str, Any] = {
            "format": MEMMAP_FORMAT,
            "capacity": self.capacity,
            "size": state.size,
            "pointer": state.pointer,
            "generation": self.generation,
            "fields": [
                {
                    "name": f.name,
                    "shape": list(f.shape),
                    "dtype": dtype_name(f.dtype),
                    "file": self.file_name(i),
                }
                for i, f in enumerate(self.fields)
            ],
        }
        if state.priorities is not None:
            atomic_write_bytes(
                self.directory / PRIORITIES_NAME,
                np.ascontiguousarray(state.priorities, dtype="<f8").tobytes(),
            )
            meta["priorities"] = {"file": PRIORITIES_NAME, "max_priority": state.max_priority}
        atomic_write_json(self.directory / META_NAME, meta)

    def close(self) -> None:
        """Drop the mappings (the files stay)."""
        self.columns = {}
        self.arrays = {}
        self._maps = []

    def remove_other_generations(self) -> None:
        """Delete column files of older layouts (after ``buffer.json`` names ours)."""
        for path in _column_files(self.directory):
            if not path.name.startswith(self.generation + "-"):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()

    #: The committed ``buffer.json`` of a memmap directory, or None if there is none
    #: (:func:`~replaystore.formats.transitions_buffer.read_buffer_meta`).
    read_meta = staticmethod(transitions_buffer.read_buffer_meta)

    @classmethod
    def reopen(cls, directory: Path, meta: Mapping[str, Any]) -> MemmapStorage:
        """Map the files a committed ``buffer.json`` names."""
        try:
            fields = [
                FieldSpec.make(f["name"], tuple(f["shape"]), dtype_from_name(f["dtype"]))
                for f in meta["fields"]
            ]
            storage = cls(directory, fields, int(meta["capacity"]), str(meta["generation"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"malformed {directory / META_NAME}: {exc!r}") from exc
        return storage

    #: The priorities file of a memmap directory (float64, ``capacity`` values;
    #: :func:`~replaystore.formats.transitions_buffer.read_priorities`).
    read_priorities = staticmethod(transitions_buffer.read_priorities)

    @staticmethod
    def clear(directory: Path) -> None:
        """Remove this storage's files from ``directory`` (``buffer.json`` first)."""
        for name in (META_NAME, PRIORITIES_NAME):
            with contextlib.suppress(FileNotFoundError):
                (directory / name).unlink()
        for path in _column_files(directory):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


class TemporaryDirectory:
    """A private directory for a memmap buffer without ``path``; removed on close or exit."""

    def __init__(self) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="replaystore-transitions-"))
        self._finalizer = weakref.finalize(self, shutil.rmtree, self.path, ignore_errors=True)

    def cleanup(self) -> None:
        self._finalizer()


def ensure_directory(path: str | os.PathLike[str]) -> Path:
    """Create ``path`` (and parents) if needed; it must be a directory."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StorageError(f"cannot create memmap directory {p}: {exc}") from exc
    if not p.is_dir():
        raise StorageError(f"memmap path {p} is not a directory")
    return p
