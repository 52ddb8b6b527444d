"""Crash-safe file writes: temporary file in the same directory, fsync, rename.

A reader never sees a half-written file, and a process killed at any instant
leaves either the old file or the new one. Used by every module that persists
data (checkpoints, iteration files, blocklists, exports).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

__all__ = [
    "atomic_open",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "fsync_dir",
]


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Flush a directory entry to disk so a completed rename survives power loss.

    A no-op on platforms where directories cannot be opened (Windows).
    """
    try:
        fd = os.open(os.fspath(path), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "wb", **kwargs: Any) -> Iterator[IO[Any]]:
    """Open a temporary file next to ``path``; on clean exit fsync it and rename it over ``path``.

    If the block raises (or the process dies), ``path`` is untouched and the
    temporary file is removed (or, after a hard kill, left as an ignorable
    ``.<name>.*.tmp`` file that never shadows real data).

    Args:
        path: final file path. Its parent directory must exist.
        mode: ``"wb"`` or ``"w"`` (text, UTF-8 unless ``encoding`` is given).
        **kwargs: passed to :func:`open` (``encoding``, ``newline``).
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open supports modes 'w' and 'wb', not {mode!r}")
    target = Path(path)
    if "b" not in mode:
        kwargs.setdefault("encoding", "utf-8")
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, mode, **kwargs) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    fsync_dir(target.parent)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_open`)."""
    with atomic_open(path, "wb") as handle:
        handle.write(data)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write UTF-8 ``text`` to ``path`` atomically (see :func:`atomic_open`)."""
    with atomic_open(path, "w") as handle:
        handle.write(text)


def atomic_write_json(path: str | os.PathLike[str], obj: Any, *, indent: int | None = 2) -> None:
    """Serialise ``obj`` as JSON (UTF-8, no NaN) and write it to ``path`` atomically.

    Raises:
        ValueError: ``obj`` holds NaN/inf, which is not valid JSON.
        TypeError: ``obj`` holds a value JSON cannot represent.
    """
    text = json.dumps(obj, indent=indent, ensure_ascii=False, allow_nan=False)
    atomic_write_text(path, text + "\n")
