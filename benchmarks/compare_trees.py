"""One benchmark script run on two source trees in turn: did a change keep the speed?

    python benchmarks/compare_trees.py --before OLD/src --after NEW/src [--runs 3] \
        -- benchmarks/trajectories.py --quick

Runs the script ``--runs`` times under each tree, alternating (before, after, after,
before, ...), each run in a fresh process with ``PYTHONPATH`` set to the tree, so the
two trees share the machine's drift. Every Markdown table row the script prints is
read; each numeric cell (``12.3 ms``, ``1.5 s``, ``694k``, ``1,044k``, ``3.2x``) is
compared by its median over the runs: ``after / before`` and, for each cell, whether
the change made it faster or slower (``ms``/``s`` cells are times, lower is better; the
others are rates or ratios, higher is better). The script's own output is not kept.

The trees must be importable as they are (a checkout's ``src`` with its compiled kernels
built or copied in): ``python -c "import replaystore"`` with ``PYTHONPATH`` set to each
must pick that tree, which this script checks before timing anything.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

NUMBER = re.compile(r"^([0-9][0-9,]*(?:\.[0-9]+)?)\s*(k|M|ms|s|x|us|µs|%)?\b")
TIMES = {"ms", "s", "us", "µs"}


def cells(output: str) -> dict[tuple[str, str, int], tuple[float, str]]:
    """``(table header, row label, column) -> (value, unit)`` of every numeric cell."""
    found: dict[tuple[str, str, int], tuple[float, str]] = {}
    header = ""
    for line in output.splitlines():
        if not line.startswith("|"):
            header = ""
            continue
        parts = [p.strip() for p in line.strip().strip("|").split("|")]
        if not header:
            header = " | ".join(parts)
            continue
        if set(parts[0]) <= {":", "-", " "}:
            continue
        for column, text in enumerate(parts[1:], 1):
            match = NUMBER.match(text)
            if match is None:
                continue
            value = float(match.group(1).replace(",", ""))
            unit = match.group(2) or ""
            value *= {"k": 1e3, "M": 1e6}.get(unit, 1.0)
            found[(header, parts[0], column)] = (value, unit)
    return found


def run_once(tree: Path, script: list[str]) -> str:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, *script], capture_output=True, text=True, env=env, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(script)} failed under {tree}:\n{done.stderr[-2000:]}")
    return done.stdout


def check_tree(tree: Path) -> None:
    code = "import replaystore, sys; sys.stdout.write(replaystore.__file__)"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    where = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout
    if not Path(where).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"PYTHONPATH={tree} imports replaystore from {where}, not from the tree")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the old tree's src")
    parser.add_argument("--after", type=Path, required=True, help="the new tree's src")
    parser.add_argument("--runs", type=int, default=3, help="runs per tree (default 3)")
    parser.add_argument("script", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS]")
    args = parser.parse_args()
    script = args.script[1:] if args.script[:1] == ["--"] else args.script
    if not script or args.runs < 1:
        parser.error("give --runs >= 1 and the script after --")
    for tree in (args.before, args.after):
        check_tree(tree)
    runs: dict[str, list[dict[tuple[str, str, int], tuple[float, str]]]] = {"b": [], "a": []}
    for i in range(args.runs):
        order = ("b", "a") if i % 2 == 0 else ("a", "b")
        for which in order:
            tree = args.before if which == "b" else args.after
            runs[which].append(cells(run_once(tree, script)))
            print(
                f"run {i + 1}/{args.runs}: {'before' if which == 'b' else 'after'} done",
                file=sys.stderr,
                flush=True,
            )
    keys = [k for k in runs["b"][0] if all(k in r for r in runs["b"] + runs["a"])]
    print(
        f"| table | row | column | before (median of {args.runs}) | after | after/before | change |"
    )
    print("| :-- | :-- | --: | --: | --: | --: | :-- |")
    for key in keys:
        unit = runs["b"][0][key][1]
        before = statistics.median(r[key][0] for r in runs["b"])
        after = statistics.median(r[key][0] for r in runs["a"])
        if before == 0:
            continue
        ratio = after / before
        faster = ratio < 1 if unit in TIMES else ratio > 1
        change = "same" if abs(ratio - 1) < 0.005 else ("faster" if faster else "slower")
        header = key[0].split(" | ")[0]
        print(
            f"| {header} | {key[1][:70]} | {key[2]} | {before:.4g}{unit} | {after:.4g}{unit} "
            f"| {ratio:.3f} | {change} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
