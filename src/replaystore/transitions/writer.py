"""Where new transitions go: the ring cursor, and the checked copy of each add into the columns.

A :class:`RingWriter` owns the ring's cursor (``pointer``: the row the next
transition goes to; ``size``: rows holding a transition) and writes
``add``/``add_batch`` experiences into the columns of a bound storage. It never
reads rows back and knows nothing about sampling; the buffer holds its lock
around every call.

Two copy paths store the same bytes and accept and refuse the same inputs:

* the compiled check-and-copy (``replaystore._ringcopy``, built at install time
  when a C compiler is available) for experiences that need no conversion:
  plain dicts of NumPy arrays (and, for ``add``, NumPy or Python scalars) whose
  dtypes and shapes are exactly the columns'. It declines everything else
  without writing;
* the NumPy path for the rest (tensors, lists, casts, a mismatch), and for
  every add when the extension is missing or ``add_backend="numpy"`` /
  ``REPLAYSTORE_RINGCOPY=numpy``. It converts what may be converted and
  raises the ``SchemaError`` naming the key (rules: :mod:`.schema`).

Batch adds of rows over :data:`PARALLEL_COPY_MIN_ROW_BYTES` (image observations)
into CPU columns are checked by the NumPy path and copied with torch's ``copy_``,
which uses torch's intra-op threads, when there are several: a single-threaded copy
of 14 MiB is the whole cost of such an add. Same bytes, same errors.

Nothing is written before the whole experience is checked, so a refused add
leaves the ring as it was.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from replaystore._kernels import resolve_kernel
from replaystore.errors import SchemaError
from replaystore.transitions.prioritized import NewRowListener
from replaystore.transitions.schema import (
    FieldSpec,
    as_flat_mapping,
    infer_fields,
    numpy_dtype,
    schema_error,
)
from replaystore.transitions.storage import MemmapStorage, TensorStorage

try:
    from replaystore import _ringcopy as _cringcopy
except ImportError:  # no compiler at install time: the NumPy path is used
    _cringcopy = None

__all__ = ["RingWriter", "resolve_add_kernel"]

_KERNEL_ENV = "REPLAYSTORE_RINGCOPY"
_MISSING = object()  # has no shape: a missing key fails the fast check
_NO_TYPES: frozenset[type] = frozenset()
# The only values whose buffers the compiled path copies; every other buffer
# exporter (bytes, memoryview, ...) is left to the NumPy path's rules.
_ARRAY_TYPES = (np.ndarray, np.generic)

Storage = TensorStorage | MemmapStorage

#: Rows of more bytes than this (all columns) are written by batch adds into CPU
#: columns with torch's ``copy_``, which splits a large copy over torch's intra-op
#: threads (``torch.get_num_threads()``); the compiled path and NumPy copy on one
#: thread. Atari-like rows (56 KiB), 256 a batch, on a 16-core host: 191 us against
#: 1,095 us (NumPy) and 1,585 us (compiled; 2026-11-26). With one torch thread the
#: usual paths are kept.
PARALLEL_COPY_MIN_ROW_BYTES = 4096


def resolve_add_kernel(backend: str | None) -> Any:
    """The compiled check-and-copy module for ``backend``, or None for the NumPy path.

    Raises:
        ValueError: an unknown backend name (argument or ``REPLAYSTORE_RINGCOPY``).
        ImportError: ``"c"`` but ``replaystore._ringcopy`` is not installed.
    """
    return resolve_kernel(_cringcopy, backend, env=_KERNEL_ENV, argument="add_backend")


def _write_rows(col: torch.Tensor, arr: np.ndarray | None, start: int, rows: Any) -> None:
    """Write validated ``rows`` (at most the capacity) from ``start``, wrapping around."""
    if isinstance(rows, torch.Tensor):
        rows = rows.detach()
        if arr is not None and rows.device.type == "cpu" and rows.dtype != torch.bfloat16:
            rows = rows.numpy()
    elif arr is None:
        rows = torch.as_tensor(rows)
    cap = col.shape[0]
    m = rows.shape[0]
    first = min(m, cap - start)
    if isinstance(rows, np.ndarray) and arr is not None:
        arr[start : start + first] = rows[:first]
        if m > first:
            arr[: m - first] = rows[first:]
    else:
        col[start : start + first].copy_(rows[:first])
        if m > first:
            col[: m - first].copy_(rows[first:])


def _copy_rows_threaded(
    col: torch.Tensor, arr: np.ndarray, start: int, end: int, rows: np.ndarray
) -> None:
    """``arr[start:end] = rows`` through torch's ``copy_`` (on torch's intra-op
    threads) where torch can view ``rows`` as they are: same dtype, writeable (torch
    warns on read-only arrays), strides it takes; else the NumPy assignment."""
    if rows.dtype == arr.dtype and rows.flags.writeable:
        try:
            source = torch.from_numpy(rows)
        except (ValueError, TypeError):  # negative strides, a dtype torch lacks
            pass
        else:
            col[start:end].copy_(source)
            return
    arr[start:end] = rows


def _write_row(col: torch.Tensor, arr: np.ndarray | None, ptr: int, value: Any) -> None:
    """Write one validated item of any accepted kind into row ``ptr``."""
    if arr is not None and not isinstance(value, torch.Tensor):
        arr[ptr] = value
    elif isinstance(value, torch.Tensor):
        value = value.detach()
        if arr is not None and value.device.type == "cpu" and value.dtype != torch.bfloat16:
            arr[ptr] = value.numpy()
        else:
            col[ptr].copy_(value)
    else:
        col[ptr].copy_(torch.as_tensor(value))


def _normalise_batch(batch: Mapping[str, Any]) -> dict[str, Any]:
    exp = as_flat_mapping(batch, batched=True)
    return {
        k: v if isinstance(v, torch.Tensor | np.ndarray) else np.asarray(v) for k, v in exp.items()
    }


class RingWriter:
    """The cursor of a ring of ``capacity`` rows and the checked copy of adds into it.

    Not thread-safe by itself: the buffer calls it under its lock.

    Args:
        capacity: rows in the ring.
        kernel: the compiled check-and-copy module (:func:`resolve_add_kernel`),
            or None for the NumPy path.
        create_storage: called with the schema inferred from the first add
            when no storage is bound; it must create the storage and
            :meth:`bind` it.
        reserved: keys an experience may not use (prioritized samples add them).
    """

    _storage: Storage | None
    _fields: dict[str, FieldSpec] | None
    _names: list[str]
    _shapes: list[tuple[int, ...]]
    _accepts: list[frozenset[Any]]
    _arrays: list[np.ndarray | None]
    _numpy_arrays: list[np.ndarray]  # the same arrays when every column has one, else []
    _columns: list[torch.Tensor]
    _numpy_rows: bool
    _large_rows: bool
    _add_plan: list[tuple[str, frozenset[type], tuple[int, ...], frozenset[Any], int, int]]
    _batch_shapes: dict[int, list[tuple[int, ...]]]
    _plan: Any  # the compiled check-and-copy of the current storage, or None

    def __init__(
        self,
        capacity: int,
        kernel: Any,
        create_storage: Callable[[list[FieldSpec]], None],
        reserved: tuple[str, ...] = (),
    ) -> None:
        self.capacity = capacity
        self.kernel = kernel
        self.priorities: NewRowListener | None = None
        """Told of every written row (``mark_new``) when the sampler needs to know."""
        self.size = 0
        """Rows holding a transition, at most ``capacity``."""
        self.pointer = 0
        """Row the next transition goes to."""
        self._create_storage = create_storage
        self._reserved = reserved
        self.unbind()

    # ------------------------------------------------------------- binding

    def bind(self, storage: Storage) -> None:
        """Write into ``storage`` from now on (the cursor is left as it is)."""
        fields = storage.fields
        self._storage = storage
        self._fields = {f.name: f for f in fields}
        # Per-column views of the schema, precomputed for the hot paths.
        self._names = [f.name for f in fields]
        self._shapes = [f.shape for f in fields]
        self._accepts = [f.accepts for f in fields]
        self._arrays = [storage.arrays[f.name] for f in fields]
        self._columns = [storage.columns[f.name] for f in fields]
        self._numpy_arrays = [a for a in self._arrays if a is not None]
        self._numpy_rows = len(self._numpy_arrays) == len(self._arrays)
        if not self._numpy_rows:
            self._numpy_arrays = []
        row_bytes = sum(a.itemsize * (a.size // max(len(a), 1)) for a in self._numpy_arrays)
        self._large_rows = row_bytes > PARALLEL_COPY_MIN_ROW_BYTES
        # Exact value types that fit a column without looking at them: Python and
        # NumPy scalars of an accepted kind, for columns of item shape ().
        self._add_plan = [
            (f.name, f.scalar_types if not f.shape else _NO_TYPES, f.shape, f.accepts, *f.int_range)
            for f in fields
        ]
        self._batch_shapes = {}
        self._plan = None
        if self.kernel is not None and self._numpy_rows:
            self._plan = self.kernel.Plan(
                tuple(self._names), tuple(self._arrays), self.capacity, _ARRAY_TYPES
            )

    def unbind(self) -> None:
        """Forget the storage (its views are released); the next add defines a schema."""
        self._storage = None
        self._fields = None
        self._names = []
        self._shapes = []
        self._accepts = []
        self._arrays = []
        self._numpy_arrays = []
        self._large_rows = False
        self._columns = []
        self._numpy_rows = False
        self._add_plan = []
        self._batch_shapes = {}
        self._plan = None

    def reset_cursor(self, size: int = 0, pointer: int = 0) -> None:
        """Set the cursor (reopening, loading, clearing)."""
        self.size = size
        self.pointer = pointer

    # -------------------------------------------------------------- adding

    def _slow_single(self, experience: Any) -> dict[str, Any]:
        """Validate an experience the fast path rejected; convert lists; raise if it is bad."""
        exp = as_flat_mapping(experience, batched=False)
        assert self._fields is not None
        err = schema_error(self._fields, exp, batched=False)
        if err is not None:
            raise err
        out: dict[str, Any] = {}
        for k, v in exp.items():
            npd = numpy_dtype(self._fields[k].dtype)
            integer = isinstance(v, int | np.integer)
            if isinstance(v, torch.Tensor | np.ndarray) or (npd is None and not integer):
                out[k] = v
                continue
            try:
                # Integer scalars are range-checked here (NumPy raises OverflowError
                # for them), so the write itself cannot fail half-way through a row.
                out[k] = np.asarray(int(v), dtype=npd) if integer else np.asarray(v)
            except (OverflowError, ValueError) as exc:
                raise SchemaError(f"key {k!r}: {v!r} does not fit the column: {exc}") from exc
        return out

    def add(self, experience: Any) -> None:
        """Write one transition at the cursor and advance it (see ``ReplayBuffer.add``).

        Raises:
            SchemaError: the experience does not fit the schema (nothing written).
        """
        plan = self._plan
        if plan is not None:
            ptr = self.pointer
            if plan.add(experience, ptr) > 0:
                self.pointer = ptr + 1 if ptr + 1 < self.capacity else 0
                if self.size < self.capacity:
                    self.size += 1
                if self.priorities is not None:
                    self.priorities.mark_new(ptr)
                return
        if type(experience) is not dict:
            experience = as_flat_mapping(experience, batched=False)
        if self._storage is None:
            self._create_storage(infer_fields(experience, batched=False, reserved=self._reserved))
        # Fast check against the cached shapes and accepted dtypes; anything
        # unusual (lists, a mismatch) goes through the slow path, which either
        # converts it or raises the SchemaError that names the key.
        values: list[Any] = []
        append = values.append
        fast = len(experience) == len(self._names)
        tensors = False
        if fast:
            for name, scalar_ok, shape, accepts, lo, hi in self._add_plan:
                v = experience.get(name, _MISSING)
                append(v)
                t = type(v)
                if t in scalar_ok:
                    if t is int and not lo <= v <= hi:  # NumPy would raise mid-row
                        fast = False
                        break
                    continue
                if t is np.ndarray:
                    if v.shape != shape or v.dtype not in accepts:
                        fast = False
                        break
                elif isinstance(v, torch.Tensor):
                    tensors = True
                    if v.shape != shape or v.dtype not in accepts:
                        fast = False
                        break
                else:
                    fast = False
                    break
        if not fast:
            experience = self._slow_single(experience)
            values = [experience[name] for name in self._names]
            tensors = True
        ptr = self.pointer
        if tensors or not self._numpy_rows:
            for v, arr, col in zip(values, self._arrays, self._columns, strict=True):
                _write_row(col, arr, ptr, v)
        else:
            for v, arr in zip(values, self._numpy_arrays, strict=True):
                arr[ptr] = v
        self.pointer = ptr + 1 if ptr + 1 < self.capacity else 0
        if self.size < self.capacity:
            self.size += 1
        if self.priorities is not None:
            self.priorities.mark_new(ptr)

    def add_batch(self, batch: Any) -> None:
        """Write N transitions from the cursor, wrapping (see ``ReplayBuffer.add_batch``).

        Raises:
            SchemaError: the batch does not fit the schema (nothing written).
        """
        plan = self._plan
        if plan is not None and not (self._large_rows and torch.get_num_threads() > 1):
            ptr = self.pointer
            n = plan.add_batch(batch, ptr)
            if n >= 0:
                if n:
                    self._advance(ptr, n)
                return
        exp = batch if type(batch) is dict else as_flat_mapping(batch, batched=True)
        if self._storage is None:
            exp = _normalise_batch(exp)
            self._create_storage(infer_fields(exp, batched=True, reserved=self._reserved))
        n, values, numpy_only = self._batch_rows(exp)
        if n < 0:  # lists, tensors on another device, or a schema mismatch
            exp = _normalise_batch(exp)
            n, values, numpy_only = self._batch_rows(exp)
            if n < 0:
                assert self._fields is not None
                err = schema_error(self._fields, exp, batched=True)
                raise err if err is not None else SchemaError("batch does not fit the schema")
        if n == 0:
            return
        cap = self.capacity
        ptr = self.pointer
        if numpy_only and ptr + n <= cap:
            # The common case: NumPy data, CPU columns, no wrap-around. NumPy
            # slice assignment is several times cheaper than torch's copy_ here.
            end = ptr + n
            if self._large_rows and torch.get_num_threads() > 1:
                for v, arr, col in zip(values, self._numpy_arrays, self._columns, strict=True):
                    _copy_rows_threaded(col, arr, ptr, end, v)
            else:
                for v, arr in zip(values, self._numpy_arrays, strict=True):
                    arr[ptr:end] = v
        else:
            m = min(n, cap)
            start = (ptr + n - m) % cap
            for v, view, col in zip(values, self._arrays, self._columns, strict=True):
                _write_rows(col, view, start, v[n - m :] if n > m else v)
        self._advance(ptr, n)

    def _advance(self, ptr: int, n: int) -> None:
        """Move the cursor on after ``n`` rows were written from ``ptr`` (newest ``cap`` kept)."""
        cap = self.capacity
        if self.priorities is not None:
            m = n if n < cap else cap
            self.priorities.mark_new_range((ptr + n - m) % cap, m)
        self.pointer = (ptr + n) % cap
        if self.size < cap:
            self.size = min(self.size + n, cap)

    def _batch_rows(self, exp: Mapping[str, Any]) -> tuple[int, list[Any], bool]:
        """(N, values in column order, all NumPy with NumPy columns) if ``exp`` fits
        the schema as-is; N is -1 otherwise."""
        names = self._names
        if len(exp) != len(names):
            return -1, [], False
        values: list[Any] = [exp.get(name) for name in names]
        try:
            n = values[0].shape[0]
        except (AttributeError, IndexError, TypeError):
            return -1, [], False
        # Full expected shapes [N, *item_shape] per N: one tuple comparison per column.
        expected = self._batch_shapes.get(n)
        if expected is None:
            if len(self._batch_shapes) > 64:
                self._batch_shapes.clear()
            expected = self._batch_shapes[n] = [(n, *shape) for shape in self._shapes]
        numpy_only = self._numpy_rows
        for v, full, accepts in zip(values, expected, self._accepts, strict=True):
            if type(v) is not np.ndarray:
                if not isinstance(v, torch.Tensor):
                    return -1, [], False
                numpy_only = False
            if v.shape != full or v.dtype not in accepts:
                return -1, [], False
        return n, values, numpy_only
