"""WebGym's ``webgym/utils/trajectory_storage.py``, over :class:`TrajectoryStorage`.

``from webgym.utils.trajectory_storage import X`` becomes
``from replaystore.pipeline.trajectory_storage import X`` (or ``from
replaystore.pipeline import X``): same function names, parameters and return
shapes; steps come back as WebGym step mappings holding replaystore's
components (:mod:`replaystore.trajectories.components`).

Directory layout (WebGym's convention): the trajectories of a split live in
``{base_dir}/{split}_trajectories/``. Two kinds of iteration files may sit there:

* **written here** (:func:`save_trajectories_incremental`): replaystore's JSONL
  iteration files (:class:`~replaystore.trajectories.storage.TrajectoryStorage`),
  ``iteration_000005.jsonl`` for a single-node save (WebGym:
  ``train_trajectories.pt.iteration5``) and ``iteration_000005.rank001.jsonl``
  for ``rank_suffix="_rank_1"`` (WebGym: ``train_trajectories.pt.iteration5_rank_1``).
  Written atomically, never pickled; ``TrajectoryStorage(dir).merge_ranks(5)``
  merges the rank files of an iteration (WebGym does that in shell).
* **written by WebGym**: ``{split}_trajectories.pt.iteration{N}`` (merged) and
  ``{split}_trajectories.pt.iteration{N}_rank_{k}`` (one rank), read through the
  safe importer (:mod:`replaystore.trajectories.webgym_import`: no code in the
  file runs). ``.checkpoint`` files are not read.

Both kinds are read together, ordered by iteration number; per iteration the
merged file is read when there is one, else its rank files (WebGym reads merged
files only, hiding iterations whose ranks were never merged). An iteration with
a merged file in both formats, or a rank in both formats, is ambiguous and
raises :class:`~replaystore.errors.StorageError`. A migrated run simply goes on:
:func:`get_next_iteration_number` counts WebGym's files too.

Differences from WebGym, each a fix:

* a file that cannot be read raises (WebGym prints a warning, skips the file and
  trains on less data without saying so in its return value);
* :func:`save_trajectories_incremental` does not modify the trajectories or the
  metadata dict it is given (WebGym strips page metadata and adds keypoint ids
  in place); ``None`` and empty trajectories (WebGym's placeholders for failed
  rollouts) hold no data and are not stored (WebGym stores them; its readers
  drop them);
* ``cleanup_old_iterations(keep_last_n=0)`` removes every iteration (WebGym's
  ``files[:-0]`` removes none); rank files of old iterations go too;
* progress is logged (``replaystore.pipeline.trajectory_storage``), not printed.
"""

from __future__ import annotations

import concurrent.futures
import datetime as _dt
import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from replaystore.atomic import fsync_dir
from replaystore.errors import StorageError

__all__ = [
    "IterationSource",
    "cleanup_old_iterations",
    "get_next_iteration_number",
    "get_trajectory_stats",
    "iteration_sources",
    "load_all_trajectories",
    "load_last_iteration_trajectories",
    "save_trajectories_incremental",
    "trajectory_dir",
]

logger = logging.getLogger("replaystore.pipeline.trajectory_storage")

_RANK_SUFFIX = re.compile(r"^_rank_(\d+)$")


def trajectory_dir(base_dir: str | os.PathLike[str], split: str) -> Path:
    """``{base_dir}/{split}_trajectories``: where a split's iteration files live.

    Raises:
        ValueError: ``split`` is empty or contains a path separator.
    """
    if not isinstance(split, str) or not split or "/" in split or os.sep in split:
        raise ValueError(f"split must be a name like 'train' or 'test', got {split!r}")
    return Path(base_dir) / f"{split}_trajectories"


def _storage(directory: Path) -> Any:
    from replaystore.trajectories.storage import TrajectoryStorage

    return TrajectoryStorage(directory)


@dataclass(frozen=True, slots=True)
class IterationSource:
    """One readable iteration file of a split.

    Attributes:
        path: the file.
        iteration: its iteration number.
        rank: its rank, or None for a merged file.
        format: ``"replaystore"`` (JSONL, ours) or ``"webgym"`` (a ``.pt`` pickle,
            read through the safe importer).
    """

    path: Path
    iteration: int
    rank: int | None
    format: Literal["replaystore", "webgym"]

    def load_with_metadata(self) -> tuple[list[list[dict[str, Any]]], dict[str, Any]]:
        """The file's trajectories (lists of step mappings) and its metadata dict.

        Raises:
            StorageError, UnsafeFileError, SchemaError, TrajectoryError: the file
                is unreadable, not what its name says, or malformed (named).
        """
        if self.format == "webgym":
            from replaystore.trajectories.webgym_import import load_webgym_file_with_metadata

            return load_webgym_file_with_metadata(self.path)
        storage = _storage(self.path.parent)
        return storage.read_file(self.path), storage.describe_file(self._file())["metadata"]

    def load(self) -> list[list[dict[str, Any]]]:
        """The file's trajectories (see :meth:`load_with_metadata`)."""
        if self.format == "webgym":
            return self.load_with_metadata()[0]
        return _storage(self.path.parent).read_file(self.path)

    def _file(self) -> Any:
        from replaystore.trajectories.storage import IterationFile

        return IterationFile(self.path, self.iteration, self.rank)


def _all_files(directory: Path, split: str) -> list[IterationSource]:
    """Every iteration file in ``directory`` of either format, sorted by (iteration, rank)."""
    if not directory.is_dir():
        return []
    from replaystore.trajectories.webgym_import import webgym_file_iteration

    found = [
        IterationSource(f.path, f.iteration, f.rank, "replaystore")
        for f in _storage(directory).files()
    ]
    prefix = f"{split}_trajectories.pt.iteration"
    for entry in os.scandir(directory):
        if entry.name.startswith(prefix) and entry.is_file():
            named = webgym_file_iteration(entry.name)
            if named is not None:
                found.append(IterationSource(Path(entry.path), named[0], named[1], "webgym"))
    found.sort(key=lambda s: (s.iteration, -1 if s.rank is None else s.rank, s.format))
    return found


def iteration_sources(
    base_dir: str | os.PathLike[str], split: str, last_n_iterations: int | None = None
) -> list[IterationSource]:
    """The files :func:`load_all_trajectories` reads, oldest iteration first.

    Per iteration: its merged file if there is one (either format), else its rank
    files. ``last_n_iterations`` None or ``<= 0`` means all (WebGym's rule).

    Raises:
        StorageError: an iteration has a merged file in both formats, or one rank
            in both formats.
    """
    by_iteration: dict[int, list[IterationSource]] = {}
    for source in _all_files(trajectory_dir(base_dir, split), split):
        by_iteration.setdefault(source.iteration, []).append(source)
    chosen = sorted(by_iteration)
    if last_n_iterations is not None and last_n_iterations > 0:
        chosen = chosen[-int(last_n_iterations) :]
    out: list[IterationSource] = []
    for iteration in chosen:
        group = by_iteration[iteration]
        seen: dict[int | None, IterationSource] = {}
        for source in group:
            if source.rank in seen:
                which = "merged file" if source.rank is None else f"rank {source.rank}"
                raise StorageError(
                    f"iteration {iteration} has a {which} in both formats: "
                    f"{seen[source.rank].path} and {source.path}; remove one"
                )
            seen[source.rank] = source
        merged = seen.get(None)
        out.extend([merged] if merged is not None else group)
    return out


def get_next_iteration_number(base_dir: str | os.PathLike[str], split: str) -> int:
    """One more than the highest *merged* iteration of ``split`` (1 when there is none).

    As in WebGym, rank files do not count: every rank of a multi-node rollout
    gets the same number until the iteration is merged. Files of both formats
    count. Creates ``{base_dir}/{split}_trajectories`` (as WebGym does).

    Cost: one directory listing.
    """
    directory = trajectory_dir(base_dir, split)
    directory.mkdir(parents=True, exist_ok=True)
    merged = [s.iteration for s in _all_files(directory, split) if s.rank is None]
    return max(merged, default=0) + 1


def _rank_of(rank_suffix: str) -> int | None:
    if rank_suffix in ("", None):
        return None
    match = _RANK_SUFFIX.match(str(rank_suffix))
    if match is None:
        raise ValueError(
            f"rank_suffix must be '' or '_rank_<k>' (e.g. '_rank_0'), got {rank_suffix!r}"
        )
    return int(match.group(1))


def save_trajectories_incremental(
    trajectories: Sequence[Sequence[Any] | None],
    base_dir: str | os.PathLike[str],
    split: str,
    rank_suffix: str = "",
    metadata: Mapping[str, Any] | None = None,
) -> str:
    """Save one rollout iteration of ``split``; returns the path of the file written.

    The iteration number is :func:`get_next_iteration_number`. ``rank_suffix``
    ``""`` writes the iteration's merged file (single node); ``"_rank_<k>"``
    writes rank ``k``'s file of that iteration. Page metadata is stripped to
    ``title`` and ``url`` and each trajectory's first step gets
    ``trajectory_metadata["keypoint_step_ids"]`` in the stored copy (see
    :class:`~replaystore.trajectories.storage.TrajectoryStorage`); the inputs
    are not modified.

    Args:
        trajectories: lists of WebGym step mappings; ``None`` and empty entries
            are skipped (logged).
        base_dir: the run directory (WebGym's ``save_path``).
        split: ``"train"`` or ``"test"`` (any plain name).
        rank_suffix: ``""`` or ``"_rank_<k>"``.
        metadata: JSON-compatible facts kept in the file header; ``timestamp``
            and ``iteration`` are added when absent (on a copy).

    Raises:
        ValueError: a malformed ``rank_suffix`` or ``split``.
        StorageError: the target file exists, or (single node) the iteration has
            unmerged rank files.
        TrajectoryError: a step is malformed or not JSON-serialisable (names the
            trajectory and step); nothing is written.

    Cost: one JSON encoding per step, one fsync (see ``TrajectoryStorage.save_iteration``).
    """
    rank = _rank_of(rank_suffix)
    present = [t for t in trajectories if t is not None and len(t) > 0]
    if len(present) < len(trajectories):
        logger.info(
            "%s: not storing %d empty (None) trajectories",
            split,
            len(trajectories) - len(present),
        )
    iteration = get_next_iteration_number(base_dir, split)
    header = dict(metadata or {})
    header.setdefault("timestamp", _dt.datetime.now().isoformat())
    header.setdefault("iteration", iteration)
    path = _storage(trajectory_dir(base_dir, split)).save_iteration(
        iteration, present, rank=rank, metadata=header
    )
    return str(path)


def _require_dir(base_dir: str | os.PathLike[str], split: str) -> Path:
    directory = trajectory_dir(base_dir, split)
    if not directory.is_dir():
        raise FileNotFoundError(
            f"Trajectory directory not found: {directory} (save trajectories with "
            "save_trajectories_incremental, or copy WebGym's iteration files there)"
        )
    return directory


def load_last_iteration_trajectories(
    base_dir: str | os.PathLike[str], split: str, return_metadata: bool = False
) -> list[list[dict[str, Any]]] | tuple[list[list[dict[str, Any]]], dict[str, Any] | None]:
    """The trajectories of the most recent iteration of ``split``.

    Returns:
        The list of trajectories, or ``(trajectories, metadata)`` with
        ``return_metadata``: the file's metadata dict; for an unmerged iteration
        read from several rank files, ``{"rank_metadata": {rank: metadata}}``.

    Raises:
        FileNotFoundError: the directory is missing or holds no iteration file.
        StorageError, UnsafeFileError, TrajectoryError: a file cannot be read (named).

    Cost: reads the iteration's file(s).
    """
    directory = _require_dir(base_dir, split)
    sources = iteration_sources(base_dir, split, last_n_iterations=1)
    if not sources:
        raise FileNotFoundError(f"No iteration files found in {directory}")
    trajectories: list[list[dict[str, Any]]] = []
    metadatas: dict[int | None, dict[str, Any]] = {}
    for source in sources:
        loaded, meta = source.load_with_metadata()
        trajectories.extend(loaded)
        metadatas[source.rank] = meta
    logger.info(
        "loaded %d trajectories of iteration %d from %s",
        len(trajectories),
        sources[0].iteration,
        directory,
    )
    if not return_metadata:
        return trajectories
    if None in metadatas:
        metadata: dict[str, Any] = metadatas[None]
    else:
        metadata = {"rank_metadata": {rank: meta for rank, meta in metadatas.items()}}
    return trajectories, metadata


def load_all_trajectories(
    base_dir: str | os.PathLike[str],
    split: str,
    return_file_list: bool = False,
    parallel: bool = True,
    num_workers: int = 4,
    last_n_iterations: int | None = None,
) -> list[list[dict[str, Any]]] | tuple[list[list[dict[str, Any]]], list[str]]:
    """Every trajectory of ``split``, oldest iteration first (ranks in order).

    Args:
        base_dir: the run directory.
        split: ``"train"`` or ``"test"``.
        return_file_list: also return the paths read, in order.
        parallel: read files in ``num_workers`` threads (file I/O and WebGym
            zip reading overlap; JSON parsing holds the GIL).
        num_workers: threads for ``parallel`` (>= 1).
        last_n_iterations: only the most recent N iterations (None or <= 0: all).

    Returns:
        The trajectories (lists of step mappings), or ``(trajectories, file_list)``.

    Raises:
        FileNotFoundError: the directory is missing or holds no iteration file.
        StorageError, UnsafeFileError, TrajectoryError: a file cannot be read
            (named); WebGym skipped such files with a printed warning.
        ValueError: ``num_workers < 1``.

    Cost: reads every chosen file; memory of all loaded steps. For training
    data, ``ReplayBuffer.from_storage`` keeps only an index instead.
    """
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ValueError(f"num_workers must be an integer >= 1, got {num_workers!r}")
    directory = _require_dir(base_dir, split)
    sources = iteration_sources(base_dir, split, last_n_iterations)
    if not sources:
        raise FileNotFoundError(
            f"No iteration files found in {directory} (expected iteration_NNNNNN[.rankRRR].jsonl "
            f"or {split}_trajectories.pt.iteration[N])"
        )
    if parallel and len(sources) > 1 and num_workers > 1:
        with concurrent.futures.ThreadPoolExecutor(max_workers=num_workers) as pool:
            loaded = list(pool.map(IterationSource.load, sources))
    else:
        loaded = [source.load() for source in sources]
    trajectories = [t for part in loaded for t in part]
    logger.info(
        "loaded %d trajectories from %d files (%d iterations) in %s",
        len(trajectories),
        len(sources),
        len({s.iteration for s in sources}),
        directory,
    )
    if return_file_list:
        return trajectories, [str(s.path) for s in sources]
    return trajectories


def cleanup_old_iterations(
    base_dir: str | os.PathLike[str], split: str, keep_last_n: int = 5
) -> list[str]:
    """Delete every file (merged and rank, both formats) of all but the last ``keep_last_n``
    iterations of ``split``. A missing directory is a no-op.

    Returns:
        The removed paths (WebGym returns None).

    Raises:
        ValueError: ``keep_last_n`` is not an integer >= 0.
    """
    if isinstance(keep_last_n, bool) or not isinstance(keep_last_n, int) or keep_last_n < 0:
        raise ValueError(f"keep_last_n must be an integer >= 0, got {keep_last_n!r}")
    directory = trajectory_dir(base_dir, split)
    files = _all_files(directory, split)
    iterations = sorted({s.iteration for s in files})
    doomed = set(iterations[: max(0, len(iterations) - keep_last_n)])
    removed = []
    for source in files:
        if source.iteration in doomed:
            source.path.unlink(missing_ok=True)
            removed.append(str(source.path))
    if removed:
        fsync_dir(directory)
        logger.info("removed %d old iteration files under %s", len(removed), directory)
    return removed


def get_trajectory_stats(base_dir: str | os.PathLike[str], split: str) -> dict[str, Any]:
    """WebGym's statistics of the stored iterations of ``split``.

    Returns:
        ``{"total_iterations", "total_trajectories", "total_size_mb", "iterations":
        [{"iteration", "filepath", "num_trajectories", "size_mb", "rank", "format"},
        ...]}``, one row per file read by :func:`load_all_trajectories`. Our files
        are counted from their headers (no step parsed); a WebGym file is loaded
        to count it, and one that cannot be loaded counts ``-1`` (logged), as in
        WebGym. A missing directory gives zeros and ``[]``.

    Raises:
        StorageError: one of our files is not what its name says.
    """
    rows = []
    for source in iteration_sources(base_dir, split):
        size_mb = source.path.stat().st_size / 2**20
        if source.format == "replaystore":
            count = _storage(source.path.parent).describe_file(source._file())["num_trajectories"]
        else:
            try:
                count = len(source.load())
            except (StorageError, ValueError) as exc:
                logger.warning("cannot count trajectories of %s: %s", source.path, exc)
                count = -1
        rows.append(
            {
                "iteration": source.iteration,
                "filepath": str(source.path),
                "num_trajectories": count,
                "size_mb": size_mb,
                "rank": source.rank,
                "format": source.format,
            }
        )
    return {
        "total_iterations": len({r["iteration"] for r in rows}),
        "total_trajectories": sum(r["num_trajectories"] for r in rows if r["num_trajectories"] > 0),
        "total_size_mb": sum(r["size_mb"] for r in rows),
        "iterations": rows,
    }


def _field(obj: Any, name: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def _strip_page_metadata(trajectories: list[Any]) -> list[Any]:
    """WebGym's helper: keep only ``title`` and ``url`` of each observation's page metadata.

    Modifies the observations in place and returns ``trajectories`` (WebGym's
    contract; its scripts save the result themselves). Keys that are absent stay
    absent (WebGym writes ``"Unknown"``). ``None`` trajectories and steps are
    skipped. :func:`save_trajectories_incremental` does this on its stored copy.
    """
    for trajectory in trajectories:
        for step in trajectory or ():
            if not isinstance(step, Mapping) or "observation" not in step:
                continue
            observation = step["observation"]
            page = _field(observation, "page_metadata")
            if not isinstance(page, Mapping):
                continue
            stripped = {k: page[k] for k in ("title", "url") if k in page}
            if isinstance(observation, dict):
                observation["page_metadata"] = stripped
            else:
                observation.page_metadata = stripped
    return trajectories


def _extract_keypoint_step_ids(trajectories: list[Any]) -> list[Any]:
    """WebGym's helper: record in each trajectory's first step the steps whose reward has
    ``submit`` set, as ``trajectory_metadata["keypoint_step_ids"]``.

    Modifies the first steps in place and returns ``trajectories`` (WebGym's
    contract). ``None`` and empty trajectories are skipped.
    :func:`save_trajectories_incremental` does this on its stored copy.

    Raises:
        TypeError: a first step is not a mutable mapping.
    """
    for trajectory in trajectories:
        if not trajectory:
            continue
        keypoints = [
            i
            for i, step in enumerate(trajectory)
            if isinstance(step, Mapping) and bool(_field(step.get("reward"), "submit"))
        ]
        first = trajectory[0]
        if first is None:
            continue
        if not isinstance(first, dict):
            raise TypeError(f"a trajectory's first step must be a dict, got {type(first).__name__}")
        meta = first.get("trajectory_metadata")
        if meta is None:
            meta = first["trajectory_metadata"] = {}
        meta["keypoint_step_ids"] = keypoints
    return trajectories
