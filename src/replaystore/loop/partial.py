"""The ``.partial``-then-rename step of every loop output that is a directory.

A directory output (a dataset, the tiny model, a checkpoint, a merged model) is written into
``<name>.partial`` next to its place and renamed into place when complete, so an
unfinished stage never leaves something a resumed run could take for its output.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

__all__ = ["build_directory", "keep_finished", "partial_path"]

T = TypeVar("T")


def partial_path(target: Path) -> Path:
    """Where ``target`` is written before it is complete: ``<target>.partial``."""
    return target.with_name(target.name + ".partial")


def _commit(partial: Path, target: Path) -> None:
    """Rename the complete ``partial`` into place: the directory's commit."""
    os.replace(partial, target)


def build_directory(target: Path, make: Callable[[Path], T]) -> T:
    """Write ``target`` through its ``.partial``: leftovers of an earlier try (the partial
    and an incomplete target) are removed, ``make(partial)`` writes it, then it is
    renamed into place; ``make``'s result. Nothing is renamed when ``make`` raises."""
    partial = partial_path(target)
    shutil.rmtree(partial, ignore_errors=True)
    shutil.rmtree(target, ignore_errors=True)
    result = make(partial)
    _commit(partial, target)
    return result


def keep_finished(
    target: Path, complete: Callable[[Path], bool], *, partial_counts: bool = True
) -> bool:
    """Whether ``target`` is complete (``complete(path)``): in place already, or (when
    ``partial_counts``) its ``.partial`` finished before the loop died, then renamed into
    place now. An unfinished ``.partial`` is left for :func:`build_directory` to redo.

    ``partial_counts=False`` is for outputs whose writer may stop between writing the
    files ``complete`` looks at and finishing (a trainer killed while it saves): only
    the renamed directory, which the loop renames once the writer returned, counts.
    """
    if target.is_dir() and complete(target):
        return True
    partial = partial_path(target)
    if not (partial_counts and partial.is_dir() and complete(partial)):
        return False
    shutil.rmtree(target, ignore_errors=True)
    _commit(partial, target)
    return True
