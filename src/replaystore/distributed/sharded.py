"""Transitions sharded over N Ray actors, sampled exactly as one big buffer.

Each shard actor holds a ``transitions.ReplayBuffer`` (RAM storage) of
``buffer_size`` transitions. Adds go to the shards round-robin, one batch per
shard. Sampling ``n`` items:

1. one call per shard returns its size, priority total and minimum;
2. the client draws how many items come from each shard,
   ``multinomial(n, total_s / sum_s total_s)`` (sizes for uniform sampling);
3. each shard draws its share inside itself, proportionally to priority
   (by default steps 1 and 3 are one call: each shard draws ``n`` items with
   its statistics and the client keeps the first ``count_s``, which are iid);
4. the client shuffles the union and computes the importance weights from the
   GLOBAL total and minimum: ``w_i = (p_i / p_min) ** -beta``.

So item ``i`` is drawn with probability ``p_i / sum p`` (``1 / size`` uniform):
the distribution of one buffer holding the union. Global indices are
``shard * buffer_size + position`` and route ``update_priorities`` back.
Items added by other writers between steps 1 and 3 may shift a shard's share
by those items' mass (one round trip's worth), as in any concurrent buffer.

Rate limiting (``rate_limiter=``): one :class:`~replaystore.transitions.RateLimiter`
for the whole buffer lives in its own actor (``<name>-limiter``). A shard asks
it for room before writing a batch and reports the batch (and the rows its ring
overwrote) once written, before its ``add_batch`` returns;
:meth:`ShardedReplayBuffer.sample_batch` asks it for ``batch_size`` samples
before drawing. A shard waits for room in its own
concurrency group (``inserts``), so it keeps serving samples meanwhile.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from tensordict import TensorDict

from replaystore.atomic import atomic_write_json
from replaystore.distributed._ray import (
    import_ray,
    logger,
    require_initialized,
    reraise,
)
from replaystore.errors import (
    ArgumentError,
    BufferIndexError,
    CheckpointError,
    EmptyBufferError,
    PriorityError,
    RateLimitTimeout,
    check_number,
)
from replaystore.transitions.rate_limiter import RateLimiter

__all__ = ["ShardedReplayBuffer"]

_MANIFEST = "manifest.json"
_FORMAT = "replaystore.sharded/1"
_LIMITER = "the rate limiter actor"


class LimiterHost:
    """The one RateLimiter of a sharded buffer, inside an actor (not public).

    Its waiting calls (``acquire_samples``, ``reserve_inserts``) run in the
    ``waits`` concurrency group, up to 256 at once (one per shard adding, one per
    learner sampling: far fewer in practice); the calls that wake them (commits,
    cancels) in the default group, so they never queue behind a wait.
    """

    def __init__(self, limiter: RateLimiter) -> None:
        self.limiter = limiter

    def acquire_samples(self, n: int, timeout: float | None) -> None:
        self.limiter.acquire_samples(n, timeout)

    def cancel_samples(self, n: int) -> None:
        self.limiter.cancel_samples(n)

    def reserve_inserts(self, n: int, timeout: float | None) -> int:
        return self.limiter.reserve_inserts(n, timeout)

    def commit_inserts(self, n: int, deleted: int) -> None:
        self.limiter.commit_inserts(n, deleted)

    def cancel_inserts(self, n: int) -> None:
        self.limiter.cancel_inserts(n)

    def get(self) -> RateLimiter:
        return self.limiter  # sent as a copy: settings and counters

    def restore(self, inserts: int, samples: int, size: int) -> None:
        self.limiter.restore(inserts, samples, size)


class ShardHost:
    """One shard: a transitions.ReplayBuffer inside an actor (not public).

    With ``checkpoint_dir`` and ``checkpoint_every``, the shard saves itself to
    ``<checkpoint_dir>/shard-<i>/auto`` after every ``checkpoint_every`` added
    transitions, and on (re)start loads that checkpoint when it exists.
    """

    def __init__(self, shard: int, config: dict[str, Any], limiter: Any = None) -> None:
        self.error: Exception | None = None
        self.limiter = limiter  # the LimiterHost actor, or None
        try:
            self._setup(shard, config)
        except Exception as exc:
            # Raised again by info(): an __init__ error would reach the client as
            # a dead actor, without the exception's type.
            self.error = exc

    def _setup(self, shard: int, config: dict[str, Any]) -> None:
        from replaystore.transitions import ReplayBuffer

        seed = config["seed"]
        self.shard = shard
        self.config = config
        self.buf = ReplayBuffer(
            "cpu",
            "cpu",
            config["buffer_size"],
            sampler=config["sampler"],
            alpha=config["alpha"],
            beta=config["beta"],
            eps=config["eps"],
            seed=None if seed is None else seed * 1000 + shard,
            storage="memory",
        )
        self.every = config["checkpoint_every"]
        self.auto: Path | None = None
        self.since = 0
        self.restored = 0
        if config["checkpoint_dir"]:
            self.auto = Path(config["checkpoint_dir"]) / f"shard-{shard}" / "auto"
            if Path(f"{self.auto}.metadata").exists():
                self.buf.load(self.auto)
                self.restored = int(self.buf.size)
                logger.warning(
                    "shard %d restarted from its checkpoint %s (%d transitions)",
                    shard,
                    self.auto,
                    self.restored,
                )

    def info(self) -> dict[str, Any]:
        if self.error is not None:
            raise self.error
        return {**self.config, "shard": self.shard, "restored": self.restored, "pid": os.getpid()}

    def add_batch(self, batch: Mapping[str, Any], timeout: float | None = None) -> int:
        n = len(next(iter(batch.values()))) if batch else 0
        if self.limiter is None or not n:
            self.buf.add_batch(batch)
        else:
            self._add_limited(batch, n, timeout)
        self.since += n
        if self.auto is not None and self.every and self.since >= self.every:
            self.buf.save(self.auto)
            self.since = 0
        return int(self.buf.size)

    def _add_limited(self, batch: Mapping[str, Any], n: int, timeout: float | None) -> None:
        """Write ``batch`` in the parts the limiter allows, reporting each (see the class)."""
        ray = import_ray()
        deadline = None if timeout is None else time.monotonic() + timeout
        wait = self.limiter.reserve_inserts.options(concurrency_group="waits")
        done = 0
        while done < n:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                k = ray.get(wait.remote(n - done, left))
            except ray.exceptions.RayError as exc:
                try:
                    reraise(exc, _LIMITER)
                except RateLimitTimeout as timed_out:
                    raise RateLimitTimeout(
                        f"add_batch of {n} rows to shard {self.shard} timed out after "
                        f"{timeout:g} s with the first {done} added: {timed_out}",
                        requested=n,
                        completed=done,
                    ) from None
            part = batch if k == n else {key: v[done : done + k] for key, v in batch.items()}
            before = int(self.buf.size)
            try:
                self.buf.add_batch(part)
            except BaseException:
                self.limiter.cancel_inserts.remote(k)
                raise
            # Waited for, so that when add_batch returns its rows are counted: a
            # sample or a counter read that follows it sees them (one round trip).
            ray.get(self.limiter.commit_inserts.remote(k, k - (int(self.buf.size) - before)))
            done += k

    def stats(self) -> tuple[int, float, float]:
        size = int(self.buf.size)
        if self.buf.sampler != "prioritized" or size == 0:
            return size, float(size), 1.0
        total, minimum = self.buf.priority_stats()
        return size, total, minimum

    def sample(self, k: int) -> tuple[dict[str, np.ndarray], np.ndarray | None, np.ndarray | None]:
        td = self.buf.sample_batch(k)
        fields = {key: td[key].numpy() for key in self.buf.fields or {}}
        if self.buf.sampler != "prioritized":
            return fields, None, None
        idx = td["index"].numpy()
        return fields, idx, self.buf.priorities_at(idx)

    def stats_and_sample(self, k: int) -> tuple[tuple[int, float, float], Any]:
        """Statistics and ``k`` draws taken at the same instant (one round trip)."""
        stats = self.stats()
        return stats, (self.sample(k) if stats[0] else None)

    def sample_all(self) -> dict[str, np.ndarray] | None:
        if not self.buf.size:
            return None
        td = self.buf.sample_all()
        return {key: td[key].numpy() for key in self.buf.fields or {}}

    def update_priorities(self, idx: np.ndarray, priorities: np.ndarray) -> None:
        self.buf.update_priorities(idx, priorities)

    def set_beta(self, beta: float) -> None:
        self.buf.beta = beta

    def save(self, path: str) -> None:
        self.buf.save(path)

    def load(self, path: str) -> int:
        self.buf.load(path)
        return int(self.buf.size)


class ShardedReplayBuffer:
    """Transitions in ``num_shards`` Ray actors, sampled as one buffer of all of them.

    Args:
        num_shards: number of shard actors (>= 1).
        buffer_size: capacity of EACH shard in transitions (total:
            ``num_shards * buffer_size``).
        sampler, alpha, beta, eps: as ``transitions.ReplayBuffer``.
        seed: seeds the client's draws and every shard (``seed * 1000 + shard``).
        device: where sampled batches go.
        name: Ray actor name prefix (shards are ``<name>-shard-<i>``) so other
            jobs find them with :meth:`connect`; ``detached`` keeps them after
            this driver exits.
        checkpoint_dir, checkpoint_every: each shard saves itself to
            ``<checkpoint_dir>/shard-<i>/auto`` after every ``checkpoint_every``
            added transitions, and loads it when (re)started.
        max_restarts: how often Ray restarts a dead shard. A restarted shard
            comes back from its last periodic checkpoint; the loss window is
            what it received after that checkpoint: fewer than
            ``checkpoint_every`` + one add batch transitions, plus the calls in
            flight when it died (those raise :class:`RemoteActorError`).
        num_cpus: CPUs each shard reserves (0 by default).
        single_round: how :meth:`sample_batch` talks to the shards. True (default):
            one round trip; every shard draws the whole batch and returns it with
            its statistics, the client keeps each shard's share (transfers
            ``num_shards`` times the batch's rows: cheap for vector observations).
            False: two rounds (statistics, then each shard draws only its
            share): for large observations (images). Same distribution either way.
        rate_limiter: one :class:`~replaystore.transitions.RateLimiter` for all
            shards (hosted in the actor ``<name>-limiter``): ``sample_batch``
            waits for ``min_size_to_sample`` transitions over all shards and, with
            ``samples_per_insert``, samples and adds wait for each other. Its
            counters are in :meth:`save`'s manifest.

    Raises:
        ArgumentError: a bad argument (named).
        RuntimeError: Ray is not initialized.
    """

    def __init__(
        self,
        num_shards: int,
        buffer_size: int,
        *,
        sampler: Literal["uniform", "prioritized"] = "prioritized",
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-6,
        seed: int | None = None,
        device: torch.device | str = "cpu",
        name: str | None = None,
        namespace: str | None = None,
        detached: bool = False,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        checkpoint_every: int | None = None,
        max_restarts: int = 0,
        num_cpus: float = 0,
        single_round: bool = True,
        rate_limiter: RateLimiter | None = None,
    ) -> None:
        ray = import_ray()
        require_initialized(ray)
        for label, value in (("num_shards", num_shards), ("buffer_size", buffer_size)):
            if type(value) is not int or value < 1:
                raise ArgumentError(f"{label} must be an integer >= 1, got {value!r}")
        if sampler not in ("uniform", "prioritized"):
            raise ArgumentError(f"sampler must be 'uniform' or 'prioritized', got {sampler!r}")
        if checkpoint_every is not None and (
            type(checkpoint_every) is not int or checkpoint_every < 1
        ):
            raise ArgumentError(
                f"checkpoint_every must be an integer >= 1, got {checkpoint_every!r}"
            )
        if (checkpoint_every is None) != (checkpoint_dir is None):
            raise ArgumentError(
                "checkpoint_dir and checkpoint_every go together: give both or neither"
            )
        if detached and not name:
            raise ArgumentError("detached=True needs name= (detached actors are found by name)")
        if rate_limiter is not None:
            if not isinstance(rate_limiter, RateLimiter):
                raise ArgumentError(
                    f"rate_limiter must be a RateLimiter or None, got {type(rate_limiter).__name__}"
                )
            if rate_limiter.min_size_to_sample > num_shards * buffer_size:
                raise ArgumentError(
                    f"rate_limiter.min_size_to_sample={rate_limiter.min_size_to_sample} is above "
                    f"the total capacity {num_shards * buffer_size}: no sample could ever go on"
                )
        config = {
            "num_shards": num_shards,
            "buffer_size": buffer_size,
            "sampler": sampler,
            "alpha": float(alpha),
            "beta": float(beta),
            "eps": float(eps),
            "seed": seed,
            "checkpoint_dir": None
            if checkpoint_dir is None
            else str(Path(checkpoint_dir).resolve()),
            "checkpoint_every": checkpoint_every,
            "max_restarts": int(max_restarts),
            "name": name,
            "single_round": bool(single_round),
            "rate_limited": rate_limiter is not None,
        }
        options: dict[str, Any] = {"num_cpus": num_cpus, "max_restarts": int(max_restarts)}
        if namespace:
            options["namespace"] = namespace
        if detached:
            options["lifetime"] = "detached"
        limiter = None
        if rate_limiter is None:
            host = ray.remote(ShardHost)
        else:
            # A shard waits for room in its "inserts" group, still serving samples.
            host = ray.remote(concurrency_groups={"inserts": 1})(ShardHost)
            lim_host = ray.remote(concurrency_groups={"waits": 256})(LimiterHost)
            opts = dict(options, name=f"{name}-limiter") if name else options
            limiter = lim_host.options(**opts).remote(rate_limiter)
        actors = []
        for i in range(num_shards):
            opts = dict(options, name=f"{name}-shard-{i}") if name else options
            actors.append(host.options(**opts).remote(i, config, limiter))
        self._init(actors, config, device, limiter)
        # Construction errors (bad alpha, ...) surface here with their own type.
        try:
            self._get([a.info.remote() for a in actors], range(num_shards))
        except BaseException:
            self.terminate()
            raise
        logger.info("started %d shards of %d transitions", num_shards, buffer_size)

    def _init(
        self,
        actors: list[Any],
        config: dict[str, Any],
        device: torch.device | str,
        limiter: Any = None,
    ) -> None:
        self._actors = actors
        self._limiter = limiter
        self._config = config
        self._capacity = config["buffer_size"]
        self._prioritized = config["sampler"] == "prioritized"
        self._beta = config["beta"]
        self._rng = np.random.default_rng(config["seed"])
        self._device = torch.device(device)
        self._next = 0
        self._single_round = bool(config.get("single_round", True))

    @classmethod
    def connect(
        cls, name: str, namespace: str | None = None, *, device: torch.device | str = "cpu"
    ) -> ShardedReplayBuffer:
        """A client of the shards named ``<name>-shard-<i>`` (started by another job).

        Raises:
            ValueError: no shard 0 has that name (Ray's error).
        """
        ray = import_ray()
        require_initialized(ray)
        first = ray.get_actor(f"{name}-shard-0", namespace=namespace)
        config = ray.get(first.info.remote())
        actors = [first] + [
            ray.get_actor(f"{name}-shard-{i}", namespace=namespace)
            for i in range(1, config["num_shards"])
        ]
        limiter = None
        if config.get("rate_limited"):
            limiter = ray.get_actor(f"{name}-limiter", namespace=namespace)
        self = cls.__new__(cls)
        self._init(actors, config, device, limiter)
        return self

    # --------------------------------------------------------------- helpers

    def _what(self, shard: int) -> str:
        name = self._config["name"]
        label = f"shard {shard} of {name!r}" if name else f"shard {shard}"
        if self._config["max_restarts"] and self._config["checkpoint_dir"]:
            label += (
                f" (Ray restarts it up to {self._config['max_restarts']} times from its last "
                f"checkpoint in {self._config['checkpoint_dir']}; retry shortly)"
            )
        elif self._config["max_restarts"]:
            label += " (Ray restarts it empty: no checkpoint_dir)"
        return label

    def _get(self, refs: list[Any], shards: Any) -> list[Any]:
        ray = import_ray()
        out = []
        for ref, shard in zip(refs, shards, strict=True):
            try:
                out.append(ray.get(ref))
            except ray.exceptions.RayError as exc:
                reraise(exc, self._what(shard))
        return out

    def _limiter_call(self, ref: Any) -> Any:
        ray = import_ray()
        try:
            return ray.get(ref)
        except ray.exceptions.RayError as exc:
            reraise(exc, _LIMITER)

    @property
    def rate_limiter(self) -> RateLimiter | None:
        """A copy of the shared rate limiter (its settings and counters now), or None."""
        if self._limiter is None:
            return None
        return self._limiter_call(self._limiter.get.remote())

    @property
    def num_shards(self) -> int:
        """Number of shard actors."""
        return len(self._actors)

    @property
    def actors(self) -> list[Any]:
        """The shard actor handles, shard 0 first (for ``ray.kill`` or monitoring)."""
        return list(self._actors)

    @property
    def buffer_size(self) -> int:
        """Total capacity: ``num_shards * buffer_size`` transitions."""
        return self._capacity * len(self._actors)

    @property
    def beta(self) -> float:
        """Importance-weight exponent (settable; sent to every shard)."""
        return self._beta

    @beta.setter
    def beta(self, value: float) -> None:
        self._get([a.set_beta.remote(value) for a in self._actors], range(self.num_shards))
        self._beta = float(value)

    def _stats(self) -> list[tuple[int, float, float]]:
        return self._get([a.stats.remote() for a in self._actors], range(self.num_shards))

    def shard_sizes(self) -> list[int]:
        """Transitions held by each shard, shard 0 first (one call per shard)."""
        return [s[0] for s in self._stats()]

    @property
    def size(self) -> int:
        """Transitions stored over all shards."""
        return sum(self.shard_sizes())

    def __len__(self) -> int:
        return self.size

    # ------------------------------------------------------------------ adds

    def submit_add_batch(self, batch: Mapping[str, Any]) -> tuple[Any, str]:
        """Send one batch to the next shard (round-robin) without waiting: ``(ObjectRef,
        label)``, the label naming the shard in errors (what :class:`BatchingWriter` sends)."""
        shard = self._next
        self._next = (shard + 1) % len(self._actors)
        return self._add_method(shard).remote(batch), self._what(shard)

    def _add_method(self, shard: int) -> Any:
        method = self._actors[shard].add_batch
        return method if self._limiter is None else method.options(concurrency_group="inserts")

    def add_batch(
        self, batch: Mapping[str, Any], *, shard: int | None = None, timeout: float | None = None
    ) -> None:
        """Add N transitions to one shard (the next round-robin one, or ``shard``).

        Args:
            batch: mapping of key -> array / tensor with a leading dimension N,
                as ``transitions.ReplayBuffer.add_batch``.
            shard: the shard to write to (default: round-robin).
            timeout: with a rate limiter, seconds to wait at most for room (None:
                no limit); the batch goes on in parts as room comes, as locally.

        Raises:
            SchemaError: as the local buffer (raised with its type).
            RemoteActorError: the shard is dead (named).
            RateLimitTimeout: ``timeout`` passed; its first ``exc.completed`` rows
                were added.
        """
        if timeout is not None:
            timeout = check_number(timeout, "timeout", minimum=0)
        if shard is None:
            shard = self._next
            self._next = (shard + 1) % len(self._actors)
        elif type(shard) is not int or not 0 <= shard < len(self._actors):
            raise ArgumentError(f"shard must be in 0..{len(self._actors) - 1}, got {shard!r}")
        self._get([self._add_method(shard).remote(dict(batch), timeout)], [shard])

    # -------------------------------------------------------------- sampling

    def sample_batch(self, batch_size: int, *, timeout: float | None = None) -> TensorDict:
        """Draw ``batch_size`` transitions over all shards, with replacement.

        Same distribution and keys as ``transitions.ReplayBuffer.sample_batch`` on
        one buffer holding every shard's items: prioritized adds ``index``
        (global: ``shard * buffer_size + position``) and ``weight``
        (``(p_i / p_min) ** -beta`` with the global minimum, at most 1).

        With a rate limiter the call first waits (at most ``timeout`` seconds;
        None: no limit) until the shared limiter allows ``batch_size`` samples.

        Raises:
            EmptyBufferError: no shard holds anything.
            ArgumentError: ``batch_size`` is not a positive integer, or a bad ``timeout``.
            RemoteActorError: a shard is dead (named).
            RateLimitTimeout: ``timeout`` passed first (no sample is counted).

        Cost: one round of actor calls (``single_round=True``; two otherwise, see
        the constructor), then one concatenation and one permutation; one more
        round trip, to the limiter actor, with a rate limiter.
        """
        if type(batch_size) is not int or batch_size < 1:
            raise ArgumentError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        if timeout is not None:
            timeout = check_number(timeout, "timeout", minimum=0)
        if self._limiter is None:
            return self._draw(batch_size)
        wait = self._limiter.acquire_samples.options(concurrency_group="waits")
        self._limiter_call(wait.remote(batch_size, timeout))
        try:
            return self._draw(batch_size)
        except BaseException:
            self._limiter.cancel_samples.remote(batch_size)  # nothing was drawn
            raise

    def _draw(self, batch_size: int) -> TensorDict:
        """``batch_size`` transitions over all shards (see :meth:`sample_batch`)."""
        if self._single_round:
            # Each shard draws the whole batch with its statistics; the first
            # counts[s] of shard s's iid draws are a draw of counts[s] items.
            both = self._get(
                [a.stats_and_sample.remote(batch_size) for a in self._actors],
                range(self.num_shards),
            )
            stats = [b[0] for b in both]
        else:
            stats = self._stats()
        mass = np.array([s[1] for s in stats], dtype=np.float64)
        if mass.sum() <= 0:
            raise EmptyBufferError("the sharded buffer is empty: no shard holds a transition")
        counts = self._rng.multinomial(batch_size, mass / mass.sum())
        shards = [i for i, c in enumerate(counts) if c]
        if self._single_round:
            parts = []
            for i in shards:
                fields, idx, pri = both[i][1]
                k = int(counts[i])
                parts.append(
                    (
                        {key: v[:k] for key, v in fields.items()},
                        None if idx is None else idx[:k],
                        None if pri is None else pri[:k],
                    )
                )
        else:
            parts = self._get(
                [self._actors[i].sample.remote(int(counts[i])) for i in shards], shards
            )
        order = self._rng.permutation(batch_size)
        out: dict[str, torch.Tensor] = {}
        for key in parts[0][0]:
            out[key] = torch.from_numpy(np.concatenate([p[0][key] for p in parts])[order])
        if self._prioritized:
            gidx = np.concatenate(
                [p[1] + i * self._capacity for p, i in zip(parts, shards, strict=True)]
            )[order]
            pri = np.concatenate([p[2] for p in parts])[order]
            pmin = min(s[2] for s in stats if s[0])
            out["index"] = torch.from_numpy(gidx.astype(np.int64))
            out["weight"] = torch.from_numpy(((pri / pmin) ** -self._beta).astype(np.float32))
        return TensorDict(out, batch_size=[batch_size], device=self._device)

    def sample_all(self) -> TensorDict:
        """Every stored transition, shard 0 first, each shard in storage order (a copy).

        Row ``j`` of shard ``s``'s part has global index ``s * buffer_size + j``.

        Raises:
            EmptyBufferError: no shard holds anything.
            RemoteActorError: a shard is dead (named).
        """
        parts = self._get([a.sample_all.remote() for a in self._actors], range(self.num_shards))
        parts = [p for p in parts if p is not None]
        if not parts:
            raise EmptyBufferError("the sharded buffer is empty: no shard holds a transition")
        out = {key: torch.from_numpy(np.concatenate([p[key] for p in parts])) for key in parts[0]}
        n = sum(len(next(iter(p.values()))) for p in parts)
        return TensorDict(out, batch_size=[n], device=self._device)

    def update_priorities(self, indices: Any, priorities: Any) -> None:
        """Set priorities by GLOBAL index (a sample's ``index``); routed to each shard.

        Everything is validated before any shard changes.

        Raises:
            PriorityError: a uniform buffer, lengths differ, or a NaN, infinite or
                negative priority (the index is named).
            BufferIndexError: an index names no stored transition.
            RemoteActorError: a shard is dead (named).
        """
        if not self._prioritized:
            raise PriorityError(
                "update_priorities needs a buffer created with sampler='prioritized'"
            )
        if isinstance(indices, torch.Tensor):
            indices = indices.detach().cpu().numpy()
        if isinstance(priorities, torch.Tensor):
            priorities = priorities.detach().cpu().numpy()
        idx = np.asarray(indices).reshape(-1)
        if idx.size and not np.issubdtype(idx.dtype, np.integer):
            raise BufferIndexError(f"indices must be integers, got dtype {idx.dtype}")
        idx = idx.astype(np.int64)
        try:
            pri = np.array(priorities, dtype=np.float64).reshape(-1)
        except (TypeError, ValueError) as exc:
            raise PriorityError(f"priorities must be numbers: {exc}") from exc
        if pri.shape != idx.shape:
            raise PriorityError(f"got {idx.size} indices but {pri.size} priorities")
        bad = ~((pri >= 0) & (pri < np.inf))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            need = "must be >= 0" if pri[i] < 0 else "must be finite"
            raise PriorityError(f"priority for index {int(idx[i])} is {pri[i]} ({need})")
        shard, local = np.divmod(idx, self._capacity)
        sizes = self.shard_sizes()
        ok = (idx >= 0) & (shard < len(sizes))
        ok[ok] &= local[ok] < np.asarray(sizes)[shard[ok]]
        if not ok.all():
            j = int(np.flatnonzero(~ok)[0])
            raise BufferIndexError(
                f"index {int(idx[j])} names no stored transition (shard sizes {sizes}, "
                f"global index = shard * {self._capacity} + position)"
            )
        targets = [int(s) for s in np.unique(shard)]
        refs = [
            self._actors[s].update_priorities.remote(local[shard == s], pri[shard == s])
            for s in targets
        ]
        self._get(refs, targets)

    # ----------------------------------------------------------- checkpoints

    def save(self, path: str | os.PathLike[str]) -> None:
        """Checkpoint every shard plus a manifest, atomic as a whole.

        The manifest also holds the rate limiter's counters (with ``rate_limiter``);
        :meth:`load` restores them (a manifest without them counts the loaded
        transitions as just inserted, none sampled).

        Each shard writes a full checkpoint into a new generation directory
        ``<path>/gen-<id>/shard-<i>``; then ``<path>/manifest.json`` is replaced
        atomically (temp file, fsync, rename) to name that generation; then older
        generations are removed. A save killed at any point leaves the previous
        manifest and the generation it names intact.

        Raises:
            EmptyBufferError: a shard holds nothing yet (it has no schema).
            RemoteActorError: a shard is dead (named).
        """
        root = Path(path).resolve()
        gen = f"gen-{uuid.uuid4().hex[:12]}"
        files = [str(root / gen / f"shard-{i}") for i in range(self.num_shards)]
        (root / gen).mkdir(parents=True, exist_ok=True)
        try:
            self._get(
                [a.save.remote(f) for a, f in zip(self._actors, files, strict=True)],
                range(self.num_shards),
            )
        except BaseException:
            shutil.rmtree(root / gen, ignore_errors=True)
            raise
        manifest = {
            "format": _FORMAT,
            "num_shards": self.num_shards,
            "buffer_size": self._capacity,
            "sampler": self._config["sampler"],
            "generation": gen,
            "shards": [f"{gen}/shard-{i}" for i in range(self.num_shards)],
        }
        if self._limiter is not None:
            manifest["rate_limiter"] = self._limiter_call(self._limiter.get.remote()).state_dict()
        atomic_write_json(root / _MANIFEST, manifest)
        for old in root.glob("gen-*"):
            if old.name != gen:
                shutil.rmtree(old, ignore_errors=True)

    def load(self, path: str | os.PathLike[str]) -> None:
        """Restore every shard from the checkpoint ``path`` written by :meth:`save`.

        Raises:
            CheckpointError: no manifest, another format, or another number of
                shards or shard capacity than this buffer.
            RemoteActorError: a shard is dead (named).
        """
        root = Path(path).resolve()
        try:
            import json

            manifest = json.loads((root / _MANIFEST).read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise CheckpointError(
                f"{root} holds no sharded checkpoint ({_MANIFEST} missing)"
            ) from exc
        except ValueError as exc:
            raise CheckpointError(f"{root / _MANIFEST} is not valid JSON: {exc}") from exc
        if manifest.get("format") != _FORMAT:
            raise CheckpointError(
                f"{root / _MANIFEST}: format {manifest.get('format')!r}, expected {_FORMAT!r}"
            )
        for key, mine in (("num_shards", self.num_shards), ("buffer_size", self._capacity)):
            if manifest.get(key) != mine:
                raise CheckpointError(
                    f"checkpoint {root} has {key}={manifest.get(key)} but this buffer has {mine}"
                )
        files = [str(root / rel) for rel in manifest["shards"]]
        sizes = self._get(
            [a.load.remote(f) for a, f in zip(self._actors, files, strict=True)],
            range(self.num_shards),
        )
        if self._limiter is not None:
            # Without saved counters the loaded items count as just inserted, none sampled.
            total = sum(sizes)
            state = manifest.get("rate_limiter") or {"inserts": total, "samples": 0}
            try:
                inserts, samples = int(state["inserts"]), int(state["samples"])
            except (KeyError, TypeError, ValueError) as exc:
                raise CheckpointError(f"{root / _MANIFEST}: bad rate_limiter: {exc!r}") from exc
            if min(inserts, samples) < 0:
                raise CheckpointError(f"{root / _MANIFEST}: negative rate limiter counters")
            self._limiter_call(self._limiter.restore.remote(inserts, samples, total))

    def terminate(self) -> None:
        """Kill every shard actor now (detached ones too); their contents are lost unless saved."""
        ray = import_ray()
        for actor in self._actors:
            ray.kill(actor, no_restart=True)
        if self._limiter is not None:
            ray.kill(self._limiter, no_restart=True)
