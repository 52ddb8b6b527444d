"""A client-side writer that batches adds and applies back-pressure."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from replaystore.distributed._ray import import_ray, reraise
from replaystore.errors import ArgumentError, SchemaError

__all__ = ["BatchingWriter"]


class BatchingWriter:
    """Collect single transitions and send them as NumPy batches to a remote buffer.

    Works with a :class:`~replaystore.distributed.RemoteBuffer` of a buffer with
    ``add_batch`` and with a :class:`~replaystore.distributed.ShardedReplayBuffer`
    (batches go to the shards round-robin). Usable inside any Ray actor (pass the
    client to it) or the driver.

    A batch is sent when ``batch_size`` transitions are pending, or on the first
    ``add`` after ``max_delay_s`` passed since the oldest pending one (there is
    no background thread: a writer that stops adding holds its pending items
    until :meth:`flush` or :meth:`close`). Sending does not wait for the actor;
    at most ``max_in_flight`` batches are unacknowledged, and the next send
    waits for the oldest one to finish: when the actor falls behind, writers
    slow down instead of growing memory (back-pressure).

    Each batch is one dict of contiguous NumPy arrays: Ray serialises it once
    into its object store and the actor reads the arrays without another copy.

    Faults: a batch is stored whole or not at all. If the process holding the
    writer dies, its pending (unsent) transitions are lost and so may be its
    in-flight batches; the buffer and every other writer go on.

    Args:
        target: the remote buffer or sharded buffer.
        batch_size: transitions per batch (>= 1).
        max_delay_s: age of the oldest pending transition that triggers a send (> 0).
        max_in_flight: unacknowledged batches allowed (>= 1).

    Raises:
        ArgumentError: a bad threshold (named).
    """

    def __init__(
        self, target: Any, batch_size: int = 1024, max_delay_s: float = 0.05, max_in_flight: int = 4
    ) -> None:
        if type(batch_size) is not int or batch_size < 1:
            raise ArgumentError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        if type(max_in_flight) is not int or max_in_flight < 1:
            raise ArgumentError(f"max_in_flight must be an integer >= 1, got {max_in_flight!r}")
        if not isinstance(max_delay_s, int | float) or not max_delay_s > 0:
            raise ArgumentError(f"max_delay_s must be a number > 0, got {max_delay_s!r}")
        if not hasattr(target, "submit_add_batch"):
            raise ArgumentError(
                f"target must be a RemoteBuffer or ShardedReplayBuffer, got {type(target).__name__}"
            )
        self.target = target
        self.batch_size = batch_size
        self.max_delay_s = float(max_delay_s)
        self.max_in_flight = max_in_flight
        self._pending: dict[str, list[Any]] = {}
        self._count = 0
        self._first = 0.0
        self._in_flight: list[tuple[Any, str]] = []
        self.sent = 0
        """Transitions sent so far (acknowledged or in flight)."""
        self._closed = False

    def add(self, transition: Mapping[str, Any]) -> None:
        """Queue one transition (a mapping of key -> one item, no batch dimension).

        Raises:
            SchemaError: its keys differ from the pending ones (named); remote
                schema errors are raised by a later send, with their type.
            ArgumentError: the writer is closed.
        """
        if self._closed:
            raise ArgumentError("this BatchingWriter is closed")
        if not self._pending:
            self._pending = {k: [] for k in transition}
            self._first = time.monotonic()
        elif transition.keys() != self._pending.keys():
            raise SchemaError(
                f"transition keys {sorted(transition)} differ from the "
                f"batch's {sorted(self._pending)}"
            )
        for key, value in transition.items():
            self._pending[key].append(value)
        self._count += 1
        if self._count >= self.batch_size or time.monotonic() - self._first >= self.max_delay_s:
            self._send_pending()

    def add_batch(self, batch: Mapping[str, Any]) -> None:
        """Send an already-batched mapping (leading dimension N) after the pending items."""
        if self._closed:
            raise ArgumentError("this BatchingWriter is closed")
        self._send_pending()
        self._send({k: _as_numpy(v) for k, v in batch.items()})

    def _send_pending(self) -> None:
        if not self._count:
            return
        batch = {k: np.stack([_as_numpy(v) for v in vals]) for k, vals in self._pending.items()}
        self._pending = {}
        self._count = 0
        self._send(batch)

    def _send(self, batch: dict[str, np.ndarray]) -> None:
        if len(self._in_flight) >= self.max_in_flight:
            self._wait(len(self._in_flight) - self.max_in_flight + 1)
        ref, what = self.target.submit_add_batch(batch)
        self._in_flight.append((ref, what))
        self.sent += len(next(iter(batch.values()))) if batch else 0

    def _wait(self, n: int) -> None:
        """Wait for the ``n`` oldest in-flight batches; raise their errors."""
        ray = import_ray()
        done, self._in_flight = self._in_flight[:n], self._in_flight[n:]
        for ref, what in done:
            try:
                ray.get(ref)
            except ray.exceptions.RayError as exc:
                reraise(exc, what)

    def flush(self) -> None:
        """Send the pending transitions and wait until every batch is stored.

        Raises:
            Whatever a remote add raised (``SchemaError``, ...), with its type;
            ``RemoteActorError`` when the target actor is dead.
        """
        self._send_pending()
        self._wait(len(self._in_flight))

    def close(self) -> None:
        """Flush, then refuse further adds. Idempotent."""
        if not self._closed:
            self.flush()
            self._closed = True

    def __enter__(self) -> BatchingWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _as_numpy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return value
