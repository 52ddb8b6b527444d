"""Full, atomic checkpoints of a transition buffer, without pickle.

Layout for ``save("ckpt/buffer")``::

    ckpt/buffer.metadata              JSON: the commit point (see below)
    ckpt/buffer.data-<32 hex>/0.bin   raw little-endian bytes of column 0, rows 0..size-1
    ckpt/buffer.data-<32 hex>/1.bin   ...
    ckpt/buffer.data-<32 hex>/priorities.bin   float64 stored priorities (prioritized only)

``buffer.metadata`` keeps ObjectRL's keys (``buffer_size``, ``data_size``,
``pointer``) and adds the format tag, the data directory name, the schema, the
byte size and CRC-32 of every file, the sampler settings and both RNG states.

Atomicity: the data goes into a fresh directory, every file and the directory
are fsynced, and only then is ``.metadata`` replaced atomically (temp file,
fsync, rename). A save killed at any instant leaves the previous ``.metadata``
naming the previous, complete data directory. After the commit the other
``<name>.data-*`` directories (the previous checkpoint, orphans of killed
saves) are removed; ``load`` never looks at a directory the metadata does not
name, and checks sizes and CRCs before touching the buffer.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import sys
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from replaystore.atomic import atomic_write_json, fsync_dir
from replaystore.errors import CheckpointError
from replaystore.transitions.schema import FieldSpec, dtype_from_name, dtype_name

__all__ = ["CHECKPOINT_FORMAT", "Snapshot", "read_checkpoint", "write_checkpoint"]

CHECKPOINT_FORMAT = "replaystore.transitions.checkpoint/1"
_CHUNK = 1 << 24


@dataclass(slots=True)
class Snapshot:
    """Everything a checkpoint restores.

    ``columns`` hold rows ``0..size-1`` in storage order (``[size, *shape]``);
    ``priorities`` the stored priorities of those rows (prioritized buffers).
    """

    capacity: int
    size: int
    pointer: int
    fields: list[FieldSpec]
    columns: dict[str, torch.Tensor]
    sampler: dict[str, Any]
    priorities: np.ndarray | None
    torch_rng: bytes
    numpy_rng: dict[str, Any]
    torch_rng_device: str = "cpu"


def _paths(path: str | os.PathLike[str]) -> tuple[Path, Path]:
    prefix = Path(path)
    return prefix, prefix.with_name(prefix.name + ".metadata")


def _data_dir_pattern(prefix: Path) -> re.Pattern[str]:
    return re.compile(re.escape(prefix.name) + r"\.data-[0-9a-f]{32}")


def _write_bytes(path: Path, data: np.ndarray) -> int:
    """Write a 1-D uint8 array, fsync, return its CRC-32."""
    crc = 0
    flat = data.reshape(-1)
    with open(path, "wb") as handle:
        for start in range(0, flat.size, _CHUNK):
            chunk = flat[start : start + _CHUNK]
            handle.write(memoryview(chunk))
            crc = zlib.crc32(chunk, crc)
        handle.flush()
        os.fsync(handle.fileno())
    return crc


def _as_bytes(tensor: torch.Tensor) -> np.ndarray:
    t = tensor.detach().contiguous().cpu().reshape(-1)
    return t.view(torch.uint8).numpy()


def write_checkpoint(path: str | os.PathLike[str], snap: Snapshot) -> Path:
    """Write ``snap`` as the checkpoint ``path`` (see the module docstring); returns the
    metadata file.

    Cost: writes every stored byte once plus one fsync per file.

    Raises:
        OSError: the files cannot be written; the previous checkpoint is intact.
    """
    if sys.byteorder != "little":  # pragma: no cover - big-endian hosts
        raise CheckpointError("checkpoints are written on little-endian hosts only")
    prefix, meta_path = _paths(path)
    parent = prefix.parent
    parent.mkdir(parents=True, exist_ok=True)
    data_name = f"{prefix.name}.data-{uuid.uuid4().hex}"
    data_dir = parent / data_name
    data_dir.mkdir()
    fields_meta = []
    for i, spec in enumerate(snap.fields):
        raw = _as_bytes(snap.columns[spec.name])
        crc = _write_bytes(data_dir / f"{i}.bin", raw)
        fields_meta.append(
            {
                "name": spec.name,
                "shape": list(spec.shape),
                "dtype": dtype_name(spec.dtype),
                "file": f"{i}.bin",
                "nbytes": int(raw.size),
                "crc32": crc,
            }
        )
    sampler = dict(snap.sampler)
    if snap.priorities is not None:
        raw = np.ascontiguousarray(snap.priorities, dtype="<f8").view(np.uint8)
        sampler["priorities"] = {
            "file": "priorities.bin",
            "nbytes": int(raw.size),
            "crc32": _write_bytes(data_dir / "priorities.bin", raw),
        }
    fsync_dir(data_dir)
    fsync_dir(parent)
    meta = {
        "buffer_size": snap.capacity,
        "data_size": snap.size,
        "pointer": snap.pointer,
        "format": CHECKPOINT_FORMAT,
        "byteorder": "little",
        "data_dir": data_name,
        "fields": fields_meta,
        "sampler": sampler,
        "rng": {
            "torch": base64.b64encode(snap.torch_rng).decode("ascii"),
            "torch_device": snap.torch_rng_device,
            "numpy": snap.numpy_rng,
        },
    }
    atomic_write_json(meta_path, meta)  # the commit point
    pattern = _data_dir_pattern(prefix)
    for other in parent.iterdir():
        if other.name != data_name and pattern.fullmatch(other.name) and other.is_dir():
            shutil.rmtree(other, ignore_errors=True)
    return meta_path


def _read_bytes(path: Path, nbytes: int, crc32: int) -> np.ndarray:
    try:
        actual = path.stat().st_size
    except OSError as exc:
        raise CheckpointError(f"checkpoint file {path} is missing: {exc}") from exc
    if actual != nbytes:
        raise CheckpointError(f"checkpoint file {path} has {actual} bytes, expected {nbytes}")
    data = np.fromfile(path, dtype=np.uint8)
    if zlib.crc32(data) != crc32:
        raise CheckpointError(f"checkpoint file {path} is corrupt (CRC-32 mismatch)")
    return data


def read_checkpoint(path: str | os.PathLike[str]) -> Snapshot:
    """Read and verify the checkpoint ``path`` (sizes, CRCs, schema) into memory.

    Raises:
        CheckpointError: no checkpoint, an ObjectRL metadata-only file, or a
            missing, truncated, corrupt or malformed part.
    """
    prefix, meta_path = _paths(path)
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise CheckpointError(f"no checkpoint at {prefix} ({meta_path} does not exist)") from exc
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {meta_path}: {exc}") from exc
    if not isinstance(meta, dict):
        raise CheckpointError(f"{meta_path} is not a replaystore checkpoint")
    if meta.get("format") != CHECKPOINT_FORMAT:
        if {"buffer_size", "data_size", "pointer"} <= meta.keys():
            raise CheckpointError(
                f"{meta_path} is a metadata-only checkpoint (ObjectRL format): it holds no "
                "transitions to restore"
            )
        raise CheckpointError(f"{meta_path} is not a replaystore checkpoint ({CHECKPOINT_FORMAT})")
    try:
        return _parse(prefix, meta)
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, CheckpointError):
            raise
        raise CheckpointError(f"malformed checkpoint {meta_path}: {exc!r}") from exc


def _parse(prefix: Path, meta: dict[str, Any]) -> Snapshot:
    if meta["byteorder"] != "little" or sys.byteorder != "little":
        raise CheckpointError("checkpoint byte order does not match this host")
    data_name = str(meta["data_dir"])
    if not _data_dir_pattern(prefix).fullmatch(data_name):
        raise CheckpointError(f"checkpoint names an unexpected data directory {data_name!r}")
    data_dir = prefix.parent / data_name
    capacity, size, pointer = int(meta["buffer_size"]), int(meta["data_size"]), int(meta["pointer"])
    if not (0 <= size <= capacity and 0 <= pointer < max(capacity, 1)):
        raise CheckpointError(
            f"inconsistent checkpoint: data_size {size}, pointer {pointer}, buffer_size {capacity}"
        )
    fields: list[FieldSpec] = []
    columns: dict[str, torch.Tensor] = {}
    for entry in meta["fields"]:
        file_name = str(entry["file"])
        if not re.fullmatch(r"[0-9]+\.bin", file_name):
            raise CheckpointError(f"checkpoint names an unexpected file {file_name!r}")
        spec = FieldSpec.make(
            str(entry["name"]), tuple(entry["shape"]), dtype_from_name(entry["dtype"])
        )
        nbytes = int(entry["nbytes"])
        if nbytes != size * spec.item_nbytes:
            raise CheckpointError(
                f"checkpoint column {spec.name!r} records {nbytes} bytes, expected "
                f"{size * spec.item_nbytes} for {size} items"
            )
        raw = _read_bytes(data_dir / file_name, nbytes, int(entry["crc32"]))
        columns[spec.name] = torch.from_numpy(raw).view(spec.dtype).reshape(size, *spec.shape)
        fields.append(spec)
    sampler = dict(meta["sampler"])
    priorities = None
    pri_meta = sampler.pop("priorities", None)
    if pri_meta is not None:
        if int(pri_meta["nbytes"]) != size * 8 or pri_meta["file"] != "priorities.bin":
            raise CheckpointError("checkpoint priorities do not match its data_size")
        raw = _read_bytes(data_dir / "priorities.bin", size * 8, int(pri_meta["crc32"]))
        priorities = raw.view("<f8").astype(np.float64)
        if not (np.isfinite(priorities).all() and (priorities > 0).all()):
            raise CheckpointError("checkpoint priorities must be finite and positive")
    rng = meta["rng"]
    return Snapshot(
        capacity=capacity,
        size=size,
        pointer=pointer,
        fields=fields,
        columns=columns,
        sampler=sampler,
        priorities=priorities,
        torch_rng=base64.b64decode(rng["torch"], validate=True),
        numpy_rng=dict(rng["numpy"]),
        torch_rng_device=str(rng.get("torch_device", "cpu")),
    )
