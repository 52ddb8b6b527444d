"""WebGym's trajectory replay buffer, as a ``torch.utils.data.Dataset``, fixed and fast.

One sample per step of every (non-dummy) trajectory::

    {"message": [chat messages of the prompt], "action": raw model response,
     "trajectory_reward": final reward of the trajectory, "same_as_next_screenshot": bool}

(only ``message`` and ``action`` with ``include_reward_in_sample=False``).

How it is built: per-step facts (trajectory, step, trajectory reward,
same-as-next flag, eligibility) live in NumPy arrays; prompts are parsed (or
built by the agent's conversation builder) only when a sample is accessed. So
the buffer costs a few dozen bytes per step instead of WebGym's ~4.4 KiB of
Python objects, and building it is a few vectorised passes. Opened with
:meth:`ReplayBuffer.from_storage`, it keeps only that index in memory and reads
each step from its iteration file on access.

Where we differ from WebGym (each is a WebGym bug or gap, see README,
"What differs from WebGym, and why"):

* ``shuffle`` permutes the order of ``len``/``getitem`` only, with a seed;
  WebGym shuffled the sample list but kept the pre-shuffle training indices, so
  ``filter_successful_only=True, shuffle=True`` served mostly failed steps.
* ``capacity`` keeps the most recent samples in collection order and every
  index stays valid (WebGym's indices could point past the truncated list).
* ``get_training_samples`` always draws from training-eligible samples only
  (successful trajectory, and not same-as-next when ``filter_same_screenshot``),
  whatever ``filter_successful_only`` says; WebGym returned every sample when
  ``filter_successful_only=False``.
* a final reward of None raises :class:`TrajectoryError` naming the trajectory
  (WebGym: ``AttributeError`` deep inside, or a silent "failed").
* ``same_as_next_screenshot`` is computed from the pixels when a step lacks it
  (WebGym assumed "different").
"""

from __future__ import annotations

import json
import logging
import math
import operator
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, overload

import numpy as np
import torch
from numpy.typing import NDArray
from torch.utils.data import Dataset, Subset

from replaystore.errors import ArgumentError, TrajectoryError
from replaystore.sampling import (
    AliasTable,
    recency_sample_without_replacement,
    recency_weights,
    weighted_sample_without_replacement,
)
from replaystore.trajectories.components import Observation, Response
from replaystore.trajectories.index import (
    StepIndex,
    StepSource,
    is_dummy_trajectory,
)
from replaystore.trajectories.memory_index import index_trajectories
from replaystore.trajectories.screenshots import (
    ScreenshotFingerprinter,
)
from replaystore.trajectories.storage import TrajectoryStorage

__all__ = [
    "BufferStats",
    "ReplayBuffer",
    "SampleList",
    "StepIndex",
    "StepSource",
    "TrajectoryBuffer",
    "index_trajectories",
    "is_dummy_trajectory",
]

logger = logging.getLogger("replaystore.trajectories.buffer")

#: Samples a file-backed buffer reads together when iterated (see ``_iter_samples``).
SAMPLE_CHUNK = 1024

_TABLE_CACHE_SIZE = 4


# --------------------------------------------------------------------------- helpers


def parse_prompt(raw_prompt: str, where: str) -> list[dict[str, Any]]:
    """Chat messages from a stored ``raw_prompt`` (JSON list of ``{"role", "content"}``).

    Raises:
        TrajectoryError: not JSON, or not a list of messages with role and content.
    """
    try:
        messages = json.loads(raw_prompt)
    except json.JSONDecodeError as exc:
        raise TrajectoryError(f"{where} has invalid JSON in raw_prompt: {exc}") from None
    _check_messages(messages, where, "raw_prompt")
    return messages


def _check_messages(messages: Any, where: str, origin: str) -> None:
    if not isinstance(messages, list):
        raise TrajectoryError(
            f"{where}: {origin} must be a list of chat messages, got {type(messages).__name__}"
        )
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise TrajectoryError(f"{where}: {origin} message {i} has no 'role'")
        if "content" not in message:
            raise TrajectoryError(f"{where}: {origin} message {i} has no 'content'")


def _rank() -> int:
    """This process's rank: torch.distributed when initialised, else env RANK, else 0."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return int(torch.distributed.get_rank())
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


# --------------------------------------------------------------------------- results


@dataclass(frozen=True, slots=True)
class BufferStats:
    """Summary of a buffer, computed once at construction.

    Attributes:
        trajectories: non-dummy trajectories.
        successful_trajectories: those whose final reward >= the success threshold.
        success_rate: successful / trajectories (0.0 when there are none).
        dummy_trajectories: invalid-URL placeholders dropped.
        samples: steps of non-dummy trajectories (before ``capacity``).
        kept_samples: samples kept by ``capacity`` (the most recent ones).
        eligible_samples: kept samples that are training-eligible.
        same_screenshot_steps: samples whose screenshot equals the next one.
        same_screenshot_share: same_screenshot_steps / samples.
        computed_screenshot_steps: flags computed from pixels (not precomputed).
        missing_screenshots: screenshot lookups that found no file (compared as different).
    """

    trajectories: int
    successful_trajectories: int
    success_rate: float
    dummy_trajectories: int
    samples: int
    kept_samples: int
    eligible_samples: int
    same_screenshot_steps: int
    same_screenshot_share: float
    computed_screenshot_steps: int
    missing_screenshots: int

    def as_dict(self) -> dict[str, int | float]:
        """The statistics as a plain dict (e.g. for wandb)."""
        return asdict(self)


class SampleList(Sequence[dict[str, Any]]):
    """A read-only list of samples, materialised on access.

    Returned by :meth:`ReplayBuffer.get_training_samples`: choosing 100,000
    samples costs milliseconds, and each sample's prompt is parsed (or built)
    only when you index or iterate (iterating a buffer opened with
    :meth:`ReplayBuffer.from_storage` reads :data:`SAMPLE_CHUNK` samples at a
    time: format 4 files parse their texts in one call). ``positions`` gives the
    chosen collection positions (oldest = 0). ``list(samples)`` materialises
    everything.
    """

    __slots__ = ("_buffer", "_full", "positions")

    def __init__(
        self, buffer: ReplayBuffer, positions: NDArray[np.int64], *, full: bool = False
    ) -> None:
        self._buffer = buffer
        self.positions = positions
        # full: every sample carries trajectory_reward and same_as_next_screenshot
        # (WebGym's ``samples`` list), whatever include_reward_in_sample says.
        self._full = full

    def __len__(self) -> int:
        return int(self.positions.size)

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> SampleList: ...

    def __getitem__(self, index: int | slice) -> dict[str, Any] | SampleList:
        if isinstance(index, slice):
            return SampleList(self._buffer, self.positions[index], full=self._full)
        n = self.positions.size
        i = operator.index(index)
        if i < -n or i >= n:
            raise IndexError(f"sample index {i} out of range for {n} samples")
        return self._buffer._sample(int(self.positions[i]), self._full)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        # A file-backed buffer reads SAMPLE_CHUNK samples at a time (each chunk's texts
        # parsed together); the samples are the same as one by one.
        yield from self._buffer._iter_samples(self.positions, self._full)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SampleList):
            return (
                self._buffer is other._buffer
                and self._full == other._full
                and np.array_equal(self.positions, other.positions)
            )
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def to_list(self) -> list[dict[str, Any]]:
        """Every sample, materialised."""
        return list(self)

    def __repr__(self) -> str:
        return f"SampleList({len(self)} samples)"


# --------------------------------------------------------------------------- the buffer


class ReplayBuffer(Dataset):
    """Training samples from web-agent trajectories (WebGym's ``ReplayBuffer``).

    Args:
        trajectories: list of trajectories; a trajectory is a list of steps
            (mappings ``{"observation", "action", "response", "reward",
            "same_as_next_screenshot"?}`` with component objects or their dicts, or
            :class:`~replaystore.trajectories.components.Step`). The buffer keeps a
            reference and reads steps on access: do not mutate them afterwards.
        agent: builds prompts for steps without ``response.raw_prompt``:
            ``getattr(agent, "conversation_builder", agent).build(task, history,
            observation)`` -> chat messages, ``history`` being the earlier step
            mappings of the trajectory. Not needed when every step has a raw prompt.
        capacity: keep only the ``capacity`` most recent samples (collection order);
            None keeps all.
        filter_successful_only: ``len``/``getitem`` cover training-eligible samples
            only (else every kept sample).
        include_reward_in_sample: samples carry ``trajectory_reward`` and
            ``same_as_next_screenshot`` besides ``message`` and ``action``.
        shuffle: ``getitem`` order is a seeded permutation. Recency (for
            ``get_training_samples``) always means collection order.
        filter_same_screenshot: steps whose screenshot equals the next one are not
            training-eligible.
        seed: seeds the shuffle and, when ``get_training_samples`` gets no seed,
            the buffer's own sampling stream.
        success_threshold: a trajectory is successful when its final reward is
            >= this (WebGym: == 1).
        fingerprinter: screenshot fingerprint cache (default: process-wide).

    Training-eligible: successful trajectory and, when ``filter_same_screenshot``,
    not same-as-next-screenshot.

    Raises:
        TrajectoryError: a trajectory is empty, has a final reward of None or not a
            number, or a malformed ``same_as_next_screenshot`` (names the trajectory).
        ValueError: a bad ``capacity`` or ``success_threshold``.

    Cost: building is O(steps) with a few Python lookups per step (no prompt is
    parsed), plus one image decode per screenshot whose flag must be computed;
    memory ~30 bytes per step. ``buffer[i]`` parses one prompt.
    """

    def __init__(
        self,
        trajectories: Sequence[Sequence[Any]],
        agent: Any = None,
        capacity: int | None = None,
        filter_successful_only: bool = False,
        include_reward_in_sample: bool = True,
        shuffle: bool = False,
        filter_same_screenshot: bool = True,
        *,
        seed: int | None = None,
        success_threshold: float = 1.0,
        fingerprinter: ScreenshotFingerprinter | None = None,
    ) -> None:
        _check_options(capacity, success_threshold)
        builder = _conversation_builder(agent, getattr(agent, "context_manager", None))
        can_build = callable(getattr(builder, "build", None))
        index = index_trajectories(trajectories, fingerprinter, prompt_flags=not can_build)
        self._setup(
            index,
            agent=agent,
            capacity=capacity,
            filter_successful_only=filter_successful_only,
            include_reward_in_sample=include_reward_in_sample,
            shuffle=shuffle,
            filter_same_screenshot=filter_same_screenshot,
            seed=seed,
            success_threshold=success_threshold,
        )

    @classmethod
    def from_index(
        cls,
        index: StepIndex,
        agent: Any = None,
        capacity: int | None = None,
        filter_successful_only: bool = False,
        include_reward_in_sample: bool = True,
        shuffle: bool = False,
        filter_same_screenshot: bool = True,
        *,
        seed: int | None = None,
        success_threshold: float = 1.0,
    ) -> ReplayBuffer:
        """A buffer over a prebuilt :class:`StepIndex` (used by :meth:`from_storage`)."""
        _check_options(capacity, success_threshold)
        buffer = cls.__new__(cls)
        buffer._setup(
            index,
            agent=agent,
            capacity=capacity,
            filter_successful_only=filter_successful_only,
            include_reward_in_sample=include_reward_in_sample,
            shuffle=shuffle,
            filter_same_screenshot=filter_same_screenshot,
            seed=seed,
            success_threshold=success_threshold,
        )
        return buffer

    @classmethod
    def from_storage(
        cls,
        path: str | os.PathLike[str],
        last_n_iterations: int | None = None,
        **buffer_kwargs: Any,
    ) -> ReplayBuffer:
        """A buffer over the iteration files of a :class:`TrajectoryStorage` directory.

        Only the index (a few NumPy arrays: rewards, flags, file ids, byte
        offsets; ~40 bytes per step) is held in memory; each sample is read from
        its file (one seek + one line) on access. The result is sample-for-sample
        equal to ``ReplayBuffer(storage.load_all(last_n_iterations), ...)``.

        Args:
            path: the storage root.
            last_n_iterations: only the most recent N iterations (None: all).
            **buffer_kwargs: the buffer's other arguments (agent, capacity, ...).

        Raises:
            StorageError: no iteration files, or a file that is not ours.
            TrajectoryError: a non-dummy trajectory with a final reward of None.
        """
        index = TrajectoryStorage(path).build_index(last_n_iterations)
        return cls.from_index(index, **buffer_kwargs)

    def _setup(
        self,
        index: StepIndex,
        *,
        agent: Any,
        capacity: int | None,
        filter_successful_only: bool,
        include_reward_in_sample: bool,
        shuffle: bool,
        filter_same_screenshot: bool,
        seed: int | None,
        success_threshold: float,
    ) -> None:
        self.agent = agent
        #: WebGym's ``agent.context_manager`` (None when the agent has none).
        self.context_manager = None if agent is None else getattr(agent, "context_manager", None)
        #: The agent's conversation builder, found as WebGym finds it (None without one).
        self.conversation_builder = _conversation_builder(agent, self.context_manager)
        # Prompts can be rebuilt only with our builder interface (build(task, history, obs));
        # WebGym's own builders (build_conversation) are never used by its buffer either.
        self._can_build = callable(getattr(self.conversation_builder, "build", None))
        self.capacity = capacity
        self.filter_successful_only = bool(filter_successful_only)
        self.include_reward_in_sample = bool(include_reward_in_sample)
        self.shuffle = bool(shuffle)
        self.filter_same_screenshot = bool(filter_same_screenshot)
        self.success_threshold = float(success_threshold)
        self.seed = seed
        self._source = index.source
        self._sample_parts = getattr(index.source, "sample_parts", None)
        self._sample_parts_many = getattr(index.source, "sample_parts_many", None)
        self._traj = index.traj
        self._step = index.step
        self._reward = index.reward
        self._same = index.same
        total = int(index.traj.size)
        self._start = max(0, total - capacity) if capacity is not None else 0
        if index.has_prompt is not None and not self._can_build:
            self._check_prompts(index.has_prompt)
        kept = slice(self._start, total)
        eligible = self._reward[kept] >= self.success_threshold
        if self.filter_same_screenshot:
            eligible &= ~self._same[kept]
        #: collection positions of training-eligible kept samples, oldest first
        self._eligible = np.flatnonzero(eligible).astype(np.int64) + self._start
        if self.filter_successful_only:
            view = self._eligible
        else:
            view = np.arange(self._start, total, dtype=np.int64)
        shuffle_seq, sample_seq, order_seq = np.random.SeedSequence(seed).spawn(3)
        if self.shuffle and view.size:
            view = view[np.random.default_rng(shuffle_seq).permutation(view.size)]
        self._view = view
        self._order_seq = order_seq
        self._sample_order: NDArray[np.int64] | None = None
        self._training_indices: NDArray[np.int64] | None = None
        self._rng = np.random.default_rng(sample_seq)
        self._tables: dict[tuple[int, float], AliasTable] = {}

        n_traj = int(index.trajectory_rewards.size)
        successful = int((index.trajectory_rewards >= self.success_threshold).sum())
        same_steps = int(self._same.sum())
        self._stats = BufferStats(
            trajectories=n_traj,
            successful_trajectories=successful,
            success_rate=successful / n_traj if n_traj else 0.0,
            dummy_trajectories=index.dummy_trajectories,
            samples=total,
            kept_samples=total - self._start,
            eligible_samples=int(self._eligible.size),
            same_screenshot_steps=same_steps,
            same_screenshot_share=same_steps / total if total else 0.0,
            computed_screenshot_steps=index.computed_steps,
            missing_screenshots=index.missing_screenshots,
        )
        if _rank() == 0:
            self._log_summary()

    def _check_prompts(self, has_prompt: NDArray[np.bool_]) -> None:
        """Fail now, as WebGym does, when a kept step has no prompt and none can be built."""
        missing = np.flatnonzero(~has_prompt[self._start :])
        if not missing.size:
            return
        pos = int(missing[0]) + self._start
        where = self._source.describe(int(self._traj[pos]), int(self._step[pos]))
        if self.agent is None:
            why = "the buffer has no agent to build it: pass agent="
        else:
            why = (
                f"the agent ({type(self.agent).__name__}) has no conversation builder with "
                "build(task, history, observation) to rebuild it: pass agent="
            )
        raise TrajectoryError(
            f"{where} has no raw_prompt ({missing.size} of {int(has_prompt.size) - self._start} "
            f"kept steps lack one) and {why}an object with conversation_builder.build(task, "
            "history, observation), or collect the trajectories again keeping raw_prompt"
        )

    def _log_summary(self) -> None:
        s = self._stats
        logger.info(
            "trajectory buffer: %d trajectories (%d dummy dropped), success rate %d/%d = %.1f%%; "
            "%d samples (%d kept by capacity), %d training-eligible; same-screenshot steps "
            "%d (%.1f%%, %d computed from pixels, %d missing screenshots)",
            s.trajectories,
            s.dummy_trajectories,
            s.successful_trajectories,
            s.trajectories,
            100.0 * s.success_rate,
            s.samples,
            s.kept_samples,
            s.eligible_samples,
            s.same_screenshot_steps,
            100.0 * s.same_screenshot_share,
            s.computed_screenshot_steps,
            s.missing_screenshots,
        )

    # ------------------------------------------------------------------ dataset

    @property
    def stats(self) -> BufferStats:
        """Success rate, eligible and dummy counts, same-screenshot share (:class:`BufferStats`)."""
        return self._stats

    @property
    def num_eligible(self) -> int:
        """How many kept samples are training-eligible."""
        return int(self._eligible.size)

    def __len__(self) -> int:
        """Training-eligible samples with ``filter_successful_only``, else all kept samples."""
        return int(self._view.size)

    def __getitem__(self, idx: int) -> dict[str, Any]:
        """Sample ``idx`` of the view (``-len <= idx < len``); parses its prompt.

        Raises:
            IndexError: ``idx`` out of range.
            TrajectoryError: the step's prompt is malformed or cannot be built.
        """
        n = self._view.size
        try:
            i = operator.index(idx)
        except TypeError:
            raise TypeError(f"buffer indices must be integers, got {type(idx).__name__}") from None
        if i < -n or i >= n:
            raise IndexError(f"sample index {i} out of range for a buffer of {n} samples")
        return self._sample(self._view.item(i))  # .item: a plain int, no NumPy scalar

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """Samples ``indices`` of the view, in order: ``[buffer[i] for i in indices]``.

        A torch ``DataLoader`` with a ``batch_size`` calls this once per batch instead of
        ``buffer[i]`` per index, so a file-backed buffer reads and parses each batch's
        prompts together (the path ``get_training_samples`` takes). The samples are those
        ``buffer[i]`` gives, one by one.

        Raises:
            TypeError: an index is not an integer.
            IndexError: an index is out of range (the first such is named; nothing read).
            TrajectoryError: a step's prompt is malformed or cannot be built.
        """
        wanted = np.asarray(indices)
        if wanted.ndim != 1:
            raise TypeError(
                f"buffer.__getitems__ takes a sequence of indices, got {type(indices).__name__}"
            )
        if wanted.size == 0:
            return []
        if wanted.dtype.kind not in "iu":
            bad = next(
                i for i in indices if isinstance(i, bool) or not isinstance(i, (int, np.integer))
            )
            raise TypeError(f"buffer indices must be integers, got {type(bad).__name__}")
        n = self._view.size
        outside = (wanted < -n) | (wanted >= n)
        if outside.any():
            i = int(wanted[int(np.argmax(outside))])
            raise IndexError(f"sample index {i} out of range for a buffer of {n} samples")
        return list(self._iter_samples(self._view[wanted], False))

    def __iter__(self) -> Iterator[dict[str, Any]]:
        yield from self._iter_samples(self._view, False)

    def _iter_samples(self, positions: NDArray[np.int64], full: bool) -> Iterator[dict[str, Any]]:
        """The samples at ``positions``, in order: read :data:`SAMPLE_CHUNK` at a time
        where the step source reads many at once (a file-backed buffer of format 4
        files), else one by one."""
        if self._sample_parts_many is None:
            for pos in positions.tolist():
                yield self._sample(pos, full)
            return
        for first in range(0, int(positions.size), SAMPLE_CHUNK):
            chunk = positions[first : first + SAMPLE_CHUNK].tolist()
            parts = self._sample_parts_many(chunk)
            if not (full or self.include_reward_in_sample):
                for pos, part in zip(chunk, parts, strict=True):
                    if part is None:
                        yield self._sample(pos, full)
                    else:
                        yield {"message": part[0], "action": part[1]}
                continue
            rewards = self._reward[chunk].tolist()
            same = self._same[chunk].tolist()
            for k, (pos, part) in enumerate(zip(chunk, parts, strict=True)):
                if part is None:
                    yield self._sample(pos, full)
                    continue
                yield {
                    "message": part[0],
                    "action": part[1],
                    "trajectory_reward": float(rewards[k]),
                    "same_as_next_screenshot": bool(same[k]),
                }

    def __repr__(self) -> str:
        s = self._stats
        return (
            f"ReplayBuffer({len(self)} samples, {s.eligible_samples} eligible, "
            f"{s.trajectories} trajectories, success rate {s.success_rate:.1%})"
        )

    # ------------------------------------------------------------------ WebGym's attributes

    def _order(self) -> NDArray[np.int64]:
        """Collection positions of :attr:`samples`, in its order (computed once)."""
        if self._sample_order is None:
            total = int(self._traj.size)
            if not self.filter_successful_only:
                order = self._view  # buffer[i] is samples[i]
            elif self.shuffle:
                kept = total - self._start
                perm = np.random.default_rng(self._order_seq).permutation(kept)
                order = perm.astype(np.int64) + self._start
            else:
                order = np.arange(self._start, total, dtype=np.int64)
            order.setflags(write=False)
            self._sample_order = order
        return self._sample_order

    @property
    def samples(self) -> SampleList:
        """Every kept sample, as WebGym's ``replay_buffer.samples`` list (lazy).

        ``len(buffer.samples)`` is the number of kept samples (all steps of
        non-dummy trajectories, the most recent ``capacity`` of them), whatever
        ``filter_successful_only`` says; ``buffer[i]`` is
        ``buffer.samples[buffer.training_indices[i]]``. Each element is a full
        sample dict (``message``, ``action``, ``trajectory_reward``,
        ``same_as_next_screenshot``) even with ``include_reward_in_sample=False``,
        as in WebGym. Order: collection order, or a seeded permutation with ``shuffle``.

        Cost: O(1) to get and ``len``; each element parses its prompt on access
        (nothing is materialised: a 1M-step buffer stays an index).
        """
        return SampleList(self, self._order(), full=True)

    @property
    def training_indices(self) -> NDArray[np.int64]:
        """Indices into :attr:`samples` that ``len``/``getitem`` serve (WebGym's attribute).

        With ``filter_successful_only`` the training-eligible samples (successful
        trajectory and, with ``filter_same_screenshot``, not same-as-next),
        in ``buffer[i]`` order; otherwise ``0 .. len(samples) - 1``. A read-only
        int64 array (WebGym: a list), so ``len``, indexing and iteration work as on
        WebGym's list. Unlike WebGym's, the indices stay valid under ``capacity``
        and ``shuffle`` (WebGym computed them before truncating and shuffling).

        Cost: computed on first access, O(kept samples) time and 8 bytes per sample.
        """
        if self._training_indices is None:
            order = self._order()
            if order is self._view:
                indices = np.arange(order.size, dtype=np.int64)
            else:
                where = np.empty(int(self._traj.size) - self._start, dtype=np.int64)
                where[order - self._start] = np.arange(order.size, dtype=np.int64)
                indices = where[self._view - self._start]
            indices.setflags(write=False)
            self._training_indices = indices
        return self._training_indices

    @property
    def successful_indices(self) -> NDArray[np.int64]:
        """WebGym's second name for :attr:`training_indices` (the same array)."""
        return self.training_indices

    @property
    def trajectories(self) -> Sequence[Sequence[Any]]:
        """The trajectories the buffer was built from (WebGym's attribute), dummies included.

        For a buffer built from a list: that very list (no copy). For
        :meth:`from_storage`: a lazy read-only sequence in ``load_all()`` order;
        ``buffer.trajectories[t]`` reads the file holding trajectory ``t`` (the last
        file read is cached, so iterating reads each file once).
        """
        source = self._source
        held = getattr(source, "trajectories", None)
        if held is not None:
            return held
        lazy = getattr(source, "trajectory_sequence", None)
        if lazy is None:
            raise AttributeError(
                f"this buffer's step source ({type(source).__name__}) cannot list trajectories"
            )
        return lazy()

    def _sample(self, pos: int, full: bool = False) -> dict[str, Any]:
        t = self._traj.item(pos)
        s = self._step.item(pos)
        # A file source hands out a stored prompt's messages without building the step
        # (version 3 files: each distinct message is parsed once, copied out after); it
        # serves only prompts that pass _check_messages, anything else reads the step.
        parts = self._sample_parts(pos, t, s) if self._sample_parts is not None else None
        if parts is not None:
            message, action = parts
            sample: dict[str, Any] = {"message": message, "action": action}
            if full or self.include_reward_in_sample:
                sample["trajectory_reward"] = float(self._reward[pos])
                sample["same_as_next_screenshot"] = bool(self._same[pos])
            return sample
        step = self._source.step(pos, t, s)
        response = step.get("response")
        if not isinstance(response, Response):
            raise TrajectoryError(
                f"{self._source.describe(t, s)} has no Response (got {type(response).__name__})"
            )
        if response.raw_prompt:
            message = parse_prompt(response.raw_prompt, self._source.describe(t, s))
        else:
            message = self._build_prompt(step, pos, t, s)
        sample = {"message": message, "action": response.raw_response}
        if full or self.include_reward_in_sample:
            sample["trajectory_reward"] = float(self._reward[pos])
            sample["same_as_next_screenshot"] = bool(self._same[pos])
        return sample

    def _build_prompt(
        self, step: Mapping[str, Any], pos: int, t: int, s: int
    ) -> list[dict[str, Any]]:
        where = self._source.describe(t, s)
        if not self._can_build:
            raise TrajectoryError(
                f"{where} has no raw_prompt and the buffer has no agent to build it: pass "
                "agent= (an object with conversation_builder.build(task, history, observation))"
            )
        observation = step.get("observation")
        if not isinstance(observation, Observation):
            raise TrajectoryError(f"{where} has no Observation to build a prompt from")
        history = self._source.history(pos, t, s)
        messages = self.conversation_builder.build(observation.task, history, observation)
        _check_messages(messages, where, "the conversation builder's result")
        return messages

    def validate(self) -> int:
        """Materialise every kept sample once; returns how many.

        Use it to find a malformed prompt up front instead of mid-training.
        Cost: one prompt parse (or build) per kept sample.

        Raises:
            TrajectoryError: the first malformed step (names trajectory and step).
        """
        for pos in range(self._start, int(self._traj.size)):
            self._sample(pos)
        return int(self._traj.size) - self._start

    # ------------------------------------------------------------------ sampling

    def training_positions(
        self,
        num_samples: int | None = None,
        recency_bias_power: float = 1.0,
        seed: int | np.random.Generator | None = None,
        *,
        eligible_only: bool = True,
    ) -> NDArray[np.int64]:
        """Collection positions chosen by :meth:`get_training_samples` (no materialisation)."""
        if eligible_only:
            pool = self._eligible
        else:
            pool = np.arange(self._start, int(self._traj.size), dtype=np.int64)
        if num_samples is None:
            return pool.copy()
        if int(num_samples) != num_samples or num_samples < 0:
            raise ArgumentError(f"num_samples must be None or an integer >= 0, got {num_samples!r}")
        k = int(num_samples)
        if k >= pool.size:
            return pool.copy()
        power = float(recency_bias_power)
        if not math.isfinite(power):
            raise ArgumentError(f"recency_bias_power must be finite, got {recency_bias_power!r}")
        gen = self._rng if seed is None else np.random.default_rng(seed)
        if power == 1.0:
            # WebGym's rule: power 1.0 means uniform, not weights (rank + 1) ** 1.
            chosen = gen.choice(pool.size, size=k, replace=False)
        elif power > 0:
            # No table: the first call costs what every later one does.
            chosen = recency_sample_without_replacement(pool.size, k, power, gen)
        else:
            chosen = weighted_sample_without_replacement(self._table(pool.size, power), k, gen)
        if int(pool[-1]) - int(pool[0]) == pool.size - 1:
            # A run of consecutive positions (every kept step eligible, or all kept
            # steps): an offset, not a gather of k random reads from the pool.
            chosen += int(pool[0])
            return chosen
        return pool[chosen]

    def _table(self, n: int, power: float) -> AliasTable:
        key = (n, power)
        table = self._tables.get(key)
        if table is None:
            if len(self._tables) >= _TABLE_CACHE_SIZE:
                self._tables.pop(next(iter(self._tables)))
            table = AliasTable(recency_weights(n, power))
            self._tables[key] = table
        return table

    def get_training_samples(
        self,
        num_samples: int | None = None,
        recency_bias_power: float = 1.0,
        seed: int | np.random.Generator | None = None,
        *,
        eligible_only: bool = True,
    ) -> SampleList:
        """Training-eligible samples, optionally a recency-biased subset.

        Always draws from training-eligible samples (successful trajectory, and
        not same-as-next when ``filter_same_screenshot``), whatever
        ``filter_successful_only`` says; ``eligible_only=False`` draws from every
        kept sample instead (e.g. for reward-aware training), with the same rules.

        Args:
            num_samples: None or >= the pool size: the whole pool, oldest first.
                Otherwise that many distinct samples in selection order.
            recency_bias_power: 1.0 (WebGym's rule) draws uniformly. Any other
                value weights the sample of recency rank r (0 = oldest in the pool,
                in collection order) by ``(r + 1) ** power`` and draws by successive
                weighted sampling without replacement (the distribution of
                ``numpy.random.Generator.choice(..., replace=False, p=...)``). Note
                the jump: 0.999 is almost linear in rank, 1.0 is flat.
            seed: an int or Generator for reproducible draws; None continues the
                buffer's own stream (seeded by the constructor's ``seed``).

        Returns:
            A :class:`SampleList` (a lazy read-only list of sample dicts).

        Raises:
            ValueError: negative or non-integer ``num_samples``, non-finite power.

        Cost: for a power > 0, O(k) for k samples up to a quarter of the pool, on
        the first call as on later ones (no table; 100,000 of 1,000,000 at power 2
        in ~3 ms); O(n) beyond a quarter. A power <= 0 builds a one-off O(n) table
        per (pool size, power), cached. Each sample's prompt is parsed when it is
        accessed.
        """
        positions = self.training_positions(
            num_samples, recency_bias_power, seed, eligible_only=eligible_only
        )
        return SampleList(self, positions)

    # ------------------------------------------------------------------ distributed

    def shard(self, rank: int, world_size: int) -> Subset:
        """This rank's share of the view: samples ``rank, rank + world_size, ...``.

        Shards of ranks ``0..world_size-1`` are disjoint and cover the buffer.
        (``torch.utils.data.DistributedSampler(buffer)`` works too: the buffer is a
        map-style dataset.)

        Raises:
            ValueError: ``world_size < 1`` or ``rank`` outside ``[0, world_size)``.
        """
        if int(world_size) != world_size or world_size < 1:
            raise ArgumentError(f"world_size must be an integer >= 1, got {world_size!r}")
        if int(rank) != rank or not 0 <= rank < world_size:
            raise ArgumentError(f"rank must be an integer in [0, {world_size}), got {rank!r}")
        return Subset(self, range(int(rank), len(self), int(world_size)))


def _conversation_builder(agent: Any, context_manager: Any) -> Any:
    """The agent's conversation builder: ``agent.conversation_builder``, else WebGym's
    ``agent.context_manager.get_model_interface().conversation_builder``, else the agent
    itself when it has ``build``; None when there is none."""
    if agent is None:
        return None
    builder = getattr(agent, "conversation_builder", None)
    if builder is None and context_manager is not None:
        get_interface = getattr(context_manager, "get_model_interface", None)
        if callable(get_interface):
            builder = getattr(get_interface(), "conversation_builder", None)
    if builder is None and callable(getattr(agent, "build", None)):
        builder = agent
    return builder


def _check_options(capacity: int | None, success_threshold: float) -> None:
    if capacity is not None and (
        isinstance(capacity, bool) or int(capacity) != capacity or capacity < 1
    ):
        raise ArgumentError(f"capacity must be None or an integer >= 1, got {capacity!r}")
    if not math.isfinite(float(success_threshold)):
        raise ArgumentError(f"success_threshold must be finite, got {success_threshold!r}")


TrajectoryBuffer = ReplayBuffer
