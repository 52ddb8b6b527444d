"""``replaystore stats PATH``: detect what a store is and print its summary, reading only."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from replaystore.cli._common import Parser, UsageError, finite_float, human_bytes, store_path, table
from replaystore.errors import ReplayStoreError
from replaystore.formats.detect import NotAStoreError
from replaystore.formats.detect import detect as detect_store
from replaystore.formats.transitions_checkpoint import (
    is_zip_archive,
    read_checkpoint_meta,
)

__all__ = ["DESCRIPTION", "add_arguments", "detect", "run"]

DESCRIPTION = (
    "Detect what PATH is and print a summary: a trajectory storage directory "
    "(iterations, trajectories, steps, success rate), a SQLite experience store (rows, "
    "tasks, agents), a transitions checkpoint (<name>.metadata, or <name> itself) or a "
    "memory-mapped transitions buffer directory (buffer.json). Reads only; never "
    "modifies PATH."
)


def add_arguments(parser: Parser) -> None:
    """The options of ``replaystore stats``."""
    parser.add_argument(
        "path",
        metavar="PATH",
        help="what to summarise: a path, a sqlite:///path URL or a postgresql:// URL",
    )
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
    parser.add_argument(
        "--success-threshold",
        type=finite_float,
        default=1.0,
        help="trajectory storage: a trajectory is successful when its final reward is >= "
        "this (default: %(default)s)",
    )


def detect(path: Path) -> tuple[str, Path]:
    """``(kind, path to open)`` of a local PATH (:func:`replaystore.formats.detect.detect`).

    Raises:
        UsageError: ``path`` does not exist or is none of the known kinds.
    """
    try:
        return detect_store(path)
    except NotAStoreError as exc:
        raise UsageError(str(exc)) from None


def _trajectory_stats(path: Path, success_threshold: float) -> dict[str, Any]:
    from replaystore.formats.trajectory_header import read_summary
    from replaystore.trajectories.index import success_rate

    stats = read_summary(path, success_threshold)  # reads only: temporaries stay
    stats["root"] = str(path.resolve())

    valid = stats["total_trajectories"] - stats["dummy_trajectories"]
    stats["success_rate"] = success_rate(stats["successful_trajectories"], valid)
    stats["success_threshold"] = success_threshold
    return stats


def _print_trajectory_stats(s: dict[str, Any]) -> None:
    from replaystore.trajectories.index import success_rate

    its = [row["iteration"] for row in s["iterations"]]
    print(f"trajectory storage: {s['root']}")
    print(
        f"  iterations: {s['total_iterations']} ({its[0]}-{its[-1]}), files: "
        f"{s['total_files']}, size: {human_bytes(s['total_size_bytes'])}"
    )
    print(
        f"  trajectories: {s['total_trajectories']} ({s['dummy_trajectories']} dummy), "
        f"successful: {s['successful_trajectories']} ({100 * s['success_rate']:.1f}% of "
        f"non-dummy, final reward >= {s['success_threshold']:g})"
    )
    print(f"  steps: {s['total_steps']}")
    rows = []
    for row in s["iterations"]:
        valid = row["trajectories"] - row["dummy_trajectories"]
        share = success_rate(row["successful_trajectories"], valid, empty=float("nan"))
        rate = "-" if math.isnan(share) else f"{100 * share:.1f}%"
        rows.append(
            (
                row["iteration"],
                row["files"],
                row["trajectories"],
                row["steps"],
                row["successful_trajectories"],
                rate,
                row["dummy_trajectories"],
                human_bytes(row["size_bytes"]),
            )
        )
    print("  per iteration:")
    header = ("iteration", "files", "trajectories", "steps", "successful", "rate", "dummy", "size")
    for line in table(header, rows, "rrrrrrrr"):
        print(line)


def _print_sqlite_stats(s: dict[str, Any]) -> None:
    print(f"SQLite experience store: {s['path']} ({human_bytes(s['size_bytes'])})")
    _print_store_body(s)


def _print_store_body(s: dict[str, Any]) -> None:
    print(
        f"  rows: {s['rows']}, tasks: {s['tasks']}, task names: {s['task_names']}, "
        f"agents: {s['agents']}"
    )
    if s["rows"]:
        print(f"  steps: {s['steps'][0]}-{s['steps'][1]}")
        print(f"  execute_time: {s['execute_time'][0]} .. {s['execute_time'][1]}")
        print("  per agent:")
        rows = [(a["agent_id"], a["rows"], a["tasks"]) for a in s["per_agent"]]
        for line in table(("agent_id", "rows", "tasks"), rows, "lrr"):
            print(line)


def _objectrl_torch_stats(meta_path: Path) -> dict[str, Any]:
    """The summary of ObjectRL's ``torch.save`` metadata file, read as ``load`` reads it:
    the pickle's opcodes only, nothing unpickled (the reader imports torch)."""
    from replaystore.transitions.checkpoint import read_objectrl_metadata

    meta = read_objectrl_metadata(meta_path.with_name(meta_path.name.removesuffix(".metadata")))
    if meta is None:
        raise UsageError(f"{meta_path} is a zip archive but not ObjectRL's metadata")
    return {
        "path": str(meta_path.resolve()),
        "format": "objectrl-metadata-only",
        "buffer_size": meta.buffer_size,
        "data_size": meta.data_size,
        "pointer": meta.pointer,
        "note": "metadata only (ObjectRL's format, torch.save): no transitions are stored",
    }


def _checkpoint_stats(meta_path: Path) -> dict[str, Any]:
    if is_zip_archive(meta_path):  # what torch.save writes
        return _objectrl_torch_stats(meta_path)
    meta = read_checkpoint_meta(meta_path)
    out: dict[str, Any] = {
        "path": str(meta_path.resolve()),
        "format": meta.format or "objectrl-metadata-only",
        "buffer_size": meta.buffer_size,
        "data_size": meta.data_size,
        "pointer": meta.pointer,
    }
    if meta.data_dir is None:
        out["note"] = "metadata only (ObjectRL's format): no transitions are stored"
        return out
    out.update(
        sampler=meta.sampler,
        fields=[{"name": c.name, "dtype": c.dtype, "shape": list(c.shape)} for c in meta.columns],
        data_dir=str(meta.data_dir.resolve()),
        data_bytes=sum(f.nbytes for f in meta.files()),
        data_files_complete=meta.complete(),
    )
    return out


def _print_transitions_stats(kind: str, s: dict[str, Any]) -> None:
    title = "transitions checkpoint" if kind == "transitions_checkpoint" else "memmap buffer"
    print(f"{title}: {s['path']} ({s['format']})")
    print(
        f"  buffer_size: {s['buffer_size']}, data_size: {s['data_size']}, pointer: {s['pointer']}"
    )
    if "note" in s:
        print(f"  {s['note']}")
        return
    if "sampler" in s:
        params = ", ".join(
            f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}"
            for k, v in s["sampler"].items()
            if k != "kind"
        )
        kind_name = s["sampler"].get("kind", "?")
        print(f"  sampler: {kind_name}" + (f" ({params})" if params else ""))
        state = (
            "complete" if s["data_files_complete"] else "INCOMPLETE (files missing or truncated)"
        )
        print(f"  data: {s['data_dir']} ({human_bytes(s['data_bytes'])}, {state})")
    else:
        print(f"  prioritized: {'yes' if s['prioritized'] else 'no'}")
        print(f"  column files: {human_bytes(s['file_bytes'])}")
    fields = [
        (f["name"], f["dtype"], "x".join(map(str, f["shape"])) or "scalar") for f in s["fields"]
    ]
    print("  fields:")
    for line in table(("name", "dtype", "shape"), fields, "lll"):
        print(line)


def _postgres_stats(url: str) -> dict[str, Any]:
    """The experience store summary of a ``postgresql://`` URL, in one read-only transaction."""
    from replaystore.formats.postgres_experience import read_summary

    try:
        return read_summary(url)
    except ReplayStoreError as exc:
        raise UsageError(str(exc)) from None


def _print_postgres_stats(s: dict[str, Any]) -> None:
    print(
        f"PostgreSQL experience store: {s['url']} schema {s['schema']} "
        f"(layout version {s['version']}, {human_bytes(s['size_bytes'])})"
    )
    _print_store_body(s)


def run(args: argparse.Namespace) -> int:
    """Print the summary of PATH (a path or a store URL); returns the exit status."""
    if ":" not in args.path:
        # Never a URL (every scheme needs a colon): skip the URL helpers, whose import
        # loads the whole experience package (~0.1 s) for nothing.
        return _print_stats(args, Path(args.path))
    from replaystore.experience.storage.urls import is_postgres_url

    if is_postgres_url(args.path):
        summary = _postgres_stats(args.path)
        if args.json:
            print(json.dumps({"kind": "postgres_experience_store", **summary}, indent=2))
        else:
            _print_postgres_stats(summary)
        return 0
    return _print_stats(args, store_path(args.path))


def _print_stats(args: argparse.Namespace, path: Path) -> int:
    """Detect what the local ``path`` is, then print its summary (text or ``--json``)."""
    kind, target = detect(path)
    if kind == "trajectory_storage":
        summary = _trajectory_stats(target, args.success_threshold)
    elif kind == "sqlite_experience_store":
        from replaystore.formats import sqlite_experience

        summary = sqlite_experience.read_summary(target)
    elif kind == "transitions_checkpoint":
        summary = _checkpoint_stats(target)
    else:  # NumPy (the priorities file) is imported for this kind only, not for --help
        from replaystore.formats import transitions_buffer

        summary = transitions_buffer.read_summary(target)
    if args.json:
        print(json.dumps({"kind": kind, **summary}, indent=2))
    elif kind == "trajectory_storage":
        _print_trajectory_stats(summary)
    elif kind == "sqlite_experience_store":
        _print_sqlite_stats(summary)
    else:
        _print_transitions_stats(kind, summary)
    return 0
