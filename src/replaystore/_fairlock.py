"""A lock that serves waiting threads in arrival order, at a plain lock's uncontended cost.

``threading.Lock`` is not fair. A thread that releases it and acquires it again
straight away (a writer calling ``add`` in a loop) wins almost every time
against a thread already blocked on it: the waiter must first be woken by the
OS and then get the GIL, and by then the writer holds the lock again. A sampler
sharing a buffer with a busy writer was measured at 90-6,500 samples/s against
35,000/s alone.

:class:`FairLock` hands the lock over instead of letting threads race for it.
A thread that finds it held (or finds others already waiting) joins a FIFO
queue and blocks on a private "turn" lock; ``release`` with a non-empty queue
does not free the lock, it gives it to the head of the queue by releasing that
thread's turn. A waiting thread therefore gets the lock before the releasing
thread (or any thread arriving later) can take it again.

Without contention, ``acquire`` is one queue check and one non-blocking
``Lock.acquire``, and ``release`` is one ``Lock.release`` and two queue checks:
no allocation, no extra lock. Every step that decides between "free the lock"
and "hand it over" is atomic under the GIL (``deque`` truthiness,
``Lock.acquire(False)``, ``Lock.release``); the slow paths serialise on an
internal lock, and the one race the unlocked fast release leaves open (a thread
queueing between its two queue checks) is closed by the second check and by the
queueing thread retrying the lock after it has queued.

Not re-entrant: a thread that acquires a FairLock it holds deadlocks, exactly as
with ``threading.Lock``.
"""

from __future__ import annotations

import threading
from collections import deque
from types import TracebackType

__all__ = ["FairLock"]


class FairLock:
    """A FIFO mutual-exclusion lock (see the module docstring for the protocol).

    Use it as a context manager (``with lock: ...``) or call :meth:`acquire` /
    :meth:`release`. Any thread may release it (as with ``threading.Lock``).

    Cost: uncontended ``acquire`` + ``release`` is two short Python calls over a
    ``threading.Lock`` (about 0.1 us more than ``with threading.Lock()``); a
    contended hand-over costs one OS wake-up of the waiting thread.
    """

    __slots__ = ("_lock", "_meta", "_queue")

    def __init__(self) -> None:
        # Held while some thread owns the FairLock. A hand-over keeps it held:
        # ownership moves to the woken thread without the lock ever being free.
        self._lock = threading.Lock()
        # Serialises the slow paths (queueing, hand-over, rescue).
        self._meta = threading.Lock()
        # Turn locks of the waiting threads, oldest first; each is held until
        # its thread is handed the FairLock.
        self._queue: deque[threading.Lock] = deque()

    def acquire(self) -> bool:
        """Block until this thread owns the lock; threads that waited longer go first.

        Returns:
            True (the signature of ``threading.Lock.acquire``).
        """
        if not self._queue and self._lock.acquire(False):
            return True
        self._wait_turn()
        return True

    def _wait_turn(self) -> None:
        with self._meta:
            if not self._queue and self._lock.acquire(False):
                return
            turn = threading.Lock()
            turn.acquire()
            self._queue.append(turn)
            # The owner may have freed the lock on its fast path after we found
            # it held and before we queued (its second queue check can have
            # missed us): then nobody will hand it over, so take it and give it
            # to the oldest waiter, which may be us.
            if self._lock.acquire(False):
                self._queue.popleft().release()
        try:
            turn.acquire()
        except BaseException:
            # Interrupted while waiting (KeyboardInterrupt in the main thread):
            # leave the queue, or pass the lock on if it was already ours.
            with self._meta:
                try:
                    self._queue.remove(turn)
                    handed = False
                except ValueError:
                    handed = True
            if handed:
                self.release()
            raise

    def release(self) -> None:
        """Give the lock to the longest-waiting thread, or free it if none waits.

        Raises:
            RuntimeError: the lock is not held (from ``threading.Lock.release``).
        """
        if self._queue:
            self._hand_over()
            return
        self._lock.release()
        if self._queue:
            self._rescue()

    def _hand_over(self) -> None:
        with self._meta:
            if not self._lock.locked():
                raise RuntimeError("release of an unlocked FairLock")
            if self._queue:
                self._queue.popleft().release()  # the lock stays held: ownership moves
            else:
                self._lock.release()

    def _rescue(self) -> None:
        # A thread queued while we were freeing the lock on the fast path; make
        # sure it is not left waiting on a free lock.
        with self._meta:
            if self._queue and self._lock.acquire(False):
                self._queue.popleft().release()

    def locked(self) -> bool:
        """Whether some thread owns the lock (a snapshot; it may change at once)."""
        return self._lock.locked()

    def waiting(self) -> int:
        """Number of threads queued for the lock (a snapshot, for tests and diagnostics)."""
        return len(self._queue)

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
