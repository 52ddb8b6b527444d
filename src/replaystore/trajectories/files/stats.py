"""Storage statistics from iteration file headers alone (no step is parsed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from replaystore.trajectories.files.header import read_header
from replaystore.trajectories.files.naming import IterationFile
from replaystore.trajectories.index import count_successes


def stats_of(files: list[IterationFile], root: Path, success_threshold: float) -> dict[str, Any]:
    """:meth:`TrajectoryStorage.stats` of ``files`` (the readable files under ``root``).

    Raises:
        FileNotFoundError: a file vanished (the caller lists again).
        StorageError, TrajectoryError: see :meth:`TrajectoryStorage.stats`.
    """
    per: dict[int, dict[str, Any]] = {}
    for f in files:
        header = read_header(f)
        size = f.path.stat().st_size
        successful, _ = count_successes(header.final_rewards, header.dummy, success_threshold)
        entry = per.setdefault(
            f.iteration,
            {
                "iteration": f.iteration,
                "files": 0,
                "trajectories": 0,
                "steps": 0,
                "successful_trajectories": 0,
                "dummy_trajectories": 0,
                "size_bytes": 0,
            },
        )
        entry["files"] += 1
        entry["trajectories"] += int(header.lengths.size)
        entry["steps"] += header.num_steps
        entry["successful_trajectories"] += successful
        entry["dummy_trajectories"] += int(header.dummy.sum())
        entry["size_bytes"] += size
    rows = [per[it] for it in sorted(per)]
    total_size = sum(r["size_bytes"] for r in rows)
    return {
        "root": str(root),
        "total_iterations": len(rows),
        "total_files": sum(r["files"] for r in rows),
        "total_trajectories": sum(r["trajectories"] for r in rows),
        "total_steps": sum(r["steps"] for r in rows),
        "successful_trajectories": sum(r["successful_trajectories"] for r in rows),
        "dummy_trajectories": sum(r["dummy_trajectories"] for r in rows),
        "total_size_bytes": total_size,
        "total_size_mb": total_size / 2**20,
        "iterations": rows,
    }
