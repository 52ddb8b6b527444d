"""Slices of consecutive steps within an episode: the sequence sampler of R2D2 and DreamerV3.

:class:`SliceSampler` draws ``S = B // L`` slices of ``L = slice_len`` steps.
A *start* is a storage position; it is valid when the ``L`` rows from it, in
time order, are stored transitions of one episode:

* no step but the last may end an episode (``end_key``, and ``terminated`` /
  ``truncated`` when the buffer has those columns, true at the step);
* the slice never passes the newest stored step, so it never joins the
  newest data to the oldest across the ring's write position (the newest
  episode, still open, is sliceable up to its newest step);
* rows of a slice may wrap from the last storage position to the first, when
  they are consecutive in time there.

With ``strict=False`` the first step of every *run* (the stored steps of one
episode: it starts after an end or at the oldest stored step) shorter than
``L`` is a valid start too: its slice is that whole run, padded with zero rows
(``index`` -1, ``mask`` False) to ``L``.

Bookkeeping is incremental: a sum tree holds one weight per start (0 when
invalid; 1, or the slice priority when prioritized). A write of rows ``W``
can only change the starts within ``L - 1`` rows before ``W`` to one row after
it, and a priority update of row i only the ``L`` starts up to i; those are
recomputed (vectorised, ``[n, L]`` gathers) before the next draw, so adding
stays a list append and a draw of S slices is an O(S log capacity) tree search
plus one gather of ``S * L`` rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from replaystore.errors import (
    ArgumentError,
    EmptyBufferError,
    PriorityError,
    SchemaError,
    check_int,
    check_number,
)
from replaystore.sampling import SumTree
from replaystore.transitions.nstep import OPTIONAL_END_KEYS
from replaystore.transitions.prioritized import stored_priorities
from replaystore.transitions.sampler import Draw, RingState, no_priorities

__all__ = ["SliceSampler"]

#: Starts recomputed per vectorised pass (bounds the ``[n, L]`` temporaries).
_CHUNK = 1 << 16


class SliceSampler:
    """Slices of ``slice_len`` consecutive steps of one episode, uniform or prioritized.

    ``sample_batch(B)`` returns a TensorDict of batch size ``[B // slice_len,
    slice_len]``: each row is ``slice_len`` consecutive stored transitions of
    one episode in time order, ``index`` holds their storage positions
    (``[S, L]`` int64). See the module docstring for which starts are valid.

    Starts are drawn with replacement, uniformly over all valid starts, or with
    ``prioritized=True`` proportionally to the slice priority
    ``eta * max + (1 - eta) * mean`` of its steps' stored priorities
    ``(|p| + eps) ** alpha`` (R2D2). Prioritized batches add ``weight``
    (float32 ``[S, L]``: the slice's importance weight
    ``(q / q_min) ** -beta`` on each of its steps, at most 1, 0 on padding).
    New steps get the largest stored step priority so far (1.0 before any
    update). ``update_priorities(index, priority)`` takes a sample's ``[S, L]``
    index with ``[S, L]`` priorities (padding entries skipped) or flat
    positions.

    Args:
        slice_len: steps per slice L, >= 1; ``sample_batch``'s size must be a
            multiple of it.
        end_key: the column that is true at the last step of an episode.
        strict: only full slices; ``False`` also draws runs shorter than
            ``slice_len``, padded, with a boolean ``mask`` entry ``[S, L]``
            (True on real steps).
        prioritized: draw starts by slice priority, with ``weight``.
        alpha: step priority exponent, >= 0.
        beta: importance-weight exponent, >= 0; settable (``buf.beta`` too).
        eps: added to ``|p|``, > 0.
        eta: weight of the max in the slice priority, in ``[0, 1]``.

    Raises:
        ArgumentError: an argument out of range.

    The buffer raises :class:`~replaystore.errors.SchemaError` at the first
    sample when it has no ``end_key`` column, and
    :class:`~replaystore.errors.EmptyBufferError` when no start is valid (no
    run of ``slice_len`` steps yet, with ``strict=True``).
    """

    kind = "slice"

    def __init__(
        self,
        slice_len: int,
        end_key: str = "done",
        strict: bool = True,
        prioritized: bool = False,
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-6,
        eta: float = 0.9,
    ) -> None:
        self.slice_len = check_int(slice_len, "slice_len", minimum=1)
        if not isinstance(end_key, str) or not end_key:
            raise ArgumentError(f"end_key must be a column name, got {end_key!r}")
        self.end_key = end_key
        self.strict = bool(strict)
        self.prioritized = bool(prioritized)
        self.alpha = check_number(alpha, "alpha", minimum=0)
        self._beta = check_number(beta, "beta", minimum=0)
        self.eps = check_number(eps, "eps", minimum=0, strict=True)
        self.eta = check_number(eta, "eta", minimum=0)
        if self.eta > 1:
            raise ArgumentError(f"eta must be in [0, 1], got {eta!r}")
        self._offsets = np.arange(self.slice_len, dtype=np.int64)
        # A written row changes the starts up to L - 1 rows before it and the row after it.
        self._around = np.arange(-self.slice_len + 1, 2, dtype=np.int64)
        self.reset(1)

    # ------------------------------------------------------------- state

    def reset(self, capacity: int) -> None:
        """Forget every row (a ring of ``capacity`` rows, none stored)."""
        self.capacity = capacity
        self._ends = np.zeros(capacity, dtype=bool)
        self._step = np.zeros(capacity) if self.prioritized else None
        self._max_priority = 1.0
        self._starts = SumTree(capacity)
        self._pending_ints: list[int] = []
        self._pending_ranges: list[tuple[int, int]] = []
        # Rows written whose end flags are not read yet; starts to recompute.
        self._unread: list[NDArray[np.int64]] = []
        self._dirty: list[NDArray[np.int64]] = []
        self._reread_all = False

    @property
    def beta(self) -> float:
        """Importance-weight exponent (anneal it towards 1)."""
        return self._beta

    @beta.setter
    def beta(self, value: float) -> None:
        self._beta = check_number(value, "beta", minimum=0)

    @property
    def max_priority(self) -> float:
        """The priority new steps get: the largest stored so far (1.0 before any update)."""
        return self._max_priority

    def settings(self) -> dict[str, Any]:
        """What a checkpoint records of this sampler (besides its step priorities)."""
        return {
            "kind": self.kind,
            "slice_len": self.slice_len,
            "end_key": self.end_key,
            "strict": self.strict,
            "prioritized": self.prioritized,
            "alpha": self.alpha,
            "beta": self._beta,
            "eps": self.eps,
            "eta": self.eta,
        }

    def __repr__(self) -> str:
        return (
            f"SliceSampler(slice_len={self.slice_len}, end_key={self.end_key!r}, "
            f"strict={self.strict}, prioritized={self.prioritized}, alpha={self.alpha}, "
            f"beta={self._beta}, eps={self.eps}, eta={self.eta})"
        )

    # ------------------------------------------------------------ writes

    def mark_new(self, position: int) -> None:
        """Row ``position`` was written (cheap: applied before the next draw)."""
        self._pending_ints.append(position)

    def mark_new_range(self, start: int, count: int) -> None:
        """Rows ``start .. start + count - 1`` (modulo the capacity) were written."""
        self._pending_ranges.append((start, count))

    def on_write(self, start: int, count: int) -> None:
        """Rows ``start .. start + count - 1`` (modulo the capacity) were written."""
        self._pending_ranges.append((start, count))

    def _take_new_rows(self) -> None:
        """Give queued new rows the maximum priority; queue them for the end-flag read."""
        if not (self._pending_ints or self._pending_ranges):
            return
        parts = [np.asarray(self._pending_ints, dtype=np.int64)] if self._pending_ints else []
        for start, count in self._pending_ranges:
            rows = np.arange(start, start + count, dtype=np.int64)
            if start + count > self.capacity:
                rows %= self.capacity
            parts.append(rows)
        rows = parts[0] if len(parts) == 1 else np.concatenate(parts)
        self._pending_ints = []
        self._pending_ranges = []
        if self._step is not None:
            self._step[rows] = self._max_priority
        self._unread.append(rows)

    def _read_ends(self, ring: RingState, rows: NDArray[np.int64]) -> NDArray[np.bool_]:
        """Whether each of ``rows`` ends its episode (any end column non-zero there)."""
        flags = np.zeros(rows.size, dtype=bool)
        for key in (self.end_key, *OPTIONAL_END_KEYS):
            col = ring.columns.get(key)
            if col is None:
                continue
            if col.device.type == "cpu" and col.dtype != torch.bfloat16:
                values = col.numpy()[rows]
            else:  # an accelerator's column: gather there, bring back only the flags
                idx = torch.from_numpy(rows).to(col.device)
                values = col.index_select(0, idx).cpu().numpy()
            flags |= (values.reshape(rows.size, -1) != 0).any(axis=1)
        return flags

    def _sync(self, ring: RingState) -> None:
        """Bring every start's weight up to date with the writes and updates since the last."""
        if ring.capacity != self.capacity:
            raise ArgumentError(
                f"SliceSampler was reset for {self.capacity} rows but the buffer has "
                f"{ring.capacity}; one sampler serves one buffer"
            )
        if self.end_key not in ring.columns:
            known = ", ".join(map(repr, ring.columns))
            raise SchemaError(
                f"SliceSampler(end_key={self.end_key!r}): the buffer has no column "
                f"{self.end_key!r} (it stores {known}); pass the key that marks episode ends"
            )
        self._take_new_rows()
        if not (self._unread or self._dirty or self._reread_all):
            return
        cap, n = self.capacity, self.slice_len
        if self._reread_all:
            read = np.arange(ring.size, dtype=np.int64)
            starts: NDArray[np.int64] | None = None
        else:
            read = np.concatenate(self._unread) if self._unread else np.zeros(0, np.int64)
            dirty = np.concatenate(self._dirty) if self._dirty else read[:0]
            # A written row changes the starts up to L - 1 rows before it (their
            # windows) and the row after it (whether that one starts a run); an
            # updated priority the L starts up to it.
            count = read.size * (n + 1) + dirty.size * n
            if count >= cap:
                starts = None
            else:
                starts = (read[:, None] + self._around).reshape(-1)
                if dirty.size:
                    before = (dirty[:, None] - self._offsets).reshape(-1)
                    starts = np.concatenate([starts, before])
                starts %= cap
                if count > _CHUNK:  # repeats are harmless (same weight), only wasted work
                    starts = np.unique(starts)
        if read.size:
            self._ends[read] = self._read_ends(ring, read)
        if starts is None:
            starts = np.arange(cap, dtype=np.int64)
        for lo in range(0, starts.size, _CHUNK):
            chunk = starts[lo : lo + _CHUNK]
            self._starts.update(chunk, self._weights(chunk, ring))
        self._unread = []
        self._dirty = []
        self._reread_all = False

    def _windows(
        self, starts: NDArray[np.int64], ring: RingState
    ) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
        """(rows ``[n, L]``, real steps m ``[n]``, age rank ``[n]``) of the slices from ``starts``.

        m is how many rows from the start stay in its run: up to and including
        the first episode end or the newest stored step, at most L.
        """
        cap = self.capacity
        oldest = ring.pointer if ring.size == cap else 0
        rank = (starts - oldest) % cap
        rows = starts[:, None] + self._offsets
        if rows.size and rows[:, -1].max() >= cap:
            rows %= cap
        stop = self._ends[rows]
        stop |= self._offsets == (ring.size - 1 - rank)[:, None]
        m = np.where(stop.any(axis=1), stop.argmax(axis=1) + 1, self.slice_len)
        return rows, m, rank

    def _weights(self, starts: NDArray[np.int64], ring: RingState) -> NDArray[np.float64]:
        """Sum-tree weight of each start: 0 when invalid, else 1 or its slice priority."""
        rows, m, rank = self._windows(starts, ring)
        stored = rank < ring.size
        valid = stored & (m == self.slice_len)
        if not self.strict:
            first = (rank == 0) | self._ends[(starts - 1) % self.capacity]
            valid |= stored & first
        if self._step is None:
            return valid.astype(np.float64)
        return np.where(valid, self._slice_priority(rows, m), 0.0)

    def _slice_priority(self, rows: NDArray[np.int64], m: NDArray[np.int64]) -> NDArray[np.float64]:
        """``eta * max + (1 - eta) * mean`` of the first m stored step priorities of each row."""
        assert self._step is not None
        p = self._step[rows]
        p[self._offsets >= m[:, None]] = 0.0
        return self.eta * p.max(axis=1) + (1.0 - self.eta) * (p.sum(axis=1) / m)

    # ------------------------------------------------------------- draws

    def sample(self, batch_size: int, ring: RingState, rng: np.random.Generator) -> Draw:
        """``batch_size // slice_len`` slices: ``index`` ``[S, L]``, plus ``mask`` / ``weight``.

        Raises:
            ArgumentError: ``batch_size`` is not a multiple of ``slice_len``.
            SchemaError: the buffer has no ``end_key`` column.
            EmptyBufferError: no valid start (no run of ``slice_len`` steps when strict).
        """
        n = self.slice_len
        if batch_size % n:
            raise ArgumentError(
                f"batch_size {batch_size} is not a multiple of slice_len {n}: a slice "
                f"sample holds batch_size // slice_len slices of {n} steps"
            )
        self._sync(ring)
        if not self._starts.total > 0:
            raise EmptyBufferError(
                f"no slice of {n} steps: none of the {ring.size} stored steps starts "
                f"{n} consecutive steps of one episode (strict=True draws only full slices)"
            )
        starts = self._starts.sample(batch_size // n, rng)
        extra: dict[str, Any] = {}
        mask = None
        if self.strict:  # every drawn start has a full slice
            index = starts[:, None] + self._offsets
            if index[:, -1].max() >= self.capacity:
                index %= self.capacity
        else:
            rows, m, _rank = self._windows(starts, ring)
            mask = self._offsets < m[:, None]
            index = np.where(mask, rows, -1)
            extra["mask"] = mask
        if self._step is not None:
            w = self._starts[starts]
            w /= self._starts.min
            w **= -self._beta
            weight = np.repeat(w.astype(np.float32)[:, None], n, axis=1)
            if mask is not None:
                weight[~mask] = 0.0
            extra["weight"] = weight
        return Draw(index, extra)

    # -------------------------------------------------------- priorities

    def _require_priorities(self, what: str) -> NDArray[np.float64]:
        if self._step is None:
            raise no_priorities(what)
        return self._step

    def update_priorities(self, index: NDArray[np.int64], priority: NDArray[np.float64]) -> None:
        """Store ``(priority + eps) ** alpha`` for steps ``index``; their slices follow.

        Raises:
            PriorityError: ``prioritized=False``.
        """
        step = self._require_priorities("update_priorities")
        if index.size == 0:
            return
        self._take_new_rows()  # new rows get the old maximum before this update
        stored = stored_priorities(priority, self.alpha, self.eps)
        step[index] = stored
        self._max_priority = max(self._max_priority, float(stored.max()))
        self._dirty.append(index)

    def priorities_at(self, index: NDArray[np.int64]) -> NDArray[np.float64]:
        """Stored step priorities of the stored rows ``index`` (validated by the caller)."""
        step = self._require_priorities("priorities_at")
        self._take_new_rows()
        return step[index]

    def stored_priorities(self, size: int) -> NDArray[np.float64]:
        """Stored step priorities of rows ``0..size-1`` (a copy)."""
        step = self._require_priorities("priorities")
        self._take_new_rows()
        return step[:size].copy()

    def restore_priorities(self, values: NDArray[np.float64], max_priority: float) -> None:
        """Replace every step priority (``values`` for rows ``0..len-1``); every start is
        recomputed, end flags re-read, before the next draw."""
        step = self._require_priorities("restore_priorities")
        if not (np.isfinite(values).all() and (values > 0).all()):
            raise PriorityError("restored priorities must be finite and positive")
        self._pending_ints = []
        self._pending_ranges = []
        self._unread = []
        self._dirty = []
        step[:] = 0.0
        step[: values.size] = values
        self._max_priority = float(max_priority)
        self._reread_all = True

    def rebuild(self) -> None:
        """Re-read every end flag and recompute every start before the next draw
        (the rows were replaced without writes, e.g. by a checkpoint load)."""
        self._reread_all = True
