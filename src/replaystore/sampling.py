"""Sampling kernels shared by every buffer in replaystore.

* :class:`SumTree`: priorities with O(log n) vectorised update and proportional
  sampling, plus the minimum priority (for importance weights). Used by the
  prioritized transition buffer.
* :func:`weighted_sample_without_replacement`: the exact distribution of
  *successive* weighted sampling without replacement (pick one item with
  probability proportional to its weight, remove it, repeat), either with
  Efraimidis-Spirakis keys (O(n)) or by rejection from a cumulative sum
  (O(k log n), fast when k is small against n), or by rejection from a prepared
  :class:`AliasTable` (O(1) per draw; reuse it across calls). Used by the
  trajectory buffer's recency-biased sampling and the task sampler.
* :func:`recency_weights`: ``(rank + 1) ** power`` with rank 0 the oldest item.
* :func:`recency_sample_without_replacement`: the same successive sampling for
  the weights ``(rank + 1) ** power``, power > 0, with no table and no O(n)
  pass: each draw inverts the CDF of the continuous density ``x ** power`` and
  is corrected to the discrete weights by rejection. Used by the trajectory
  buffer's recency-biased sampling (its first call costs what later ones do).

Everything here works on whole NumPy arrays; there is no Python loop per item.
"""

from __future__ import annotations

import threading
from types import ModuleType
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from replaystore._kernels import resolve_kernel
from replaystore.errors import check_int

try:
    from replaystore import _sumtree as _csumtree
except ImportError:  # no compiler at install time: the NumPy fallback is used
    _csumtree = None
try:
    from replaystore import _recency as _crecency
except ImportError:  # no compiler at install time: the NumPy fallback is used
    _crecency = None

__all__ = [
    "AliasTable",
    "SumTree",
    "as_generator",
    "recency_sample_without_replacement",
    "recency_weights",
    "weighted_sample_without_replacement",
]

SeedLike = int | np.random.Generator | None


def as_generator(seed: SeedLike) -> np.random.Generator:
    """Return ``seed`` if it is a Generator, else a new PCG64 Generator seeded with it."""
    if isinstance(seed, np.random.Generator):
        return seed
    return np.random.default_rng(seed)


_SUMTREE_ENV = "REPLAYSTORE_SUMTREE"


class SumTree:
    """A fixed-capacity F-ary tree of non-negative priorities with sums and minima.

    Leaves hold one priority per slot (0 for an empty slot). Internal nodes hold
    the sum (for proportional sampling) and the minimum over non-empty slots
    (for importance-weight normalisation) of their children.

    Two backends share one memory layout and give bit-identical results for
    the same fan-out: a compiled kernel (``replaystore._sumtree``, built when
    the package is installed with a C compiler; drawing or updating 256 slots
    takes about 10 us at a million slots) and a NumPy fallback (a few
    vectorised calls per tree level, about 10x slower). ``backend="auto"`` uses
    the compiled one when it is importable; the environment variable
    ``REPLAYSTORE_SUMTREE=numpy`` (or ``=c``) forces one when the constructor
    does not name it.

    Cost: ``update`` and ``find`` of a batch of m items are O(m * F * log_F n)
    element operations; memory is about 16 bytes per slot.

    Args:
        capacity: number of slots, >= 1.
        fanout: children per internal node, >= 2. ``None``: each backend's
            fastest, 8 compiled (one cache line per node), 32 with NumPy (fewer
            levels, so fewer NumPy calls).
        backend: ``"auto"``, ``"c"`` or ``"numpy"``; ``None`` reads
            ``REPLAYSTORE_SUMTREE`` (default ``"auto"``).

    Raises:
        ArgumentError: bad capacity or fan-out (a ``ValueError``; ``ArgumentTypeError``,
            also a ``TypeError``, when not a number).
        ValueError: an unknown backend name.
        ImportError: ``backend="c"`` but the compiled kernel is not installed.
    """

    def __init__(
        self,
        capacity: int,
        fanout: int | None = None,
        *,
        backend: Literal["auto", "c", "numpy"] | None = None,
    ) -> None:
        self.capacity = check_int(capacity, "SumTree capacity", minimum=1)
        self._kernel = _resolve_backend(backend)
        if fanout is None:
            fanout = 32 if self._kernel is None else 8
        self.fanout = check_int(fanout, "SumTree fanout", minimum=2)
        # Level 0 is the leaves, then each parent level, the root last. Every
        # level below the root is padded to a multiple of the fan-out, so a
        # level reshaped to (-1, fanout) has one row of children per parent.
        f = self.fanout
        sizes = [-(-self.capacity // f) * f]
        while sizes[-1] > f:
            sizes.append(-(-(sizes[-1] // f) // f) * f)
        sizes.append(1)
        self._depth = len(sizes) - 1
        self._offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self._sum_flat = np.zeros(int(self._offsets[-1]))
        self._min_flat = np.full(int(self._offsets[-1]), np.inf)
        bounds = list(zip(self._offsets[:-1].tolist(), self._offsets[1:].tolist(), strict=True))
        self._sums = [self._sum_flat[a:b] for a, b in bounds]
        self._mins = [self._min_flat[a:b] for a, b in bounds]

    @property
    def backend(self) -> str:
        """``"c"`` or ``"numpy"``: which implementation this tree uses."""
        return "numpy" if self._kernel is None else "c"

    @property
    def total(self) -> float:
        """Sum of all priorities."""
        return float(self._sum_flat[-1])

    @property
    def min(self) -> float:
        """Smallest priority among slots holding a positive priority (``inf`` when none)."""
        return float(self._min_flat[-1])

    def values(self) -> NDArray[np.float64]:
        """A copy of the priorities of all ``capacity`` slots."""
        return self._sums[0][: self.capacity].copy()

    def __getitem__(self, indices: ArrayLike) -> NDArray[np.float64]:
        """Priorities at ``indices`` (validated slot numbers), as a 1-D float64 array.

        Raises:
            TypeError: the indices are not integers.
            IndexError: an index is outside ``[0, capacity)``.
        """
        idx = _as_int64(indices)
        if self._kernel is None or idx is None:
            return self._sums[0][self._check_indices(indices)]
        out = np.empty(idx.size)
        if self._kernel.gather(self._sum_flat, self.capacity, idx, out):
            self._check_indices(indices)  # raises with the offending index
        return out

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

    @staticmethod
    def _check_priorities(pri: NDArray[np.float64]) -> None:
        if not np.isfinite(pri).all():
            raise ValueError("priorities must be finite (found NaN or inf)")
        if (pri < 0).any():
            raise ValueError(f"priorities must be >= 0, found {float(pri.min())}")

    def update(self, indices: ArrayLike, priorities: ArrayLike) -> None:
        """Set the priority of each slot in ``indices``; the last value wins for repeats.

        ``priorities`` has one value per index, or a single value for all of them.
        Everything is validated before anything is written.

        Raises:
            TypeError: the indices are not integers.
            IndexError: an index is outside ``[0, capacity)``.
            ValueError: a priority is negative, NaN or infinite, or the lengths differ.
        """
        idx = _as_int64(indices)
        if idx is None:
            idx = self._check_indices(indices)
        pri = np.ascontiguousarray(priorities, dtype=np.float64).reshape(-1)
        if pri.size != idx.size and pri.size != 1:
            raise ValueError(f"got {idx.size} indices but {pri.size} priorities")
        if idx.size == 0:
            return
        if self._kernel is not None:
            status = self._kernel.update(
                self._sum_flat, self._min_flat, self._offsets, self.fanout, self.capacity, idx, pri
            )
            if status:  # raise with the message of the reference checks
                self._check_indices(idx)
                self._check_priorities(pri)
                raise RuntimeError(f"SumTree kernel rejected the update (status {status})")
            return
        idx = self._check_indices(idx)
        self._check_priorities(pri)
        if pri.size != idx.size:
            pri = np.broadcast_to(pri, idx.shape)
        self._sums[0][idx] = pri
        self._mins[0][idx] = np.where(pri > 0, pri, np.inf)
        f = self.fanout
        nodes = idx
        for lvl in range(self._depth):
            nodes = np.unique(nodes // f) if nodes.size > 64 else nodes // f
            # The last column of cumsum is the sequential sum, the same rounding
            # as the compiled kernel and as the prefix sums that `find` walks.
            rows = self._sums[lvl].reshape(-1, f)[nodes]
            self._sums[lvl + 1][nodes] = np.cumsum(rows, axis=1)[:, -1]
            self._mins[lvl + 1][nodes] = self._mins[lvl].reshape(-1, f)[nodes].min(axis=1)

    def find(self, mass: ArrayLike) -> NDArray[np.int64]:
        """Slots whose cumulative priority interval contains each value of ``mass``.

        Slot i owns ``[prefix(i), prefix(i) + p_i)``; values are clipped into
        ``[0, total)`` and a slot of zero priority is never returned.

        Raises:
            ValueError: the tree is empty (total priority 0).
        """
        return self._find(np.array(mass, dtype=np.float64).reshape(-1))

    def _find(self, v: NDArray[np.float64]) -> NDArray[np.int64]:
        # `v` is a fresh contiguous float64 array that this call may overwrite.
        if not self.total > 0:
            raise ValueError("cannot sample from a SumTree whose total priority is 0")
        if self._kernel is not None:
            out = np.empty(v.size, dtype=np.int64)
            self._kernel.find(self._sum_flat, self._offsets, self.fanout, v, out)
            return out
        if v.size == 0:
            return np.zeros(0, dtype=np.int64)
        np.maximum(v, 0.0, out=v)
        f = self.fanout
        node = np.zeros(v.shape, dtype=np.int64)
        rows = np.arange(v.size)
        # cum[:, k] is the sequential prefix sum of the first k children, so the
        # prefix before child j is cum[:, j] (column 0 stays 0).
        cum = np.zeros((v.size, f + 1))
        has_nan = bool(np.isnan(v).any())
        for lvl in range(self._depth - 1, -1, -1):
            children = self._sums[lvl].reshape(-1, f)[node]
            np.cumsum(children, axis=1, out=cum[:, 1:])
            j = np.count_nonzero(cum[:, 1:] <= v[:, None], axis=1)
            # For a number v >= 0, j < f implies child j has positive mass (its
            # prefix sum grew past v). Rounding can push v past the last child
            # with mass (j == f), and a NaN stops at child 0 whatever its mass:
            # then fall back to the last child with positive mass.
            if has_nan or j.max() >= f:
                over = (j >= f) | ~(children[rows, np.minimum(j, f - 1)] > 0)
                if over.any():
                    positive = children[over] > 0
                    j[over] = f - 1 - np.argmax(positive[:, ::-1], axis=1)
            v -= cum[rows, j]
            node *= f
            node += j
        return node

    def sample(self, n: int, rng: SeedLike = None) -> NDArray[np.int64]:
        """Draw ``n`` slots independently with probability ``p_i / total`` (with replacement).

        Both backends draw the same slots from the same ``rng`` state.

        Raises:
            ValueError: the tree is empty (total priority 0).
        """
        gen = as_generator(rng)
        v = gen.random(int(n))
        v *= self.total
        return self._find(v)


def _resolve_backend(backend: str | None) -> ModuleType | None:
    """The compiled kernel module for ``backend``, or None for the NumPy fallback."""
    return resolve_kernel(_csumtree, backend, env=_SUMTREE_ENV, argument="backend")


def _as_int64(indices: ArrayLike) -> NDArray[np.int64] | None:
    """``indices`` as a contiguous 1-D int64 array when it already has that dtype, else None."""
    idx = np.asarray(indices)
    if idx.dtype != np.int64:
        return None
    return np.ascontiguousarray(idx).reshape(-1)


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


class AliasTable:
    """Prepared weights for O(1) draws with replacement (Walker's alias method).

    Build once (O(n), vectorised), then draw any number of items in O(1) each:
    one uniform number picks a bucket and, with its fractional part, either the
    bucket's own item or its alias. Pass it as ``weights`` to
    :func:`weighted_sample_without_replacement` to reuse it across calls (the
    trajectory buffer caches one per (pool size, recency power)).

    The table is built with a vectorised "sweep": light items (below the mean
    weight) are filled, in order, by heavy items in order; a heavy item whose
    remaining mass drops below the mean becomes a bucket aliased to the next
    heavy item. Prefix sums of deficits and excesses give every bucket at once.
    Probabilities are exact up to the float64 rounding of those prefix sums
    (for a million power-2 recency weights, at most ~1e-14 absolute per item,
    far below what any number of draws can detect).

    Args:
        weights: n >= 1 non-negative finite weights with a positive sum.

    Raises:
        ValueError: empty, negative, non-finite or all-zero weights.

    Memory: 20 bytes per item (+ a 4-byte-per-item scratch buffer for sampling
    without replacement, allocated on first use).
    """

    __slots__ = ("_lock", "_scratch", "alias", "n", "positive", "probability", "weights")

    def __init__(self, weights: ArrayLike) -> None:
        w = np.asarray(weights, dtype=np.float64).reshape(-1)
        if w.size == 0:
            raise ValueError("an AliasTable needs at least one weight")
        if not np.isfinite(w).all():
            raise ValueError("weights must be finite (found NaN or inf)")
        if (w < 0).any():
            raise ValueError(f"weights must be >= 0, found {float(w.min())}")
        total = float(w.sum())
        if not total > 0:
            raise ValueError("weights must have a positive sum")
        n = w.size
        self.n = n
        self.weights = w
        self.positive = int(np.count_nonzero(w))
        p = w * (n / total)  # mean 1
        light = p < 1.0
        li = np.flatnonzero(light)
        hi = np.flatnonzero(~light)
        prob = np.ones(n)
        alias = np.arange(n, dtype=np.int32 if n < 2**31 else np.int64)
        if li.size and hi.size:
            deficit_end = np.cumsum(1.0 - p[li])
            deficit_start = np.concatenate(([0.0], deficit_end[:-1]))
            excess_end = np.cumsum(p[hi] - 1.0)
            # Light item i is filled by the heavy item whose excess interval
            # [E_{h-1}, E_h) holds the start of i's deficit interval.
            owner = np.searchsorted(excess_end, deficit_start, side="right")
            np.minimum(owner, hi.size - 1, out=owner)
            prob[li] = p[li]
            alias[li] = hi[owner]
            # Heavy h (all but the last) gave away its excess plus the part of
            # the light interval straddling E_h: that overshoot is h's own
            # deficit, filled by heavy h + 1.
            boundaries = np.concatenate(([0.0], deficit_end))
            nxt = np.searchsorted(boundaries, excess_end[:-1], side="left")
            np.minimum(nxt, boundaries.size - 1, out=nxt)
            overshoot = np.clip(boundaries[nxt] - excess_end[:-1], 0.0, 1.0)
            prob[hi[:-1]] = 1.0 - overshoot
            alias[hi[:-1]] = hi[1:]
        prob[w == 0] = 0.0  # never drawn, even through rounding
        self.probability = prob
        self.alias = alias
        self._scratch: NDArray[np.int32] | None = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        # Picklable for DataLoader workers started with "spawn": drop the lock and scratch.
        return {
            name: getattr(self, name)
            for name in ("alias", "n", "positive", "probability", "weights")
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)
        self._scratch = None
        self._lock = threading.Lock()

    def draw(self, m: int, rng: SeedLike = None) -> NDArray[np.int64]:
        """``m`` independent draws with probability ``w_i / sum(w)`` (with replacement).

        Cost: O(m): one uniform number and two table lookups per draw.
        """
        gen = as_generator(rng)
        x = gen.random(int(m)) * self.n
        bucket = x.astype(np.int64)
        np.minimum(bucket, self.n - 1, out=bucket)
        own = (x - bucket) < self.probability[bucket]
        return np.where(own, bucket, self.alias[bucket]).astype(np.int64, copy=False)


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


def _first_occurrences(
    draws: NDArray[np.int64], scratch: NDArray[np.int32] | NDArray[np.int64]
) -> NDArray[np.int64]:
    # scratch[item] = position of the item's first draw (writes of repeated
    # indices are applied in order, so writing the reversed stream leaves the
    # first position); an item is new where its position is its own.
    order = np.arange(draws.size, dtype=scratch.dtype)
    scratch[draws[::-1]] = order[::-1]
    return draws[scratch[draws] == order]


def _sample_rejection(
    w: NDArray[np.float64] | AliasTable,
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
    if isinstance(w, AliasTable):
        table = w
        n = table.n
        weights = table.weights

        def draw(m: int) -> NDArray[np.int64]:
            return table.draw(m, gen)

        with table._lock:
            if table._scratch is None:
                table._scratch = np.empty(n, dtype=np.int32 if n < 2**31 else np.int64)
        scratch = table._scratch
        lock = table._lock
    else:
        weights = w
        n = w.size
        cum = np.cumsum(w) if cumulative is None else cumulative
        total = cum[-1]

        def draw(m: int) -> NDArray[np.int64]:
            out = np.searchsorted(cum, gen.random(m) * total, side="right")
            return np.minimum(out, n - 1, out=out)

        scratch = np.empty(n, dtype=np.int64)
        lock = threading.Lock()
    chosen: list[NDArray[np.int64]] = []
    got = 0
    taken: NDArray[np.bool_] | None = None
    with lock:
        for _ in range(max_rounds):
            need = k - got
            if need == 0:
                break
            draws = draw(int(need * 1.25) + 32)
            if taken is not None:
                draws = draws[~taken[draws]]
                if draws.size == 0:
                    continue
            new = _first_occurrences(draws, scratch)[:need]
            chosen.append(new)
            got += new.size
            if got < k:
                if taken is None:
                    taken = np.zeros(n, dtype=bool)
                    for earlier in chosen:
                        taken[earlier] = True
                else:
                    taken[new] = True
    if got < k:
        if taken is None:
            taken = np.zeros(n, dtype=bool)
        for earlier in chosen:
            taken[earlier] = True
        chosen.append(_sample_es_keys(weights, k - got, gen, taken))
    if not chosen:
        return np.empty(0, dtype=np.int64)
    return np.concatenate(chosen).astype(np.int64, copy=False)


def weighted_sample_without_replacement(
    weights: ArrayLike | AliasTable,
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
        weights: n non-negative finite weights (items of weight 0 are never
            drawn), or an :class:`AliasTable` prepared from them. A table is
            the fast path for repeated calls on the same weights: no O(n)
            validation or cumulative sum per call, O(1) per draw.
        k: number of distinct items, ``0 <= k <= count of positive weights``.
        rng: a seed or a ``numpy.random.Generator``.
        method: ``"keys"`` (Efraimidis-Spirakis, O(n)), ``"rejection"`` (draws with
            replacement, keeps first occurrences; O(k) with a table, O(k log n)
            from a cumulative sum, while the mass is not concentrated on the
            items already taken; a stalled stream finishes with keys), or
            ``"auto"``: rejection when k is at most a quarter of n with a table,
            at most 1/64 of n without one (binary search over a cold cumulative
            sum loses to one pass of keys beyond that), else keys.
        cumulative: optional precomputed ``np.cumsum(weights)`` to reuse across calls
            (array weights and the rejection method only).

    Returns:
        int64 array of k distinct indices.

    Raises:
        ValueError: negative/non-finite weights, or k larger than the number of
            positive weights.

    Cost: for k = 100,000 of n = 1,000,000 with a prepared table, about a tenth
    of numpy's weighted ``choice`` (see benchmarks/RESULTS.md).
    """
    if int(k) != k or k < 0:
        raise ValueError(f"k must be a non-negative integer, got {k!r}")
    k = int(k)
    if isinstance(weights, AliasTable):
        if k > weights.positive:
            raise ValueError(
                f"cannot draw {k} distinct items: only {weights.positive} have positive weight"
            )
        w: NDArray[np.float64] | AliasTable = weights
        n = weights.n
    else:
        w = _check_weights(weights, k)
        n = w.size
        if cumulative is not None and cumulative.shape != w.shape:
            raise ValueError(f"cumulative has shape {cumulative.shape}, weights {w.shape}")
    gen = as_generator(rng)
    if k == 0:
        return np.empty(0, dtype=np.int64)
    if method == "auto":
        share = 4 if isinstance(w, AliasTable) else 64
        method = "rejection" if k * share <= n else "keys"
    if method == "keys":
        return _sample_es_keys(w.weights if isinstance(w, AliasTable) else w, k, gen, None)
    if method == "rejection":
        return _sample_rejection(w, k, gen, cumulative, max_rounds=8)
    raise ValueError(f"unknown method {method!r}; use 'auto', 'keys' or 'rejection'")


_THREAD = threading.local()


def _scratch(n: int) -> NDArray[np.int32] | NDArray[np.int64]:
    """This thread's scratch array of ``n`` items, reused (a fresh one costs page faults)."""
    dtype = np.int32 if n < 2**31 else np.int64
    buf = getattr(_THREAD, "scratch", None)
    if buf is None or buf.size < n or buf.dtype != dtype:
        buf = _THREAD.scratch = np.empty(n, dtype=dtype)
    return buf[:n]


def _recency_root(u: NDArray[np.float64], n: int, power: float) -> NDArray[np.float64]:
    """``(f + (1 - f) * u) ** (1 / (power + 1))`` with ``f = (n + 1) ** -(power + 1)``.

    The inverse of the CDF of the density ``x ** power`` on ``[1, n + 1)``, scaled
    to ``[f ** (1 / (power + 1)), 1)``: times ``n + 1`` it is ``x``. Overwrites
    ``u`` and returns it.
    """
    q = power + 1.0
    floor_mass = (n + 1.0) ** -q  # F(1) scaled; underflows harmlessly to 0 for large n, power
    u *= 1.0 - floor_mass
    u += floor_mass
    return np.cbrt(u, out=u) if q == 3.0 else np.power(u, 1.0 / q, out=u)


def _accept_recency(
    u: NDArray[np.float64], v: NDArray[np.float64], n: int, power: float
) -> NDArray[np.int64]:
    """The ranks accepted from uniform pairs ``(u, v)`` (NumPy path of ``_recency.accept``).

    Overwrites ``u``.

    ``x`` is drawn from the density proportional to ``x ** power`` on ``[1, n + 1)``
    by inverting its CDF at ``u``, and accepted when ``v < (floor(x) / x) ** power``;
    an accepted ``x`` then has the density ``floor(x) ** power`` (a step function),
    so ``floor(x) - 1`` has the weights ``(rank + 1) ** power``. Since
    ``(1 - t) ** power >= 1 - max(power, 1) * t``, most pairs are accepted on that
    bound without a power; acceptance is at least ``2 ** -power`` (rank 0) and
    tends to 1 for the ranks that hold the mass.
    """
    x = _recency_root(u, n, power)
    slope = max(power, 1.0)
    x *= n + 1.0
    whole = np.floor(x)
    t = x - whole
    t /= x
    accept = v < 1.0 - slope * t
    unsure = np.flatnonzero(~accept)
    if unsure.size:
        accept[unsure] = v[unsure] < (1.0 - t[unsure]) ** power
    ranks = whole[accept].astype(np.int64)
    ranks -= 1
    np.clip(ranks, 0, n - 1, out=ranks)  # rank -1 (x < 1 by rounding) is never accepted
    return ranks


def _draw_recency(
    m: int, n: int, power: float, gen: np.random.Generator, kernel: ModuleType | None = None
) -> NDArray[np.int64]:
    """``m`` i.i.d. ranks in ``[0, n)`` with probability proportional to ``(rank + 1) ** power``.

    Exact, for power > 0 (see :func:`_accept_recency`). ``kernel`` is the compiled
    ``replaystore._recency`` or None (NumPy); both give the same ranks from the
    same generator state.
    """
    out: list[NDArray[np.int64]] = []
    got = 0
    rate = 0.95  # share of pairs accepted: near 1 unless n is small and the power large
    while got < m:
        want = int((m - got) / rate * 1.02) + 16
        u = gen.random(want)
        v = gen.random(want)
        if kernel is None:
            ranks = _accept_recency(u, v, n, power)
        else:
            ranks = np.empty(want, dtype=np.int64)
            ranks = ranks[: kernel.accept(_recency_root(u, n, power), v, n, power, ranks)]
        out.append(ranks)
        got += ranks.size
        rate = max(ranks.size / want, 0.01)
    if len(out) == 1:
        return out[0][:m]
    return np.concatenate(out)[:m] if out else np.empty(0, dtype=np.int64)


def _round_size(need: int) -> int:
    """Draws per round of the recency sampler when ``need`` distinct ranks are missing.

    Slightly more than ``need``: repeats are few while the ranks drawn are few
    against the pool; a short round is followed by a smaller one (cheaper than
    drawing too much in the first).
    """
    return int(need * 1.12) + 32


def _mask(n: int) -> tuple[NDArray[np.uint8], int]:
    """This thread's byte mask of ``n`` items and a fresh stamp (1..255) for one draw.

    A byte equal to the stamp means "taken" in this draw; every other value
    means untaken, so nothing is cleared between draws: the whole mask is
    zeroed once the 255 stamps are used up.
    """
    buf = getattr(_THREAD, "mask", None)
    stamp = getattr(_THREAD, "stamp", 0) + 1
    if buf is None or buf.size < n:
        buf = _THREAD.mask = np.zeros(n, dtype=np.uint8)
        stamp = 1
    elif stamp > 255:
        buf[:] = 0
        stamp = 1
    _THREAD.stamp = stamp
    return buf[:n], stamp


def _recency_keys(
    n: int, k: int, power: float, gen: np.random.Generator, taken: NDArray[np.bool_] | None
) -> NDArray[np.int64]:
    # Efraimidis-Spirakis keys E_i / w_i compared as logs (no overflow for large powers).
    keys = np.log(gen.standard_exponential(n))
    keys -= power * np.log1p(np.arange(n, dtype=np.float64))
    if taken is not None:
        keys[taken] = np.inf
    top = np.argpartition(keys, k - 1)[:k] if k < n else np.arange(n)
    return top[np.argsort(keys[top], kind="stable")].astype(np.int64)


def recency_sample_without_replacement(
    n: int, k: int, power: float, rng: SeedLike = None, *, backend: str | None = None
) -> NDArray[np.int64]:
    """``k`` distinct ranks of ``0..n-1``, successive sampling with weights ``(rank + 1) ** power``.

    The same distribution as ``weighted_sample_without_replacement(recency_weights(n,
    power), k)`` (and numpy's ``choice(n, k, replace=False, p=w / w.sum())``), in
    selection order, without building the weights: draws with replacement come
    from :func:`_draw_recency` (exact, O(1) each) and the first occurrence of each
    rank is kept, as :func:`weighted_sample_without_replacement` does with a table.
    When k is more than a quarter of n, or the stream stalls on taken ranks,
    the rest is drawn with Efraimidis-Spirakis keys (O(n)).

    Args:
        n: number of items (ranks ``0..n-1``, rank 0 the oldest).
        k: number of distinct ranks, ``0 <= k <= n``.
        power: > 0 (0 is uniform, negative favours old items: use
            :func:`weighted_sample_without_replacement` with :func:`recency_weights`).
        rng: a seed or a ``numpy.random.Generator``.
        backend: ``"auto"`` (the compiled ``replaystore._recency`` when installed),
            ``"c"`` or ``"numpy"``; None reads ``REPLAYSTORE_RECENCY`` (default
            ``"auto"``). Both give the same ranks for the same seed.

    Returns:
        int64 array of k distinct ranks.

    Raises:
        ValueError: ``power`` not finite and > 0, ``k`` not in ``[0, n]``, or an
            unknown ``backend``. ImportError: ``backend="c"`` without the extension.

    Cost: O(k) for k <= n / 4 (100,000 of 1,000,000 at power 2: about 1.5 ms
    with the compiled kernel, 4-5 ms with NumPy), with a scratch array of one byte
    (compiled) or four bytes (NumPy) per item kept per thread for the next call;
    O(n) beyond.
    """
    power = float(power)
    if not (np.isfinite(power) and power > 0):
        raise ValueError(f"power must be finite and > 0, got {power}")
    if int(n) != n or n < 0:
        raise ValueError(f"n must be a non-negative integer, got {n!r}")
    if int(k) != k or not 0 <= k <= n:
        raise ValueError(f"k must be an integer in [0, {n}], got {k!r}")
    n, k = int(n), int(k)
    kernel = resolve_kernel(_crecency, backend, env="REPLAYSTORE_RECENCY", argument="backend")
    gen = as_generator(rng)
    if k == 0:
        return np.empty(0, dtype=np.int64)
    if 4 * k > n:
        return _recency_keys(n, k, power, gen, None)
    if kernel is not None:
        return _recency_compiled(n, k, power, gen, kernel)
    scratch = _scratch(n)
    chosen: list[NDArray[np.int64]] = []
    got = 0
    taken: NDArray[np.bool_] | None = None
    for _ in range(8):
        need = k - got
        draws = _draw_recency(_round_size(need), n, power, gen)
        if taken is not None:
            draws = draws[~taken[draws]]
        new = _first_occurrences(draws, scratch)[:need]
        chosen.append(new)
        got += new.size
        if got == k:
            break
        if taken is None:
            taken = np.zeros(n, dtype=bool)
            taken[chosen[0]] = True
        else:
            taken[new] = True
    else:
        chosen.append(_recency_keys(n, k - got, power, gen, taken))
    return np.concatenate(chosen) if len(chosen) > 1 else chosen[0]


def _recency_compiled(
    n: int, k: int, power: float, gen: np.random.Generator, kernel: ModuleType
) -> NDArray[np.int64]:
    # The NumPy path's rounds, with the filter and first occurrences done by
    # ``kernel.first_new`` on a byte mask stamped for this draw (see _mask).
    mask, stamp = _mask(n)
    out = np.empty(k, dtype=np.int64)
    got = 0
    for _ in range(8):
        need = k - got
        draws = _draw_recency(_round_size(need), n, power, gen, kernel)
        got += kernel.first_new(draws, mask, need, out[got:], stamp)
        if got == k:
            break
    else:
        out[got:] = _recency_keys(n, k - got, power, gen, mask == stamp)
    return out
