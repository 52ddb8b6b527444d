"""Slice sampling side by side: replaystore's SliceSampler against TorchRL's (part ``slices``).

Run through ``python benchmarks/transitions.py --only slices [--quick] [--out FILE]``.

Data: 1,000,000 CartPole-like transitions (obs float32[4], action int64, reward
float32, next_obs float32[4], done bool) in episodes of 20-500 steps (uniform
lengths; the newest episode is still open), stored once in each buffer
(capacity 1,000,000). Operations, all drawing 32 slices of 8 steps (a batch of 256):

* sample: one draw from the full, unchanged buffer (median after warm-up);
* add 1 + sample: one new transition, then one draw (a training loop's step:
  the samplers' bookkeeping of new data is part of the cost);
* first sample after the fill: the one-off cost of indexing 1M steps.

TorchRL runs as its users configure it: ``ReplayBuffer(storage=LazyTensorStorage(N),
sampler=SliceSampler(slice_len=8, end_key=("next", "done")), batch_size=256)``
(``cache_values=False``, its default: trajectories are found again at every
draw; ``cache_values=True`` is listed too, meant by TorchRL for static data),
and ``PrioritizedSliceSampler(max_capacity=N, alpha=0.6, beta=0.4, ...)``.
Both prioritized samplers start with every priority equal (no update).
"""

from __future__ import annotations

import gc
import importlib
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from common import best_of_rounds, fmt_us, markdown_table, median_seconds

SLICE_LEN = 8
NUM_SLICES = 32
ALPHA, BETA = 0.6, 0.4
OPS = ("sample", "add 1 + sample")


def episodes_data(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``n`` CartPole-like transitions in episodes of 20-500 steps (the last one open)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(20, 501, size=n // 20 + 1)
    ends = np.cumsum(lengths)
    ends = ends[ends <= n]
    done = np.zeros(n, dtype=bool)
    done[ends - 1] = True
    obs = rng.standard_normal((n, 4), dtype=np.float32)
    return {
        "obs": obs,
        "action": rng.integers(0, 2, n),
        "reward": np.ones(n, dtype=np.float32),
        "next_obs": np.roll(obs, -1, axis=0),
        "done": done,
    }


def one_step(data: dict[str, np.ndarray], i: int) -> dict[str, Any]:
    return {k: v[i] for k, v in data.items()}


class OursSlices:
    def __init__(self, n: int, storage: str, prioritized: bool) -> None:
        from replaystore.transitions import ReplayBuffer, SliceSampler

        sampler = SliceSampler(SLICE_LEN, prioritized=prioritized, alpha=ALPHA, beta=BETA)
        self.rb = ReplayBuffer("cpu", "cpu", n, storage=storage, sampler=sampler, seed=0)

    def fill(self, data: dict[str, np.ndarray]) -> None:
        self.rb.add_batch(data)

    def add_one(self, t: dict[str, Any]) -> None:
        self.rb.add(t)

    def sample(self) -> object:
        return self.rb.sample_batch(NUM_SLICES * SLICE_LEN)

    def close(self) -> None:
        self.rb.close()


def _torchrl_td(data: dict[str, np.ndarray], batch: bool) -> Any:
    from tensordict import TensorDict

    def t(v: Any) -> torch.Tensor:
        return torch.from_numpy(np.asarray(v)) if batch else torch.as_tensor(v)

    done = t(data["done"])
    done = done.unsqueeze(-1) if batch else done.reshape(1)
    n = [len(data["done"])] if batch else []
    return TensorDict(
        {
            "observation": t(data["obs"]),
            "action": t(data["action"]),
            "done": torch.zeros_like(done),
            "next": {"observation": t(data["next_obs"]), "reward": t(data["reward"]), "done": done},
        },
        batch_size=n,
    )


class TorchRLSlices:
    def __init__(self, n: int, kind: str) -> None:
        from torchrl.data import LazyTensorStorage, ReplayBuffer
        from torchrl.data.replay_buffers.samplers import PrioritizedSliceSampler, SliceSampler

        logging = importlib.import_module("logging")
        logging.getLogger("torchrl").setLevel(logging.WARNING)
        common = {"slice_len": SLICE_LEN, "end_key": ("next", "done"), "strict_length": True}
        if kind == "prioritized":
            sampler: Any = PrioritizedSliceSampler(n, ALPHA, BETA, **common)
        else:
            sampler = SliceSampler(cache_values=kind == "cached", **common)
        self.rb = ReplayBuffer(
            storage=LazyTensorStorage(n), sampler=sampler, batch_size=NUM_SLICES * SLICE_LEN
        )

    def fill(self, data: dict[str, np.ndarray]) -> None:
        self.rb.extend(_torchrl_td(data, True))

    def add_one(self, t: dict[str, Any]) -> None:
        self.rb.add(_torchrl_td(t, False))

    def sample(self) -> object:
        return self.rb.sample()

    def close(self) -> None:
        del self.rb
        gc.collect()


def ratio(ours: float, peer: float) -> str:
    """``ours / peer`` with three significant digits (the ratios here span 0.001-1)."""
    return f"{ours / peer:.3g}x"


def torchrl_version() -> str | None:
    """TorchRL's version, or None when it is not importable."""
    try:
        return str(importlib.import_module("torchrl").__version__)
    except Exception:  # any import failure (missing, or broken against this torch)
        return None


def measure(impl: Any, data: dict[str, np.ndarray], repeats: int) -> dict[str, float]:
    impl.fill(data)
    start = time.perf_counter()
    impl.sample()
    first = time.perf_counter() - start
    out = {"first sample after the fill": first}
    out["sample"] = best_of_rounds(median_seconds, impl.sample, repeats)
    steps = iter(range(10**9))

    def add_and_sample() -> None:
        impl.add_one(one_step(data, next(steps) % len(data["done"])))
        impl.sample()

    out["add 1 + sample"] = best_of_rounds(median_seconds, add_and_sample, repeats)
    return out


def run_slices(quick: bool) -> str:
    """Measure every implementation on the same data; the Markdown section."""
    n = 100_000 if quick else 1_000_000
    repeats = 20 if quick else 200
    data = episodes_data(n)
    version = torchrl_version()
    impls: list[tuple[str, str, Callable[[], Any]]] = [
        ("ours SliceSampler (memory)", "uniform", lambda: OursSlices(n, "memory", False)),
        ("ours SliceSampler (memmap)", "uniform", lambda: OursSlices(n, "memmap", False)),
        (
            "ours SliceSampler(prioritized=True) (memory)",
            "prioritized",
            lambda: OursSlices(n, "memory", True),
        ),
        (
            "ours SliceSampler(prioritized=True) (memmap)",
            "prioritized",
            lambda: OursSlices(n, "memmap", True),
        ),
    ]
    if version is not None:
        impls += [
            (f"TorchRL {version} SliceSampler", "uniform", lambda: TorchRLSlices(n, "uniform")),
            (
                f"TorchRL {version} SliceSampler(cache_values=True)",
                "uniform-cached",
                lambda: TorchRLSlices(n, "cached"),
            ),
            (
                f"TorchRL {version} PrioritizedSliceSampler",
                "prioritized",
                lambda: TorchRLSlices(n, "prioritized"),
            ),
        ]
    results: list[tuple[str, str, dict[str, float]]] = []
    skipped: list[str] = []
    for name, kind, build in impls:
        print(f"slices: {name}", flush=True)
        try:
            impl = build()
        except Exception as exc:  # a peer that cannot run here is reported, not fatal
            if name.startswith("ours"):
                raise
            skipped.append(f"{name} skipped: {type(exc).__name__}: {exc}")
            continue
        try:
            results.append((name, kind, measure(impl, data, repeats)))
        finally:
            impl.close()
    peer = {kind: r for name, kind, r in results if name.startswith("TorchRL")}
    rows = []
    for name, kind, r in results:
        ours = not name.startswith("TorchRL")
        ref = peer.get(kind) if ours else None
        cached = peer.get("uniform-cached") if ours and kind == "uniform" else None
        rows.append(
            [
                name,
                *(fmt_us(r[op]) for op in OPS),
                f"{r['first sample after the fill'] * 1e3:.0f} ms",
                *(ratio(r[op], ref[op]) if ref else "" for op in OPS),
                ratio(r["sample"], cached["sample"]) if cached else "",
            ]
        )
    lines = [
        f"### Slices: 32 slices of 8 from {n:,} stored CartPole-like transitions",
        "",
        "Episodes of 20-500 steps; every sampler draws the same 32 x 8 = 256 steps per call.",
        "Ratios: ours / TorchRL's sampler of the same kind (uniform: TorchRL's default",
        "`SliceSampler`; prioritized: `PrioritizedSliceSampler`); target: at most 0.5x.",
        "",
    ]
    if version is None:
        lines.append(
            "TorchRL rows skipped: torchrl is not importable in this environment "
            "(run from a venv with torchrl, e.g. /work/peers/torchrl-venv)."
        )
        lines.append("")
    else:
        lines.append(f"TorchRL version: {version}; torch {torch.__version__} (both sides).")
        lines.append("")
    for note in skipped:
        lines += [note, ""]
    header = ["implementation", *(f"{op} (µs)" for op in OPS), "first sample after the fill"]
    header += [f"{op}: ours / TorchRL" for op in OPS]
    header.append("sample: ours / TorchRL cache_values=True")
    lines.append(markdown_table(header, rows))
    return "\n".join(lines)
