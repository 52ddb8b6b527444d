"""Iteration file names and paths: the names of iteration files and of our temporary
files, listing a storage directory, which files a reader reads, removing abandoned
temporaries, and screenshot paths relative to the storage root."""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replaystore.errors import StorageError

logger = logging.getLogger("replaystore.trajectories.storage")

#: Default age (seconds) after which our own temporary files count as abandoned.
STALE_TEMP_AGE_S = 3600.0
_FILE_RE = re.compile(r"^iteration_(\d{6,})(?:\.rank(\d{3,}))?\.jsonl$")
# atomic_open's temporary names for our iteration files: .<name>.<mkstemp random>.tmp
_TEMP_RE = re.compile(r"^\.iteration_\d{6,}(?:\.rank\d{3,})?\.jsonl\.[A-Za-z0-9_]+\.tmp$")
_LISTING_RETRIES = 5


@dataclass(frozen=True, slots=True)
class IterationFile:
    """One iteration file on disk: ``rank`` is None for a merged file."""

    path: Path
    iteration: int
    rank: int | None


def merged_path(root: Path, iteration: int) -> Path:
    """The path of ``iteration``'s merged file under ``root``."""
    return root / f"iteration_{iteration:06d}.jsonl"


def rank_path(root: Path, iteration: int, rank: int) -> Path:
    """The path of ``iteration``'s file of ``rank`` under ``root``."""
    return root / f"iteration_{iteration:06d}.rank{rank:03d}.jsonl"


def iteration_file(path: str | os.PathLike[str]) -> IterationFile:
    """The :class:`IterationFile` of ``path``, from its name.

    Raises:
        StorageError: ``path`` is not named like an iteration file.
    """
    path = Path(path)
    match = _FILE_RE.match(path.name)
    if match is None:
        raise StorageError(f"{path} is not named like an iteration file")
    rank = None if match.group(2) is None else int(match.group(2))
    return IterationFile(path, int(match.group(1)), rank)


def list_files(root: Path) -> list[IterationFile]:
    """Every iteration file under ``root``, sorted by (iteration, rank); merged files first."""
    if not root.is_dir():
        return []
    out = []
    for entry in os.scandir(root):
        match = _FILE_RE.match(entry.name)
        if match and entry.is_file():
            rank = None if match.group(2) is None else int(match.group(2))
            out.append(IterationFile(Path(entry.path), int(match.group(1)), rank))
    out.sort(key=lambda f: (f.iteration, -1 if f.rank is None else f.rank))
    return out


def readable_files(
    files: list[IterationFile], last_n_iterations: int | None
) -> list[IterationFile]:
    """Of ``files`` (sorted), per iteration its merged file if present, else its rank files.

    Raises:
        ValueError: ``last_n_iterations`` is not None or an integer >= 1.
    """
    if last_n_iterations is not None and (
        int(last_n_iterations) != last_n_iterations or last_n_iterations < 1
    ):
        raise ValueError(
            f"last_n_iterations must be None or an integer >= 1, got {last_n_iterations!r}"
        )
    by_iteration: dict[int, list[IterationFile]] = {}
    for f in files:
        by_iteration.setdefault(f.iteration, []).append(f)
    chosen = sorted(by_iteration)
    if last_n_iterations is not None:
        chosen = chosen[-int(last_n_iterations) :]
    out: list[IterationFile] = []
    for it in chosen:
        group = by_iteration[it]
        merged = [f for f in group if f.rank is None]
        out.extend(merged or group)
    return out


def with_listing(list_readable: Callable[[], list[IterationFile]], read: Any) -> Any:
    """``read(list_readable())``, listed again when a listed file vanished meanwhile."""
    # A merge or a cleanup may remove a listed file before we open it; the
    # data then lives in the merged file (or was deleted on purpose): list again.
    for attempt in range(_LISTING_RETRIES):
        files = list_readable()
        try:
            return read(files)
        except FileNotFoundError:
            if attempt == _LISTING_RETRIES - 1:
                raise
    raise AssertionError("unreachable")


def remove_stale_temporaries(root: Path, older_than_s: float) -> list[Path]:
    """Remove our abandoned temporary files under ``root`` older than ``older_than_s``
    seconds (see :meth:`TrajectoryStorage.remove_stale_temporaries`); returns their paths."""
    removed: list[Path] = []
    if not root.is_dir():
        return removed
    cutoff = time.time() - float(older_than_s)
    for entry in os.scandir(root):
        if not _TEMP_RE.match(entry.name):
            continue
        try:
            if not entry.is_file(follow_symlinks=False) or entry.stat().st_mtime > cutoff:
                continue
            os.unlink(entry.path)
        except FileNotFoundError:  # its writer finished (renamed it) or another opener won
            continue
        removed.append(Path(entry.path))
    if removed:
        logger.warning(
            "removed %d abandoned temporary files (killed writers) under %s: %s",
            len(removed),
            root,
            ", ".join(p.name for p in removed[:5]),
        )
    return removed


def resolve_image(root: Path, image_path: Any) -> Any:
    """A stored screenshot path made absolute again (relative ones lie under ``root``)."""
    if not isinstance(image_path, str) or image_path == "" or os.path.isabs(image_path):
        return image_path
    return str(root / image_path)


def relative_image(image_path: Any, root: str, inside: str) -> Any:
    """A screenshot path relative to the storage root (``/``-separated) when it lies
    under it, else absolute; anything but a non-empty string as it is. ``root`` is the
    absolute root, ``inside`` the same ending with the path separator."""
    if not isinstance(image_path, str) or image_path == "":
        return image_path
    absolute = os.path.abspath(image_path)
    if absolute.startswith(inside):
        return absolute[len(inside) :].replace(os.sep, "/")
    return "." if absolute == root else absolute
