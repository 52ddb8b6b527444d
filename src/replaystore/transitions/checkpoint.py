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
import pickletools
import re
import shutil
import sys
import uuid
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from replaystore.atomic import atomic_write_json, fsync_dir
from replaystore.errors import CheckpointError
from replaystore.formats.transitions_checkpoint import FORMAT_PREFIX, OBJECTRL_KEYS, is_zip_archive
from replaystore.transitions.schema import FieldSpec, dtype_from_name, dtype_name

__all__ = [
    "CHECKPOINT_FORMAT",
    "ObjectRLMetadata",
    "Snapshot",
    "read_checkpoint",
    "read_objectrl_metadata",
    "write_checkpoint",
]

CHECKPOINT_FORMAT = f"{FORMAT_PREFIX}1"
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
    # The rate limiter's counters {"inserts", "samples", "deletes"}; None: no limiter.
    rate_limiter: dict[str, int] | None = None


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
            handle.write(chunk.data)
            crc = zlib.crc32(chunk.data, crc)
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
    if snap.rate_limiter is not None:
        meta["rate_limiter"] = dict(snap.rate_limiter)
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
    if zlib.crc32(data.data) != crc32:
        raise CheckpointError(f"checkpoint file {path} is corrupt (CRC-32 mismatch)")
    return data


def read_checkpoint(path: str | os.PathLike[str]) -> Snapshot:
    """Read and verify the checkpoint ``path`` (sizes, CRCs, schema) into memory.

    Raises:
        CheckpointError: no checkpoint, an ObjectRL metadata-only file, or a
            missing, truncated, corrupt or malformed part.
    """
    prefix, meta_path = _paths(path)
    if is_zip_archive(meta_path):
        raise CheckpointError(
            f"{meta_path} is ObjectRL's metadata-only checkpoint (torch.save of buffer_size, "
            "data_size, pointer): it holds no transitions to restore (ReplayBuffer.load "
            "applies it to the transitions the buffer holds, as ObjectRL's load does)"
        )
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
                "transitions to restore (ReplayBuffer.load applies it to the transitions "
                "the buffer holds, as ObjectRL's load does)"
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
    limiter = meta.get("rate_limiter")
    if limiter is not None:
        limiter = {key: int(limiter[key]) for key in ("inserts", "samples", "deletes")}
        if min(limiter.values()) < 0:
            raise CheckpointError(f"checkpoint rate limiter counters are negative: {limiter}")
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
        rate_limiter=limiter,
    )


# ----------------------------------------------------------------------------- ObjectRL

_PICKLE_INT_OPS = {"BININT", "BININT1", "BININT2", "INT", "LONG", "LONG1", "LONG4"}
_PICKLE_STR_OPS = {"BINUNICODE", "SHORT_BINUNICODE", "UNICODE", "BINUNICODE8"}
_PICKLE_MEMO_OPS = {"MEMOIZE", "BINPUT", "LONG_BINPUT", "PUT"}
_OBJECTRL_MAX_BYTES = 1 << 16


@dataclass(frozen=True, slots=True)
class ObjectRLMetadata:
    """What ObjectRL's ``ReplayBuffer.save`` writes: three counters, no transitions.

    Attributes:
        buffer_size: the capacity of the buffer that saved it.
        data_size: how many transitions it held (at most ``buffer_size``).
        pointer: the storage position its next transition would have gone to.
    """

    buffer_size: int
    data_size: int
    pointer: int


def _objectrl_dict_from_pickle(raw: bytes, where: Path) -> dict[str, int]:
    """The ``{str: int}`` dict a protocol-2+ pickle of one flat dict holds, read opcode by
    opcode with :func:`pickletools.genops` (a parser: nothing is unpickled or executed).

    Anything but a flat dict of string keys and integer values (a class, a global, a
    tensor, a nested container) is refused.
    """
    stack: list[Any] = []
    marks: list[int] = []
    result: dict[str, int] | None = None
    try:
        for op, arg, _pos in pickletools.genops(raw):
            name = op.name
            if name in ("PROTO", "FRAME") or name in _PICKLE_MEMO_OPS:
                continue
            if name == "EMPTY_DICT":
                if result is not None:
                    raise CheckpointError(f"{where}: more than one dict in the pickle")
                result = {}
                stack.append(result)
            elif name == "MARK":
                marks.append(len(stack))
            elif name in _PICKLE_STR_OPS:
                stack.append(str(arg))
            elif name in _PICKLE_INT_OPS:
                if isinstance(arg, bool) or not isinstance(arg, int):
                    raise CheckpointError(f"{where}: a value is not an integer ({arg!r})")
                stack.append(arg)
            elif name in ("SETITEM", "SETITEMS"):
                start = len(stack) - 2 if name == "SETITEM" else marks.pop()
                items = stack[start:]
                del stack[start:]
                if not stack or stack[-1] is not result or result is None:
                    raise CheckpointError(f"{where}: items set on something not the dict")
                for key, value in zip(items[::2], items[1::2], strict=True):
                    if not isinstance(key, str) or not isinstance(value, int):
                        raise CheckpointError(f"{where}: entry {key!r}: {value!r} is not str: int")
                    result[key] = value
            elif name == "STOP":
                break
            else:
                raise CheckpointError(
                    f"{where}: unexpected pickle opcode {name} (not ObjectRL's flat dict of ints)"
                )
    except CheckpointError:
        raise
    except (ValueError, IndexError) as exc:
        raise CheckpointError(f"{where}: malformed pickle stream: {exc}") from exc
    if result is None or len(stack) != 1:
        raise CheckpointError(f"{where}: the pickle does not hold a single dict")
    return result


def read_objectrl_metadata(path: str | os.PathLike[str]) -> ObjectRLMetadata | None:
    """Read ObjectRL's ``<path>.metadata`` (``torch.save`` of ``buffer_size``,
    ``data_size``, ``pointer``) without unpickling; ``None`` when the file is not one.

    ``torch.save`` writes a zip archive whose ``data.pkl`` is a pickle; this reads
    that pickle's opcodes with :mod:`pickletools` (no object is built, no code
    runs) and accepts only a flat dict of string keys and integer values. A JSON
    ``.metadata`` with only ObjectRL's three keys is accepted too.

    Returns:
        The three counters, or ``None`` when ``<path>.metadata`` is missing or is a
        replaystore checkpoint (or anything else that is not ObjectRL's format).

    Raises:
        CheckpointError: the file is a zip archive but not ObjectRL's metadata
            (other content, a missing key, inconsistent counters).
    """
    _prefix, meta_path = _paths(path)
    if is_zip_archive(meta_path):
        try:
            with zipfile.ZipFile(meta_path) as archive:
                names = [
                    n for n in archive.namelist() if n.endswith("/data.pkl") or n == "data.pkl"
                ]
                if len(names) != 1:
                    raise CheckpointError(f"{meta_path} is a zip archive without a torch data.pkl")
                info = archive.getinfo(names[0])
                if info.file_size > _OBJECTRL_MAX_BYTES:
                    raise CheckpointError(
                        f"{meta_path}: data.pkl is too large for ObjectRL metadata"
                    )
                raw = archive.read(info)
        except (OSError, zipfile.BadZipFile) as exc:
            raise CheckpointError(f"cannot read {meta_path}: {exc}") from exc
        values: dict[str, Any] = _objectrl_dict_from_pickle(raw, meta_path)
    else:
        try:
            values = json.loads(meta_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(values, dict) or set(values) != set(OBJECTRL_KEYS):
            return None
    missing = [k for k in OBJECTRL_KEYS if k not in values]
    if missing:
        raise CheckpointError(f"{meta_path} lacks ObjectRL's key(s) {', '.join(missing)}")
    counters = [values[k] for k in OBJECTRL_KEYS]
    if any(isinstance(v, bool) or not isinstance(v, int) for v in counters):
        raise CheckpointError(f"{meta_path}: buffer_size, data_size, pointer must be integers")
    meta = ObjectRLMetadata(*counters)
    if not (
        meta.buffer_size > 0
        and 0 <= meta.data_size <= meta.buffer_size
        and 0 <= meta.pointer < meta.buffer_size
    ):
        raise CheckpointError(
            f"inconsistent ObjectRL metadata {meta_path}: data_size {meta.data_size}, "
            f"pointer {meta.pointer}, buffer_size {meta.buffer_size}"
        )
    return meta
