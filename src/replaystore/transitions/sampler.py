"""Which stored transitions are picked: random draws, epochs, and the gather into a batch.

* :class:`TransitionSampler` draws positions (uniform with replacement, or
  proportional to priorities through a :class:`.PriorityIndex`) with its own
  seeded generators, and gathers those rows of every column into a TensorDict
  on the training device. On CPU storage whose columns all have NumPy views and
  small rows, the draw and the gathers are NumPy calls (``Generator.integers``,
  one ``take`` per column, wrapped with ``torch.from_numpy``): unlike torch
  calls they keep the GIL, so a sample is not interrupted by a writer thread
  (see ``benchmarks/RESULTS.md``, "Sampling under a busy writer"). Otherwise
  one ``torch.randint`` and one ``index_select`` per column.
* :class:`EpochSchedule` is the state of a run of epochs: the current epoch's
  permutation and how far it has been handed out. It is a plain object that
  the buffer advances under its lock, one batch per call, so any number of
  threads can draw from one schedule: between them they get each batch of
  the schedule exactly once, so each stored item exactly once per epoch.
  :class:`EpochIterator` is the iterator over a schedule that
  ``create_epoch_iterator`` returns.

Nothing here is thread-safe by itself: the buffer calls every method under its
lock (the iterator through a callable that takes it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from replaystore._tensordict_compat import batch_tensordict
from replaystore.errors import EmptyBufferError
from replaystore.transitions.prioritized import PriorityIndex
from replaystore.transitions.storage import MemmapStorage, TensorStorage

__all__ = ["EpochIterator", "EpochSchedule", "RngState", "TransitionSampler"]

#: Rows up to this many bytes (all columns) are sampled with NumPy gathers on CPU.
NUMPY_GATHER_MAX_ROW_BYTES = 4096


def require_items(size: int) -> None:
    """Raise EmptyBufferError when nothing is stored."""
    if size == 0:
        raise EmptyBufferError("the replay buffer is empty: add transitions before sampling")


class TransitionSampler:
    """Seeded draws of stored positions and gathers of those rows into a batch.

    Args:
        storing_device: where the columns live (and the torch generator).
        device: where batches go.
        seed: seeds both generators (``None``: fresh entropy). The torch one
            shuffles epochs and draws uniform samples off the NumPy path; the
            NumPy one draws uniform samples on it and prioritized samples.

    Attributes:
        priorities: the priority index of a prioritized buffer, else None.
        torch_generator: the ``torch.Generator`` on ``storing_device``.
        numpy_rng: the ``numpy.random.Generator``.
    """

    _columns: dict[str, torch.Tensor]
    _column_items: list[tuple[str, torch.Tensor]]
    # (name, NumPy view) of every column when sampling gathers with NumPy, else None.
    _array_items: list[tuple[str, np.ndarray]] | None

    def __init__(
        self, storing_device: torch.device, device: torch.device, seed: int | None
    ) -> None:
        self.storing_device = storing_device
        self.device = device
        self.priorities: PriorityIndex | None = None
        seq = np.random.SeedSequence(seed)
        self.torch_generator = torch.Generator(device=storing_device)
        self.torch_generator.manual_seed(int(seq.generate_state(1, np.uint64)[0] >> np.uint64(1)))
        self.numpy_rng = np.random.Generator(np.random.PCG64(seq.spawn(1)[0]))
        self._batch_device = None if device == storing_device else device
        # The device keyword costs ~1 us on CPU; CUDA generators need it.
        self._on_cpu = storing_device.type == "cpu"
        self.unbind()

    def bind(self, storage: TensorStorage | MemmapStorage) -> None:
        """Gather from ``storage``'s columns from now on."""
        names = [f.name for f in storage.fields]
        arrays = [a for a in (storage.arrays[name] for name in names) if a is not None]
        self._columns = dict(storage.columns)
        self._column_items = [(name, storage.columns[name]) for name in names]
        # NumPy gathers keep the GIL (good under a busy writer thread) but are single
        # threaded copies: for large rows (Atari frames) torch's index_select is
        # faster (measured 1.48x slower with NumPy at 56 KiB rows), and releasing the
        # GIL during a long copy is what a writer thread wants anyway.
        row_bytes = sum(a.itemsize * (a.size // max(len(a), 1)) for a in arrays)
        numpy_gathers = (
            len(arrays) == len(names)
            and self._batch_device is None
            and row_bytes <= NUMPY_GATHER_MAX_ROW_BYTES
        )
        self._array_items = list(zip(names, arrays, strict=True)) if numpy_gathers else None

    def unbind(self) -> None:
        """Forget the storage (its views are released)."""
        self._columns = {}
        self._column_items = []
        self._array_items = None

    # ------------------------------------------------------------ gathers

    def gather(self, idx: torch.Tensor, extra: dict[str, torch.Tensor] | None = None) -> TensorDict:
        """Rows ``idx`` (on the storing device) of every column, as a TensorDict on ``device``.

        ``extra`` entries (same leading length) are added as they are.
        """
        out = {name: col.index_select(0, idx) for name, col in self._column_items}
        if extra:
            out.update(extra)
        if self._batch_device is not None:
            out = {k: v.to(self._batch_device) for k, v in out.items()}
        return batch_tensordict(out, idx.shape[0], self.device)

    def gather_fields(self, names: list[str], idx: torch.Tensor) -> dict[str, torch.Tensor]:
        """Rows ``idx`` of the columns ``names`` (validated by the caller), on ``device``."""
        return {name: self._columns[name].index_select(0, idx).to(self.device) for name in names}

    # -------------------------------------------------------------- draws

    def sample(self, n: int, size: int) -> TensorDict:
        """``n`` rows drawn with replacement from positions ``0..size-1``.

        Uniform: every position equally likely. Prioritized: position i with
        probability ``p_i / sum p``, plus ``index`` (int64 positions) and
        ``weight`` (float32 importance weights) entries.

        Raises:
            EmptyBufferError: ``size`` is 0.
        """
        arrays = self._array_items
        if self.priorities is None and size:
            if arrays is not None:
                # NumPy draw and gathers: unlike torch calls, none of them
                # releases the GIL for small rows (see the module docstring).
                pos = self.numpy_rng.integers(0, size, n)
                out = {name: torch.from_numpy(a.take(pos, axis=0)) for name, a in arrays}
                return batch_tensordict(out, n, self.device)
            if self._on_cpu:
                idx = torch.randint(size, (n,), generator=self.torch_generator)
            else:
                gen = self.torch_generator
                idx = torch.randint(size, (n,), generator=gen, device=self.storing_device)
            return self.gather(idx)
        require_items(size)
        assert self.priorities is not None  # uniform samplers with items returned above
        slots, weights = self.priorities.sample(n, self.numpy_rng)
        idx = torch.from_numpy(slots)
        weight = torch.from_numpy(weights)
        if arrays is not None:
            out = {name: torch.from_numpy(a.take(slots, axis=0)) for name, a in arrays}
            out["index"] = idx
            out["weight"] = weight
            return batch_tensordict(out, n, self.device)
        if not self._on_cpu:  # storage on an accelerator (.to costs ~0.5 us on CPU)
            idx = idx.to(self.storing_device)
            weight = weight.to(self.storing_device)
        return self.gather(idx, {"index": idx, "weight": weight})

    # ------------------------------------------------------ random state

    def rng_state(self) -> tuple[bytes, dict[str, Any]]:
        """Both generators' states: torch's as raw bytes, NumPy's PCG64 state dict."""
        torch_state = bytes(self.torch_generator.get_state().numpy().tobytes())
        return torch_state, dict(self.numpy_rng.bit_generator.state)

    def check_rng_state(
        self, torch_state: bytes, numpy_state: dict[str, Any], torch_device_type: str
    ) -> RngState:
        """A saved state checked against fresh generators, ready for :meth:`set_rng_state`.

        The torch state only fits a generator of the device type it was saved
        on (CPU and CUDA states differ); for another one it is left out
        (``RngState.torch_state`` is None) and this sampler keeps its own.

        Raises:
            RuntimeError, TypeError, ValueError, KeyError: a state the generators refuse.
        """
        state: torch.Tensor | None = None
        if torch_device_type == self.storing_device.type:
            state = torch.frombuffer(bytearray(torch_state), dtype=torch.uint8)
            torch.Generator(device=self.storing_device).set_state(state)
        bitgen = np.random.PCG64()
        bitgen.state = numpy_state  # type: ignore[assignment]  # PCG64 checks it
        return RngState(state, bitgen)

    def set_rng_state(self, state: RngState) -> None:
        """Continue both random streams from a checked saved state."""
        if state.torch_state is not None:
            self.torch_generator.set_state(state.torch_state)
        self.numpy_rng = np.random.Generator(state.numpy_bit_generator)

    def permutation(self, size: int, shuffle: bool) -> torch.Tensor:
        """One epoch's order of positions ``0..size-1`` (a seeded permutation, or in order)."""
        if shuffle:
            return torch.randperm(size, generator=self.torch_generator, device=self.storing_device)
        return torch.arange(size, device=self.storing_device)

    def epoch_batch(self, idx: torch.Tensor) -> TensorDict:
        """An epoch batch of rows ``idx``: prioritized buffers add ``index`` and unit ``weight``."""
        extra = None
        if self.priorities is not None:
            ones = torch.ones(idx.shape[0], dtype=torch.float32, device=self.storing_device)
            extra = {"index": idx, "weight": ones}
        return self.gather(idx, extra)


@dataclass(slots=True)
class RngState:
    """A checked saved state of a sampler's generators (see ``check_rng_state``)."""

    torch_state: torch.Tensor | None
    """The torch generator's state, or None when saved on another device type."""
    numpy_bit_generator: np.random.PCG64


class EpochSchedule:
    """``n_epochs`` passes over the stored items, handed out one batch at a time.

    Each epoch's order is drawn when its first batch is asked for, over the
    items stored at that moment; the epoch then hands out
    ``order[k * batch_size : (k + 1) * batch_size]`` for k = 0, 1, ... (the last
    one partial unless ``drop_last``). Every call of :meth:`next_indices` takes
    the next batch, whoever calls: consumers sharing a schedule share its
    epochs. Not thread-safe by itself (the buffer calls it under its lock).
    """

    __slots__ = ("_next", "_order", "_stop", "batch_size", "drop_last", "epochs_left", "shuffle")

    def __init__(self, batch_size: int, n_epochs: int, shuffle: bool, drop_last: bool) -> None:
        self.batch_size = batch_size
        self.epochs_left = n_epochs
        self.shuffle = shuffle
        self.drop_last = drop_last
        self._order: torch.Tensor | None = None
        self._next = 0
        self._stop = 0

    @property
    def exhausted(self) -> bool:
        """Every batch of every epoch has been handed out."""
        return self._order is None and self.epochs_left == 0

    def next_indices(self, size: int, sampler: TransitionSampler) -> torch.Tensor | None:
        """The positions of the next batch, or None when the schedule is exhausted.

        ``size`` is the number of stored items now (used when an epoch starts);
        ``sampler`` draws the permutation.
        """
        while self._order is None:
            if self.epochs_left == 0:
                return None
            self.epochs_left -= 1
            order = sampler.permutation(size, self.shuffle)
            stop = size - size % self.batch_size if self.drop_last else size
            if stop > 0:
                self._order, self._next, self._stop = order, 0, stop
        start = self._next
        idx = self._order[start : start + self.batch_size]
        self._next = start + self.batch_size
        if self._next >= self._stop:
            self._order = None
        return idx


class EpochIterator(Iterator[TensorDict]):
    """Iterator over the batches of an :class:`EpochSchedule`.

    Safe to share between threads: each ``next`` takes the buffer's lock and
    the next batch of the schedule, so between them the threads get each batch
    once. ``get_next_batch`` draws from the same schedule while it is the
    buffer's current one.
    """

    def __init__(
        self, schedule: EpochSchedule, fetch: Callable[[EpochSchedule], TensorDict | None]
    ) -> None:
        self.schedule = schedule
        self._fetch = fetch

    def __iter__(self) -> EpochIterator:
        return self

    def __next__(self) -> TensorDict:
        batch = self._fetch(self.schedule)
        if batch is None:
            raise StopIteration
        return batch

    def __repr__(self) -> str:
        s = self.schedule
        return (
            f"EpochIterator(batch_size={s.batch_size}, epochs_left={s.epochs_left}, "
            f"shuffle={s.shuffle}, drop_last={s.drop_last})"
        )
