"""Rate limiter overhead when nothing waits (part ``ratelimit``).

Run through ``python benchmarks/transitions.py --only ratelimit [--quick] [--out FILE]``.

Three RAM buffers of CartPole-like transitions (obs float32[4], action int64,
reward float32, next_obs float32[4], done bool), capacity 100,000, same seed,
differing only in ``rate_limiter``: none; ``RateLimiter(1)`` (Reverb's
``MinSize``); ``RateLimiter(1, samples_per_insert=1, error_buffer=1e12)`` (a
ratio that never binds, so the full ratio check runs and passes). Each figure is
the time of one call from a loop of 1,000 calls (the fastest of the loops over
3 rounds: on a shared machine the least disturbed; the variants take turns loop
by loop so a burst of other work hits them alike): ``add`` of one transition
given as a dict of NumPy values, ``add_batch`` of 256, ``sample_batch(32)`` and
``sample_batch(256)`` (uniform). The last row times the limiter's own calls.
"Added" is the limited figure minus the plain one. Target (issue 26): under 2 us
added per ``add`` / ``sample_batch``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from common import fmt_us, markdown_table

CAPACITY = 100_000
LOOP = 1000
TARGET_US = 2.0


def _transitions(n: int, rng: np.random.Generator) -> list[dict[str, Any]]:
    obs = rng.standard_normal((n + 1, 4)).astype(np.float32)
    return [
        {
            "obs": obs[i],
            "action": np.int64(i % 2),
            "reward": np.float32(1.0),
            "next_obs": obs[i + 1],
            "done": np.bool_(i % 200 == 199),
        }
        for i in range(n)
    ]


def _batch(rows: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    return {k: np.stack([np.asarray(r[k]) for r in rows]) for k in rows[0]}


def _variants() -> dict[str, Any]:
    from replaystore.transitions import RateLimiter, ReplayBuffer

    def make(limiter: Any) -> Any:
        return ReplayBuffer("cpu", "cpu", CAPACITY, storage="memory", seed=0, rate_limiter=limiter)

    return {
        "no limiter": make(None),
        "MinSize": make(RateLimiter(1)),
        "SampleToInsertRatio (never binds)": make(
            RateLimiter(1, samples_per_insert=1.0, error_buffer=1e12)
        ),
    }


def _per_call(fns: dict[str, Callable[[], object]], loops: int) -> dict[str, float]:
    """Seconds per call of each ``fns`` entry: its fastest of ``loops`` loops of ``LOOP``
    calls (the least disturbed by other work on a shared machine); the entries take
    turns loop by loop, so a burst of other work hits them alike."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(loops):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(LOOP):
                fn()
            times[name].append((time.perf_counter() - start) / LOOP)
    return {name: min(t) for name, t in times.items()}


def run_ratelimit(quick: bool) -> str:
    """Measure every row; returns the Markdown section."""
    loops = 5 if quick else 30
    rng = np.random.default_rng(0)
    singles = _transitions(LOOP, rng)
    batch = _batch(_transitions(256, rng))
    buffers = _variants()
    for buf in buffers.values():
        buf.add_batch(_batch(_transitions(CAPACITY, rng)))  # full: every add overwrites

    ops: dict[str, Callable[[Any], Callable[[], object]]] = {}

    def add_op(buf: Any) -> Callable[[], object]:
        it = iter(singles * (loops + 2))
        return lambda: buf.add(next(it))

    ops["add (1 transition)"] = add_op
    ops["add_batch (256)"] = lambda buf: lambda: buf.add_batch(batch)
    ops["sample_batch(32)"] = lambda buf: lambda: buf.sample_batch(32)
    ops["sample_batch(256)"] = lambda buf: lambda: buf.sample_batch(256)

    best: dict[tuple[str, str], float] = {}
    for op, factory in ops.items():
        print(f"rate limiter overhead: {op}", flush=True)
        for _ in range(3):
            fns = {name: factory(buf) for name, buf in buffers.items()}
            for fn in fns.values():
                fn()  # warm-up
            for name, t in _per_call(fns, loops).items():
                best[(op, name)] = min(best.get((op, name), t), t)
    # The limiter's own calls, without a buffer: what every add / sample adds at least.
    from replaystore.transitions import RateLimiter

    alone = RateLimiter(1, samples_per_insert=1.0, error_buffer=1e12)

    def insert_alone() -> None:
        alone.reserve_inserts(1)
        alone.commit_inserts(1, 0)

    floor = _per_call(
        {"insert": insert_alone, "sample": lambda: alone.acquire_samples(32)}, loops * 3
    )
    limited = [n for n in buffers if n != "no limiter"]
    rows = []
    worst = 0.0
    for op in ops:
        plain = best[(op, "no limiter")]
        row = [op, fmt_us(plain)]
        for name in limited:
            added = best[(op, name)] - plain
            if op.startswith(("add (", "sample_batch")):
                worst = max(worst, added)
            row += [fmt_us(best[(op, name)]), f"{added * 1e6:+.2f}"]
        rows.append(row)
    header = ["operation (us per call)", "no limiter"]
    for name in limited:
        header += [name, "added"]
    rows.append(
        [
            "the limiter alone (ratio): reserve + commit of 1 insert / acquire of 32 samples",
            "-",
            "-",
            "-",
            f"{fmt_us(floor['insert'])} / {fmt_us(floor['sample'])}",
            "",
        ]
    )
    verdict = "met" if worst * 1e6 < TARGET_US else "NOT met"
    lines = [
        "### Rate limiter overhead per call when nothing waits",
        "",
        markdown_table(header, rows),
        "",
        f"Target (issue 26): under {TARGET_US:g} us added per `add` / `sample_batch` when "
        f"nothing waits: {verdict} (largest added: {worst * 1e6:.2f} us). One insert is a "
        "reservation and a commit (two lock round trips on the limiter); a sample is one.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    torch.set_num_threads(1)
    print(run_ratelimit(quick=True))
