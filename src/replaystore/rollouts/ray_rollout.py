"""Rollouts across machines on Ray: many actors, each with its own Chromium and task
server, feed one driver that stores every trajectory exactly once.

:func:`ray_rollout` is :meth:`RolloutCollector.run_iteration
<replaystore.rollouts.collector.RolloutCollector.run_iteration>` spread over a Ray
cluster:

1. It connects to the cluster (``RayOptions.address``: ``"auto"``, ``"local"``,
   ``host:port`` or ``ray://...``) and starts ``actors`` :class:`~.ray_worker.RolloutWorker`
   actors, spread over the nodes (``placement``), each with ``browsers_per_actor``
   browser contexts. An actor that cannot start (no Chromium there) is left out.
2. The driver owns the queue (:class:`~.task_ledger.TaskLedger`): an actor gets a
   task whenever one of its browsers is free, so a slow node takes fewer tasks.
3. Each finished task comes back as bytes (:mod:`~.shipping`: JSON and PNGs, no
   pickle of our formats); the driver writes its screenshots under the run's
   screenshot root: no file system is shared between nodes.
4. An actor or a node that dies: its unfinished tasks go back to the queue for the
   others; a task finished twice is kept once (by its position; the duplicate is
   counted). With no actor left, :class:`~.task_ledger.NoActorsLeftError`, and
   nothing is stored (the screenshots written are removed): an iteration is stored
   whole, so that running it again redoes all of it.
5. When every task is done (or Ctrl-C), the kept trajectories are written as one
   iteration file (rank ``rank``), the actors are stopped, and the result is an
   :class:`~.outcomes.IterationResult` whose ``ray`` says what the cluster did.

Every node needs this package (same version), the ``rollouts`` extra and Chromium
(and ``miniwob`` for MiniWoB++ tasks); the driver needs only Ray.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import socket
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from replaystore.errors import ConfigError
from replaystore.trajectories.components import Task

from .outcomes import IterationResult, TaskOutcome, is_text_only_model_error
from .ray_worker import RolloutWorker
from .screenshots import default_screenshot_root
from .shipping import unpack_outcome
from .task_ledger import NoActorsLeftError, TaskLedger

__all__ = ["PLACEMENTS", "RayOptions", "ray_rollout"]

logger = logging.getLogger("replaystore.rollouts.ray")

#: ``spread``: actors over as many nodes as possible (Ray's SPREAD); ``pack``: Ray's
#: default placement (fills a node before the next).
PLACEMENTS = ("spread", "pack")

_INSTALL = 'pip install "replaystore[ray]"'
#: Ray's errors that mean an actor (or its node, or a result held there) is gone.
_LOST = (
    "RayActorError",
    "ActorUnavailableError",
    "ObjectLostError",
    "NodeDiedError",
    "OwnerDiedError",
)


@dataclass(slots=True)
class RayOptions:
    """Where and how wide a Ray rollout runs.

    Attributes:
        address: the cluster (``ray.init``'s address: ``"auto"``, ``"local"`` for a
            Ray started in this process, ``host:port`` of the head's GCS, or
            ``ray://host:10001``). Ignored when Ray is already initialized.
        actors: rollout actors (each its own Chromium and task server).
        browsers_per_actor: browser contexts (tasks at once) per actor.
        placement: one of :data:`PLACEMENTS`.
        resources: custom Ray resources each actor needs (``{"browser_node": 1}``
            keeps actors on nodes started with that resource).
        num_cpus: CPUs Ray reserves per actor.
        startup_timeout_s: how long the actors may take to start their browsers.
        max_attempts: how many times one task is retried after a failed call on a
            live actor (a lost actor's tasks are always handed on).
    """

    address: str | None = "auto"
    actors: int = 2
    browsers_per_actor: int = 2
    placement: str = "spread"
    resources: dict[str, float] = field(default_factory=dict)
    num_cpus: float = 1.0
    startup_timeout_s: float = 120.0
    max_attempts: int = 3

    def check(self) -> None:
        """Raise :class:`ConfigError` naming the first bad field."""
        for name in ("actors", "browsers_per_actor", "max_attempts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"ray {name} must be an int >= 1, got {value!r}")
        if self.placement not in PLACEMENTS:
            raise ConfigError(f"ray placement must be spread or pack, got {self.placement!r}")
        if not isinstance(self.resources, Mapping) or not all(
            isinstance(k, str) and isinstance(v, int | float) and v > 0
            for k, v in self.resources.items()
        ):
            raise ConfigError(
                f"ray resources must map names to numbers > 0, got {self.resources!r}"
            )
        if not (isinstance(self.num_cpus, int | float) and self.num_cpus >= 0):
            raise ConfigError(f"ray num_cpus must be a number >= 0, got {self.num_cpus!r}")
        if not (isinstance(self.startup_timeout_s, int | float) and self.startup_timeout_s > 0):
            raise ConfigError(f"ray startup_timeout_s must be > 0, got {self.startup_timeout_s!r}")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> RayOptions:
        """From a config mapping (the loop's ``rollout.ray``); unknown keys are refused.

        Raises:
            ConfigError: an unknown key or a bad value.
        """
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"rollout.ray has unknown key {unknown[0]!r}; keys: {sorted(known)}")
        options = cls(**dict(data))
        options.resources = dict(options.resources or {})
        options.check()
        return options


def ray_rollout(
    tasks: Sequence[Task | Mapping[str, Any]],
    storage: Any,
    iteration: int,
    *,
    spec: Mapping[str, Any],
    options: RayOptions,
    rank: int = 0,
    screenshot_root: str | Path | None = None,
    metadata: Mapping[str, Any] | None = None,
    blocklist: Any = None,
    task_history: Any = None,
    worker: type = RolloutWorker,
) -> IterationResult:
    """Roll out ``tasks`` on Ray actors and store them as ``iteration`` (module docstring).

    Args:
        tasks: the tasks (:class:`Task` or its dicts); their websites name the
            driver's servers (actors serve their own, see :func:`~.ray_worker.localize_task`).
        storage: the :class:`~replaystore.trajectories.storage.TrajectoryStorage` the
            driver writes the iteration file to.
        iteration: the iteration number (>= 1).
        spec: the actors' :func:`~.ray_worker.worker_spec` (its ``browsers`` is
            replaced by ``options.browsers_per_actor``).
        options: the cluster, actors and placement.
        rank: the file's rank (one file per iteration and rank).
        screenshot_root: where the driver writes screenshots (default: the storage's).
        metadata: more keys for the iteration file's header.
        blocklist: a :class:`~replaystore.pipeline.blocklist.Blocklist` that gets the
            sites where a task met an anti-bot wall (None: not recorded).
        task_history: a :class:`~replaystore.pipeline.task_history.TaskHistory` updated
            with the stored attempts (None: none).
        worker: the actor class (its ``start``, ``run`` and ``stop`` as
            :class:`~.ray_worker.RolloutWorker`'s; tests give a fake one).

    Returns:
        The iteration's result (``interrupted`` after Ctrl-C; ``ray``: actors and their
        nodes, tasks per actor, duplicates, reassigned tasks, lost actors).

    Raises:
        ConfigError: bad options, or the cluster cannot be reached (one line).
        NoActorsLeftError: no actor started, or every actor was lost mid-run (nothing
            is stored).
        TaskFailedError: one task's call failed ``max_attempts`` times on live actors
            (nothing is stored).
        ImportError: Ray is not installed.

    Cost: per task one round trip of its trajectory and screenshots; one iteration file.
    """
    options.check()
    if int(iteration) != iteration or iteration < 1:
        raise ValueError(f"iteration must be an integer >= 1, got {iteration!r}")
    todo = [Task.from_dict(t) for t in tasks]
    root = Path(screenshot_root) if screenshot_root else default_screenshot_root(storage.root)
    ray, started_here = _connect(options.address)
    run = _Run(ray, todo, int(iteration), int(rank), root, options)
    try:
        run.start_actors(worker, {**spec, "browsers": options.browsers_per_actor})
        try:
            run.dispatch()
        except KeyboardInterrupt:
            run.interrupted = True
            logger.warning(
                "Ctrl-C: stopping the rollout actors; saving %d finished trajectories",
                len(run.outcomes),
            )
        except Exception:
            run.discard()  # an iteration is stored whole or not at all (a rerun redoes it)
            raise
    finally:
        run.stop_actors()
        if started_here:
            ray.shutdown()
    return run.store(storage, metadata, blocklist, task_history)


class _Run:
    """One :func:`ray_rollout`'s actors, queue and results."""

    def __init__(
        self,
        ray: ModuleType,
        todo: list[Task],
        iteration: int,
        rank: int,
        root: Path,
        options: RayOptions,
    ) -> None:
        self.ray = ray
        self.todo = todo
        self.dicts = [t.to_dict() for t in todo]
        self.iteration = iteration
        self.rank = rank
        self.root = root
        self.options = options
        self.handles: dict[str, Any] = {}
        self.places: dict[str, dict[str, Any]] = {}
        self.ledger = TaskLedger(0, [])
        self.outcomes: dict[int, TaskOutcome] = {}
        self.timings: Counter[str] = Counter()
        self.interrupted = False
        self.started = time.perf_counter()
        self.startup_s = 0.0
        self.driver_s = 0.0  # unpacking results and writing their screenshots

    def start_actors(self, worker: type, spec: Mapping[str, Any]) -> None:
        """Create the actors and wait for their browsers; leave out those that fail.

        Raises:
            NoActorsLeftError: none started (names the first error).
        """
        ray, o = self.ray, self.options
        remote = ray.remote(worker)
        actor_options: dict[str, Any] = {
            "num_cpus": o.num_cpus,
            "max_restarts": 0,
            "max_concurrency": o.browsers_per_actor + 4,
        }
        if o.placement == "spread":
            actor_options["scheduling_strategy"] = "SPREAD"
        if o.resources:
            actor_options["resources"] = dict(o.resources)
        handles = {
            f"actor-{i}": remote.options(**actor_options).remote(spec) for i in range(o.actors)
        }
        starting = {handles[name].start.remote(): name for name in handles}
        try:
            ready, late = ray.wait(
                list(starting), num_returns=len(starting), timeout=o.startup_timeout_s
            )
        except BaseException:  # Ctrl-C while the browsers start: end every actor
            for handle in handles.values():
                with contextlib.suppress(Exception):
                    ray.kill(handle, no_restart=True)
            raise
        errors: list[str] = []
        for ref in ready:
            name = starting[ref]
            try:
                self.places[name] = ray.get(ref)
                self.handles[name] = handles[name]
            except Exception as exc:  # no browser or package on that node, a dead node
                errors.append(f"{name}: {_first_line(exc)}")
                logger.warning("rollout %s did not start: %s", name, _first_line(exc))
        for ref in late:
            errors.append(f"{starting[ref]}: not started after {o.startup_timeout_s:g} s")
        for name in set(handles) - set(self.handles):
            with contextlib.suppress(Exception):
                ray.kill(handles[name], no_restart=True)
        if not self.handles:
            raise NoActorsLeftError(f"no rollout actor started: {errors[0]}")
        nodes = len({p.get("node") or p.get("host") for p in self.places.values()})
        logger.info("%d rollout actors started on %d node(s)", len(self.handles), nodes)
        self.ledger = TaskLedger(len(self.todo), self.handles, max_attempts=o.max_attempts)
        self.startup_s = time.perf_counter() - self.started
        self.started = time.perf_counter()  # the iteration's time counts from here

    def dispatch(self) -> None:
        """Hand out tasks as browsers free up and collect the results, until every task is
        done (see the module docstring for what a lost actor does)."""
        ray, ledger = self.ray, self.ledger
        calls: dict[Any, tuple[str, int]] = {}
        while not ledger.complete:
            for name in [str(a) for a in ledger.actors]:
                while ledger.in_flight(name) < self.options.browsers_per_actor:
                    index = ledger.next_for(name)
                    if index is None:
                        break
                    ref = self.handles[name].run.remote(
                        index, self.dicts[index], self.iteration, self.rank
                    )
                    calls[ref] = (name, index)
            if not calls:  # every live actor idle and the queue empty: cannot happen
                raise NoActorsLeftError(ledger.no_actors_message())
            ready, _ = ray.wait(list(calls), num_returns=1, timeout=1.0)
            for ref in ready:
                name, index = calls.pop(ref)
                self._collect(ref, name, index, calls)

    def _collect(self, ref: Any, name: str, index: int, calls: dict[Any, tuple[str, int]]) -> None:
        """One finished call: keep its result, or hand the task (or the actor's) on."""
        ray, ledger = self.ray, self.ledger
        lost = tuple(  # the names this Ray has (ActorUnavailableError is recent)
            getattr(ray.exceptions, name)
            for name in _LOST
            if isinstance(getattr(ray.exceptions, name, None), type)
        )
        try:
            data = ray.get(ref)
        except lost as exc:
            if name not in ledger.held:
                return  # an actor already lost: its tasks went back to the queue
            back = ledger.lose(name)  # NoActorsLeftError when it was the last
            logger.warning(
                "rollout %s (%s) lost: %s; %d task(s) handed to the other actors",
                name,
                self.places.get(name, {}).get("host", "?"),
                _first_line(exc),
                len(back),
            )
            # Its other calls stay awaited (it gets no new task): an actor that was only
            # unreachable may still answer, and a task it finishes after its copy did is
            # a counted duplicate. stop_actors ends it.
            return
        except ray.exceptions.RayError as exc:
            if name not in ledger.held:
                return  # a lost actor's failed call: its task is back in the queue
            ledger.fail(name, index, _first_line(exc))  # TaskFailedError at the limit
            logger.warning("task %d failed on %s, handed on: %s", index, name, _first_line(exc))
            return
        if not ledger.finish(name, index):
            logger.info("task %d finished twice; the duplicate from %s is dropped", index, name)
            return
        t0 = time.perf_counter()
        shipped = unpack_outcome(data)
        self.outcomes[index] = shipped.write(self.root)
        self.driver_s += time.perf_counter() - t0
        self.timings.update({k: float(v) for k, v in shipped.header.get("timings", {}).items()})

    def discard(self) -> None:
        """Remove the screenshots written for a run that stores nothing."""
        from .screenshots import screenshot_folder

        folder = screenshot_folder(self.root, self.iteration, self.rank)
        for index in self.outcomes:
            for path in folder.glob(f"{index:04d}_*"):
                shutil.rmtree(path, ignore_errors=True)
        for directory in (folder, folder.parent):
            with contextlib.suppress(OSError):
                directory.rmdir()  # only when empty

    def stop_actors(self) -> None:
        """Close every actor's browsers (10 s at most), then end the actors."""
        ray = self.ray
        stopping = []
        for handle in self.handles.values():
            with contextlib.suppress(Exception):
                stopping.append(handle.stop.remote())
        with contextlib.suppress(Exception):
            ray.wait(stopping, num_returns=len(stopping), timeout=10.0)
        for handle in self.handles.values():
            with contextlib.suppress(Exception):
                ray.kill(handle, no_restart=True)

    def store(
        self, storage: Any, metadata: Mapping[str, Any] | None, blocklist: Any, history: Any
    ) -> IterationResult:
        """Write the kept trajectories as one iteration file; the result."""
        kept = sorted(self.outcomes)
        ordered = [self.outcomes[i] for i in kept]
        skipped = [t for i, t in enumerate(self.todo) if i not in self.outcomes]
        counts = self.ledger.counts
        report = {
            "actors": {
                name: {**self.places[name], "tasks": counts.per_actor.get(name, 0)}
                for name in self.places
            },
            "nodes": len({p.get("node") or p.get("host") for p in self.places.values()}),
            "startup_s": round(self.startup_s, 3),
            "driver_s": round(self.driver_s, 3),
            "duplicates": counts.duplicates,
            "reassigned": counts.reassigned,
            "lost_actors": [str(a) for a in counts.lost_actors],
        }
        blocked = sorted({_site(o) for o in ordered if o.status == "blocked"} - {""})
        if blocklist is not None:
            for o in ordered:
                if o.status == "blocked":
                    last = o.trajectory[-1]["observation"]
                    url = (last.page_metadata or {}).get("url") or o.task.website
                    blocklist.record_blocked_website(
                        url, task_id=o.task.task_id, screenshot_path=last.image_path
                    )
        path = None
        if ordered:
            path = storage.save_iteration(
                self.iteration,
                [o.trajectory for o in ordered],
                rank=self.rank,
                metadata={
                    **dict(metadata or {}),
                    "collector": "replaystore.rollouts.ray",
                    "statuses": dict(Counter(o.status for o in ordered)),
                    "interrupted": self.interrupted,
                    "skipped_task_ids": [t.task_id for t in skipped],
                    "blocked_sites": blocked,
                    "ray": {k: v for k, v in report.items() if k != "actors"},
                },
            )
        if history is not None:
            history.update([o.trajectory for o in ordered if o.status != "navigation_error"])
        result = IterationResult(
            iteration=self.iteration,
            rank=self.rank,
            outcomes=ordered,
            skipped=skipped,
            path=path,
            interrupted=self.interrupted,
            blocked_sites=blocked,
            navigation_errors={},
            seconds=time.perf_counter() - self.started,
            timings=dict(self.timings),
            model_server_error=_server_error(ordered),
            ray=report,
        )
        logger.info(
            "iteration %d rank %d on Ray: %d trajectories from %d actor(s) on %d node(s), "
            "%d reassigned, %d duplicate(s), %.2f steps/s",
            result.iteration,
            result.rank,
            len(ordered),
            len(self.places),
            report["nodes"],
            counts.reassigned,
            counts.duplicates,
            result.steps_per_second,
        )
        return result


def _connect(address: str | None) -> tuple[ModuleType, bool]:
    """Ray, connected (to ``address`` unless already initialized); whether we connected.

    Raises:
        ImportError: no Ray (names the extra).
        ConfigError: the address cannot be reached (one line).
    """
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - exercised only without ray
        raise ImportError(f"Ray rollouts need Ray, which is not installed: {_INSTALL}") from exc
    if ray.is_initialized():
        return ray, False
    target = address or "auto"
    host, _, port = target.rpartition(":")
    if "://" not in target and host and port.isdigit():
        # ray.init retries an unreachable GCS for a minute: fail fast with one line.
        try:
            socket.create_connection((host, int(port)), timeout=5.0).close()
        except OSError as exc:
            raise ConfigError(
                f"cannot reach the Ray cluster at {target}: {exc.strerror or exc}; start it "
                "with `ray start --head` or give the head's GCS address (host:6379)"
            ) from None
    try:
        ray.init(address=target, log_to_driver=False, configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ConfigError(
            f"cannot connect to the Ray cluster at {target}: {_first_line(exc)}"
        ) from None
    return ray, True


def _server_error(outcomes: list[TaskOutcome]) -> str | None:
    """The model server's message when it failed the iteration (as the collector says)."""
    failed = [o.error for o in outcomes if (o.error or "").startswith("ModelServerError: ")]
    for message in failed:
        if is_text_only_model_error(str(message)):
            return str(message).removeprefix("ModelServerError: ")
    if outcomes and len(failed) == len(outcomes):
        return str(failed[0]).removeprefix("ModelServerError: ")
    return None


def _site(outcome: TaskOutcome) -> str:
    from replaystore.pipeline.blocklist import normalize_site

    url = (outcome.trajectory[-1]["observation"].page_metadata or {}).get("url") or ""
    try:
        return normalize_site(url or outcome.task.website)
    except ValueError:
        return ""


def _first_line(exc: BaseException) -> str:
    """The first line of what went wrong: a remote call's own exception, not Ray's wrapper."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException) and cause is not exc:
        exc = cause
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
