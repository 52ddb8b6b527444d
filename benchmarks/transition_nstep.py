"""n-step sampling against the plain sample of the same buffer (part ``nstep``).

Run through ``python benchmarks/transitions.py --only nstep [--quick] [--out FILE]``.

Data: 100,000 CartPole-like transitions (obs float32[4], action int64, reward
float32, next_obs float32[4], done bool) in episodes of 20-500 steps, stored in
two buffers that differ only in ``n_step`` (1 and 3, gamma 0.99), same seed.
Each row times ``sample_batch(256)`` of both, side by side in the same rounds
(best of 7 medians of 1,000 calls each), on RAM and memmap storage, uniform and prioritized:
the n-step sample holds the same rows plus ``n_step_return``,
``n_step_next_obs``, ``n_step_done`` and ``n_step_discount``. The kernel rows use
the compiled ``replaystore._nstep`` (the default where it is built); the NumPy
rows force its fallback (``REPLAYSTORE_NSTEP=numpy``). Target: the n-step sample
at most 1.5x the plain one.
"""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
from typing import Any

import numpy as np
import torch
from common import fmt_us, markdown_table, median_seconds
from transition_slices import episodes_data

BATCH = 256
N_STEP = 3
GAMMA = 0.99
TARGET = 1.5
#: Alternating rounds per row, each the median of ``repeats`` calls; a row's figure is
#: the best round. Seven short rounds rather than three long ones: two rows running
#: the same code (RAM and memmap) differed by 12% with three (2026-11-25 21:10).
ROUNDS = 7


def _buffer(storage: str, sampler: str, n_step: int, data: dict[str, np.ndarray]) -> Any:
    from replaystore.transitions import ReplayBuffer

    capacity = len(data["done"])
    kwargs: dict[str, Any] = {"sampler": sampler, "seed": 0, "n_step": n_step, "gamma": GAMMA}
    if storage == "memmap":
        kwargs.update(storage="memmap", path=tempfile.mkdtemp(prefix="bench-nstep-"))
    else:
        kwargs.update(storage="memory")
    buf = ReplayBuffer(torch.device("cpu"), torch.device("cpu"), capacity, **kwargs)
    buf.add_batch(data)
    return buf


def _close(buf: Any) -> None:
    path = buf.path if buf.storage_kind == "memmap" else None
    buf.close()
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)


def measure_pair(
    storage: str, sampler: str, backend: str, data: dict[str, np.ndarray], repeats: int
) -> tuple[float, float, str]:
    """Seconds per ``sample_batch(256)``: (plain, n-step), and the n-step path used."""
    previous = os.environ.get("REPLAYSTORE_NSTEP")
    os.environ["REPLAYSTORE_NSTEP"] = backend
    try:
        plain = _buffer(storage, sampler, 1, data)
        multi = _buffer(storage, sampler, N_STEP, data)
    finally:
        if previous is None:
            os.environ.pop("REPLAYSTORE_NSTEP", None)
        else:
            os.environ["REPLAYSTORE_NSTEP"] = previous
    used = multi._gatherer.nstep.backend  # which path computed the entries
    times = {"plain": [], "nstep": []}
    for _ in range(ROUNDS):  # alternate rounds: a burst of other work hits both alike
        times["plain"].append(median_seconds(lambda: plain.sample_batch(BATCH), repeats, 50))
        times["nstep"].append(median_seconds(lambda: multi.sample_batch(BATCH), repeats, 50))
    _close(plain)
    _close(multi)
    gc.collect()
    return min(times["plain"]), min(times["nstep"]), used


def run_nstep(quick: bool) -> str:
    """Measure every row; returns the Markdown section."""
    size = 10_000 if quick else 100_000
    repeats = 200 if quick else 1000
    data = episodes_data(size)
    rows = []
    verdicts = []
    for backend, label in (("auto", "kernel"), ("numpy", "NumPy fallback")):
        for sampler in ("uniform", "prioritized"):
            for storage in ("memory", "memmap"):
                print(f"n-step sampling: {storage}, {sampler}, {label}", flush=True)
                plain, nstep, used = measure_pair(storage, sampler, backend, data, repeats)
                ratio = nstep / plain
                name = f"{storage}, {sampler}, {label} ({used})"
                rows.append(
                    [name, fmt_us(plain), fmt_us(nstep), f"{ratio:.2f}x", fmt_us(nstep - plain)]
                )
                verdicts.append((name, ratio))
    header = [
        f"buffer ({size:,} CartPole-like transitions)",
        f"plain sample_batch({BATCH})",
        f"n_step={N_STEP} sample_batch({BATCH})",
        "ratio",
        "added",
    ]
    met = [name for name, ratio in verdicts if ratio <= TARGET and "kernel" in name]
    missed = [name for name, ratio in verdicts if ratio > TARGET and "kernel" in name]
    lines = [
        f"### n-step (n={N_STEP}) sampling of {BATCH} vs the plain sample of {BATCH}",
        "",
        f"Each figure: the best of {ROUNDS} medians of {repeats:,} calls, the two buffers' "
        "rounds alternating.",
        "",
        markdown_table(header, rows),
        "",
        f"Target (issue 26): n-step sampling at most {TARGET}x the plain sample. With the "
        f"compiled kernel: met on {len(met)} of {len(met) + len(missed)} rows"
        + (f" (missed: {'; '.join(missed)})" if missed else "")
        + ". The NumPy rows are what an install without a C compiler gets.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    torch.set_num_threads(1)
    print(run_nstep(quick=True))
