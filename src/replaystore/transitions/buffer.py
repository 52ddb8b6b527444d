"""The tensor transition buffer: ObjectRL's ``ReplayBuffer`` API, with full checkpoints.

A ring of ``buffer_size`` transitions stored column by column (one preallocated
tensor per key) in RAM, in memory-mapped files or on a CUDA device. Sampling is
uniform or proportional to priorities (:mod:`replaystore.transitions.prioritized`).
On CPU storage whose columns all have NumPy views, the draw and the gathers are
NumPy calls (``Generator.integers``, one ``take`` per column, wrapped with
``torch.from_numpy``); otherwise one ``torch.randint`` and one ``index_select``
per column.

Adds on CPU storage go through a compiled check-and-copy
(``replaystore._ringcopy``, built at install time when a C compiler is
available) for experiences that need no conversion: plain dicts of NumPy arrays
(and, for ``add``, NumPy or Python scalars) whose dtypes and shapes are exactly
the columns'. Anything else (tensors, lists, casts, a mismatch), and every add
when the extension is missing or ``add_backend="numpy"`` /
``REPLAYSTORE_RINGCOPY=numpy``, takes the NumPy path, which stores the same
bytes and raises the SchemaError naming the key.

Concurrency: every public method takes the buffer's lock, so one writer thread
and any number of sampler threads in the same process see whole transitions
(never a row whose keys come from different adds). Epoch iterators take the
lock per batch, not for the whole epoch. The lock is a plain ``threading.Lock``
on purpose: a thread woken from it takes it in C, before it needs the GIL, which
keeps a sampler's waits for it short while a writer adds in a loop. A strict
FIFO hand-over lock was measured to be slower for both threads: every hand-over
waits for the other thread to be scheduled (a lock convoy). What a writer
running Python in a tight loop still takes from a sampler thread is interpreter
time: both need the GIL, and a thread that gives it up (a torch call, or being
preempted on a busy machine) may wait a switch interval (5 ms) to get it back.
That is why CPU sampling gathers with NumPy: every torch call releases the GIL
(six per uniform ``sample_batch`` of a five-column buffer), NumPy's draw and
small ``take`` calls do not, so a sample is not interrupted by the writer. A
writer-side hand-over (the writer blocks on a Condition once a sampler has
waited for the lock) was measured and not kept: the sampler waited for the
buffer's lock in under 1 % of its calls, so it almost never fired.
``benchmarks/RESULTS.md``, "Sampling under a busy writer", measures it.
"""

from __future__ import annotations

import gc
import logging
import math
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from replaystore._kernels import resolve_kernel
from replaystore.errors import (
    CheckpointError,
    EmptyBufferError,
    PriorityError,
    SchemaError,
)
from replaystore.transitions.checkpoint import (
    ObjectRLMetadata,
    Snapshot,
    read_checkpoint,
    read_objectrl_metadata,
    write_checkpoint,
)
from replaystore.transitions.prioritized import PriorityIndex, as_index_array, check_stored
from replaystore.transitions.schema import (
    FieldSpec,
    as_flat_mapping,
    infer_fields,
    numpy_dtype,
    schema_error,
)
from replaystore.transitions.storage import (
    MemmapState,
    MemmapStorage,
    TemporaryDirectory,
    TensorStorage,
    ensure_directory,
)

try:
    from replaystore import _ringcopy as _cringcopy
except ImportError:  # no compiler at install time: the NumPy path is used
    _cringcopy = None

__all__ = ["ReplayBuffer"]

logger = logging.getLogger(__name__)

_KERNEL_ENV = "REPLAYSTORE_RINGCOPY"


def _resolve_kernel(backend: str | None) -> Any:
    """The compiled check-and-copy module for ``backend``, or None for the NumPy path."""
    return resolve_kernel(_cringcopy, backend, env=_KERNEL_ENV, argument="add_backend")


Indices = Sequence[int] | torch.Tensor | range | np.ndarray
_MISSING = object()  # has no shape: a missing key fails the fast check


def _tensordict(entries: dict[str, torch.Tensor], n: int, device: torch.device) -> TensorDict:
    """A TensorDict of batch size ``[n]`` on ``device`` from entries we built ourselves.

    TensorDict's checked constructor (and even ``_new_unsafe`` with a device,
    which probes for MPS) costs more than gathering a CartPole batch. Every entry
    here already has leading dimension n and lives on ``device``, so the checks
    are skipped and the device is set directly. Tested in test_api (device and
    batch size of samples).
    """
    td = TensorDict._new_unsafe(entries, batch_size=torch.Size([n]), nested=False)
    td._device = device
    return td


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


_RESERVED = ("index", "weight")


#: Rows up to this many bytes (all columns) are sampled with NumPy gathers on CPU.
_NUMPY_GATHER_MAX_ROW_BYTES = 4096


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or int(value) != value or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _normalise_batch(batch: Mapping[str, Any]) -> dict[str, Any]:
    exp = as_flat_mapping(batch, batched=True)
    return {
        k: v if isinstance(v, torch.Tensor | np.ndarray) else np.asarray(v) for k, v in exp.items()
    }


class TransitionCount(int):
    """An ``int`` that can also be called: ``buf.size`` and ``buf.size()`` both give the count.

    ObjectRL's ``size`` is a property; code written against a ``size()`` method
    (as in AWorld's and many other buffers) works too. It is a plain ``int`` in
    every other respect (comparisons, arithmetic, JSON, ``isinstance(x, int)``).
    """

    __slots__ = ()

    def __call__(self) -> int:
        """The count as a plain ``int``."""
        return int(self)


class ReplayBuffer:
    """A fixed-size ring of transitions with uniform or prioritized sampling.

    The schema (keys, item shapes, dtypes) is taken from the first ``add`` or
    ``add_batch``; columns are preallocated then, and every later experience
    must match it (``SchemaError`` naming the key otherwise).

    Args:
        device: where sampled batches go (the training device).
        storing_device: where the transitions live. ``cpu`` stores them in a
            file-backed memory map by default (ObjectRL's ``LazyMemmapStorage``);
            ``cuda`` keeps them on the GPU, so sampling never crosses the bus.
        buffer_size: capacity in transitions; the oldest are overwritten first.
        print_gc_warning: log a warning when :meth:`reset` runs the garbage collector.
        sampler: ``"uniform"`` (with replacement) or ``"prioritized"``
            (proportional, with importance weights).
        alpha: priority exponent (prioritized): stored priority ``(|p| + eps) ** alpha``.
        beta: importance-weight exponent (prioritized); settable as ``buf.beta``.
        eps: added to ``|p|`` so no item has probability 0 (prioritized).
        path: directory of the memory-mapped columns. If it already holds a
            buffer (``buffer.json``), that buffer is reopened with everything
            flushed before; without ``path`` a private temporary directory is
            used and removed by :meth:`close` or at exit.
        seed: seeds every random choice (sampling, permutations). Same seed and
            same calls give the same samples. ``None`` draws fresh entropy.
        storage: ``"auto"`` (cpu -> ``"memmap"``, other devices -> tensors on
            that device), ``"memmap"`` (cpu only) or ``"memory"`` (plain tensors
            on ``storing_device``: RAM for cpu, fastest to fill).
        add_backend: how ``add``/``add_batch`` copy rows into CPU storage:
            ``"auto"`` (the compiled check-and-copy when it is installed, else
            NumPy), ``"c"`` or ``"numpy"``; ``None`` reads ``REPLAYSTORE_RINGCOPY``
            (default ``"auto"``). Both store the same bytes and raise the same
            errors; the compiled one is faster for small rows.

    Raises:
        ValueError: a bad argument (size, sampler, exponents, storage on a device
            that does not support it, ``path`` without memmap storage).
        CheckpointError: ``path`` holds a buffer of another capacity.
        ImportError: ``add_backend="c"`` but ``replaystore._ringcopy`` is not installed.
    """

    def __init__(
        self,
        device: torch.device | str,
        storing_device: torch.device | str,
        buffer_size: int,
        print_gc_warning: bool = False,
        *,
        sampler: Literal["uniform", "prioritized"] = "uniform",
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-6,
        path: str | os.PathLike[str] | None = None,
        seed: int | None = None,
        storage: Literal["auto", "memory", "memmap"] = "auto",
        add_backend: Literal["auto", "c", "numpy"] | None = None,
    ) -> None:
        self.device = torch.device(device)
        self.storing_device = torch.device(storing_device)
        self.print_gc_warning = bool(print_gc_warning)
        self._capacity = _positive_int(buffer_size, "buffer_size")
        if storage not in ("auto", "memory", "memmap"):
            raise ValueError(f"storage must be 'auto', 'memory' or 'memmap', got {storage!r}")
        on_cpu = self.storing_device.type == "cpu"
        if storage == "memmap" and not on_cpu:
            raise ValueError(
                f"storage='memmap' needs storing_device cpu, got {self.storing_device}"
            )
        self._kind = "memmap" if on_cpu and storage in ("auto", "memmap") else "memory"
        if path is not None and self._kind != "memmap":
            raise ValueError("path= names the memory-map directory; it needs memmap storage")
        if sampler not in ("uniform", "prioritized"):
            raise ValueError(f"sampler must be 'uniform' or 'prioritized', got {sampler!r}")
        self._sampler = sampler
        self._kernel = _resolve_kernel(add_backend)
        self._alpha, self._beta, self._eps = float(alpha), float(beta), float(eps)
        self._prio = self._new_priorities() if sampler == "prioritized" else None
        self._path = ensure_directory(path) if path is not None else None
        self._tmpdir: TemporaryDirectory | None = None

        seq = np.random.SeedSequence(seed)
        self._gen = torch.Generator(device=self.storing_device)
        self._gen.manual_seed(int(seq.generate_state(1, np.uint64)[0] >> np.uint64(1)))
        self._np_rng = np.random.Generator(np.random.PCG64(seq.spawn(1)[0]))

        # A plain Lock (cheaper than RLock): no method takes it while holding it.
        self._lock = threading.Lock()
        self._storage: TensorStorage | MemmapStorage | None = None
        self._fields: dict[str, FieldSpec] | None = None
        self._names: list[str] = []
        self._shapes: list[tuple[int, ...]] = []
        self._accepts: list[frozenset[Any]] = []
        self._arrays: list[np.ndarray | None] = []
        self._columns: list[torch.Tensor] = []
        self._column_items: list[tuple[str, torch.Tensor]] = []
        # (name, NumPy view) of every column when sampling can gather with NumPy (see
        # sample_batch); None when a column has no NumPy view or batches go to another device.
        self._array_items: list[tuple[str, np.ndarray]] | None = None
        self._scalar_ok: list[frozenset[type]] = []
        self._numpy_rows = False
        self._add_plan: list[
            tuple[str, frozenset[type], tuple[int, ...], frozenset[Any], int, int]
        ] = []
        self._batch_shapes: dict[int, list[tuple[int, ...]]] = {}
        self._plan: Any = None  # compiled check-and-copy of the current storage
        self._size = 0
        self._ptr = 0
        self._iterator: Iterator[TensorDict] | None = None
        self._batch_device = None if self.device == self.storing_device else self.device
        self._rand_device = {} if on_cpu else {"device": self.storing_device}
        if self._path is not None:
            self._reopen(self._path)

    # ----------------------------------------------------------------- state

    def _new_priorities(self) -> PriorityIndex:
        return PriorityIndex(self._capacity, self._alpha, self._beta, self._eps)

    @property
    def buffer_size(self) -> int:
        """Capacity in transitions."""
        return self._capacity

    @property
    def data_size(self) -> int:
        """Number of stored transitions (ObjectRL's name; same as :attr:`size`)."""
        return self._size

    @property
    def size(self) -> TransitionCount:
        """Number of stored transitions, at most :attr:`buffer_size`.

        An ``int`` that is also callable, so ObjectRL's ``buf.size`` and the method
        spelling ``buf.size()`` give the same number (see :class:`TransitionCount`).
        """
        return TransitionCount(self._size)

    def __len__(self) -> int:
        return self._size

    @property
    def pointer(self) -> int:
        """Storage position the next transition goes to."""
        return self._ptr

    @property
    def fields(self) -> dict[str, FieldSpec] | None:
        """The schema (key -> item shape and dtype), or None before the first add."""
        return None if self._fields is None else dict(self._fields)

    @property
    def storage_kind(self) -> str:
        """``"memmap"`` or ``"memory"`` (tensors on ``storing_device``, RAM or GPU)."""
        return self._kind

    @property
    def path(self) -> Path | None:
        """Directory of the memory-mapped columns (None for memory storage)."""
        if self._path is not None:
            return self._path
        return self._tmpdir.path if self._tmpdir is not None else None

    @property
    def add_backend(self) -> str:
        """``"c"`` or ``"numpy"``: how ``add``/``add_batch`` copy rows (see the constructor)."""
        return "numpy" if self._kernel is None else "c"

    @property
    def sampler(self) -> str:
        """``"uniform"`` or ``"prioritized"``."""
        return self._sampler

    @property
    def beta(self) -> float:
        """Importance-weight exponent of prioritized sampling (anneal it towards 1)."""
        return self._beta

    @beta.setter
    def beta(self, value: float) -> None:
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"beta must be finite and >= 0, got {value!r}")
        with self._lock:
            self._beta = float(value)
            if self._prio is not None:
                self._prio.beta = float(value)

    def __repr__(self) -> str:
        return (
            f"ReplayBuffer(size={self._size}/{self._capacity}, storage={self._kind}, "
            f"storing_device={self.storing_device}, device={self.device}, "
            f"sampler={self._sampler!r})"
        )

    # --------------------------------------------------------------- storage

    def _memmap_dir(self) -> Path:
        if self._path is not None:
            return self._path
        if self._tmpdir is None:
            self._tmpdir = TemporaryDirectory()
        return self._tmpdir.path

    def _install(self, storage: TensorStorage | MemmapStorage) -> None:
        old = self._storage
        self._storage = storage
        self._fields = {f.name: f for f in storage.fields}
        # Per-column views of the schema, precomputed for the add and sample hot paths.
        self._names = [f.name for f in storage.fields]
        self._shapes = [f.shape for f in storage.fields]
        self._accepts = [f.accepts for f in storage.fields]
        self._arrays = [storage.arrays[f.name] for f in storage.fields]
        self._columns = [storage.columns[f.name] for f in storage.fields]
        self._column_items = list(zip(self._names, self._columns, strict=True))
        # Exact value types that fit a column without looking at them: Python and
        # NumPy scalars of an accepted kind, for columns of item shape ().
        self._scalar_ok = [f.scalar_types if not f.shape else frozenset() for f in storage.fields]
        self._numpy_rows = all(a is not None for a in self._arrays)
        # NumPy gathers keep the GIL (good under a busy writer thread) but are single
        # threaded copies: for large rows (Atari frames) torch's index_select is
        # faster (measured 1.48x slower with NumPy at 56 KiB rows), and releasing the
        # GIL during a long copy is what a writer thread wants anyway.
        row_bytes = (
            sum(a.itemsize * (a.size // max(len(a), 1)) for a in self._arrays)  # type: ignore[union-attr]
            if self._numpy_rows
            else 0
        )
        self._array_items = (
            list(zip(self._names, self._arrays, strict=True))  # type: ignore[arg-type]
            if self._numpy_rows
            and self._batch_device is None
            and row_bytes <= _NUMPY_GATHER_MAX_ROW_BYTES
            else None
        )
        self._add_plan = [
            (f.name, ok, f.shape, f.accepts, *f.int_range)
            for f, ok in zip(storage.fields, self._scalar_ok, strict=True)
        ]
        self._batch_shapes = {}
        self._plan = None
        if self._kernel is not None and self._numpy_rows:
            self._plan = self._kernel.Plan(tuple(self._names), tuple(self._arrays), self._capacity)
        if old is not None and old is not storage:
            old.close()

    def _create(self, fields: list[FieldSpec]) -> None:
        if self._kind == "memmap":
            storage: TensorStorage | MemmapStorage = MemmapStorage(
                self._memmap_dir(), fields, self._capacity
            )
            storage.flush(MemmapState(0, 0))
            storage.remove_other_generations()
        else:
            storage = TensorStorage(fields, self._capacity, self.storing_device)
        self._install(storage)

    def _reopen(self, directory: Path) -> None:
        meta = MemmapStorage.read_meta(directory)
        if meta is None:
            return
        if int(meta.get("capacity", -1)) != self._capacity:
            raise CheckpointError(
                f"{directory} holds a buffer of capacity {meta.get('capacity')}, but "
                f"buffer_size is {self._capacity}; open it with that buffer_size"
            )
        storage = MemmapStorage.reopen(directory, meta)
        size, ptr = int(meta["size"]), int(meta["pointer"])
        if not (0 <= size <= self._capacity and 0 <= ptr < self._capacity):
            raise CheckpointError(f"{directory}: inconsistent size {size} / pointer {ptr}")
        if self._prio is not None:
            pri = meta.get("priorities")
            if pri is not None:
                values = MemmapStorage.read_priorities(directory, self._capacity)[:size]
                self._prio.restore(values, float(pri["max_priority"]))
            else:
                self._prio.restore(np.ones(size), 1.0)
        self._install(storage)
        self._size, self._ptr = size, ptr
        logger.info("reopened %d transitions from %s", size, directory)

    def _memmap_state(self) -> MemmapState:
        if self._prio is None:
            return MemmapState(self._size, self._ptr)
        values = np.zeros(self._capacity)
        values[: self._size] = self._prio.values(self._size)
        return MemmapState(self._size, self._ptr, values, self._prio.max_priority)

    def flush(self) -> None:
        """Make everything added so far durable in the memmap directory.

        Writes the dirty pages of every column back to its file, then atomically
        replaces ``buffer.json`` (schema, size, pointer; priorities alongside).
        Reopening the directory (``path=``) after a crash restores the state of
        the last flush. Caveat: once the ring has wrapped, rows overwritten after
        the last flush hold the newer data (possibly only some of its keys if the
        crash hit mid-add); use :meth:`save` for an exact point-in-time copy.
        A no-op for memory storage. Cost: proportional to the pages written since
        the last flush, plus two small fsynced files.
        """
        with self._lock:
            if isinstance(self._storage, MemmapStorage):
                self._storage.flush(self._memmap_state())

    def close(self) -> None:
        """Flush (memmap), release the storage and remove a private temporary directory.

        The buffer is empty afterwards and can be filled again.
        """
        with self._lock:
            if isinstance(self._storage, MemmapStorage) and self._path is not None:
                self._storage.flush(self._memmap_state())
            self._drop_storage(remove_files=False)
            if self._tmpdir is not None:
                self._tmpdir.cleanup()
                self._tmpdir = None

    def __enter__(self) -> ReplayBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _drop_storage(self, *, remove_files: bool) -> None:
        self._plan = None  # releases its views of the columns
        if self._storage is not None:
            self._storage.close()
        if remove_files and self._kind == "memmap":
            directory = self.path
            if directory is not None:
                MemmapStorage.clear(directory)
        self._storage = None
        self._fields = None
        self._names, self._shapes, self._accepts = [], [], []
        self._arrays, self._columns, self._column_items = [], [], []
        self._array_items = None
        self._scalar_ok, self._numpy_rows = [], False
        self._batch_shapes = {}
        self._add_plan = []
        self._size = 0
        self._ptr = 0
        self._iterator = None
        if self._prio is not None:
            self._prio = self._new_priorities()

    def reset(self, buffer_size: int | None = None) -> None:
        """Remove every transition and the schema, optionally changing the capacity.

        The next add defines a new schema. Memmap files of the old contents are
        deleted. The random state is kept (the seeded stream continues).

        Args:
            buffer_size: new capacity; None keeps the current one.
        """
        with self._lock:
            if buffer_size is not None:
                self._capacity = _positive_int(buffer_size, "buffer_size")
            self._drop_storage(remove_files=True)
        if self.print_gc_warning:
            logger.warning("ReplayBuffer.reset: running the garbage collector")
        gc.collect()

    # ---------------------------------------------------------------- adding

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

    def add(self, experience: TensorDictBase | Mapping[str, Any]) -> None:
        """Add one transition.

        Args:
            experience: a TensorDict with batch size ``[]`` or a mapping of key ->
                tensor / numpy array / numpy or Python scalar, one item each (no
                batch dimension). The first add defines the schema.

        Raises:
            SchemaError: a missing or extra key, a wrong item shape or a dtype that
                does not cast to the column's (named in the message). Nothing is
                written then.

        Cost: about 0.5 us for a CartPole transition given as a dict of NumPy
        arrays and scalars of the columns' dtypes on CPU storage (one compiled
        call checks every key, then copies the rows); about 2 us on the NumPy
        path (lists, tensors, casts, or no compiled kernel).
        """
        with self._lock:
            plan = self._plan
            if plan is not None:
                ptr = self._ptr
                if plan.add(experience, ptr) > 0:
                    self._ptr = ptr + 1 if ptr + 1 < self._capacity else 0
                    if self._size < self._capacity:
                        self._size += 1
                    if self._prio is not None:
                        self._prio.mark_new(ptr)
                    return
            if type(experience) is not dict:
                experience = as_flat_mapping(experience, batched=False)
            if self._storage is None:
                self._create(infer_fields(experience, batched=False, reserved=self._reserved()))
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
            ptr = self._ptr
            if tensors or not self._numpy_rows:
                for v, arr, col in zip(values, self._arrays, self._columns, strict=True):
                    _write_row(col, arr, ptr, v)
            else:
                for v, arr in zip(values, self._arrays, strict=True):
                    arr[ptr] = v
            self._ptr = ptr + 1 if ptr + 1 < self._capacity else 0
            if self._size < self._capacity:
                self._size += 1
            if self._prio is not None:
                self._prio.mark_new(ptr)

    def _reserved(self) -> tuple[str, ...]:
        return _RESERVED if self._prio is not None else ()

    def add_batch(self, batch: TensorDictBase | Mapping[str, Any]) -> None:
        """Add N transitions, as if added one by one in order.

        The batch wraps around the end of the ring; a batch larger than the
        capacity keeps only its newest ``buffer_size`` items.

        Args:
            batch: a TensorDict with batch size ``[N]`` or a mapping of key ->
                tensor / array / list with a leading dimension N (the same for
                every key). The first add defines the schema from ``shape[1:]``.

        Raises:
            SchemaError: as :meth:`add`, or keys with different N. Nothing is
                written then.

        Cost: one compiled call that checks every key and copies the rows (one
        or two ``memcpy`` per column) for a dict of NumPy arrays of the columns'
        dtypes on CPU storage; otherwise one or two slice copies per column.
        """
        with self._lock:
            plan = self._plan
            if plan is not None:
                ptr = self._ptr
                n = plan.add_batch(batch, ptr)
                if n >= 0:
                    if n:
                        self._advance(ptr, n)
                    return
            exp = batch if type(batch) is dict else as_flat_mapping(batch, batched=True)
            if self._storage is None:
                exp = _normalise_batch(exp)
                self._create(infer_fields(exp, batched=True, reserved=self._reserved()))
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
            cap = self._capacity
            ptr = self._ptr
            if numpy_only and ptr + n <= cap:
                # The common case: NumPy data, CPU columns, no wrap-around. NumPy
                # slice assignment is several times cheaper than torch's copy_ here.
                end = ptr + n
                for v, arr in zip(values, self._arrays, strict=True):
                    arr[ptr:end] = v
            else:
                m = min(n, cap)
                start = (ptr + n - m) % cap
                for v, arr, col in zip(values, self._arrays, self._columns, strict=True):
                    _write_rows(col, arr, start, v[n - m :] if n > m else v)
            self._advance(ptr, n)

    def _advance(self, ptr: int, n: int) -> None:
        """Move the ring on after ``n`` rows were written from ``ptr`` (newest ``cap`` kept)."""
        cap = self._capacity
        if self._prio is not None:
            m = n if n < cap else cap
            self._prio.mark_new_range((ptr + n - m) % cap, m)
        self._ptr = (ptr + n) % cap
        if self._size < cap:
            self._size = min(self._size + n, cap)

    def _batch_rows(self, exp: Mapping[str, Any]) -> tuple[int, list[Any], bool]:
        """(N, values in column order, all NumPy with NumPy columns) if ``exp`` fits
        the schema as-is; N is -1 otherwise."""
        names = self._names
        if len(exp) != len(names):
            return -1, [], False
        values = [exp.get(name) for name in names]
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

    # -------------------------------------------------------------- sampling

    def _gather(
        self, idx: torch.Tensor, extra: dict[str, torch.Tensor] | None = None
    ) -> TensorDict:
        """Rows ``idx`` (on the storing device) of every column, as a TensorDict on ``device``."""
        out = {name: col.index_select(0, idx) for name, col in self._column_items}
        if extra:
            out.update(extra)
        if self._batch_device is not None:
            out = {k: v.to(self._batch_device) for k, v in out.items()}
        return _tensordict(out, idx.shape[0], self.device)

    def _require_items(self) -> None:
        if self._size == 0:
            raise EmptyBufferError("the replay buffer is empty: add transitions before sampling")

    def sample_batch(self, batch_size: int) -> TensorDict:
        """Draw ``batch_size`` stored transitions at random, with replacement.

        Uniform buffers draw every stored item with equal probability.
        Prioritized buffers draw item i with probability ``p_i / sum p`` and add
        two entries: ``index`` (int64 storage positions, for
        :meth:`update_priorities`) and ``weight`` (float32 importance weights
        ``(p_i / p_min) ** -beta``, at most 1).

        Returns:
            TensorDict of batch size ``[batch_size]`` on ``device``.

        Raises:
            EmptyBufferError: nothing is stored.
            ValueError: ``batch_size`` is not a positive integer.

        Cost: one random draw plus one gather per column (uniform; NumPy
        ``take`` on CPU storage, which keeps the GIL for small rows, else
        ``index_select``); prioritized adds an O(batch log capacity) tree search.
        """
        n = batch_size if type(batch_size) is int and batch_size > 0 else None
        if n is None:
            n = _positive_int(batch_size, "batch_size")
        with self._lock:
            arrays = self._array_items
            if self._prio is None and self._size:
                if arrays is not None:
                    # NumPy draw and gathers: unlike torch calls, none of them
                    # releases the GIL for small rows (see the module docstring).
                    pos = self._np_rng.integers(0, self._size, n)
                    out = {name: torch.from_numpy(a.take(pos, axis=0)) for name, a in arrays}
                    return _tensordict(out, n, self.device)
                # The device keyword costs ~1 us on CPU; CUDA generators need it.
                idx = torch.randint(self._size, (n,), generator=self._gen, **self._rand_device)
                return self._gather(idx)
            self._require_items()
            assert self._prio is not None  # uniform buffers with items returned above
            slots, weights = self._prio.sample(n, self._np_rng)
            idx = torch.from_numpy(slots)
            weight = torch.from_numpy(weights)
            if arrays is not None:
                out = {name: torch.from_numpy(a.take(slots, axis=0)) for name, a in arrays}
                out["index"] = idx
                out["weight"] = weight
                return _tensordict(out, n, self.device)
            if self._rand_device:  # storage on an accelerator (.to costs ~0.5 us on CPU)
                idx = idx.to(self.storing_device)
                weight = weight.to(self.storing_device)
            return self._gather(idx, {"index": idx, "weight": weight})

    def sample_random(self, batch_size: int) -> TensorDict:
        """Alias of :meth:`sample_batch`."""
        return self.sample_batch(batch_size)

    def _checked_index(self, indices: Indices) -> torch.Tensor:
        idx = as_index_array(indices)
        if idx.size:
            self._require_items()
        check_stored(idx, self._size)
        return torch.from_numpy(idx).to(self.storing_device)

    def sample_by_index(self, indices: Indices) -> TensorDict:
        """The transitions at storage positions ``indices`` (repeats allowed), in that order.

        Positions are ``0..size-1``; once the ring has wrapped, position
        ``pointer`` holds the oldest item.

        Raises:
            EmptyBufferError: nothing is stored.
            BufferIndexError: an index is negative or ``>= size`` (named in the message).
        """
        with self._lock:
            self._require_items()
            return self._gather(self._checked_index(indices))

    def sample_by_index_fields(
        self, indices: Indices, fields: Sequence[str] | str, *, as_tuple: bool = False
    ) -> TensorDict | torch.Tensor | tuple[torch.Tensor, ...]:
        """Some fields of the transitions at ``indices``.

        Args:
            indices: storage positions, as for :meth:`sample_by_index`.
            fields: a field name or a sequence of them.
            as_tuple: return bare tensors instead of a TensorDict.

        Returns:
            By default a TensorDict holding only ``fields``, batch size
            ``[len(indices)]``, on ``device`` (what ObjectRL returns:
            ``batch["obs"]``). With ``as_tuple=True``: a tensor when ``fields`` names
            one field (a string or a one-element list), else a tuple of tensors in
            the order of ``fields`` (``obs, act = ...``). Each tensor has shape
            ``[len(indices), *item_shape]``.

        Raises:
            SchemaError: a field is not a key of the buffer, or ``fields`` is empty.
            EmptyBufferError, BufferIndexError: as :meth:`sample_by_index`.
        """
        names = [fields] if isinstance(fields, str) else list(fields)
        with self._lock:
            self._require_items()
            assert self._storage is not None and self._fields is not None
            if not names:
                raise SchemaError("fields is empty: name at least one field")
            for name in names:
                if not isinstance(name, str) or name not in self._fields:
                    known = ", ".join(map(repr, self._fields))
                    raise SchemaError(f"unknown field {name!r}; the buffer stores {known}")
            idx = self._checked_index(indices)
            out = {
                name: self._storage.columns[name].index_select(0, idx).to(self.device)
                for name in names
            }
        if not as_tuple:
            return _tensordict(out, idx.shape[0], self.device)
        tensors = tuple(out[name] for name in names)
        return tensors[0] if len(tensors) == 1 else tensors

    def sample_all(self, *, chronological: bool = False) -> TensorDict:
        """Every stored transition: storage positions ``0..size-1`` (a copy).

        Args:
            chronological: order oldest to newest instead (differs from storage
                order once the ring has wrapped).

        Raises:
            EmptyBufferError: nothing is stored.
        """
        with self._lock:
            self._require_items()
            return self._gather(self._all_positions(chronological))

    def _all_positions(self, chronological: bool) -> torch.Tensor:
        idx = torch.arange(self._size, device=self.storing_device)
        if chronological and self._size == self._capacity:
            idx = (idx + self._ptr) % self._capacity
        return idx

    # ----------------------------------------------------------- prioritized

    def update_priorities(self, indices: Indices, priorities: Any) -> None:
        """Set the priorities of stored items (e.g. to their absolute TD errors).

        The stored priority is ``(|p| + eps) ** alpha``; the running maximum
        (given to new items) grows accordingly. Repeated indices: the last wins.
        Validation happens before anything changes.

        Args:
            indices: storage positions, e.g. a sample's ``index`` entry.
            priorities: one finite, non-negative value per index.

        Raises:
            PriorityError: a uniform buffer, lengths differ, or a NaN, infinite
                or negative priority (the message names the index).
            BufferIndexError: an index is not a stored position.

        Note: an item overwritten between sampling and the update gets the
        priority meant for its predecessor (as in every ring-buffer PER).
        """
        with self._lock:
            if self._prio is None:
                raise PriorityError(
                    "update_priorities needs a buffer created with sampler='prioritized'"
                )
            idx, stored = self._prio.check_update(indices, priorities, self._size)
            self._prio.update(idx, stored)

    def priorities(self) -> np.ndarray:
        """Stored priorities ``(|p| + eps) ** alpha`` of positions ``0..size-1`` (a copy)."""
        with self._lock:
            if self._prio is None:
                raise PriorityError("a uniform buffer has no priorities")
            return self._prio.values(self._size)

    # ---------------------------------------------------------------- epochs

    def create_epoch_iterator(
        self, batch_size: int, n_epochs: int = 1, shuffle: bool = True, drop_last: bool = False
    ) -> Iterator[TensorDict]:
        """An iterator of batches that visits every stored item once per epoch.

        Each epoch draws a fresh seeded permutation of the items stored at its
        start (``shuffle=False``: positions ``0..size-1`` in order, as ObjectRL).
        The iterator also becomes the buffer's current one, which
        :meth:`get_next_batch` draws from. Prioritized buffers add ``index`` and
        ``weight`` (all 1) entries so training code can treat both alike.

        Args:
            batch_size: items per batch; the last batch of an epoch may be
                smaller unless ``drop_last``.
            n_epochs: number of passes, >= 1.
            shuffle: permute items each epoch.
            drop_last: skip each epoch's last partial batch.

        Raises:
            EmptyBufferError: nothing is stored.
        """
        bs = _positive_int(batch_size, "batch_size")
        epochs = _positive_int(n_epochs, "n_epochs")
        with self._lock:
            self._require_items()
            iterator = self._epochs(bs, epochs, bool(shuffle), bool(drop_last))
            self._iterator = iterator
        return iterator

    def _epochs(
        self, batch_size: int, n_epochs: int, shuffle: bool, drop_last: bool
    ) -> Iterator[TensorDict]:
        for _ in range(n_epochs):
            with self._lock:
                size = self._size
                if shuffle:
                    order = torch.randperm(size, generator=self._gen, device=self.storing_device)
                else:
                    order = torch.arange(size, device=self.storing_device)
            stop = size - size % batch_size if drop_last else size
            for start in range(0, stop, batch_size):
                idx = order[start : start + batch_size]
                with self._lock:
                    extra = None
                    if self._prio is not None:
                        ones = torch.ones(
                            idx.shape[0], dtype=torch.float32, device=self.storing_device
                        )
                        extra = {"index": idx, "weight": ones}
                    batch = self._gather(idx, extra)
                yield batch

    def get_next_batch(self, batch_size: int) -> TensorDict:
        """The next batch of the current epoch iterator, or a random batch.

        Falls back to :meth:`sample_batch` when there is no current iterator
        (none created, or ``get_steps_and_iterator(n_epochs=0, ...)``) and when
        the current one is exhausted (it is then dropped).

        Args:
            batch_size: size of the random batch when falling back (the
                iterator's batches keep the size it was created with).
        """
        iterator = self._iterator
        if iterator is not None:
            try:
                return next(iterator)
            except StopIteration:
                with self._lock:
                    if self._iterator is iterator:
                        self._iterator = None
        return self.sample_batch(batch_size)

    def calculate_num_batches(self, batch_size: int) -> int:
        """Full batches in the current contents: ``size // batch_size``."""
        return self._size // _positive_int(batch_size, "batch_size")

    def get_steps_and_iterator(
        self, n_epochs: int, max_iter: int, batch_size: int, *, shuffle: bool = True
    ) -> int:
        """Number of training steps, preparing the internal iterator.

        ``n_epochs > 0``: an internal iterator over ``n_epochs`` epochs of full
        batches (the last partial batch of each epoch is dropped, a different one
        each epoch when shuffling) and ``n_epochs * size // batch_size`` steps, so
        ``get_next_batch`` is called exactly as often as the iterator has batches.
        ``n_epochs == 0``: no iterator, ``max_iter`` steps, and ``get_next_batch``
        samples at random.

        Raises:
            ValueError: negative ``n_epochs`` or ``max_iter``, or a bad batch size.
        """
        if int(n_epochs) != n_epochs or n_epochs < 0:
            raise ValueError(f"n_epochs must be an integer >= 0, got {n_epochs!r}")
        if int(max_iter) != max_iter or max_iter < 0:
            raise ValueError(f"max_iter must be an integer >= 0, got {max_iter!r}")
        bs = _positive_int(batch_size, "batch_size")
        if n_epochs == 0:
            with self._lock:
                self._iterator = None
            return int(max_iter)
        with self._lock:
            steps = int(n_epochs) * (self._size // bs)
            if steps == 0:
                self._iterator = None
                return 0
            self._iterator = self._epochs(bs, int(n_epochs), bool(shuffle), True)
        return steps

    # ------------------------------------------------------------ checkpoints

    def _snapshot(self) -> Snapshot:
        assert self._storage is not None
        sampler: dict[str, Any] = {"kind": self._sampler}
        priorities = None
        if self._prio is not None:
            sampler.update(
                alpha=self._alpha,
                beta=self._beta,
                eps=self._eps,
                max_priority=self._prio.max_priority,
            )
            priorities = self._prio.values(self._size)
        state = self._np_rng.bit_generator.state
        return Snapshot(
            capacity=self._capacity,
            size=self._size,
            pointer=self._ptr,
            fields=list(self._storage.fields),
            columns={k: c[: self._size] for k, c in self._storage.columns.items()},
            sampler=sampler,
            priorities=priorities,
            torch_rng=bytes(self._gen.get_state().numpy().tobytes()),
            numpy_rng=state,
            torch_rng_device=self.storing_device.type,
        )

    def save(self, path: str | os.PathLike[str]) -> None:
        """Checkpoint the whole buffer: contents, schema, pointer, priorities, RNG state.

        Writes ``<path>.metadata`` (JSON with ObjectRL's ``buffer_size``,
        ``data_size``, ``pointer`` and everything needed to restore) and a data
        directory ``<path>.data-<id>/`` of raw column files; no pickle. Atomic: a
        save killed at any point leaves the previous checkpoint loadable. Parent
        directories are created. Holds the buffer's lock while writing.

        Raises:
            EmptyBufferError: nothing was ever added (there is no schema to save).
            OSError: the files cannot be written (the previous checkpoint stays).

        Cost: writes every stored byte once, with one fsync per file.
        """
        with self._lock:
            if self._storage is None:
                raise EmptyBufferError("nothing to save: the buffer has no schema yet")
            write_checkpoint(path, self._snapshot())

    def _apply_objectrl_metadata(self, meta: ObjectRLMetadata, path: object) -> None:
        """ObjectRL's ``load``: set ``data_size``/``pointer`` over the transitions held."""
        if meta.buffer_size != self._capacity:
            raise CheckpointError(
                f"ObjectRL metadata {path} has buffer_size {meta.buffer_size} but this buffer "
                f"has {self._capacity}; call reset(buffer_size={meta.buffer_size}) before load"
            )
        if meta.data_size < meta.buffer_size and meta.pointer != meta.data_size:
            raise CheckpointError(
                f"inconsistent ObjectRL metadata {path}: pointer {meta.pointer} with data_size "
                f"{meta.data_size} < buffer_size (a buffer that never wrapped has pointer == "
                "data_size)"
            )
        with self._lock:
            if meta.data_size > self._size:
                raise CheckpointError(
                    f"{path}.metadata is ObjectRL's metadata-only checkpoint: it holds no "
                    f"transitions, only data_size={meta.data_size}, and this buffer holds "
                    f"{self._size}, so there is nothing to restore them from (ObjectRL's load "
                    "relies on its storage still holding them; save with replaystore to "
                    "checkpoint the contents)"
                )
            if self._storage is None:
                return
            self._size, self._ptr = meta.data_size, meta.pointer
            self._iterator = None
            if self._prio is not None:
                self._prio.restore(self._prio.values(self._size), self._prio.max_priority)
            if isinstance(self._storage, MemmapStorage):
                self._storage.flush(self._memmap_state())

    def load(self, path: str | os.PathLike[str]) -> None:
        """Replace the buffer's contents and state with the checkpoint ``path``.

        ObjectRL's own ``<path>.metadata`` (``torch.save`` of ``buffer_size``,
        ``data_size`` and ``pointer``; read opcode by opcode, never unpickled) is
        loaded as ObjectRL loads it: those counters are set over the transitions
        this buffer already holds (``data_size`` may not exceed :attr:`size`); no
        contents, priorities or RNG state are restored from it.

        Restores the items, schema, pointer, priorities, ``beta`` and both random
        generators, so the next samples equal those the saved buffer would have
        drawn (for the torch generator: when both buffers store on the same
        device type; across CPU and CUDA it keeps its own, with a warning). The
        checkpoint is verified (sizes, CRC-32) before the buffer changes. Loading
        a uniform checkpoint into a prioritized buffer gives every item priority
        1; a prioritized checkpoint into a uniform buffer ignores its priorities.
        The current epoch iterator is dropped.

        Raises:
            CheckpointError: no checkpoint, a corrupt part, a different
                ``buffer_size`` (``reset(buffer_size=N)`` first), different
                ``alpha``/``eps`` for prioritized buffers, or ObjectRL metadata with
                a ``data_size`` above what this buffer holds.
        """
        objectrl = read_objectrl_metadata(path)
        if objectrl is not None:
            self._apply_objectrl_metadata(objectrl, path)
            return
        snap = read_checkpoint(path)
        if snap.capacity != self._capacity:
            raise CheckpointError(
                f"checkpoint {path} has buffer_size {snap.capacity} but this buffer has "
                f"{self._capacity}; call reset(buffer_size={snap.capacity}) before load"
            )
        if self._prio is not None and snap.sampler.get("kind") == "prioritized":
            for name, mine in (("alpha", self._alpha), ("eps", self._eps)):
                if float(snap.sampler[name]) != mine:
                    raise CheckpointError(
                        f"checkpoint {path} was saved with {name}={snap.sampler[name]}, "
                        f"this buffer uses {name}={mine}"
                    )
        # The torch generator lives on the storing device; its state only fits a
        # generator of the same device type (CPU and CUDA states differ).
        torch_state: torch.Tensor | None = torch.frombuffer(
            bytearray(snap.torch_rng), dtype=torch.uint8
        )
        same_device = snap.torch_rng_device == self.storing_device.type
        try:
            if same_device:
                torch.Generator(device=self.storing_device).set_state(torch_state)
            bitgen = np.random.PCG64()
            bitgen.state = snap.numpy_rng
        except (RuntimeError, TypeError, ValueError, KeyError) as exc:
            raise CheckpointError(f"checkpoint {path} has an unusable RNG state: {exc}") from exc
        if not same_device:
            logger.warning(
                "checkpoint %s was saved with %s storage: its torch RNG state does not fit "
                "this %s buffer, which keeps its own (epoch shuffles will differ)",
                path,
                snap.torch_rng_device,
                self.storing_device.type,
            )
            torch_state = None
        with self._lock:
            if self._kind == "memmap":
                storage: TensorStorage | MemmapStorage = MemmapStorage(
                    self._memmap_dir(), snap.fields, self._capacity
                )
            else:
                storage = TensorStorage(snap.fields, self._capacity, self.storing_device)
            for name, data in snap.columns.items():
                storage.columns[name][: snap.size].copy_(data)
            self._install(storage)
            self._size, self._ptr = snap.size, snap.pointer
            self._iterator = None
            if torch_state is not None:
                self._gen.set_state(torch_state)
            self._np_rng = np.random.Generator(bitgen)
            if self._prio is not None:
                if snap.priorities is not None:
                    self._beta = float(snap.sampler.get("beta", self._beta))
                    self._prio.beta = self._beta
                    self._prio.restore(snap.priorities, float(snap.sampler["max_priority"]))
                else:
                    self._prio.restore(np.ones(snap.size), 1.0)
            if isinstance(storage, MemmapStorage):
                storage.flush(self._memmap_state())
                storage.remove_other_generations()
