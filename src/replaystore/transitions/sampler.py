"""Which stored transitions are picked: random draws, epochs, and the gather into a batch.

* :class:`Sampler` is the protocol of a sampling policy: given the ring's
  size and write position and a random generator it draws storage positions
  (:meth:`Sampler.sample`); the buffer tells it of every row written
  (:meth:`Sampler.on_write`) and of priority updates
  (:meth:`Sampler.update_priorities`). Built in: :class:`UniformSampler`,
  :class:`PrioritizedSampler` and :class:`~.slices.SliceSampler`; a user's
  own class with these four methods works too.
* :class:`BatchGatherer` owns the buffer's seeded generators, asks the
  policy for positions and gathers those rows of every column into a TensorDict
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

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from numpy.typing import NDArray
from tensordict import TensorDict

from replaystore._tensordict_compat import batch_tensordict, shaped_tensordict
from replaystore.errors import BufferIndexError, EmptyBufferError, PriorityError, check_number
from replaystore.transitions.nstep import NStepReader
from replaystore.transitions.prioritized import PriorityIndex, check_stored, stored_priorities
from replaystore.transitions.storage import MemmapStorage, TensorStorage

__all__ = [
    "BatchGatherer",
    "Draw",
    "EpochIterator",
    "EpochSchedule",
    "PrioritizedSampler",
    "RingState",
    "RngState",
    "Sampler",
    "UniformSampler",
]

#: Rows up to this many bytes (all columns) are sampled with NumPy gathers on CPU.
NUMPY_GATHER_MAX_ROW_BYTES = 4096


def require_items(size: int) -> None:
    """Raise EmptyBufferError when nothing is stored."""
    if size == 0:
        raise EmptyBufferError("the replay buffer is empty: add transitions before sampling")


@dataclass(slots=True)
class RingState:
    """What a :class:`Sampler` sees of the buffer when it draws.

    Stored rows are positions ``0..size-1``. Before the ring is full the oldest
    is 0 and the newest ``size - 1``; once full (``size == capacity``) the
    oldest is ``pointer`` and the newest ``pointer - 1`` (modulo ``capacity``).
    Every stored row is complete: the buffer's lock keeps a row that is being
    written out of every draw.
    """

    capacity: int
    """Rows in the ring."""
    size: int
    """Rows holding a transition."""
    pointer: int
    """The write position: the row the next transition goes to."""
    columns: Mapping[str, torch.Tensor]
    """The stored columns (``[capacity, *item_shape]`` each, on the storing device;
    rows at or past ``size`` hold nothing yet). Read them, never write them."""


@dataclass(slots=True)
class Draw:
    """Storage positions drawn by a :class:`Sampler`, and entries to add to the batch.

    ``index`` has shape ``[B]`` (single transitions) or ``[S, L]`` (``S`` rows
    of ``L`` steps); the batch gets that batch size. An entry of -1 is padding:
    its row in the batch is all zeros. ``extra`` entries (NumPy arrays or
    tensors of the same leading shape, e.g. ``weight``, ``mask``) are added to
    the batch as they are, beside ``index`` itself.
    """

    index: NDArray[np.int64]
    extra: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Sampler(Protocol):
    """A sampling policy of a :class:`~.buffer.ReplayBuffer`: which stored rows a sample holds.

    Pass an instance as ``ReplayBuffer(..., sampler=obj)``; one instance serves
    one buffer. The buffer calls every method under its lock, so a sampler
    needs no locking of its own, and never calls :meth:`sample` on an empty
    buffer.

    * :meth:`reset` is called with the capacity when the buffer adopts the
      sampler and whenever it is emptied (``reset``, ``close``, ``load``):
      forget every row.
    * :meth:`on_write` is called after every ``add`` / ``add_batch`` with the
      positions written (``start .. start + count - 1`` modulo the capacity,
      oldest first): those rows now hold new, complete transitions.
      ``count`` never exceeds the capacity.
    * :meth:`sample` draws positions for ``sample_batch(batch_size)`` from the
      ring's ``size``, write position ``pointer`` and columns
      (:class:`RingState`), using only ``rng`` (the buffer's seeded
      ``numpy.random.Generator``) for randomness, so seeded buffers repeat.
    * :meth:`update_priorities` receives ``update_priorities`` calls: validated
      positions (1-D int64, each a stored row) and their raw priorities (1-D
      float64, finite, ``>= 0``). A sampler without priorities raises
      :class:`~replaystore.errors.PriorityError`.

    The returned :class:`Draw` becomes the batch: rows ``draw.index`` of every
    column, an ``index`` entry with the positions and ``draw.extra``.
    Checkpoints save the contents of a buffer with a user's sampler but refuse
    to load into it (its state is unknown to them).
    """

    def reset(self, capacity: int) -> None:
        """Forget every row; the ring now has ``capacity`` rows, none stored."""

    def on_write(self, start: int, count: int) -> None:
        """Rows ``start .. start + count - 1`` (modulo the capacity) were written."""

    def sample(self, batch_size: int, ring: RingState, rng: np.random.Generator) -> Draw:
        """Positions (``[B]`` or ``[S, L]``, each in ``0..ring.size-1`` or -1 for padding)."""

    def update_priorities(self, index: NDArray[np.int64], priority: NDArray[np.float64]) -> None:
        """New raw priorities for stored rows ``index`` (the last value wins for repeats)."""


def no_priorities(what: str) -> PriorityError:
    """The error of a priority call on a buffer whose sampler keeps no priorities."""
    return PriorityError(
        f"{what} needs a buffer created with sampler='prioritized', PrioritizedSampler() "
        "or SliceSampler(prioritized=True)"
    )


class UniformSampler:
    """Every stored transition equally likely, drawn with replacement.

    ``ReplayBuffer(..., sampler="uniform")`` is the same. Batches hold the
    columns only (no ``index``). It keeps no state.
    """

    kind = "uniform"
    prioritized = False

    def reset(self, capacity: int) -> None:
        """Nothing to forget."""

    def on_write(self, start: int, count: int) -> None:
        """Nothing to note."""

    def sample(self, batch_size: int, ring: RingState, rng: np.random.Generator) -> Draw:
        """``batch_size`` positions drawn uniformly from ``0..ring.size-1``."""
        return Draw(rng.integers(0, ring.size, batch_size))

    def update_priorities(self, index: NDArray[np.int64], priority: NDArray[np.float64]) -> None:
        """Raises :class:`~replaystore.errors.PriorityError`: uniform sampling has no priorities."""
        raise no_priorities("update_priorities")

    def settings(self) -> dict[str, Any]:
        """What a checkpoint records of this sampler."""
        return {"kind": self.kind}

    def __repr__(self) -> str:
        return "UniformSampler()"


class PrioritizedSampler:
    """Proportional prioritized replay (Schaul et al., 2016), with importance weights.

    Item i is drawn with probability ``p_i / sum_j p_j`` where the stored
    priority is ``p_i = (|delta_i| + eps) ** alpha``; new items get the largest
    stored priority so far (1.0 before any update). Batches add ``index``
    (int64 positions ``[B]``) and ``weight`` (float32 ``(p_i / p_min) ** -beta``,
    at most 1). ``ReplayBuffer(..., sampler="prioritized", alpha=, beta=, eps=)``
    is the same.

    Args:
        alpha: priority exponent, >= 0 (0 is uniform).
        beta: importance-weight exponent, >= 0; settable (``buf.beta`` too).
        eps: added to ``|p|`` so no item has probability 0, > 0.

    Raises:
        ArgumentError: an exponent or ``eps`` out of range.

    Cost: a draw of B is an O(B log capacity) sum-tree search.
    """

    kind = "prioritized"
    prioritized = True

    def __init__(self, alpha: float = 0.6, beta: float = 0.4, eps: float = 1e-6) -> None:
        self.alpha = check_number(alpha, "alpha", minimum=0)
        self._beta = check_number(beta, "beta", minimum=0)
        self.eps = check_number(eps, "eps", minimum=0, strict=True)
        self.index = PriorityIndex(1, self.alpha, self._beta, self.eps)
        """The priorities of the ring's rows (re-created by :meth:`reset`)."""

    @property
    def beta(self) -> float:
        """Importance-weight exponent (anneal it towards 1)."""
        return self._beta

    @beta.setter
    def beta(self, value: float) -> None:
        self._beta = check_number(value, "beta", minimum=0)
        self.index.beta = self._beta

    @property
    def max_priority(self) -> float:
        """The priority new rows get: the largest stored so far (1.0 before any update)."""
        return self.index.max_priority

    def reset(self, capacity: int) -> None:
        """Forget every priority (a ring of ``capacity`` rows)."""
        self.index = PriorityIndex(capacity, self.alpha, self._beta, self.eps)

    def on_write(self, start: int, count: int) -> None:
        """New rows get the current maximum priority."""
        self.index.mark_new_range(start, count)

    def sample(self, batch_size: int, ring: RingState, rng: np.random.Generator) -> Draw:
        """``batch_size`` positions drawn proportionally to priority, with ``weight``."""
        idx, weight = self.index.sample(batch_size, rng)
        return Draw(idx, {"weight": weight})

    def update_priorities(self, index: NDArray[np.int64], priority: NDArray[np.float64]) -> None:
        """Store ``(priority + eps) ** alpha`` at ``index`` (``priority`` is modified)."""
        self.index.update(index, stored_priorities(priority, self.alpha, self.eps))

    def priorities_at(self, index: NDArray[np.int64]) -> NDArray[np.float64]:
        """Stored priorities of the stored rows ``index`` (validated by the caller)."""
        return self.index.values_at(index)

    def stored_priorities(self, size: int) -> NDArray[np.float64]:
        """Stored priorities of rows ``0..size-1`` (a copy)."""
        return self.index.values(size)

    def total_and_min(self) -> tuple[float, float]:
        """Sum and minimum of the stored priorities (O(1): the sum tree's root)."""
        self.index.apply_pending()
        return self.index.tree.total, self.index.tree.min

    def restore_priorities(self, values: NDArray[np.float64], max_priority: float) -> None:
        """Replace every stored priority: ``values`` for rows ``0..len-1``, none after."""
        self.index.restore(values, max_priority)

    def settings(self) -> dict[str, Any]:
        """What a checkpoint records of this sampler (besides its priorities)."""
        return {"kind": self.kind, "alpha": self.alpha, "beta": self._beta, "eps": self.eps}

    def __repr__(self) -> str:
        return f"PrioritizedSampler(alpha={self.alpha}, beta={self._beta}, eps={self.eps})"


class BatchGatherer:
    """Seeded draws of stored positions and gathers of those rows into a batch.

    Args:
        storing_device: where the columns live (and the torch generator).
        device: where batches go.
        seed: seeds both generators (``None``: fresh entropy). The torch one
            shuffles epochs and draws uniform samples off the NumPy path; the
            NumPy one draws uniform samples on it and prioritized samples.

    Attributes:
        policy: the :class:`Sampler` that draws positions.
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
        self.policy: Sampler = UniformSampler()
        self.nstep: NStepReader | None = None
        """Set by a buffer with ``n_step > 1``: adds the n-step entries to every sample."""
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
        batch_device = self._batch_device
        if batch_device is None:
            out = {name: col.index_select(0, idx) for name, col in self._column_items}
            if extra:
                out.update(extra)
        else:
            # Each column's rows go to the batch device before the next column is
            # gathered, so one host copy is alive at a time. With all of them kept
            # at once (14 MiB for 256 Atari-like rows) a sample_batch(256) took
            # 2.8 ms against 1.5 ms for index_select + .to per column on an H200
            # host (2026-11-26; most likely the allocator returning and faulting in
            # the 14 MiB on every call).
            out = {
                name: col.index_select(0, idx).to(batch_device) for name, col in self._column_items
            }
            if extra:
                out.update({k: v.to(batch_device) for k, v in extra.items()})
        return batch_tensordict(out, idx.shape[0], self.device)

    def gather_fields(self, names: list[str], idx: torch.Tensor) -> dict[str, torch.Tensor]:
        """Rows ``idx`` of the columns ``names`` (validated by the caller), on ``device``."""
        return {name: self._columns[name].index_select(0, idx).to(self.device) for name in names}

    # -------------------------------------------------------------- draws

    def sample(self, n: int, size: int, pointer: int, capacity: int) -> TensorDict:
        """A batch for ``sample_batch(n)`` from the ``size`` stored rows, drawn by :attr:`policy`.

        Uniform: ``n`` rows, every position equally likely. Prioritized: position
        i with probability ``p_i / sum p``, plus ``index`` (int64 positions) and
        ``weight`` (float32 importance weights) entries. Any other policy: the
        rows of its :class:`Draw`, with ``index`` and its extra entries.

        Raises:
            EmptyBufferError: ``size`` is 0.
        """
        arrays = self._array_items
        policy = self.policy
        nstep = self.nstep
        if type(policy) is UniformSampler and size:
            if arrays is not None:
                # NumPy draw and gathers: unlike torch calls, none of them
                # releases the GIL for small rows (see the module docstring).
                pos = self.numpy_rng.integers(0, size, n)
                out = {name: torch.from_numpy(a.take(pos, axis=0)) for name, a in arrays}
                if nstep is not None:
                    nstep.fill(out, pos, pointer)
                return batch_tensordict(out, n, self.device)
            if self._on_cpu:
                idx = torch.randint(size, (n,), generator=self.torch_generator)
            else:
                gen = self.torch_generator
                idx = torch.randint(size, (n,), generator=gen, device=self.storing_device)
            return self.gather(idx, None if nstep is None else nstep.fields(idx, pointer))
        require_items(size)
        if type(policy) is PrioritizedSampler:
            slots, weights = policy.index.sample(n, self.numpy_rng)
            idx = torch.from_numpy(slots)
            weight = torch.from_numpy(weights)
            if arrays is not None:
                out = {name: torch.from_numpy(a.take(slots, axis=0)) for name, a in arrays}
                out["index"] = idx
                out["weight"] = weight
                if nstep is not None:
                    nstep.fill(out, slots, pointer)
                return batch_tensordict(out, n, self.device)
            if not self._on_cpu:  # storage on an accelerator (.to costs ~0.5 us on CPU)
                idx = idx.to(self.storing_device)
                weight = weight.to(self.storing_device)
            extra = {"index": idx, "weight": weight}
            if nstep is not None:
                extra.update(nstep.fields(idx, pointer))
            return self.gather(idx, extra)
        ring = RingState(capacity, size, pointer, self._columns)
        return self.gather_draw(policy.sample(n, ring, self.numpy_rng), size, pointer)

    def gather_draw(self, draw: Draw, size: int, pointer: int | None = None) -> TensorDict:
        """The batch of a :class:`Draw`: its rows (zeros where ``index`` is -1), ``index``
        and its extra entries, with the batch size of ``draw.index`` (``[B]`` or ``[S, L]``).
        With :attr:`nstep` and the ring's write position ``pointer``: the n-step
        entries too (zeros where ``index`` is -1).

        Raises:
            TypeError: ``draw`` is not a Draw.
            BufferIndexError: a position is not a stored row (nor -1).
        """
        if not isinstance(draw, Draw):
            raise TypeError(f"a Sampler's sample() must return a Draw, got {type(draw).__name__}")
        raw = draw.index
        if isinstance(raw, torch.Tensor):
            raw = raw.detach().cpu().numpy()
        index_np = np.asarray(raw)
        if index_np.dtype != np.int64:
            if index_np.dtype.kind not in "iu":
                raise BufferIndexError(f"a Draw's index must hold integers, got {index_np.dtype}")
            index_np = index_np.astype(np.int64)
        shape = index_np.shape
        flat = index_np.reshape(-1)
        padding = flat < 0
        padded = bool(flat.size) and bool(padding.any())
        pos = np.maximum(flat, 0) if padded else flat
        if padded and (flat[padding] != -1).any():
            raise BufferIndexError("a Sampler's draw holds a negative index other than -1")
        check_stored(pos, size)
        pad = padding.reshape(shape) if padded else None
        arrays = self._array_items
        out: dict[str, torch.Tensor]
        if arrays is not None:
            out = {}
            for name, a in arrays:
                rows = a.take(pos, axis=0).reshape(*shape, *a.shape[1:])
                if pad is not None:
                    rows[pad] = 0
                out[name] = torch.from_numpy(rows)
        else:
            dev_pos = torch.from_numpy(pos)
            if not self._on_cpu:
                dev_pos = dev_pos.to(self.storing_device)
            out = {
                name: col.index_select(0, dev_pos).reshape(*shape, *col.shape[1:])
                for name, col in self._column_items
            }
            if pad is not None:
                keep = torch.from_numpy(~pad)
                if not self._on_cpu:
                    keep = keep.to(self.storing_device)
                for value in out.values():
                    value[~keep] = 0
        index = torch.from_numpy(index_np)
        if not self._on_cpu:
            index = index.to(self.storing_device)
        out["index"] = index
        for name, value in draw.extra.items():
            tensor = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
            out[name] = tensor if self._on_cpu else tensor.to(self.storing_device)
        if self.nstep is not None and pointer is not None:
            mask = None if pad is None else torch.from_numpy(~pad)
            if mask is not None and not self._on_cpu:
                mask = mask.to(self.storing_device)
            out.update(self.nstep.fields(index, pointer, mask))
        if self._batch_device is not None:
            out = {k: v.to(self._batch_device) for k, v in out.items()}
        return shaped_tensordict(out, shape, self.device)

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

    def epoch_batch(self, idx: torch.Tensor, pointer: int | None = None) -> TensorDict:
        """An epoch batch of rows ``idx``: prioritized buffers add ``index`` and unit ``weight``;
        with :attr:`nstep` and the write position ``pointer``, the n-step entries."""
        extra: dict[str, torch.Tensor] = {}
        if getattr(self.policy, "prioritized", False):
            ones = torch.ones(idx.shape[0], dtype=torch.float32, device=self.storing_device)
            extra = {"index": idx, "weight": ones}
        if self.nstep is not None and pointer is not None:
            extra.update(self.nstep.fields(idx, pointer))
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

    def next_indices(self, size: int, sampler: BatchGatherer) -> torch.Tensor | None:
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
