"""Which task goes to which rollout actor, which are done, and what a lost actor gives back.

:class:`TaskLedger` is the driver's queue of a Ray rollout (no Ray in it): actors
pull work one task at a time (:meth:`~TaskLedger.next_for` when a browser is free),
so a slow actor takes fewer tasks; a lost actor's unfinished tasks go back to the
front of the queue (:meth:`~TaskLedger.lose`); a task finished twice is kept once,
by key (the first result; :meth:`~TaskLedger.finish` says whether to keep it and
counts the duplicate).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

from replaystore.errors import ReplayStoreError

__all__ = ["LedgerCounts", "NoActorsLeftError", "TaskFailedError", "TaskLedger"]


class NoActorsLeftError(ReplayStoreError, RuntimeError):
    """Every rollout actor was lost (or none started) before every task was done; the
    message says how many tasks were left."""


class TaskFailedError(ReplayStoreError, RuntimeError):
    """One task failed on every actor it was given to (an actor-side bug, not a lost
    node: a task's own failures are its trajectory's status)."""


@dataclass(slots=True)
class LedgerCounts:
    """What a rollout's queue went through.

    Attributes:
        done: tasks with a kept result.
        duplicates: results of an already-done task, dropped (by key).
        reassigned: tasks handed back to the queue by a lost actor (or a failed call).
        lost_actors: actors lost mid-run, in loss order.
        per_actor: results kept per actor.
    """

    done: int = 0
    duplicates: int = 0
    reassigned: int = 0
    lost_actors: list[Hashable] = field(default_factory=list)
    per_actor: dict[Hashable, int] = field(default_factory=dict)


class TaskLedger:
    """The queue of task keys ``0..total-1`` for a set of actors (see the module docstring).

    Args:
        total: how many tasks (keys are their positions).
        actors: the actors that take tasks (any hashable names).
        max_attempts: how many times one task may be handed out before a call that
            failed on it (not a lost actor) raises :class:`TaskFailedError`.

    Cost: O(1) per call but :meth:`lose` (O(tasks the actor held)).
    """

    def __init__(self, total: int, actors: Iterable[Hashable], *, max_attempts: int = 3) -> None:
        if isinstance(total, bool) or not isinstance(total, int) or total < 0:
            raise ValueError(f"total must be an int >= 0, got {total!r}")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts!r}")
        self.total = total
        self.max_attempts = max_attempts
        self.pending: deque[int] = deque(range(total))
        self.held: dict[Hashable, set[int]] = {a: set() for a in actors}
        self.attempts: dict[int, int] = {}
        self.failures: dict[int, int] = {}
        self.done: set[int] = set()
        self.counts = LedgerCounts()

    @property
    def actors(self) -> list[Hashable]:
        """The actors still alive."""
        return list(self.held)

    @property
    def complete(self) -> bool:
        """Every task has a kept result."""
        return len(self.done) == self.total

    def in_flight(self, actor: Hashable) -> int:
        """How many tasks ``actor`` holds now."""
        return len(self.held[actor])

    def next_for(self, actor: Hashable) -> int | None:
        """The next task for ``actor`` (recorded as held by it), or None when the queue is
        empty. A task that is done meanwhile is skipped.

        Raises:
            KeyError: ``actor`` is unknown or lost.
        """
        held = self.held[actor]
        while self.pending:
            index = self.pending.popleft()
            if index in self.done:
                continue
            held.add(index)
            self.attempts[index] = self.attempts.get(index, 0) + 1
            return index
        return None

    def finish(self, actor: Hashable, index: int) -> bool:
        """``actor`` returned task ``index``'s result: True to keep it (its first), False
        for a duplicate (counted, to be dropped). A lost actor's late result counts too."""
        self.held.get(actor, set()).discard(index)
        if index in self.done:
            self.counts.duplicates += 1
            return False
        self.done.add(index)
        self.counts.done += 1
        self.counts.per_actor[actor] = self.counts.per_actor.get(actor, 0) + 1
        return True

    def fail(self, actor: Hashable, index: int, why: str) -> None:
        """The call running task ``index`` on ``actor`` failed (the actor lives): the task
        goes back to the front of the queue.

        Raises:
            TaskFailedError: it failed ``max_attempts`` times (names the task and why).
        """
        self.held.get(actor, set()).discard(index)
        if index in self.done:
            return
        self.failures[index] = self.failures.get(index, 0) + 1
        if self.failures[index] >= self.max_attempts:
            raise TaskFailedError(
                f"task {index} failed on {self.failures[index]} tries; the last: {why}"
            )
        self.pending.appendleft(index)
        self.counts.reassigned += 1

    def lose(self, actor: Hashable) -> list[int]:
        """``actor`` is gone: its unfinished tasks go back to the front of the queue (in
        task order); returns them. Losing an actor twice does nothing.

        Raises:
            NoActorsLeftError: no actor is left and some task is not done.
        """
        held = self.held.pop(actor, None)
        if held is None:
            return []
        self.counts.lost_actors.append(actor)
        back = sorted(i for i in held if i not in self.done)
        self.pending.extendleft(reversed(back))
        self.counts.reassigned += len(back)
        if not self.held and not self.complete:
            raise NoActorsLeftError(self.no_actors_message())
        return back

    def no_actors_message(self) -> str:
        """The one line of a run with no actor left."""
        left = self.total - len(self.done)
        lost = len(self.counts.lost_actors)
        return (
            f"no rollout actor is left ({lost} lost): {left} of {self.total} tasks not done; "
            "check the Ray cluster's nodes (ray status) and the actors' logs"
        )
