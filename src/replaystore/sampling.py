"""Sampling kernels shared by every buffer in replaystore.

* :class:`SumTree`: priorities with O(log n) vectorised update and proportional
  sampling, plus the minimum priority (for importance weights). Used by the
  prioritized transition buffer.
* :func:`weighted_sample_without_replacement`: the exact distribution of
  *successive* weighted sampling without replacement (pick one item with
  probability proportional to its weight, remove it, repeat), either with
  Efraimidis-Spirakis keys (O(n)) or by rejection from a cumulative sum
  (O(k log n), fast when k is small against n). Used by the trajectory buffer's
  recency-biased sampling and the task sampler.
* :func:`recency_weights`: ``(rank + 1) ** power`` with rank 0 the oldest item.

Everything here works on whole NumPy arrays; there is no Python loop per item.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "SumTree",
    "as_generator",
    "recency_weights",
    "weighted_sample_without_replacement",
]

SeedLike = int | np.random.Generator | None


def as_generator(seed: SeedLike) -> np.random.Generator:
    """Return ``seed`` if it is a Generator, else a new PCG64 Generator seeded with it."""
    if isinstance(seed, np.random.Generator):
        return seed
    return np.random.default_rng(seed)


class SumTree:
    """A fixed-capacity F-ary tree of non-negative priorities with sums and minima.

    Leaves hold one priority per slot (0 for an empty slot). Internal nodes hold
    the sum (for proportional sampling) and the minimum over non-empty slots
    (for importance-weight normalisation) of their children. A wide fan-out
    (default 32) keeps the tree shallow (4 levels for a million slots), so a
    batch update or a batch search is a handful of NumPy operations per level.

    Cost: ``update`` and ``find`` of a batch of m items are O(m * F * log_F n)
    element operations, done as O(log_F n) vectorised NumPy calls.

    Args:
        capacity: number of slots, >= 1.
        fanout: children per internal node, >= 2.
    """

    def __init__(self, capacity: int, fanout: int = 32) -> None:
        if int(capacity) != capacity or capacity < 1:
            raise ValueError(f"SumTree capacity must be a positive integer, got {capacity!r}")
        if int(fanout) != fanout or fanout < 2:
            raise ValueError(f"SumTree fanout must be an integer >= 2, got {fanout!r}")
        self.capacity = int(capacity)
        self.fanout = int(fanout)
        depth = 1
        while self.fanout**depth < self.capacity:
            depth += 1
        self._depth = depth
        # Level 0 is the leaves, padded to fanout**depth; level `depth` is the root.
        self._sums = [np.zeros(self.fanout ** (depth - lvl)) for lvl in range(depth + 1)]
        self._mins = [np.full(self.fanout ** (depth - lvl), np.inf) for lvl in range(depth + 1)]

    @property
    def total(self) -> float:
        """Sum of all priorities."""
        return float(self._sums[-1][0])

    @property
    def min(self) -> float:
        """Smallest priority among slots holding a positive priority (``inf`` when none)."""
        return float(self._mins[-1][0])

    def values(self) -> NDArray[np.float64]:
        """A copy of the priorities of all ``capacity`` slots."""
        return self._sums[0][: self.capacity].copy()

    def __getitem__(self, indices: ArrayLike) -> NDArray[np.float64]:
        """Priorities at ``indices`` (validated slot numbers)."""
        idx = self._check_indices(indices)
        return self._sums[0][idx]

    def _check_indices(self, indices: ArrayLike) -> NDArray[np.int64]:
        idx = np.asarray(indices)
        if idx.dtype.kind not in "iu":
            if idx.size == 0:
                return idx.astype(np.int64).reshape(-1)
            raise TypeError(f"SumTree indices must be integers, got dtype {idx.dtype}")
        idx = idx.astype(np.int64, copy=False).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= self.capacity):
            bad = idx[(idx < 0) | (idx >= self.capacity)][0]
            raise IndexError(f"SumTree index {int(bad)} out of range [0, {self.capacity})")
        return idx

    def update(self, indices: ArrayLike, priorities: ArrayLike) -> None:
        """Set the priority of each slot in ``indices``; the last value wins for repeats.

        Raises:
            IndexError: an index is outside ``[0, capacity)``.
            ValueError: a priority is negative, NaN or infinite, or the lengths differ.
        """
        idx = self._check_indices(indices)
        pri = np.asarray(priorities, dtype=np.float64).reshape(-1)
        if pri.size == 1 and idx.size != 1:
            pri = np.broadcast_to(pri, idx.shape)
        if pri.shape != idx.shape:
            raise ValueError(f"got {idx.size} indices but {pri.size} priorities")
        if idx.size == 0:
            return
        if not np.isfinite(pri).all():
            raise ValueError("priorities must be finite (found NaN or inf)")
        if (pri < 0).any():
            raise ValueError(f"priorities must be >= 0, found {float(pri.min())}")
        self._sums[0][idx] = pri
        self._mins[0][idx] = np.where(pri > 0, pri, np.inf)
        f = self.fanout
        nodes = idx
        for lvl in range(self._depth):
            nodes = np.unique(nodes // f) if nodes.size > 64 else nodes // f
            self._sums[lvl + 1][nodes] = self._sums[lvl].reshape(-1, f)[nodes].sum(axis=1)
            self._mins[lvl + 1][nodes] = self._mins[lvl].reshape(-1, f)[nodes].min(axis=1)

    def find(self, mass: ArrayLike) -> NDArray[np.int64]:
        """Slots whose cumulative priority interval contains each value of ``mass``.

        Slot i owns ``[prefix(i), prefix(i) + p_i)``; values are clipped into
        ``[0, total)`` and a slot of zero priority is never returned.

        Raises:
            ValueError: the tree is empty (total priority 0).
        """
        if not self.total > 0:
            raise ValueError("cannot sample from a SumTree whose total priority is 0")
        v = np.asarray(mass, dtype=np.float64).reshape(-1).copy()
        f = self.fanout
        node = np.zeros(v.shape, dtype=np.int64)
        rows = np.arange(v.size)
        for lvl in range(self._depth - 1, -1, -1):
            children = self._sums[lvl].reshape(-1, f)[node]
            cum = np.cumsum(children, axis=1)
            j = (cum <= v[:, None]).sum(axis=1)
            # Rounding can push a value past the last non-empty child, or onto an
            # empty one: fall back to the last child with positive mass.
            over = (j >= f) | (children[rows, np.minimum(j, f - 1)] <= 0)
            if over.any():
                positive = children[over] > 0
                j[over] = f - 1 - np.argmax(positive[:, ::-1], axis=1)
            prefix = np.where(j > 0, cum[rows, np.maximum(j - 1, 0)], 0.0)
            v -= prefix
            node = node * f + j
        return node

    def sample(self, n: int, rng: SeedLike = None) -> NDArray[np.int64]:
        """Draw ``n`` slots independently with probability ``p_i / total`` (with replacement)."""
        gen = as_generator(rng)
        return self.find(gen.random(int(n)) * self.total)


def recency_weights(n: int, power: float) -> NDArray[np.float64]:
    """``(rank + 1) ** power`` for ranks ``0..n-1``, rank 0 being the oldest item.

    Power 0 gives equal weights; larger powers favour recent items more.
    (The trajectory buffer treats power 1.0 as uniform, as WebGym does; this
    kernel does not special-case it.)
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not np.isfinite(power):
        raise ValueError(f"recency power must be finite, got {power}")
    return np.arange(1, n + 1, dtype=np.float64) ** float(power)


def _check_weights(weights: ArrayLike, k: int) -> NDArray[np.float64]:
    w = np.asarray(weights, dtype=np.float64).reshape(-1)
    if not np.isfinite(w).all():
        raise ValueError("weights must be finite (found NaN or inf)")
    if (w < 0).any():
        raise ValueError(f"weights must be >= 0, found {float(w.min())}")
    if int(k) != k or k < 0:
        raise ValueError(f"k must be a non-negative integer, got {k!r}")
    positive = int(np.count_nonzero(w))
    if k > positive:
        raise ValueError(f"cannot draw {k} distinct items: only {positive} have positive weight")
    return w


def _sample_es_keys(
    w: NDArray[np.float64], k: int, gen: np.random.Generator, excluded: NDArray[np.bool_] | None
) -> NDArray[np.int64]:
    # Efraimidis-Spirakis: key_i = E_i / w_i with E_i ~ Exp(1); the k smallest
    # keys, in increasing order, are distributed exactly as k successive draws.
    with np.errstate(divide="ignore"):
        keys = gen.standard_exponential(w.size) / w
    if excluded is not None:
        keys[excluded] = np.inf
    top = np.argpartition(keys, k - 1)[:k] if k < w.size else np.arange(w.size)
    return top[np.argsort(keys[top], kind="stable")].astype(np.int64)


def _sample_rejection(
    w: NDArray[np.float64],
    k: int,
    gen: np.random.Generator,
    cumulative: NDArray[np.float64] | None,
    max_rounds: int,
) -> NDArray[np.int64]:
    # Successive sampling without replacement is the sequence of first
    # occurrences in an i.i.d. stream of draws with replacement, so draw in
    # vectorised rounds and keep new items in draw order. If the stream stalls
    # (weights concentrated on the already-taken items), the remainder is
    # successive sampling from the untaken items: finish with ES keys.
    cum = np.cumsum(w) if cumulative is None else cumulative
    total = cum[-1]
    taken = np.zeros(w.size, dtype=bool)
    chosen: list[NDArray[np.int64]] = []
    got = 0
    first_pos = np.empty(w.size, dtype=np.int64)
    for _ in range(max_rounds):
        need = k - got
        if need == 0:
            break
        m = int(need * 1.25) + 32
        draws = np.searchsorted(cum, gen.random(m) * total, side="right")
        np.minimum(draws, w.size - 1, out=draws)
        draws = draws[~taken[draws]]
        if draws.size == 0:
            continue
        order = np.arange(draws.size)
        first_pos[draws[::-1]] = order[::-1]
        new = draws[first_pos[draws] == order][:need]
        taken[new] = True
        chosen.append(new)
        got += new.size
    if got < k:
        chosen.append(_sample_es_keys(w, k - got, gen, taken))
    return np.concatenate(chosen).astype(np.int64) if chosen else np.empty(0, dtype=np.int64)


def weighted_sample_without_replacement(
    weights: ArrayLike,
    k: int,
    rng: SeedLike = None,
    *,
    method: Literal["auto", "keys", "rejection"] = "auto",
    cumulative: NDArray[np.float64] | None = None,
) -> NDArray[np.int64]:
    """Draw ``k`` distinct indices by successive weighted sampling without replacement.

    The result is in selection order: index 0 was drawn first with probability
    ``w_i / sum(w)``, index 1 from the rest with renormalised weights, and so on.
    This is the distribution of ``numpy.random.Generator.choice(n, k,
    replace=False, p=w / w.sum())``, computed much faster.

    Args:
        weights: n non-negative finite weights; items of weight 0 are never drawn.
        k: number of distinct items, ``0 <= k <= count of positive weights``.
        rng: a seed or a ``numpy.random.Generator``.
        method: ``"keys"`` (Efraimidis-Spirakis, O(n)), ``"rejection"`` (draws with
            replacement from the cumulative sum, keeps first occurrences;
            O(k log n) when the weight mass is not concentrated on few items),
            or ``"auto"`` (rejection when k is at most a quarter of n).
        cumulative: optional precomputed ``np.cumsum(weights)`` to reuse across calls.

    Returns:
        int64 array of k distinct indices.

    Raises:
        ValueError: negative/non-finite weights, or k larger than the number of
            positive weights.
    """
    w = _check_weights(weights, k)
    k = int(k)
    gen = as_generator(rng)
    if k == 0:
        return np.empty(0, dtype=np.int64)
    if cumulative is not None and cumulative.shape != w.shape:
        raise ValueError(f"cumulative has shape {cumulative.shape}, weights {w.shape}")
    if method == "auto":
        method = "rejection" if k * 4 <= w.size else "keys"
    if method == "keys":
        return _sample_es_keys(w, k, gen, None)
    if method == "rejection":
        return _sample_rejection(w, k, gen, cumulative, max_rounds=8)
    raise ValueError(f"unknown method {method!r}; use 'auto', 'keys' or 'rejection'")
