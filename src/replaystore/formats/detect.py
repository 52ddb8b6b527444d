"""What a local path holds: the one format detection of the tools that only look.

:func:`detect` names the store a path is (``replaystore stats`` and ``replaystore view``
both ask it); :func:`detect_with_storage` also opens a run's output directory, whose
trajectory storage is in ``storage/`` (a demo's or a rollout's ``--out``). The kinds:

* ``trajectory_storage``: a directory of trajectory iteration files
  (``iteration_*.jsonl``, what :class:`~replaystore.trajectories.storage.TrajectoryStorage`
  writes);
* ``sqlite_experience_store``: a SQLite experience store file;
* ``transitions_checkpoint``: a transitions checkpoint's ``<name>.metadata`` (also found
  from ``<name>``, as ``ReplayBuffer.save``/``load`` take it, or from a directory holding
  exactly one);
* ``transitions_memmap``: a memory-mapped transitions buffer directory (``buffer.json``).

Detection only reads: names, a file's first bytes, a directory's listing. It removes
nothing (a writer's temporary files stay) and imports neither torch nor the writers.
"""

from __future__ import annotations

from pathlib import Path

from replaystore.errors import ArgumentError
from replaystore.formats.sqlite_experience import is_sqlite_file

__all__ = ["KINDS", "NotAStoreError", "detect", "detect_with_storage", "has_iteration_files"]

#: Every kind :func:`detect` names.
KINDS = (
    "trajectory_storage",
    "sqlite_experience_store",
    "transitions_checkpoint",
    "transitions_memmap",
)


class NotAStoreError(ArgumentError):
    """The path is none of the stores replaystore writes (the message says what it is)."""


def has_iteration_files(directory: Path) -> bool:
    """Whether ``directory`` holds trajectory iteration files (listing only)."""
    from replaystore.trajectories.files.naming import list_files

    return directory.is_dir() and bool(list_files(directory))


def detect(path: Path) -> tuple[str, Path]:
    """``(kind, the path to open)`` of a local ``path`` (kinds: :data:`KINDS`).

    Raises:
        NotAStoreError: ``path`` does not exist or is none of the kinds (one line).
    """
    if path.is_dir():
        if (path / "buffer.json").is_file():
            return "transitions_memmap", path
        checkpoints = sorted(path.glob("*.metadata"))
        if len(checkpoints) == 1:
            return "transitions_checkpoint", checkpoints[0]
        if has_iteration_files(path):
            return "trajectory_storage", path
        raise NotAStoreError(
            f"{path} is a directory with no trajectory iteration files (iteration_*.jsonl), "
            "no memory-mapped transitions buffer (buffer.json) and no single checkpoint "
            "(*.metadata)"
        )
    if path.is_file():
        return _detect_file(path)
    metadata = path.with_name(path.name + ".metadata")
    if metadata.is_file():  # a checkpoint named by its prefix, as save()/load() take it
        return "transitions_checkpoint", metadata
    raise NotAStoreError(f"{path} does not exist")


def _detect_file(path: Path) -> tuple[str, Path]:
    if is_sqlite_file(path):
        return "sqlite_experience_store", path
    if path.name.endswith(".metadata"):
        return "transitions_checkpoint", path
    if path.name == "buffer.json":
        return "transitions_memmap", path.parent
    if path.name.startswith("iteration_") and path.suffix == ".jsonl":
        raise NotAStoreError(
            f"{path} is one trajectory iteration file: pass its directory ({path.parent})"
        )
    raise NotAStoreError(
        f"cannot tell what {path} is: expected a trajectory storage directory, a SQLite "
        "experience store, a transitions checkpoint (<name>.metadata) or a memmap "
        "buffer directory"
    )


def detect_with_storage(path: Path) -> tuple[str, Path, Path | None]:
    """:func:`detect`, and a run's output directory too: ``(kind, the path to open, the
    directory screenshots may come from, or None for the store's own)``. A directory
    with no store of its own but a trajectory storage in ``storage/`` opens that storage,
    with screenshots allowed from the whole directory (they sit beside ``storage/``).

    Raises:
        NotAStoreError: as :func:`detect`.
    """
    other = (path / "buffer.json").is_file() or len(list(path.glob("*.metadata"))) == 1
    if (
        path.is_dir()
        and not other
        and not has_iteration_files(path)
        and has_iteration_files(path / "storage")
    ):
        return "trajectory_storage", path / "storage", path
    kind, target = detect(path)
    return kind, target, None
