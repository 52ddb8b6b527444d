"""Crash-safe file writes: temporary file in the same directory, fsync, rename.

A reader never sees a half-written file, and a process killed at any instant
leaves either the old file or the new one. Used by every module that persists
data (checkpoints, iteration files, blocklists, exports).

File modes: a file this module *creates* gets the mode a plain ``open(path, "w")``
would give it under the process umask (``0o666 & ~umask``: 0644 under umask 022,
0664 under 002, 0600 under 077), not the 0600 of the temporary file behind it.
A file it *replaces* keeps the permission bits it had (as ``sed -i`` and most
editors do), so a file a user made private, or shared with a group, stays so.
Ownership is not carried over: the new file belongs to the writing process.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

__all__ = [
    "atomic_open",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "current_umask",
    "fsync_dir",
    "new_file_mode",
]

_UMASK_LOCK = threading.Lock()


def _umask_from_proc() -> int | None:
    """The umask from ``/proc/self/status`` (Linux 4.7+), or None where it is not shown."""
    try:
        with open("/proc/self/status", "rb") as handle:
            for line in handle:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        return None
    return None


def current_umask() -> int:
    """The process umask (e.g. ``0o022``), read without changing it where possible.

    Linux shows the umask in ``/proc/self/status``; elsewhere it can only be read
    by setting it (``os.umask``) and restoring it at once. That is done under a
    lock, so two threads of this module never interleave; a file another thread
    creates in that instant (outside this module) could get the umask 0o077, the
    most private one, never a more open one.

    Cost: one small file read (about 20 µs); not cached, since the umask can change.
    """
    mask = _umask_from_proc()
    if mask is not None:
        return mask
    with _UMASK_LOCK:
        mask = os.umask(0o077)
        os.umask(mask)
    return mask


def new_file_mode() -> int:
    """Permission bits a new regular file gets from ``open()`` now: ``0o666 & ~umask``."""
    return 0o666 & ~current_umask()


def _target_mode(target: Path) -> int:
    """The existing file's permission bits, or :func:`new_file_mode` for a new file."""
    try:
        st = os.stat(target)
    except OSError:  # missing (the common case), or unreadable: a new file's mode
        return new_file_mode()
    if not stat.S_ISREG(st.st_mode):
        return new_file_mode()
    return stat.S_IMODE(st.st_mode) & 0o777  # no setuid/setgid/sticky bits on a rewritten file


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
def atomic_open(
    path: str | os.PathLike[str], mode: str = "wb", *, file_mode: int | None = None, **kwargs: Any
) -> Iterator[IO[Any]]:
    """Open a temporary file next to ``path``; on clean exit fsync it and rename it over ``path``.

    If the block raises (or the process dies), ``path`` is untouched and the
    temporary file is removed (or, after a hard kill, left as an ignorable
    ``.<name>.*.tmp`` file that never shadows real data).

    Args:
        path: final file path. Its parent directory must exist.
        mode: ``"wb"`` or ``"w"`` (text, UTF-8 unless ``encoding`` is given).
        file_mode: permission bits of the written file. Default: those of the
            file being replaced, or, for a new file, ``0o666 & ~umask`` (what
            ``open()`` gives; see the module docstring).
        **kwargs: passed to :func:`open` (``encoding``, ``newline``).

    Raises:
        ValueError: ``mode`` is not ``"w"``/``"wb"``, or ``file_mode`` is not in ``0..0o777``.
        OSError: the directory is missing or not writable, or the disk is full.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open supports modes 'w' and 'wb', not {mode!r}")
    if file_mode is not None and (
        isinstance(file_mode, bool) or not isinstance(file_mode, int) or not 0 <= file_mode <= 0o777
    ):
        raise ValueError(f"file_mode must be permission bits in 0..0o777, got {file_mode!r}")
    target = Path(path)
    if "b" not in mode:
        kwargs.setdefault("encoding", "utf-8")
    perms = _target_mode(target) if file_mode is None else file_mode
    # mkstemp creates the file 0600 and the mode survives the rename: set the real one.
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        if hasattr(os, "fchmod"):
            os.fchmod(fd, perms)
        else:  # pragma: no cover - Windows before Python 3.13
            os.chmod(tmp_name, perms)
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


def atomic_write_bytes(
    path: str | os.PathLike[str], data: bytes, *, file_mode: int | None = None
) -> None:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_open` for ``file_mode``)."""
    with atomic_open(path, "wb", file_mode=file_mode) as handle:
        handle.write(data)


def atomic_write_text(
    path: str | os.PathLike[str], text: str, *, file_mode: int | None = None
) -> None:
    """Write UTF-8 ``text`` to ``path`` atomically (see :func:`atomic_open` for ``file_mode``)."""
    with atomic_open(path, "w", file_mode=file_mode) as handle:
        handle.write(text)


def atomic_write_json(
    path: str | os.PathLike[str],
    obj: Any,
    *,
    indent: int | None = 2,
    file_mode: int | None = None,
) -> None:
    """Serialise ``obj`` as JSON (UTF-8, no NaN) and write it to ``path`` atomically.

    Raises:
        ValueError: ``obj`` holds NaN/inf, which is not valid JSON.
        TypeError: ``obj`` holds a value JSON cannot represent.
    """
    text = json.dumps(obj, indent=indent, ensure_ascii=False, allow_nan=False)
    atomic_write_text(path, text + "\n", file_mode=file_mode)
