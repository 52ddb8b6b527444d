"""The tensor transition buffer: ObjectRL's ``ReplayBuffer`` API, with full checkpoints.

A ring of ``buffer_size`` transitions stored column by column (one preallocated
tensor per key) in RAM, in memory-mapped files or on a CUDA device. The buffer
composes three parts, each in its own module, and owns their lifecycle, the
lock, and checkpoints:

* storage (:mod:`.storage`): where the columns live (RAM, memory map, CUDA);
* writer (:mod:`.writer`): where new items go: the ring cursor, and the
  checked copy of ``add``/``add_batch`` (compiled or NumPy, one rule);
* sampler (:mod:`.sampler`, :mod:`.slices`): which items are picked (a
  :class:`~.sampler.Sampler` object: uniform, prioritized, slices within
  episodes, or a user's own; epochs) and the gather into a TensorDict on the
  training device.

Its epoch methods are in :mod:`.buffer_epochs`, ``save``/``load`` in
:mod:`.buffer_checkpoints` (base classes of :class:`ReplayBuffer`).

Data flows one way: add -> writer -> storage <- sampler -> batch.

Concurrency: every public method takes the buffer's lock, so one writer thread
and any number of sampler threads in the same process see whole transitions
(never a row whose keys come from different adds). Epoch iterators take the
lock per batch, not for the whole epoch; threads drawing from one epoch run
(``get_next_batch``, or one iterator shared between them) share it: between
them they get each stored item exactly once per epoch. The lock is a plain
``threading.Lock`` on purpose: a thread woken from it takes it in C, before it
needs the GIL, which keeps a sampler's waits for it short while a writer adds
in a loop. A strict
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
import os
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from replaystore._tensordict_compat import batch_tensordict
from replaystore.errors import (
    ArgumentError,
    CheckpointError,
    RateLimitTimeout,
    SchemaError,
    check_choice,
    check_int,
    check_number,
)
from replaystore.transitions.buffer_checkpoints import (
    CheckpointMethods,
    PriorityHolder,
)
from replaystore.transitions.buffer_epochs import EpochMethods
from replaystore.transitions.nstep import (
    NSTEP_KEYS,
    NStepReader,
    check_nstep_config,
    check_nstep_schema,
)
from replaystore.transitions.prioritized import (
    NewRowListener,
    as_index_array,
    check_priority_update,
    check_stored,
)
from replaystore.transitions.rate_limiter import RateLimiter
from replaystore.transitions.sampler import (
    BatchGatherer,
    EpochSchedule,
    PrioritizedSampler,
    Sampler,
    UniformSampler,
    no_priorities,
    require_items,
)
from replaystore.transitions.schema import FieldSpec
from replaystore.transitions.slices import SliceSampler
from replaystore.transitions.storage import (
    MemmapState,
    MemmapStorage,
    TemporaryDirectory,
    TensorStorage,
    ensure_directory,
)
from replaystore.transitions.writer import RingWriter, resolve_add_kernel

__all__ = ["ReplayBuffer"]

logger = logging.getLogger(__name__)

Indices = Sequence[int] | torch.Tensor | range | np.ndarray
_RESERVED = ("index", "weight", "mask")


def _sampler_object(sampler: object, alpha: float, beta: float, eps: float) -> Sampler:
    """The sampler ``ReplayBuffer(sampler=...)`` names: a string's built-in, or the object."""
    if isinstance(sampler, str):
        check_choice(sampler, "sampler", ("uniform", "prioritized"))
        if sampler == "uniform":
            # Kept (not checked) as before: only a prioritized sampler uses them.
            return UniformSampler()
        return PrioritizedSampler(alpha, beta, eps)
    if not isinstance(sampler, Sampler):
        raise ArgumentError(
            "sampler must be 'uniform', 'prioritized' or a Sampler object (reset, on_write, "
            f"sample, update_priorities), got {sampler!r}"
        )
    return sampler


# The buffer each sampler object serves (one object, one buffer: it holds that ring's state).
_SAMPLER_OWNERS: weakref.WeakKeyDictionary[Any, weakref.ref[Any]] = weakref.WeakKeyDictionary()


def _claim(sampler: Sampler, buffer: object) -> None:
    """Record that ``sampler`` serves ``buffer``; ArgumentError if it serves another one."""
    try:
        owner = _SAMPLER_OWNERS.get(sampler)
    except TypeError:  # not weak-referenceable or not hashable: cannot be tracked
        return
    if owner is not None and owner() is not None and owner() is not buffer:
        raise ArgumentError(
            f"{sampler!r} already serves another ReplayBuffer: a sampler object holds its "
            "buffer's state (positions, priorities), so each buffer needs its own"
        )
    _SAMPLER_OWNERS[sampler] = weakref.ref(buffer)


class _ForwardWrites:
    """Tells a user's sampler of the rows the writer wrote (the writer's listener)."""

    __slots__ = ("_sampler",)

    def __init__(self, sampler: Sampler) -> None:
        self._sampler = sampler

    def mark_new(self, position: int) -> None:
        self._sampler.on_write(position, 1)

    def mark_new_range(self, start: int, count: int) -> None:
        self._sampler.on_write(start, count)


def _row_listener(policy: Sampler) -> NewRowListener | None:
    """What the writer tells of new rows: nothing, a priority index, or the sampler."""
    if type(policy) is UniformSampler:
        return None
    if type(policy) is PrioritizedSampler:
        return policy.index  # the cheapest path: one list append per add
    if type(policy) is SliceSampler:
        return policy
    return _ForwardWrites(policy)


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


def _batch_rows(batch: Any) -> int | None:
    """N, the leading dimension shared by every key of ``batch``; None if there is none."""
    if isinstance(batch, TensorDictBase):
        return int(batch.batch_size[0]) if batch.batch_dims else None
    if not isinstance(batch, Mapping) or not batch:
        return None
    sizes = set()
    for value in batch.values():
        try:
            sizes.add(len(value))
        except TypeError:  # a scalar, or a 0-d array
            return None
    return sizes.pop() if len(sizes) == 1 else None


def _batch_rows_slice(batch: Any, start: int, stop: int) -> Any:
    """Rows ``start:stop`` of a batch whose N :func:`_batch_rows` found."""
    if isinstance(batch, TensorDictBase):
        return batch[start:stop]
    return {key: value[start:stop] for key, value in batch.items()}


class ReplayBuffer(EpochMethods, CheckpointMethods):
    """A fixed-size ring of transitions with uniform, prioritized or slice sampling.

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
        sampler: which stored items a sample holds: ``"uniform"`` (with
            replacement, :class:`~.sampler.UniformSampler`), ``"prioritized"``
            (proportional, with importance weights: ``PrioritizedSampler(alpha,
            beta, eps)``), or a sampler object: :class:`~.sampler.UniformSampler`,
            :class:`~.sampler.PrioritizedSampler`, :class:`~.slices.SliceSampler`
            (slices of consecutive steps within episodes) or a user's own
            :class:`~.sampler.Sampler`. One object serves one buffer.
        alpha: priority exponent of ``sampler="prioritized"``: stored priority
            ``(|p| + eps) ** alpha`` (a sampler object carries its own).
        beta: importance-weight exponent of ``sampler="prioritized"``; settable as
            ``buf.beta`` (which also sets a sampler object's).
        eps: added to ``|p|`` so no item has probability 0 (``sampler="prioritized"``).
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
        n_step: the n-step horizon n. 1 (default): batches hold the stored
            transitions only. ``n > 1``: every sample (``sample_batch``,
            ``get_next_batch``, epoch batches, ``sample_by_index``) also holds
            ``n_step_return``, ``n_step_next_obs``, ``n_step_done`` (bool) and
            ``n_step_discount`` (float32), plus ``n_step_terminated`` when the
            transitions have a ``terminated`` key, computed at sample time over
            the next ``m <= n`` stored steps of the same episode (see
            :mod:`~replaystore.transitions.nstep` and ``docs/transitions.md``).
            Needs the keys ``reward``, ``done`` and ``next_obs``.
        gamma: the discount of the n-step entries, in ``[0, 1]``.
        rate_limiter: a :class:`~replaystore.transitions.RateLimiter` that makes
            ``sample_batch`` wait for ``min_size_to_sample`` items (and, with
            ``samples_per_insert``, makes samples and adds wait for each other);
            ``None`` (default): nothing waits. Its counters are checkpointed.

    Raises:
        ArgumentError: a bad argument (size, sampler, exponents, storage on a
            device that does not support it, ``path`` without memmap storage);
            a ``ValueError`` (``ArgumentTypeError``, also a ``TypeError``, for a
            ``buffer_size`` that is not a number).
        CheckpointError: ``path`` holds a buffer of another capacity.
        ConfigError: ``n_step`` is not a positive integer or ``gamma`` not in
            ``[0, 1]`` (an ``ArgumentError``); with ``n_step > 1``, ``path`` holds
            a buffer without ``reward``/``done``/``next_obs`` (the first add of
            such transitions raises it too, naming the missing keys).
        ImportError: ``add_backend="c"`` but ``replaystore._ringcopy`` is not installed.
    """

    def __init__(
        self,
        device: torch.device | str,
        storing_device: torch.device | str,
        buffer_size: int,
        print_gc_warning: bool = False,
        *,
        sampler: Literal["uniform", "prioritized"] | Sampler = "uniform",
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-6,
        path: str | os.PathLike[str] | None = None,
        seed: int | None = None,
        storage: Literal["auto", "memory", "memmap"] = "auto",
        add_backend: Literal["auto", "c", "numpy"] | None = None,
        n_step: int = 1,
        gamma: float = 0.99,
        rate_limiter: RateLimiter | None = None,
    ) -> None:
        self.device = torch.device(device)
        self.storing_device = torch.device(storing_device)
        self.print_gc_warning = bool(print_gc_warning)
        self._capacity = check_int(buffer_size, "buffer_size", minimum=1)
        check_choice(storage, "storage", ("auto", "memory", "memmap"))
        on_cpu = self.storing_device.type == "cpu"
        if storage == "memmap" and not on_cpu:
            raise ArgumentError(
                f"storage='memmap' needs storing_device cpu, got {self.storing_device}"
            )
        self._kind = "memmap" if on_cpu and storage in ("auto", "memmap") else "memory"
        if path is not None and self._kind != "memmap":
            raise ArgumentError("path= names the memory-map directory; it needs memmap storage")
        policy = _sampler_object(sampler, alpha, beta, eps)
        _claim(policy, self)
        kernel = resolve_add_kernel(add_backend)
        self._n_step, self._gamma = check_nstep_config(n_step, gamma)
        nstep = NStepReader(self._n_step, self._gamma) if self._n_step > 1 else None
        # A uniform buffer keeps beta (settable) though it never uses it.
        self._beta = float(getattr(policy, "beta", beta))
        if rate_limiter is not None:
            if not isinstance(rate_limiter, RateLimiter):
                raise ArgumentError(
                    f"rate_limiter must be a RateLimiter or None, got {type(rate_limiter).__name__}"
                )
            if rate_limiter.min_size_to_sample > self._capacity:
                raise ArgumentError(
                    f"rate_limiter.min_size_to_sample={rate_limiter.min_size_to_sample} is above "
                    f"buffer_size={self._capacity}: no sample could ever go on"
                )
            rate_limiter.bind(self)
        self._limiter = rate_limiter
        # Every argument is checked: only now is anything created on disk.
        self._path = ensure_directory(path) if path is not None else None
        self._tmpdir: TemporaryDirectory | None = None

        # A plain Lock (cheaper than RLock): no method takes it while holding it.
        self._lock = threading.Lock()
        self._storage: TensorStorage | MemmapStorage | None = None
        self._fields: dict[str, FieldSpec] | None = None
        self._gatherer = BatchGatherer(self.storing_device, self.device, seed)
        self._gatherer.nstep = nstep
        reserved = () if type(policy) is UniformSampler else _RESERVED
        if nstep is not None:
            reserved = (*reserved, *NSTEP_KEYS, "n_step_terminated")
        self._writer = RingWriter(self._capacity, kernel, self._create, reserved)
        self._sampler = policy
        self._adopt(policy)
        # The epochs get_next_batch draws from (None: it samples at random).
        self._epochs: EpochSchedule | None = None
        if self._path is not None:
            self._reopen(self._path)

    # ----------------------------------------------------------------- state

    def _adopt(self, policy: Sampler) -> None:
        """Make ``policy`` the sampler, reset to the capacity; the writer tells it of new rows."""
        policy.reset(self._capacity)
        self._sampler = policy
        self._gatherer.policy = policy
        self._writer.priorities = _row_listener(policy)

    def _rows_replaced(self) -> None:
        """The stored rows were replaced without the writer (load, reopen): the sampler
        starts over and is told of every stored row, oldest first."""
        self._adopt(self._sampler)
        size = self._writer.size
        if size:
            oldest = self._writer.pointer if size == self._capacity else 0
            self._sampler.on_write(oldest, size)

    def _priority_holder(self) -> PriorityHolder | None:
        """The sampler when it is a built-in one that keeps priorities, else None."""
        policy = self._sampler
        if type(policy) is PrioritizedSampler:
            return policy
        if type(policy) is SliceSampler and policy.prioritized:
            return policy
        return None

    @property
    def buffer_size(self) -> int:
        """Capacity in transitions."""
        return self._capacity

    @property
    def data_size(self) -> int:
        """Number of stored transitions (ObjectRL's name; same as :attr:`size`)."""
        return self._writer.size

    @property
    def size(self) -> TransitionCount:
        """Number of stored transitions, at most :attr:`buffer_size`.

        An ``int`` that is also callable, so ObjectRL's ``buf.size`` and the method
        spelling ``buf.size()`` give the same number (see :class:`TransitionCount`).
        """
        return TransitionCount(self._writer.size)

    def __len__(self) -> int:
        return self._writer.size

    @property
    def pointer(self) -> int:
        """Storage position the next transition goes to."""
        return self._writer.pointer

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
        return "numpy" if self._writer.kernel is None else "c"

    @property
    def sampler(self) -> str:
        """The sampler's kind: ``"uniform"``, ``"prioritized"``, ``"slice"``, or the class
        name of a user's own sampler (the object: :attr:`sampler_object`)."""
        return str(getattr(self._sampler, "kind", type(self._sampler).__name__))

    @property
    def sampler_object(self) -> Sampler:
        """The :class:`~.sampler.Sampler` that draws the samples (a string names a built-in)."""
        return self._sampler

    @property
    def rate_limiter(self) -> RateLimiter | None:
        """The :class:`~replaystore.transitions.RateLimiter` given to the constructor, or None."""
        return self._limiter

    @property
    def beta(self) -> float:
        """Importance-weight exponent of prioritized sampling (anneal it towards 1)."""
        return self._beta

    @beta.setter
    def beta(self, value: float) -> None:
        beta = check_number(value, "beta", minimum=0)
        with self._lock:
            self._beta = beta
            if hasattr(self._sampler, "beta"):
                self._sampler.beta = beta

    def __repr__(self) -> str:
        return (
            f"ReplayBuffer(size={self._writer.size}/{self._capacity}, storage={self._kind}, "
            f"storing_device={self.storing_device}, device={self.device}, "
            f"sampler={self.sampler!r})"
        )

    # --------------------------------------------------------------- storage

    def _memmap_dir(self) -> Path:
        if self._path is not None:
            return self._path
        if self._tmpdir is None:
            self._tmpdir = TemporaryDirectory()
        return self._tmpdir.path

    def _install(self, storage: TensorStorage | MemmapStorage) -> None:
        """Make ``storage`` the buffer's: the writer writes into it, the sampler reads it."""
        old = self._storage
        self._storage = storage
        self._fields = {f.name: f for f in storage.fields}
        self._writer.bind(storage)
        self._gatherer.bind(storage)
        if self._gatherer.nstep is not None:
            self._gatherer.nstep.bind(storage.columns, storage.arrays)
        if old is not None and old is not storage:
            old.close()

    def _new_storage(self, fields: list[FieldSpec]) -> TensorStorage | MemmapStorage:
        """Fresh columns for ``fields`` of this buffer's kind (memmap: a new file generation)."""
        if self._kind == "memmap":
            return MemmapStorage(self._memmap_dir(), fields, self._capacity)
        return TensorStorage(fields, self._capacity, self.storing_device)

    def _check_nstep_fields(self, fields: Sequence[FieldSpec]) -> None:
        """ConfigError unless ``n_step`` works with ``fields`` (before any storage is made)."""
        check_nstep_schema({f.name: tuple(f.shape) for f in fields}, self._n_step)

    def _create(self, fields: list[FieldSpec]) -> None:
        """Storage for the schema of the first add (the writer calls this)."""
        self._check_nstep_fields(fields)
        storage = self._new_storage(fields)
        if isinstance(storage, MemmapStorage):
            storage.flush(MemmapState(0, 0))  # buffer.json names the new, empty generation
            storage.remove_other_generations()
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
        try:
            self._check_nstep_fields(storage.fields)
        except Exception:
            storage.close()
            raise
        size, ptr = int(meta["size"]), int(meta["pointer"])
        if not (0 <= size <= self._capacity and 0 <= ptr < self._capacity):
            raise CheckpointError(f"{directory}: inconsistent size {size} / pointer {ptr}")
        holder = self._priority_holder()
        pri = meta.get("priorities")
        values = None
        if holder is not None and pri is not None:
            values = MemmapStorage.read_priorities(directory, self._capacity)[:size]
        self._install(storage)
        self._writer.reset_cursor(size, ptr)
        self._rows_replaced()  # new rows get priority 1 where none were flushed
        if holder is not None and values is not None and pri is not None:
            holder.restore_priorities(values, float(pri["max_priority"]))
        logger.info("reopened %d transitions from %s", size, directory)

    def _memmap_state(self) -> MemmapState:
        size, ptr = self._writer.size, self._writer.pointer
        holder = self._priority_holder()
        if holder is None:
            return MemmapState(size, ptr)
        values = np.zeros(self._capacity)
        values[:size] = holder.stored_priorities(size)
        return MemmapState(size, ptr, values, holder.max_priority)

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
        self._writer.unbind()  # releases the compiled plan's views of the columns
        self._gatherer.unbind()
        if self._gatherer.nstep is not None:
            self._gatherer.nstep.unbind()  # the kernel's plan holds the columns' buffers
        if self._storage is not None:
            self._storage.close()
        if remove_files and self._kind == "memmap":
            directory = self.path
            if directory is not None:
                MemmapStorage.clear(directory)
        self._storage = None
        self._fields = None
        self._writer.capacity = self._capacity
        self._writer.reset_cursor()
        self._epochs = None
        self._adopt(self._sampler)
        if self._limiter is not None:
            self._limiter.reset()  # the buffer is empty again

    def reset(self, buffer_size: int | None = None) -> None:
        """Remove every transition and the schema, optionally changing the capacity.

        The next add defines a new schema. Memmap files of the old contents are
        deleted. The random state is kept (the seeded stream continues).

        Args:
            buffer_size: new capacity; None keeps the current one.

        Raises:
            ArgumentError: ``buffer_size`` is not a positive integer (nothing changes).
        """
        with self._lock:
            if buffer_size is not None:
                self._capacity = check_int(buffer_size, "buffer_size", minimum=1)
            self._drop_storage(remove_files=True)
        if self.print_gc_warning:
            logger.warning("ReplayBuffer.reset: running the garbage collector")
        gc.collect()

    # ---------------------------------------------------------------- adding

    def add(
        self, experience: TensorDictBase | Mapping[str, Any], *, timeout: float | None = None
    ) -> None:
        """Add one transition.

        Args:
            experience: a TensorDict with batch size ``[]`` or a mapping of key ->
                tensor / numpy array / numpy or Python scalar, one item each (no
                batch dimension). The first add defines the schema.
            timeout: with a rate limiter, seconds to wait at most for room to
                insert (None: as long as it takes; 0: never wait). Unused without one.

        Raises:
            SchemaError: a missing or extra key, a wrong item shape, a dtype that
                does not cast to the column's, or a ``bytes``/``bytearray``/``str``
                value (wrap raw bytes with ``numpy.frombuffer``); the message names
                the key. Nothing is written then. Both add paths (compiled and
                NumPy) accept and refuse exactly the same values.
            RateLimitTimeout: the rate limiter kept the insert waiting past
                ``timeout`` (the actors are ahead of the learner); nothing is written.

        Cost: about 0.5 us for a CartPole transition given as a dict of NumPy
        arrays and scalars of the columns' dtypes on CPU storage (one compiled
        call checks every key, then copies the rows); about 2 us on the NumPy
        path (lists, tensors, casts, or no compiled kernel).
        A rate limiter that lets the insert through adds under 1 us.
        """
        limiter = self._limiter
        if limiter is None:
            if timeout is not None:
                check_number(timeout, "timeout", minimum=0)
            with self._lock:
                self._writer.add(experience)
            return
        limiter.reserve_inserts(1, timeout)
        writer = self._writer  # _add_counted, inlined: this is the per-step path
        try:
            with self._lock:
                before = writer.size
                writer.add(experience)
                deleted = 1 - (writer.size - before)
        except BaseException:
            limiter.cancel_inserts(1)
            raise
        limiter.commit_inserts(1, deleted)

    def _add_counted(self, limiter: RateLimiter, n: int, write: Any, data: Any) -> None:
        """Write ``n`` reserved inserts, then count them (and the rows they overwrote)."""
        try:
            with self._lock:
                before = self._writer.size
                write(data)
                grown = self._writer.size - before
        except BaseException:
            limiter.cancel_inserts(n)
            raise
        limiter.commit_inserts(n, n - grown)

    def add_batch(
        self, batch: TensorDictBase | Mapping[str, Any], *, timeout: float | None = None
    ) -> None:
        """Add N transitions, as if added one by one in order.

        The batch wraps around the end of the ring; a batch larger than the
        capacity keeps only its newest ``buffer_size`` items.

        Args:
            batch: a TensorDict with batch size ``[N]`` or a mapping of key ->
                tensor / array / list with a leading dimension N (the same for
                every key). The first add defines the schema from ``shape[1:]``.
            timeout: with a rate limiter, seconds to wait at most, in all (None:
                no limit). The limiter counts N inserts; when it allows fewer
                than N at once, the batch is written in parts, in order, each as
                soon as it is allowed (Reverb's per-item rule), so a batch larger
                than the error range never waits for room that cannot come.

        Raises:
            SchemaError: as :meth:`add`, or keys with different N. Nothing is
                written then.
            RateLimitTimeout: ``timeout`` passed while the limiter held back the
                rest of the batch; its first ``exc.completed`` rows were added.

        Cost: one compiled call that checks every key and copies the rows (one
        or two ``memcpy`` per column) for a dict of NumPy arrays of the columns'
        dtypes on CPU storage; otherwise one or two slice copies per column.
        """
        limiter = self._limiter
        n = None if limiter is None else _batch_rows(batch)
        if limiter is None or not n:
            # No limiter, or a batch of no rows or of no clear N (the writer
            # says what is wrong with it): nothing to count.
            if timeout is not None:
                check_number(timeout, "timeout", minimum=0)
            with self._lock:
                self._writer.add_batch(batch)
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        k = limiter.reserve_inserts(n, timeout)
        if k == n:
            self._add_counted(limiter, n, self._writer.add_batch, batch)
            return
        done = 0
        try:
            while True:
                self._add_counted(
                    limiter, k, self._writer.add_batch, _batch_rows_slice(batch, done, done + k)
                )
                done += k
                if done == n:
                    return
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                k = limiter.reserve_inserts(n - done, left)
        except RateLimitTimeout as exc:
            raise RateLimitTimeout(
                f"add_batch of {n} rows timed out after {timeout:g} s with the first {done} "
                f"added: {exc}",
                requested=n,
                completed=done,
            ) from None

    # -------------------------------------------------------------- sampling

    def sample_batch(self, batch_size: int, *, timeout: float | None = None) -> TensorDict:
        """Draw ``batch_size`` stored transitions at random, with replacement.

        With a rate limiter the call first waits until the limiter allows
        ``batch_size`` samples (at most ``timeout`` seconds; None: no limit; 0:
        never wait), then draws. Without one ``timeout`` is unused.

        Uniform buffers draw every stored item with equal probability.
        Prioritized buffers draw item i with probability ``p_i / sum p`` and add
        two entries: ``index`` (int64 storage positions, for
        :meth:`update_priorities`) and ``weight`` (float32 importance weights
        ``(p_i / p_min) ** -beta``, at most 1). A
        :class:`~.slices.SliceSampler` returns ``batch_size // slice_len``
        slices of ``slice_len`` consecutive steps of one episode (``index``
        ``[S, L]``; ``mask`` / ``weight`` as configured); a user's sampler, the
        rows of its :class:`~.sampler.Draw` with ``index`` and its extra entries.

        Returns:
            TensorDict of batch size ``[batch_size]`` on ``device``
            (``[batch_size // slice_len, slice_len]`` for slices).

        Raises:
            EmptyBufferError: nothing is stored (for slices: no valid start).
            ArgumentError: ``batch_size`` is not a positive integer (a ``ValueError``),
                or not a multiple of a slice sampler's ``slice_len``.
            SchemaError: a slice sampler's ``end_key`` is not a column.
            RateLimitTimeout: the rate limiter kept the call waiting past
                ``timeout`` (too few items, or the learner is ahead); no sample
                is counted.

        Cost: one random draw plus one gather per column (uniform; NumPy
        ``take`` on CPU storage, which keeps the GIL for small rows, else
        ``index_select``); prioritized adds an O(batch log capacity) tree search.
        """
        n = batch_size if type(batch_size) is int and batch_size > 0 else None
        if n is None:
            n = check_int(batch_size, "batch_size", minimum=1)
        limiter = self._limiter
        if limiter is not None:
            limiter.acquire_samples(n, timeout)
        elif timeout is not None:
            check_number(timeout, "timeout", minimum=0)
        try:
            with self._lock:
                w = self._writer
                return self._gatherer.sample(n, w.size, w.pointer, self._capacity)
        except BaseException:
            if limiter is not None:
                limiter.cancel_samples(n)  # nothing was drawn
            raise

    def sample_random(self, batch_size: int, *, timeout: float | None = None) -> TensorDict:
        """Alias of :meth:`sample_batch`."""
        return self.sample_batch(batch_size, timeout=timeout)

    def _checked_index(self, indices: Indices) -> torch.Tensor:
        idx = as_index_array(indices)
        if idx.size:
            require_items(self._writer.size)
        check_stored(idx, self._writer.size)
        return torch.from_numpy(idx).to(self.storing_device)

    def sample_by_index(self, indices: Indices) -> TensorDict:
        """The transitions at storage positions ``indices`` (repeats allowed), in that order.

        Positions are ``0..size-1``; once the ring has wrapped, position
        ``pointer`` holds the oldest item. With ``n_step > 1`` the batch holds
        the n-step entries too.

        Raises:
            EmptyBufferError: nothing is stored.
            BufferIndexError: an index is negative or ``>= size`` (named in the message).
        """
        with self._lock:
            require_items(self._writer.size)
            idx = self._checked_index(indices)
            nstep = self._gatherer.nstep
            extra = None if nstep is None else nstep.fields(idx, self._writer.pointer)
            return self._gatherer.gather(idx, extra)

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
            require_items(self._writer.size)
            assert self._fields is not None
            if not names:
                raise SchemaError("fields is empty: name at least one field")
            for name in names:
                if not isinstance(name, str) or name not in self._fields:
                    known = ", ".join(map(repr, self._fields))
                    raise SchemaError(f"unknown field {name!r}; the buffer stores {known}")
            idx = self._checked_index(indices)
            out = self._gatherer.gather_fields(names, idx)
        if not as_tuple:
            return batch_tensordict(out, idx.shape[0], self.device)
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
            require_items(self._writer.size)
            return self._gatherer.gather(self._all_positions(chronological))

    def _all_positions(self, chronological: bool) -> torch.Tensor:
        size = self._writer.size
        idx = torch.arange(size, device=self.storing_device)
        if chronological and size == self._capacity:
            idx = (idx + self._writer.pointer) % self._capacity
        return idx

    # ----------------------------------------------------------- prioritized

    def update_priorities(self, indices: Indices, priorities: Any) -> None:
        """Set the priorities of stored items (e.g. to their absolute TD errors).

        The stored priority is ``(|p| + eps) ** alpha``; the running maximum
        (given to new items) grows accordingly. Repeated indices: the last wins.
        Validation happens before anything changes.

        Args:
            indices: storage positions, e.g. a sample's ``index`` entry: flat
                (``[B]``), or a slice sample's ``[S, L]`` (its -1 padding
                entries are skipped).
            priorities: one finite, non-negative value per index, the same
                shape (``[S, L]`` for a slice sample: each step its own).

        Raises:
            PriorityError: a sampler without priorities (uniform), counts
                differ, or a NaN, infinite or negative priority (the message
                names the index).
            BufferIndexError: an index is not a stored position.

        Note: an item overwritten between sampling and the update gets the
        priority meant for its predecessor (as in every ring-buffer PER).
        """
        with self._lock:
            policy = self._sampler
            if type(policy) is UniformSampler or (
                type(policy) is SliceSampler and not policy.prioritized
            ):
                raise no_priorities("update_priorities")
            idx, raw = check_priority_update(indices, priorities, self._writer.size)
            policy.update_priorities(idx, raw)

    def _priority_reader(self, what: str) -> PriorityHolder:
        holder = self._priority_holder()
        if holder is None:
            raise no_priorities(what)
        return holder

    def priorities(self) -> np.ndarray:
        """Stored priorities ``(|p| + eps) ** alpha`` of positions ``0..size-1`` (a copy).

        Raises:
            PriorityError: the sampler keeps no priorities (uniform, a user's own).
        """
        with self._lock:
            return self._priority_reader("priorities").stored_priorities(self._writer.size)

    def priorities_at(self, indices: Indices) -> np.ndarray:
        """Stored priorities ``(|p| + eps) ** alpha`` of the items at storage positions ``indices``.

        Args:
            indices: storage positions (any shape: a sample's ``[B]`` or ``[S, L]``
                ``index``; repeats allowed).

        Returns:
            float64 array of the shape of ``indices`` (a copy). For a
            :class:`~.slices.SliceSampler` these are the step priorities (a
            slice's priority is computed from them).

        Raises:
            PriorityError: the sampler keeps no priorities (uniform, a user's own).
            BufferIndexError: an index is not a stored position.
        """
        shape = np.shape(indices.detach().cpu() if isinstance(indices, torch.Tensor) else indices)
        with self._lock:
            holder = self._priority_reader("priorities_at")
            idx = as_index_array(indices)
            check_stored(idx, self._writer.size)
            return holder.priorities_at(idx).reshape(shape)

    def priority_stats(self) -> tuple[float, float]:
        """``(sum, min)`` of the stored priorities of the stored items.

        The normalisers of proportional sampling: item i is drawn with
        probability ``p_i / sum``, and its importance weight is
        ``(p_i / min) ** -beta``. O(1) for :class:`~.sampler.PrioritizedSampler`
        (read off its sum tree); O(size) for a prioritized slice sampler.

        Raises:
            PriorityError: the sampler keeps no priorities.
            EmptyBufferError: nothing is stored.
        """
        with self._lock:
            holder = self._priority_reader("priority_stats")
            require_items(self._writer.size)
            if type(holder) is PrioritizedSampler:
                return holder.total_and_min()
            values = holder.stored_priorities(self._writer.size)
            return float(values.sum()), float(values.min())
