"""The transition buffer's checkpoints: ``save`` and ``load``, ours and ObjectRL's.

:class:`CheckpointMethods` holds :class:`~replaystore.transitions.buffer.ReplayBuffer`'s
``save`` and ``load``: the snapshot of the buffer's state that
:mod:`.checkpoint` writes (atomically, no pickle) and its restore, checked before the
buffer changes; and ObjectRL's metadata-only checkpoints, applied as ObjectRL applies them.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from replaystore.errors import CheckpointError, ConfigError, EmptyBufferError
from replaystore.transitions.checkpoint import (
    ObjectRLMetadata,
    Snapshot,
    read_checkpoint,
    read_objectrl_metadata,
    write_checkpoint,
)
from replaystore.transitions.rate_limiter import RateLimiter
from replaystore.transitions.sampler import (
    BatchGatherer,
    EpochSchedule,
    PrioritizedSampler,
    Sampler,
    UniformSampler,
)
from replaystore.transitions.schema import FieldSpec
from replaystore.transitions.slices import SliceSampler
from replaystore.transitions.storage import MemmapState, MemmapStorage, TensorStorage
from replaystore.transitions.writer import RingWriter

__all__ = ["BUILT_IN_SAMPLERS", "SAMPLER_KINDS", "CheckpointMethods", "PriorityHolder"]

logger = logging.getLogger(__name__)

#: The samplers whose state a checkpoint saves and restores, and their kinds.
BUILT_IN_SAMPLERS = (UniformSampler, PrioritizedSampler, SliceSampler)
SAMPLER_KINDS = tuple(cls.kind for cls in BUILT_IN_SAMPLERS)
#: The built-in samplers that keep priorities.
PriorityHolder = PrioritizedSampler | SliceSampler


class CheckpointMethods:
    """``save``/``load`` of :class:`~replaystore.transitions.buffer.ReplayBuffer` (a base
    class of it, not used alone): they read the buffer's state under its lock."""

    _lock: threading.Lock
    _writer: RingWriter
    _gatherer: BatchGatherer
    _epochs: EpochSchedule | None
    _storage: TensorStorage | MemmapStorage | None
    _capacity: int
    _limiter: RateLimiter | None
    _sampler: Sampler
    _beta: float
    storing_device: torch.device

    if TYPE_CHECKING:

        def _priority_holder(self) -> PriorityHolder | None: ...

        def _check_nstep_fields(self, fields: Sequence[FieldSpec]) -> None: ...

        def _new_storage(self, fields: list[FieldSpec]) -> TensorStorage | MemmapStorage: ...

        def _install(self, storage: TensorStorage | MemmapStorage) -> None: ...

        def _rows_replaced(self) -> None: ...

        def _memmap_state(self) -> MemmapState: ...

    def _snapshot(self) -> Snapshot:
        assert self._storage is not None
        size = self._writer.size
        policy = self._sampler
        if type(policy) in BUILT_IN_SAMPLERS:
            sampler: dict[str, Any] = policy.settings()  # type: ignore[attr-defined]
        else:  # recorded so that a load can say what it cannot restore
            name = f"{type(policy).__module__}.{type(policy).__qualname__}"
            sampler = {"kind": "user", "class": name}
        priorities = None
        holder = self._priority_holder()
        if holder is not None:
            sampler["max_priority"] = holder.max_priority
            priorities = holder.stored_priorities(size)
        torch_rng, numpy_rng = self._gatherer.rng_state()
        return Snapshot(
            capacity=self._capacity,
            size=size,
            pointer=self._writer.pointer,
            fields=list(self._storage.fields),
            columns={k: c[:size] for k, c in self._storage.columns.items()},
            sampler=sampler,
            priorities=priorities,
            torch_rng=torch_rng,
            numpy_rng=numpy_rng,
            torch_rng_device=self.storing_device.type,
            rate_limiter=None if self._limiter is None else self._limiter.state_dict(),
        )

    def _restore_limiter(self, state: dict[str, Any] | None, size: int) -> None:
        """The limiter's counters from a checkpoint; one without them counts its
        ``size`` items as just inserted and not yet sampled."""
        assert self._limiter is not None
        if state is None:
            self._limiter.restore(size, 0, size)
        else:
            self._limiter.restore(int(state["inserts"]), int(state["samples"]), size)

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
            if meta.data_size > self._writer.size:
                raise CheckpointError(
                    f"{path}.metadata is ObjectRL's metadata-only checkpoint: it holds no "
                    f"transitions, only data_size={meta.data_size}, and this buffer holds "
                    f"{self._writer.size}, so there is nothing to restore them from (ObjectRL's "
                    "load relies on its storage still holding them; save with replaystore to "
                    "checkpoint the contents)"
                )
            if self._storage is None:
                return
            self._writer.reset_cursor(meta.data_size, meta.pointer)
            self._epochs = None
            if self._limiter is not None:
                lim = self._limiter
                lim.restore(lim.inserts, lim.samples, meta.data_size)
            holder = self._priority_holder()
            kept = None if holder is None else holder.stored_priorities(meta.data_size)
            top = 1.0 if holder is None else holder.max_priority
            self._rows_replaced()
            if holder is not None and kept is not None:
                holder.restore_priorities(kept, top)
            if isinstance(self._storage, MemmapStorage):
                self._storage.flush(self._memmap_state())

    def load(self, path: str | os.PathLike[str]) -> None:
        """Replace the buffer's contents and state with the checkpoint ``path``.

        ObjectRL's own ``<path>.metadata`` (``torch.save`` of ``buffer_size``,
        ``data_size`` and ``pointer``; read opcode by opcode, never unpickled) is
        loaded as ObjectRL loads it: those counters are set over the transitions
        this buffer already holds (``data_size`` may not exceed :attr:`size`); no
        contents, priorities or RNG state are restored from it.

        Restores the items, schema, pointer, priorities, ``beta``, the rate
        limiter's counters (a checkpoint without them counts its items as just
        inserted, none sampled) and both random generators, so the next samples
        equal those the saved buffer would have drawn (for the torch generator:
        when both buffers store on the same device type; across CPU and CUDA it
        keeps its own, with a warning). The
        checkpoint is verified (sizes, CRC-32) before the buffer changes. Loading
        a uniform checkpoint into a prioritized buffer gives every item priority
        1; a prioritized checkpoint into a uniform buffer ignores its priorities.
        The current epochs are dropped (``get_next_batch`` samples at random).

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
        try:
            self._check_nstep_fields(snap.fields)
        except ConfigError as exc:
            raise ConfigError(f"checkpoint {path}: {exc}") from exc
        if snap.capacity != self._capacity:
            raise CheckpointError(
                f"checkpoint {path} has buffer_size {snap.capacity} but this buffer has "
                f"{self._capacity}; call reset(buffer_size={snap.capacity}) before load"
            )
        kind = snap.sampler.get("kind")
        if kind not in SAMPLER_KINDS:
            what = snap.sampler.get("class", kind)
            raise CheckpointError(
                f"checkpoint {path} was saved with a sampler replaystore does not know "
                f"({what!r}; it knows {', '.join(SAMPLER_KINDS)}): its state cannot be restored"
            )
        if type(self._sampler) not in BUILT_IN_SAMPLERS:
            raise CheckpointError(
                f"this buffer's sampler {type(self._sampler).__qualname__} is not a built-in one: "
                f"a checkpoint cannot restore its state (use one of "
                f"{', '.join(c.__name__ for c in BUILT_IN_SAMPLERS)}, or a sampler string)"
            )
        holder = self._priority_holder()
        if holder is not None and snap.priorities is not None:
            for name, mine in (("alpha", holder.alpha), ("eps", holder.eps)):
                if float(snap.sampler[name]) != mine:
                    raise CheckpointError(
                        f"checkpoint {path} was saved with {name}={snap.sampler[name]}, "
                        f"this buffer uses {name}={mine}"
                    )
        try:
            rng = self._gatherer.check_rng_state(
                snap.torch_rng, snap.numpy_rng, snap.torch_rng_device
            )
        except (RuntimeError, TypeError, ValueError, KeyError) as exc:
            raise CheckpointError(f"checkpoint {path} has an unusable RNG state: {exc}") from exc
        if rng.torch_state is None:
            logger.warning(
                "checkpoint %s was saved with %s storage: its torch RNG state does not fit "
                "this %s buffer, which keeps its own (epoch shuffles will differ)",
                path,
                snap.torch_rng_device,
                self.storing_device.type,
            )
        with self._lock:
            storage = self._new_storage(snap.fields)
            for name, data in snap.columns.items():
                storage.columns[name][: snap.size].copy_(data)
            self._install(storage)
            self._writer.reset_cursor(snap.size, snap.pointer)
            self._epochs = None
            self._gatherer.set_rng_state(rng)
            if self._limiter is not None:
                self._restore_limiter(snap.rate_limiter, snap.size)
            self._rows_replaced()  # without saved priorities every item gets 1
            if holder is not None and snap.priorities is not None:
                self._beta = float(snap.sampler.get("beta", self._beta))
                holder.beta = self._beta
                holder.restore_priorities(snap.priorities, float(snap.sampler["max_priority"]))
            if isinstance(storage, MemmapStorage):
                storage.flush(self._memmap_state())
                storage.remove_other_generations()
