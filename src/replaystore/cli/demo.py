"""``replaystore demo``: run every part of the library for real and summarise the outputs."""

from __future__ import annotations

import argparse
import importlib
import shlex
import time
from collections.abc import Sequence
from pathlib import Path

from replaystore import __version__
from replaystore.cli._common import Parser, UsageError, did_you_mean, table

__all__ = ["DESCRIPTION", "add_arguments", "demo_view_paths", "run"]

DESCRIPTION = (
    "Run every part of the library for real on generated or embedded data "
    "(no network) and print a summary with where the outputs are."
)


def add_arguments(parser: Parser) -> None:
    """The options of ``replaystore demo``."""
    parser.add_argument(
        "--out", default="demo-output", help="output directory (default: %(default)s)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="smaller runs (for CI): well under a minute in total"
    )
    parser.add_argument(
        "--part",
        action="append",
        help="run only this part (repeatable); default: all but the opt-in "
        "'distributed' (Ray: pip install \"replaystore[ray]\"), 'loop' (LLaMA-Factory "
        "and vLLM: bash .ci/install-loop-tools) and 'miniwob' (the loop on MiniWoB++ "
        'tasks, measured on held-out seeds; also pip install "replaystore[miniwob]")',
    )


def run(args: argparse.Namespace) -> int:
    """Run the chosen demo parts in order; print each one's lines and a summary."""
    from replaystore.demos import OPT_IN_PARTS, PARTS

    parts = PARTS if not args.part else tuple(args.part)
    known = PARTS + OPT_IN_PARTS
    unknown = [p for p in parts if p not in known]
    if unknown:
        raise UsageError(
            f"unknown demo part {unknown[0]!r}{did_you_mean(unknown[0], known)} "
            f"(choose from {', '.join(known)})"
        )
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(
            f"--out {out} exists and is not a directory; give a new or an existing directory"
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create the --out directory {out}: {exc.strerror}") from None
    mode = "quick" if args.quick else "full"
    print(f"replaystore {__version__} demo ({mode}); outputs under {out.resolve()}")
    if args.quick:
        print("quick mode: small smoke runs that check every part works, not full training")
    done: list[tuple[str, float, Path]] = []
    for part in parts:
        module = importlib.import_module(f"replaystore.demos.{part}")
        print(f"\n== {part} ==", flush=True)
        start = time.perf_counter()
        lines = module.run(out / part, quick=args.quick)
        seconds = time.perf_counter() - start
        for line in lines:
            print(f"  {line}")
        print(f"  ({seconds:.1f} s)", flush=True)
        done.append((part, seconds, (out / part).resolve()))
    print("\n== summary ==")
    rows = [(p, f"{s:.1f}", d) for p, s, d in done]
    for line in table(("part", "seconds", "outputs"), rows, "lrl", indent="  "):
        print(line)
    print(f"  total {sum(s for _, s, _ in done):.1f} s")
    views = demo_view_paths([d for _, _, d in done])
    if views:
        print("\nlook at the outputs in a browser (read-only; Ctrl-C stops):")
        for path in views:
            print(f"  replaystore view {shlex.quote(str(path))}")
    return 0


def demo_view_paths(part_dirs: Sequence[Path]) -> list[Path]:
    """What ``replaystore view`` opens among the demo parts' outputs that exist."""
    candidates = ("storage", "experience.sqlite", "checkpoint/buffer.metadata")
    out = []
    for directory in part_dirs:
        for name in candidates:
            if (directory / name).exists():
                # the trajectories part: its directory (storage/ and screenshots/ inside)
                out.append(directory if name == "storage" else directory / name)
    return out
