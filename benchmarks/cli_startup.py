"""Start-up time of the ``replaystore`` command: ``--help`` and ``stats`` of a small store.

    python benchmarks/cli_startup.py [--runs 15] [--baseline-src DIR]

Each case starts the command as a new process, as the console script does
(``python -c "from replaystore.cli import main; ..."``), once to warm the file
cache and then ``--runs`` times, and reports the median wall time and the
number of modules the process imported. Cases: ``replaystore --help``,
``replaystore stats --help``, and ``replaystore stats`` of a 50-row SQLite
experience store (written here, in a temporary directory).

``--baseline-src DIR`` also runs every case with another tree's ``src/`` first on
``PYTHONPATH`` (for example the commit before a change:
``git archive COMMIT src | tar -x -C /tmp/before``, then ``--baseline-src
/tmp/before/src``), alternating run by run with this tree, and prints the ratio
of the medians (this tree / baseline; below 1 is faster).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_summary, markdown_table

SRC = Path(__file__).resolve().parents[1] / "src"
# What the console script runs, plus the module count on stderr at exit.
ENTRY = (
    "import atexit, sys; atexit.register(lambda: print(len(sys.modules), file=sys.stderr)); "
    "from replaystore.cli import main; sys.exit(main(sys.argv[1:]))"
)


def _store(directory: Path) -> Path:
    from replaystore.experience import DataRow, Experience, ExpMeta, SqliteStorage

    path = directory / "experience.sqlite"
    storage = SqliteStorage(path)
    storage.add_batch(
        [
            DataRow(ExpMeta(f"task-{t}", "web_nav", "a", s, 1.7e9 + t), Experience(state={"s": s}))
            for t in range(10)
            for s in range(5)
        ]
    )
    storage.close()
    return path


def _run(src: Path, args: list[str]) -> tuple[float, int]:
    """Wall seconds of one run of ``replaystore ARGS`` with ``src`` first on the path."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", ENTRY, *args], env=env, capture_output=True, text=True, check=False
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"replaystore {' '.join(args)} failed with {src}: {done.stderr}")
    return seconds, int(done.stderr.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="counted runs per case")
    parser.add_argument("--baseline-src", type=Path, help="another tree's src/ to compare with")
    args = parser.parse_args()
    trees = [("this tree", SRC)]
    if args.baseline_src is not None:
        trees.append(("baseline", args.baseline_src.resolve()))
    with tempfile.TemporaryDirectory() as tmp:
        store = _store(Path(tmp))
        cases = [
            ("replaystore --help", ["--help"]),
            ("replaystore stats --help", ["stats", "--help"]),
            ("replaystore stats experience.sqlite (50 rows)", ["stats", str(store)]),
        ]
        rows = []
        for title, argv in cases:
            times: dict[str, list[float]] = {name: [] for name, _ in trees}
            modules: dict[str, int] = {}
            for _, src in trees:
                _run(src, argv)  # warm-up
            for _ in range(args.runs):
                for name, src in trees:  # alternating: drift of the machine hits both
                    seconds, modules[name] = _run(src, argv)
                    times[name].append(seconds)
            row: list[object] = [title]
            for name, _ in trees:
                row += [f"{1000 * statistics.median(times[name]):.0f} ms", modules[name]]
            if len(trees) == 2:
                ratio = statistics.median(times["this tree"]) / statistics.median(times["baseline"])
                row.append(f"{ratio:.2f}x")
            rows.append(row)
    header = ["case", "this tree (median wall)", "modules"]
    if len(trees) == 2:
        header += ["baseline (median wall)", "modules", "this / baseline"]
    print(f"Machine: {machine_summary()}; load average {os.getloadavg()[0]:.1f}")
    print(f"{args.runs} runs per case after a warm-up, new process each\n")
    print(markdown_table(header, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
