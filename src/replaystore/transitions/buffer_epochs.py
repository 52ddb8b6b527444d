"""The transition buffer's epochs: every stored item once per epoch, shared by threads.

:class:`EpochMethods` holds :class:`~replaystore.transitions.buffer.ReplayBuffer`'s
epoch methods (ObjectRL's ``create_epoch_iterator``, ``get_next_batch``,
``calculate_num_batches``, ``get_steps_and_iterator``). The schedule itself
(:class:`~.sampler.EpochSchedule`) and the gathers are in :mod:`.sampler`; this
module only takes the buffer's lock around them.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from tensordict import TensorDict

from replaystore.errors import check_int
from replaystore.transitions.sampler import (
    BatchGatherer,
    EpochIterator,
    EpochSchedule,
    require_items,
)
from replaystore.transitions.writer import RingWriter

__all__ = ["EpochMethods"]


class EpochMethods:
    """Epoch methods of :class:`~replaystore.transitions.buffer.ReplayBuffer` (a base
    class of it, not used alone): they read the buffer's lock, writer and gatherer."""

    _lock: threading.Lock
    _writer: RingWriter
    _gatherer: BatchGatherer
    _epochs: EpochSchedule | None

    if TYPE_CHECKING:

        def sample_batch(self, batch_size: int, *, timeout: float | None = None) -> TensorDict: ...

    def create_epoch_iterator(
        self, batch_size: int, n_epochs: int = 1, shuffle: bool = True, drop_last: bool = False
    ) -> Iterator[TensorDict]:
        """An iterator of batches that visits every stored item once per epoch.

        Each epoch draws a fresh seeded permutation of the items stored when its
        first batch is taken (``shuffle=False``: positions ``0..size-1`` in
        order, as ObjectRL). The iterator's epochs also become the buffer's
        current ones, which :meth:`get_next_batch` draws from. Prioritized
        buffers add ``index`` and ``weight`` (all 1) entries so training code can
        treat both alike.

        Threads: the iterator may be shared, and used alongside
        :meth:`get_next_batch`; every ``next`` (or ``get_next_batch``) takes the
        next batch of the one schedule under the buffer's lock, so between them
        all callers get each stored item exactly once per epoch, no batch twice.

        Args:
            batch_size: items per batch; the last batch of an epoch may be
                smaller unless ``drop_last``.
            n_epochs: number of passes, >= 1.
            shuffle: permute items each epoch.
            drop_last: skip each epoch's last partial batch.

        Raises:
            EmptyBufferError: nothing is stored.
            ArgumentError: ``batch_size`` or ``n_epochs`` is not a positive integer.
        """
        bs = check_int(batch_size, "batch_size", minimum=1)
        epochs = check_int(n_epochs, "n_epochs", minimum=1)
        with self._lock:
            require_items(self._writer.size)
            schedule = EpochSchedule(bs, epochs, bool(shuffle), bool(drop_last))
            self._epochs = schedule
        return EpochIterator(schedule, self._next_epoch_batch)

    def _next_epoch_batch(self, schedule: EpochSchedule) -> TensorDict | None:
        """The next batch of ``schedule``, or None once it is exhausted (then dropped)."""
        with self._lock:
            idx = schedule.next_indices(self._writer.size, self._gatherer)
            if idx is None:
                if self._epochs is schedule:
                    self._epochs = None
                return None
            return self._gatherer.epoch_batch(idx, self._writer.pointer)

    def get_next_batch(self, batch_size: int) -> TensorDict:
        """The next batch of the current epochs, or a random batch.

        Falls back to :meth:`sample_batch` when there are no current epochs
        (none created, or ``get_steps_and_iterator(n_epochs=0, ...)``) and when
        they are exhausted (they are then dropped). Any number of threads may
        call it: they share the current epochs, each call taking the next batch,
        so between them they get each stored item exactly once per epoch.

        Args:
            batch_size: size of the random batch when falling back (epoch
                batches keep the size the epochs were created with).

        Raises:
            EmptyBufferError: falling back, and nothing is stored.
            ArgumentError: falling back, and ``batch_size`` is not a positive integer.
        """
        if self._epochs is not None:
            with self._lock:
                schedule = self._epochs  # read again: another thread may have replaced it
                if schedule is not None:
                    idx = schedule.next_indices(self._writer.size, self._gatherer)
                    if idx is not None:
                        return self._gatherer.epoch_batch(idx, self._writer.pointer)
                    self._epochs = None
        return self.sample_batch(batch_size)

    def calculate_num_batches(self, batch_size: int) -> int:
        """Full batches in the current contents: ``size // batch_size``."""
        return self._writer.size // check_int(batch_size, "batch_size", minimum=1)

    def get_steps_and_iterator(
        self, n_epochs: int, max_iter: int, batch_size: int, *, shuffle: bool = True
    ) -> int:
        """Number of training steps, preparing the epochs :meth:`get_next_batch` draws from.

        ``n_epochs > 0``: ``n_epochs`` epochs of full batches (the last partial
        batch of each epoch is dropped, a different one each epoch when
        shuffling) and ``n_epochs * size // batch_size`` steps, so
        ``get_next_batch`` is called exactly as often as the epochs have
        batches (by one thread or several together).
        ``n_epochs == 0``: no epochs, ``max_iter`` steps, and ``get_next_batch``
        samples at random.

        Raises:
            ArgumentError: negative ``n_epochs`` or ``max_iter``, or a bad batch size.
        """
        epochs = check_int(n_epochs, "n_epochs", minimum=0)
        steps_max = check_int(max_iter, "max_iter", minimum=0)
        bs = check_int(batch_size, "batch_size", minimum=1)
        with self._lock:
            if epochs == 0:
                self._epochs = None
                return steps_max
            steps = epochs * (self._writer.size // bs)
            if steps == 0:
                self._epochs = None
                return 0
            self._epochs = EpochSchedule(bs, epochs, bool(shuffle), True)
        return steps
