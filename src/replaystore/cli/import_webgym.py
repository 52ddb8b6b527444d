"""``replaystore import-webgym FILE... --out DIR``: WebGym ``.pt`` files, imported safely."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from replaystore.cli._common import Parser, UsageError, progress

__all__ = ["DESCRIPTION", "add_arguments", "run"]

DESCRIPTION = (
    "Read WebGym's torch.save'd iteration files (train_trajectories.pt."
    "iterationN[_rank_R], or a directory of them) without running pickle code: only "
    "WebGym's component classes, plain containers and tensors are allowed, anything "
    "else is refused naming the global. Writes one JSONL iteration file per source file."
)


def add_arguments(parser: Parser) -> None:
    """The options of ``replaystore import-webgym``."""
    parser.add_argument(
        "files", nargs="+", metavar="FILE", help="WebGym .pt files, or one directory of them"
    )
    parser.add_argument("--out", required=True, help="trajectory storage directory to write into")
    parser.add_argument(
        "--keep-page-metadata",
        action="store_true",
        help="keep every page-metadata field (default: only title and url)",
    )


def run(args: argparse.Namespace) -> int:
    """Import the WebGym files into the trajectory storage; returns the exit status."""
    from replaystore.trajectories.storage import TrajectoryStorage
    from replaystore.trajectories.webgym_import import import_webgym

    paths = [Path(p) for p in args.files]
    for p in paths:
        if not p.exists():
            raise UsageError(f"{p} does not exist")
    if len(paths) > 1 and any(p.is_dir() for p in paths):
        raise UsageError("give either one directory or one or more files, not both")
    storage = TrajectoryStorage(args.out, keep_page_metadata=args.keep_page_metadata)
    bar = None

    def advance(count: int, total: int, _: Any) -> None:
        nonlocal bar
        if bar is None:
            bar = progress(None, total, "importing", unit="file")
        bar.update(1)

    try:
        done = import_webgym(paths[0] if len(paths) == 1 else paths, storage, progress=advance)
    finally:
        if bar is not None:
            bar.close()
    trajectories = sum(d.trajectories for d in done)
    steps = sum(d.steps for d in done)
    print(
        f"imported {len(done)} file(s) into {storage.root.resolve()}: "
        f"{trajectories} trajectories, {steps} steps"
    )
    for d in done:
        print(
            f"  {d.source} -> iteration {d.iteration} rank {d.rank}: "
            f"{d.trajectories} trajectories, {d.steps} steps ({d.written.name})"
        )
    return 0
