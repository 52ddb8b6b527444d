"""Screenshot fingerprints and same-screenshot detection.

WebGym precomputes ``same_as_next_screenshot`` during rollouts and, for steps
that lack it, simply assumes "different". We compute it instead: two
screenshots are the same when their *decoded pixels* are identical (same mode,
same size, same bytes), whatever the file names or PNG compression.

A fingerprint is ``sha256(mode, size, pixels)`` (32 bytes; SHA-256 is hardware-
accelerated on current CPUs, ~1.5x faster than BLAKE2b on our machine). Fingerprints are
cached by ``(absolute path, mtime_ns, file size)``, so a screenshot shared by
several steps, or seen again by a later buffer, is decoded once; editing the
file invalidates its entry.

A missing or unreadable screenshot has no fingerprint: it compares as
"different" (the step stays trainable, as in WebGym), and it is counted in
:attr:`ScreenshotFingerprinter.missing` and reported once per batch as a
warning, never silently.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from numpy.typing import NDArray

from replaystore.errors import ArgumentError

__all__ = [
    "ScreenshotFingerprinter",
    "default_fingerprinter",
    "fingerprint_image",
    "same_as_next_flags",
]

logger = logging.getLogger("replaystore.trajectories.screenshots")

# A worker pool pays off once there are enough files to decode; Pillow's PNG
# decoder releases the GIL, so threads decode in parallel.
_PARALLEL_MIN_FILES = 64


def fingerprint_image(path: str | os.PathLike[str]) -> bytes:
    """The 32-byte pixel fingerprint of an image file (decodes the file; no caching).

    Raises:
        OSError: the file cannot be read or decoded as an image.
    """
    from PIL import Image  # here, not at import: storage and ``stats`` never decode pixels

    with Image.open(path) as image:
        image.load()
        digest = hashlib.sha256()
        digest.update(f"{image.mode}|{image.size[0]}x{image.size[1]}|".encode())
        digest.update(image.tobytes())
        return digest.digest()


class ScreenshotFingerprinter:
    """Pixel fingerprints of screenshot files, cached by (path, mtime, size).

    Args:
        max_entries: cache size bound; when full, the cache is cleared (files are
            re-decoded on their next use, results stay correct).
        workers: threads used to decode many uncached files at once (default:
            ``min(4, os.cpu_count())``; 1 disables the pool).

    Attributes:
        missing: how many lookups found no readable file (cumulative).
        decoded: how many files were decoded (cumulative; cache misses).
    """

    def __init__(self, max_entries: int = 200_000, workers: int | None = None) -> None:
        if max_entries < 1:
            raise ArgumentError(f"max_entries must be >= 1, got {max_entries}")
        self.max_entries = int(max_entries)
        self.workers = int(workers) if workers is not None else min(4, os.cpu_count() or 1)
        self.missing = 0
        self.decoded = 0
        self._cache: dict[tuple[str, int, int], bytes] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._cache)

    def clear(self) -> None:
        """Forget every cached fingerprint."""
        with self._lock:
            self._cache.clear()

    def fingerprint(self, path: str | os.PathLike[str] | None) -> bytes | None:
        """The fingerprint of one file, or None when it is missing or unreadable."""
        return self.fingerprints([path])[0]

    def fingerprints(self, paths: Sequence[str | os.PathLike[str] | None]) -> list[bytes | None]:
        """Fingerprints of many files (None for missing/unreadable/empty paths).

        Each distinct uncached file is decoded once, in parallel threads when
        there are many. Missing files are counted and logged as one warning.

        Cost: one ``stat`` per distinct path plus one decode per cache miss.
        """
        keys: dict[str, tuple[str, int, int] | None] = {}
        missing: list[str] = []
        for raw in paths:
            if raw is None or raw == "":
                continue
            path = os.fspath(raw)
            if path in keys:
                continue
            try:
                st = os.stat(path)
            except OSError:
                keys[path] = None
                missing.append(path)
                continue
            keys[path] = (os.path.abspath(path), st.st_mtime_ns, st.st_size)

        todo = [key for key in keys.values() if key is not None and key not in self._cache]
        todo = list(dict.fromkeys(todo))
        if todo:
            results = self._decode_all([key[0] for key in todo])
            with self._lock:
                if len(self._cache) + len(todo) > self.max_entries:
                    self._cache.clear()
                for key, (value, error) in zip(todo, results, strict=True):
                    if value is not None:
                        self._cache[key] = value
                    else:
                        missing.append(f"{key[0]} ({error})")
                self.decoded += len(todo)
        # Look up after inserting; a cache cleared above still has this batch.
        out: list[bytes | None] = []
        failed_lookups = 0
        for raw in paths:
            if raw is None or raw == "":
                out.append(None)
                continue
            found = keys[os.fspath(raw)]
            value = None if found is None else self._cache.get(found)
            failed_lookups += value is None
            out.append(value)
        if missing:
            # Count lookups, not files: each step compared as "different" because
            # its file is missing is one counted event.
            self.missing += failed_lookups
            logger.warning(
                "%d screenshot lookup(s) found no readable file (%d distinct), treated as "
                "'different from the next screenshot'; first: %s",
                failed_lookups,
                len(missing),
                missing[0],
            )
        return out

    def _decode_all(self, paths: list[str]) -> list[tuple[bytes | None, str]]:
        def one(path: str) -> tuple[bytes | None, str]:
            try:
                return fingerprint_image(path), ""
            except (OSError, ValueError) as exc:  # PIL.UnidentifiedImageError is an OSError
                return None, f"{type(exc).__name__}: {exc}"

        show_bar = len(paths) >= 2000 and sys.stderr.isatty()
        if self.workers > 1 and len(paths) >= _PARALLEL_MIN_FILES:
            with ThreadPoolExecutor(max_workers=self.workers) as pool:
                results: Iterable[tuple[bytes | None, str]] = pool.map(one, paths, chunksize=16)
                if show_bar:
                    from tqdm import tqdm

                    results = tqdm(results, total=len(paths), desc="fingerprinting screenshots")
                return list(results)
        return [one(p) for p in paths]


_DEFAULT: ScreenshotFingerprinter | None = None
_DEFAULT_LOCK = threading.Lock()


def default_fingerprinter() -> ScreenshotFingerprinter:
    """The process-wide fingerprinter that buffers use unless given their own."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = ScreenshotFingerprinter()
        return _DEFAULT


def same_as_next_flags(
    image_paths: Sequence[str | os.PathLike[str] | None],
    next_image_paths: Sequence[str | os.PathLike[str] | None],
    fingerprinter: ScreenshotFingerprinter | None = None,
) -> NDArray[np.bool_]:
    """Whether each screenshot has exactly the pixels of the paired next screenshot.

    Args:
        image_paths: the step's screenshot, one per pair.
        next_image_paths: the next step's screenshot, same length.
        fingerprinter: the cache to use (default: :func:`default_fingerprinter`).

    Returns:
        bool array, one per pair. A pair with a missing, unreadable or empty path
        is False (counted in ``fingerprinter.missing`` unless the path is empty).

    Raises:
        ValueError: the two sequences differ in length.
    """
    if len(image_paths) != len(next_image_paths):
        raise ValueError(
            f"got {len(image_paths)} screenshots but {len(next_image_paths)} next screenshots"
        )
    fp = fingerprinter if fingerprinter is not None else default_fingerprinter()
    prints = fp.fingerprints(list(image_paths) + list(next_image_paths))
    n = len(image_paths)
    return np.fromiter(
        (a is not None and a == b for a, b in zip(prints[:n], prints[n:], strict=True)),
        dtype=bool,
        count=n,
    )
