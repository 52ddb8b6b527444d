"""Proportional prioritized replay (Schaul et al., 2016) over a ring of stored items.

Item i is drawn with probability ``P(i) = p_i / sum_j p_j`` where the stored
priority is ``p_i = (|delta_i| + eps) ** alpha``. New items get the largest
stored priority seen so far (1.0 before any update), so each is likely to be
replayed at least once. The importance weight of a draw is
``w_i = (N * P(i)) ** -beta / max_j (N * P(j)) ** -beta = (p_i / p_min) ** -beta``
over the N stored items, so the largest weight is 1.

Priorities live in :class:`replaystore.sampling.SumTree` (only its public API is
used). Marking new items is deferred: positions are queued and written to the
tree in one vectorised update before the next sample, update or snapshot. This
is exact because the value they get (the running maximum) only changes in
:meth:`PriorityIndex.update`, which applies the queue first.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch
from numpy.typing import NDArray

from replaystore.errors import BufferIndexError, PriorityError, check_number
from replaystore.sampling import SumTree

__all__ = [
    "NewRowListener",
    "PriorityIndex",
    "as_index_array",
    "check_priority_update",
    "stored_priorities",
]


class NewRowListener(Protocol):
    """What the ring writer tells of every row it wrote (a priority index, a slice sampler)."""

    def mark_new(self, position: int) -> None:
        """Row ``position`` now holds a new, complete transition."""

    def mark_new_range(self, start: int, count: int) -> None:
        """Rows ``start .. start + count - 1`` (modulo the capacity) do."""


def as_index_array(indices: object) -> NDArray[np.int64]:
    """``indices`` (list, range, tensor, ndarray, int) as a 1-D int64 array.

    Raises:
        BufferIndexError: the values are not integers.
    """
    if isinstance(indices, torch.Tensor):
        arr = indices.detach().cpu().numpy()
    elif isinstance(indices, range):
        arr = np.arange(indices.start, indices.stop, indices.step, dtype=np.int64)
    else:
        arr = np.asarray(indices)
    if arr.dtype.kind not in "iu":
        if arr.size == 0:
            return np.empty(0, dtype=np.int64)
        raise BufferIndexError(f"indices must be integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False).reshape(-1)


def check_stored(idx: NDArray[np.int64], size: int) -> None:
    """Raise BufferIndexError naming the first index outside ``[0, size)``."""
    # One pass: negative int64 values are huge as uint64.
    outside = idx.view(np.uint64) >= size
    if outside.any():
        bad = int(idx[outside][0])
        raise BufferIndexError(
            f"index {bad} is out of range: the buffer stores {size} items (valid: 0..{size - 1})"
            if size
            else f"index {bad} is out of range: the buffer is empty"
        )


def check_priority_update(
    indices: object, priorities: object, size: int
) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """Validate an update of priorities; returns (positions, raw priorities), both 1-D.

    ``indices`` may have any shape (a sample's ``[B]`` or ``[S, L]`` ``index``);
    ``priorities`` must have as many values, and they are matched in
    row-major order. A 2-D ``indices`` may hold -1 (the padding of
    ``SliceSampler(strict=False)``): those entries and their priorities are
    skipped. The raw priorities are a fresh array (the caller's is never
    modified).

    Raises:
        BufferIndexError: an index is not an integer in ``[0, size)``.
        PriorityError: the counts differ, or a value is NaN, infinite or negative
            (the message names the index).
    """
    two_d = getattr(indices, "ndim", None) == 2 or (
        isinstance(indices, list | tuple) and bool(indices) and isinstance(indices[0], list | tuple)
    )
    idx = as_index_array(indices)
    if isinstance(priorities, torch.Tensor):
        priorities = priorities.detach().cpu().numpy()
    try:
        raw = np.array(priorities, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError) as exc:
        raise PriorityError(f"priorities must be numbers: {exc}") from exc
    if raw.shape != idx.shape:
        raise PriorityError(f"got {idx.size} indices but {raw.size} priorities")
    if two_d:
        real = idx != -1
        if not real.all():
            idx, raw = idx[real], raw[real]
    check_stored(idx, size)
    # Two reductions decide (a NaN makes both NaN, which fails the test); the
    # elementwise pass only runs to name the offending index.
    if raw.size and not (raw.min() >= 0 and raw.max() < np.inf):
        ok = (raw >= 0) & (raw < np.inf)  # False for NaN, inf and negatives
        i = int(np.flatnonzero(~ok)[0])
        need = "must be >= 0" if raw[i] < 0 else "must be finite"
        raise PriorityError(f"priority for index {int(idx[i])} is {raw[i]} ({need})")
    return idx, raw


def stored_priorities(raw: NDArray[np.float64], alpha: float, eps: float) -> NDArray[np.float64]:
    """``(raw + eps) ** alpha`` for validated, non-negative ``raw`` (modified in place)."""
    raw += eps
    return raw if alpha == 1.0 else raw**alpha


class PriorityIndex:
    """Priorities of the slots of a ring buffer, with proportional sampling.

    Args:
        capacity: number of slots.
        alpha: priority exponent, >= 0 (0 is uniform).
        beta: importance-sampling exponent, >= 0 (0 gives weights of 1).
        eps: added to ``|priority|`` before the exponent, > 0, so no stored item
            has probability 0.

    Raises:
        ArgumentError: an exponent or ``eps`` out of range (a ``ValueError``).
    """

    def __init__(self, capacity: int, alpha: float, beta: float, eps: float) -> None:
        self.alpha = check_number(alpha, "alpha", minimum=0)
        self.beta = check_number(beta, "beta", minimum=0)
        self.eps = check_number(eps, "eps", minimum=0, strict=True)
        self.capacity = capacity
        self.tree = SumTree(capacity)
        self.max_priority = 1.0
        self._pending_ints: list[int] = []
        self._pending_ranges: list[tuple[int, int]] = []

    def mark_new(self, position: int) -> None:
        """Queue one slot that received a new item (cheap; applied lazily)."""
        self._pending_ints.append(position)

    def mark_new_range(self, start: int, count: int) -> None:
        """Queue ``count`` consecutive slots from ``start`` (wrapping around the end)."""
        self._pending_ranges.append((start, count))

    def apply_pending(self) -> None:
        """Give every queued slot the current maximum priority."""
        if not (self._pending_ints or self._pending_ranges):
            return
        parts = []
        for start, count in self._pending_ranges:
            slots = np.arange(start, start + count, dtype=np.int64)
            if start + count > self.capacity:
                slots %= self.capacity
            parts.append(slots)
        if self._pending_ints:
            parts.append(np.asarray(self._pending_ints, dtype=np.int64))
        # Repeats (a slot written twice) are harmless: they all get the same value.
        idx = parts[0] if len(parts) == 1 else np.concatenate(parts)
        self.tree.update(idx, self.max_priority)
        self._pending_ints = []
        self._pending_ranges = []

    def sample(
        self, n: int, rng: np.random.Generator
    ) -> tuple[NDArray[np.int64], NDArray[np.float32]]:
        """``n`` slots drawn with replacement with probability ``p_i / total``, and weights.

        Cost: O(n log capacity) in a few vectorised NumPy calls.
        """
        self.apply_pending()
        idx = self.tree.sample(n, rng)
        weights = self.tree[idx]  # a fresh array: the weights are computed in place
        weights /= self.tree.min
        weights **= -self.beta
        return idx, weights.astype(np.float32)

    def check_update(
        self, indices: object, priorities: object, size: int
    ) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
        """Validate an update without changing anything; returns (slots, stored priorities).

        Raises:
            BufferIndexError: an index is not an integer in ``[0, size)``.
            PriorityError: lengths differ, or a value is NaN, infinite or negative.
        """
        idx, raw = check_priority_update(indices, priorities, size)
        return idx, stored_priorities(raw, self.alpha, self.eps)

    def update(self, idx: NDArray[np.int64], stored: NDArray[np.float64]) -> None:
        """Set already-validated stored priorities (see :meth:`check_update`)."""
        self.apply_pending()
        if idx.size == 0:
            return
        self.tree.update(idx, stored)
        self.max_priority = max(self.max_priority, float(stored.max()))

    def values(self, size: int) -> NDArray[np.float64]:
        """Stored priorities of slots ``0..size-1`` (pending slots included)."""
        self.apply_pending()
        return self.tree[np.arange(size)]

    def values_at(self, idx: NDArray[np.int64]) -> NDArray[np.float64]:
        """Stored priorities of the validated slots ``idx`` (pending slots included)."""
        self.apply_pending()
        return self.tree[idx]

    def restore(self, values: NDArray[np.float64], max_priority: float) -> None:
        """Replace all priorities: ``values`` for the first slots, 0 for the rest."""
        self.tree = SumTree(self.capacity)
        self._pending_ints = []
        self._pending_ranges = []
        if values.size:
            self.tree.update(np.arange(values.size), values)
        self.max_priority = float(max_priority)
