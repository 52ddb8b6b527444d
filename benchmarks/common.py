"""Small timing and reporting helpers shared by the benchmark scripts.

Stable on purpose (other benchmark scripts import it): add, do not change signatures.

* :func:`median_seconds`: median wall time of a call, after warm-up.
* :func:`median_block_seconds`: the same for a call repeated ``block`` times, divided by ``block``
  (for operations too short to time one at a time).
* :func:`best_of_rounds`: the smallest of several such medians, taken in separate rounds
  (on a shared machine, a burst of someone else's work spoils a round, not the figure).
* :func:`markdown_table`: rows of cells as a Markdown table.
* :func:`fmt_us`, :func:`fmt_rate`, :func:`fmt_ratio`: number formatting used in the tables.
* :func:`machine_summary`: one line describing the interpreter, libraries and CPU.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "best_of_rounds",
    "fmt_rate",
    "fmt_ratio",
    "fmt_us",
    "machine_summary",
    "markdown_table",
    "median_block_seconds",
    "median_seconds",
    "replace_generated_block",
]


def median_seconds(fn: Callable[[], object], repeats: int, warmup: int = 5) -> float:
    """Median seconds of one ``fn()`` call over ``repeats`` timed calls, after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    clock = time.perf_counter
    times = []
    for _ in range(repeats):
        start = clock()
        fn()
        times.append(clock() - start)
    return statistics.median(times)


def median_block_seconds(
    fn: Callable[[], object], block: int, repeats: int, warmup_blocks: int = 1
) -> float:
    """Median over ``repeats`` blocks of (seconds for ``block`` calls of ``fn``) / ``block``."""
    clock = time.perf_counter
    times = []
    for r in range(warmup_blocks + repeats):
        start = clock()
        for _ in range(block):
            fn()
        if r >= warmup_blocks:
            times.append((clock() - start) / block)
    return statistics.median(times)


def best_of_rounds(
    measure: Callable[..., float], *args: Any, rounds: int = 3, **kwargs: Any
) -> float:
    """The smallest of ``rounds`` calls of ``measure(*args, **kwargs)``.

    Example: ``best_of_rounds(median_seconds, fn, 100)``.
    """
    return min(measure(*args, **kwargs) for _ in range(rounds))


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table; the first column is left-aligned, the others right-aligned."""
    align = [":--"] + ["--:"] * (len(header) - 1)
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def fmt_us(seconds: float | None) -> str:
    """Seconds as microseconds with sensible precision; ``None`` as a dash."""
    if seconds is None:
        return "-"
    us = seconds * 1e6
    return f"{us:,.0f}" if us >= 100 else f"{us:.1f}"


def fmt_rate(per_second: float | None) -> str:
    """Items per second as ``12.3k/s`` or ``1.23M/s``; ``None`` as a dash."""
    if per_second is None:
        return "-"
    if per_second >= 1e6:
        return f"{per_second / 1e6:.2f}M/s"
    return f"{per_second / 1e3:.1f}k/s"


def fmt_ratio(ratio: float | None) -> str:
    """A ratio as ``1.23x``; ``None`` as a dash."""
    return "-" if ratio is None else f"{ratio:.2f}x"


def machine_summary() -> str:
    """Python, NumPy and torch versions, CPU model and core count, in one line."""
    parts = [f"Python {platform.python_version()}"]
    for name in ("numpy", "torch"):
        try:
            module = __import__(name)
            parts.append(f"{name} {module.__version__}")
        except ImportError:
            pass
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    parts.append(f"{cpu}, {os.cpu_count()} logical CPUs")
    return "; ".join(parts)


def replace_generated_block(path: Path, begin: str, end: str, body: str) -> None:
    """Replace the text between the ``begin`` and ``end`` markers of ``path`` with ``body``
    (the text around them is kept), atomically.

    Raises:
        SystemExit: ``path`` lacks either marker.
    """
    from replaystore.atomic import atomic_write_text

    doc = path.read_text(encoding="utf-8")
    if begin not in doc or end not in doc:
        raise SystemExit(f"{path} has no {begin} ... {end} markers")
    head, rest = doc.split(begin, 1)
    _, tail = rest.split(end, 1)
    atomic_write_text(path, f"{head}{begin}\n{body}\n{end}{tail}")
