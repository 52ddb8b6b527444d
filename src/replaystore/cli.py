"""The ``replaystore`` command.

User errors (a missing file, a bad option) are printed as one line on stderr
with exit status 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from replaystore import __version__
from replaystore.errors import ReplayStoreError

__all__ = ["main"]


def _cmd_demo(args: argparse.Namespace) -> int:
    from replaystore.demos import PARTS

    parts = PARTS if not args.part else tuple(args.part)
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise _UsageError(f"unknown demo part {unknown[0]!r}; choose from {', '.join(PARTS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    mode = "quick" if args.quick else "full"
    print(f"replaystore {__version__} demo ({mode}); outputs under {out.resolve()}")
    for part in parts:
        module = importlib.import_module(f"replaystore.demos.{part}")
        print(f"\n== {part} ==")
        start = time.perf_counter()
        lines = module.run(out / part, quick=args.quick)
        for line in lines:
            print(f"  {line}")
        print(f"  ({time.perf_counter() - start:.1f} s)")
    return 0


class _UsageError(Exception):
    """A mistake in how the command was called: one line, exit status 2."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="replaystore",
        description="Store and sample reinforcement-learning experience.",
    )
    parser.add_argument("--version", action="version", version=f"replaystore {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = sub.add_parser(
        "demo",
        help="run the end-to-end demo of every part of the library",
        description="Run every part of the library for real on embedded data (no network) "
        "and print a summary with where the outputs are.",
    )
    demo.add_argument(
        "--out", default="demo-output", help="output directory (default: %(default)s)"
    )
    demo.add_argument("--quick", action="store_true", help="smaller runs (for CI): a minute or so")
    demo.add_argument(
        "--part", action="append", help="run only this part (repeatable); default: all"
    )
    demo.set_defaults(func=_cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``replaystore`` command; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args))
    except (_UsageError, ReplayStoreError, FileNotFoundError) as exc:
        print(f"replaystore {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
