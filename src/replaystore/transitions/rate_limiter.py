"""A rate limiter that keeps actors and learner in step (Reverb's ``MinSize`` and
``SampleToInsertRatio``).

A :class:`RateLimiter` counts inserts, samples and deletes (items the ring
overwrote) and decides, for each insert and each sample, whether it may go on
now or must wait. The rules are Reverb's (``reverb/cc/rate_limiter.cc``),
item by item:

* a sample may go on once ``inserts - deletes >= min_size_to_sample`` (that
  many items exist) and ``inserts * samples_per_insert - samples - 1 >=
  min_diff`` (the learner is not too far ahead);
* an insert may go on while ``inserts + 1 - deletes <= min_size_to_sample``
  (filling up to the minimum is never limited) or ``(inserts + 1) *
  samples_per_insert - samples <= max_diff`` (the actors are not too far ahead).

With ``samples_per_insert=None`` (Reverb's ``MinSize``) only the size rule
applies. With a number ``error_buffer`` the allowed range of the error
``inserts * samples_per_insert - samples`` is ``offset +- error_buffer`` with
``offset = samples_per_insert * min_size_to_sample``: the error counted is the
one built up after the buffer reached its minimum size.

A batch counts item by item: ``sample_batch(B)`` is ``B`` samples and
``add_batch`` of ``N`` rows ``N`` inserts. A batch larger than the limiter lets
through at once does not wait for room for all of it (which may never come):
it goes on in parts, as many items as are allowed at each moment, exactly as
``B`` single calls would (see :meth:`RateLimiter.acquire_samples` and
:meth:`RateLimiter.reserve_inserts`).

Waiting is on one ``threading.Condition``: a call that must wait sleeps until a
counter it depends on changes, and a call that need not wait takes the lock
once and compares two numbers (well under a microsecond).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any

from replaystore.errors import ArgumentError, RateLimitTimeout, check_int, check_number

__all__ = ["RateLimitTimeout", "RateLimiter"]

logger = logging.getLogger(__name__)

_STATE_KEYS = ("inserts", "samples", "deletes")


def _check_timeout(timeout: Any) -> float | None:
    if timeout is None:
        return None
    return check_number(timeout, "timeout", minimum=0)


class RateLimiter:
    """Block samples until enough items exist, and keep samples per insert near a target.

    Args:
        min_size_to_sample: samples wait until at least this many items exist
            (``inserts - deletes``: the buffer's current size). Integer >= 1.
        samples_per_insert: target average number of times each inserted item
            is sampled (Reverb's ``SampleToInsertRatio``). ``None``: no ratio,
            only the minimum size (Reverb's ``MinSize``).
        error_buffer: how far the error ``inserts * samples_per_insert -
            samples`` may stray before a call waits. A number ``e``: the range
            is ``offset - e .. offset + e`` with ``offset = samples_per_insert *
            min_size_to_sample``; a pair ``(lo, hi)``: that range, no offset.
            Required with ``samples_per_insert``, refused without it.

    Raises:
        ArgumentError: ``min_size_to_sample`` below 1; ``samples_per_insert``
            not > 0; ``error_buffer`` missing, given without
            ``samples_per_insert``, or a range narrower than ``2 *
            max(1, samples_per_insert)`` or above ``offset`` (either would stop
            inserts or samples for good, as Reverb checks).

    A range whose top is below ``offset`` is allowed with a warning (Reverb's
    too): inserts then stop at ``min_size_to_sample`` until the learner samples,
    which deadlocks a program that inserts and samples from one thread.

    One limiter belongs to one buffer (``ReplayBuffer(rate_limiter=...)``); a
    second buffer refuses it. Thread-safe. Counters: :attr:`inserts`,
    :attr:`samples`, :attr:`deletes`.
    """

    def __init__(
        self,
        min_size_to_sample: int,
        samples_per_insert: float | None = None,
        error_buffer: float | tuple[float, float] | None = None,
    ) -> None:
        self._min_size = check_int(min_size_to_sample, "min_size_to_sample", minimum=1)
        if samples_per_insert is None:
            if error_buffer is not None:
                raise ArgumentError(
                    "error_buffer bounds the samples-per-insert error: it needs "
                    "samples_per_insert (without it the limiter only waits for "
                    "min_size_to_sample items)"
                )
            spi, lo, hi = 1.0, -math.inf, math.inf
        else:
            spi = check_number(samples_per_insert, "samples_per_insert", minimum=0, strict=True)
            lo, hi = self._range(spi, error_buffer)
        self._spi = spi
        self._ratio = samples_per_insert is not None
        self._min_diff = lo
        self._max_diff = hi
        self._error_buffer = error_buffer
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._waiting = 0
        self._inserts = 0
        self._pending = 0  # inserts reserved, being written, not yet counted
        self._samples = 0
        self._deletes = 0
        self._owner: int | None = None

    def _range(self, spi: float, error_buffer: Any) -> tuple[float, float]:
        offset = spi * self._min_size
        if error_buffer is None:
            raise ArgumentError(
                "samples_per_insert needs error_buffer: how far (in samples) the learner "
                "or the actors may get ahead before waiting, e.g. error_buffer="
                f"{max(2.0 * spi, 0.1 * offset):g}"
            )
        if isinstance(error_buffer, tuple | list):
            if len(error_buffer) != 2:
                raise ArgumentError(
                    f"error_buffer must be a number or a (min, max) pair, got {error_buffer!r}"
                )
            lo = check_number(error_buffer[0], "error_buffer[0]")
            hi = check_number(error_buffer[1], "error_buffer[1]")
        else:
            e = check_number(error_buffer, "error_buffer", minimum=0)
            lo, hi = offset - e, offset + e
        if hi - lo < 2 * max(1.0, spi):
            raise ArgumentError(
                f"error_buffer allows a range of {hi - lo:g}; it must be at least "
                f"2 * max(1, samples_per_insert) = {2 * max(1.0, spi):g}, else inserts "
                "or samples could be blocked for good"
            )
        if lo > offset:
            raise ArgumentError(
                f"error_buffer's range starts at {lo:g}, above samples_per_insert * "
                f"min_size_to_sample = {offset:g}: no sample could ever go on"
            )
        if hi < offset:
            logger.warning(
                "error_buffer's range ends at %g, below samples_per_insert * "
                "min_size_to_sample = %g: inserts stop at min_size_to_sample items until "
                "the learner samples (a deadlock if the same thread inserts and samples)",
                hi,
                offset,
            )
        return lo, hi

    # ----------------------------------------------------------------- reading

    @property
    def min_size_to_sample(self) -> int:
        """Items that must exist before any sample goes on."""
        return self._min_size

    @property
    def samples_per_insert(self) -> float | None:
        """The target ratio, or None (minimum size only)."""
        return self._spi if self._ratio else None

    @property
    def error_range(self) -> tuple[float, float]:
        """``(min_diff, max_diff)``: the allowed range of ``inserts * spi - samples``
        (``(-inf, inf)`` without a ratio)."""
        return self._min_diff, self._max_diff

    @property
    def inserts(self) -> int:
        """Items inserted (counted once written), since creation or the last reset."""
        return self._inserts

    @property
    def samples(self) -> int:
        """Items sampled (a batch of B counts B)."""
        return self._samples

    @property
    def deletes(self) -> int:
        """Items removed: overwritten by the ring."""
        return self._deletes

    @property
    def size(self) -> int:
        """``inserts - deletes``: the items the limited buffer holds."""
        return self._inserts - self._deletes

    def __repr__(self) -> str:
        ratio = (
            f", samples_per_insert={self._spi:g}, error_range=({self._min_diff:g}, "
            f"{self._max_diff:g})"
            if self._ratio
            else ""
        )
        return (
            f"RateLimiter(min_size_to_sample={self._min_size}{ratio}; inserts={self._inserts}, "
            f"samples={self._samples}, deletes={self._deletes})"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # A copy (e.g. sent to a Ray actor) has the same settings and counters,
        # its own lock, and no owner.
        return (_rebuild, (self.config(), self.state_dict()))

    def config(self) -> dict[str, Any]:
        """The constructor's arguments (JSON-ready: a pair becomes a list)."""
        eb = self._error_buffer
        return {
            "min_size_to_sample": self._min_size,
            "samples_per_insert": self.samples_per_insert,
            "error_buffer": list(eb) if isinstance(eb, tuple | list) else eb,
        }

    def can_sample(self, n: int = 1) -> bool:
        """Whether ``n`` samples would go on now without waiting."""
        with self._lock:
            return self._sample_room(n) >= n

    def can_insert(self, n: int = 1) -> bool:
        """Whether ``n`` inserts would go on now without waiting."""
        with self._lock:
            return self._insert_room(n) >= n

    # ------------------------------------------------------------ room (locked)

    def _sample_room(self, n: int) -> int:
        """How many of ``n`` samples may go on now (0..n)."""
        if self._inserts - self._deletes < self._min_size:
            return 0
        error = self._inserts * self._spi - self._samples - self._min_diff
        if error >= n:  # also the -inf min_diff of MinSize
            return n
        return max(0, math.floor(error))

    def _insert_room(self, n: int) -> int:
        """How many of ``n`` inserts may go on now (0..n)."""
        done = self._inserts + self._pending
        free = self._min_size - (done - self._deletes)  # inserts up to the minimum size
        if free >= n or (done + n) * self._spi - self._samples <= self._max_diff:
            return n
        k = math.floor((self._max_diff + self._samples) / self._spi) - done
        # floor() of a float quotient may be off by one either way: settle it exactly.
        while k > 0 and (done + k) * self._spi - self._samples > self._max_diff:
            k -= 1
        while k < n and (done + k + 1) * self._spi - self._samples <= self._max_diff:
            k += 1
        return min(n, max(free, k, 0))

    def _wait(self, deadline: float | None) -> bool:
        """Wait for a counter to change; False once ``deadline`` has passed."""
        if deadline is None:
            remaining = None
        else:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
        self._waiting += 1
        try:
            self._cond.wait(remaining)
        finally:
            self._waiting -= 1
        return True

    # --------------------------------------------------- the protocol buffers use

    def acquire_samples(self, n: int, timeout: float | None = None) -> None:
        """Count ``n`` samples, waiting until the rules allow all of them.

        Called by the buffer before it draws ``n`` items. The samples are
        granted as they become allowed (a batch larger than the error range
        goes on in parts while actors insert); the call returns when all ``n``
        are granted.

        Args:
            n: number of samples (>= 1).
            timeout: seconds to wait at most; None waits as long as it takes, 0
                never waits.

        Raises:
            RateLimitTimeout: ``timeout`` passed first; the samples granted so
                far are given back, so a timed-out call counts no sample.
            ArgumentError: a bad ``timeout``.
        """
        if timeout is not None:
            timeout = _check_timeout(timeout)
        with self._lock:
            if self._inserts - self._deletes >= self._min_size and (
                self._inserts * self._spi - self._samples - n >= self._min_diff
            ):
                self._samples += n
                if self._waiting:
                    self._cond.notify_all()  # inserts may now go on
                return
            deadline = None if timeout is None else time.monotonic() + timeout
            got = 0
            while True:
                k = self._sample_room(n - got)
                if k:
                    self._samples += k
                    got += k
                    if self._waiting:
                        self._cond.notify_all()  # inserts may now go on
                    if got == n:
                        return
                    continue
                if not self._wait(deadline):
                    break
            self._samples -= got
            if got and self._waiting:
                self._cond.notify_all()
            raise RateLimitTimeout(self._why_sample(n, timeout), requested=n, completed=0)

    def cancel_samples(self, n: int) -> None:
        """Give back ``n`` samples granted by :meth:`acquire_samples` but not drawn
        (the draw failed)."""
        with self._lock:
            self._samples -= n
            if self._waiting:
                self._cond.notify_all()

    def reserve_inserts(self, n: int, timeout: float | None = None) -> int:
        """Reserve room for up to ``n`` inserts; returns how many (1..n) may be written now.

        Waits until at least one insert is allowed, then reserves as many of
        the ``n`` as the rules allow at once. The caller writes that many items
        and then calls :meth:`commit_inserts` (or :meth:`cancel_inserts` if the
        write failed), and reserves again for the rest. Reserved inserts count
        against the ratio, but samples only see them once committed (written).

        Args:
            n: inserts wanted (>= 1).
            timeout: seconds to wait at most (None: no limit; 0: never wait).

        Raises:
            RateLimitTimeout: ``timeout`` passed with no room (nothing reserved).
            ArgumentError: a bad ``timeout``.
        """
        if timeout is not None:
            timeout = _check_timeout(timeout)
        with self._lock:
            done = self._inserts + self._pending
            if (
                done + n - self._deletes <= self._min_size
                or (done + n) * self._spi - self._samples <= self._max_diff
            ):
                self._pending += n
                return n
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                k = self._insert_room(n)
                if k:
                    self._pending += k
                    return k
                if not self._wait(deadline):
                    raise RateLimitTimeout(self._why_insert(n, timeout), requested=n, completed=0)

    def commit_inserts(self, n: int, deleted: int = 0) -> None:
        """Count ``n`` reserved inserts as written; ``deleted`` items were overwritten by them."""
        with self._lock:
            self._pending -= n
            self._inserts += n
            self._deletes += deleted
            if self._waiting:
                self._cond.notify_all()

    def cancel_inserts(self, n: int) -> None:
        """Release ``n`` reserved inserts that were not written (the write failed)."""
        with self._lock:
            self._pending -= n
            if self._waiting:
                self._cond.notify_all()

    def state_dict(self) -> dict[str, int]:
        """The counters: ``{"inserts", "samples", "deletes"}`` (what a checkpoint saves)."""
        with self._lock:
            return {"inserts": self._inserts, "samples": self._samples, "deletes": self._deletes}

    def restore(self, inserts: int, samples: int, size: int) -> None:
        """Set the counters for a buffer that now holds ``size`` items (a checkpoint load).

        ``deletes`` becomes ``inserts - size`` so the minimum-size rule sees the
        restored contents; ``inserts`` is raised to ``size`` if it is below.
        Waiting calls re-check.
        """
        inserts = max(check_int(inserts, "inserts", minimum=0), size)
        samples = check_int(samples, "samples", minimum=0)
        with self._lock:
            self._inserts, self._samples, self._deletes = inserts, samples, inserts - size
            self._cond.notify_all()

    def reset(self) -> None:
        """Zero the counters (the buffer was emptied: ``reset``/``close``)."""
        self.restore(0, 0, 0)

    def bind(self, owner: object) -> None:
        """Attach the limiter to the buffer ``owner``; a limiter serves one buffer.

        Raises:
            ArgumentError: it already belongs to another buffer.
        """
        with self._lock:
            if self._owner is not None and self._owner != id(owner):
                raise ArgumentError(
                    "this RateLimiter already limits another buffer; give each buffer its own "
                    "(counters shared by two buffers would mix their inserts and samples)"
                )
            self._owner = id(owner)

    # -------------------------------------------------------------- messages

    def _why_sample(self, n: int, timeout: float | None) -> str:
        have = self._inserts - self._deletes
        if have < self._min_size:
            return (
                f"sampling {n} timed out after {timeout:g} s: {have} items exist, the rate "
                f"limiter needs min_size_to_sample={self._min_size} before any sample"
            )
        return (
            f"sampling {n} timed out after {timeout:g} s: the learner is ahead of "
            f"samples_per_insert={self._spi:g} ({self._samples} samples for {self._inserts} "
            f"inserts; the error inserts * samples_per_insert - samples may not fall below "
            f"{self._min_diff:g}); it waits for actors to insert"
        )

    def _why_insert(self, n: int, timeout: float | None) -> str:
        return (
            f"inserting {n} timed out after {timeout:g} s: the actors are ahead of "
            f"samples_per_insert={self._spi:g} ({self._inserts + self._pending} inserts for "
            f"{self._samples} samples; the error inserts * samples_per_insert - samples may "
            f"not exceed {self._max_diff:g}); it waits for the learner to sample"
        )


def _rebuild(config: dict[str, Any], state: dict[str, int]) -> RateLimiter:
    eb = config["error_buffer"]
    limiter = RateLimiter(
        config["min_size_to_sample"],
        config["samples_per_insert"],
        tuple(eb) if isinstance(eb, list) else eb,
    )
    limiter._inserts, limiter._samples, limiter._deletes = (int(state[k]) for k in _STATE_KEYS)
    return limiter
