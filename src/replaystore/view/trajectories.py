"""What the viewer knows about a trajectory storage: a per-trajectory summary index.

Built once when the app starts, from the iteration files' headers (lengths,
final rewards, dummy and same-screenshot flags, byte offsets of every step
line) plus two line reads per trajectory: its first step (the task: name,
website, difficulty) and its last step (``reward.is_blocked``, and from its
``trajectory_metadata`` the ``policy`` that acted, the ``checkpoint`` it was
served from and the ``observation`` mode, when the producer recorded them:
the loop and the rollout collector do). Pages then
filter and count with NumPy over these arrays and read the few step lines they
show by seeking to their offsets; no page loads every step.

Memory: about 40 bytes per trajectory plus its task name, and 17 bytes per step
(offset, CRC, flag): a million steps take tens of MB.

Read-only: the storage is opened with ``stale_temp_age_s=None`` (it would
otherwise remove abandoned temporary files) and files are opened for reading.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from replaystore.errors import StorageError
from replaystore.formats.trajectory_header import Header, read_header
from replaystore.trajectories.index import success_rate
from replaystore.trajectories.storage import TrajectoryStorage

__all__ = ["TrajectoryFilter", "TrajectoryIndex"]

logger = logging.getLogger("replaystore.view.trajectories")


@dataclass(frozen=True, slots=True)
class TrajectoryFilter:
    """The list page's filters (None: no restriction on that attribute).

    ``success``/``blocked``: True keeps only successful/blocked trajectories, False
    only the others. ``text``: case-insensitive substring of the task name.
    ``min_reward``/``max_reward``: inclusive bounds on the final reward.
    ``acting``: what acted, one of :attr:`TrajectoryIndex.actings` (``"demonstrations"``,
    ``"model checkpoints/000"``...).
    """

    iteration: int | None = None
    website: str | None = None
    difficulty: str | None = None
    success: bool | None = None
    blocked: bool | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    text: str | None = None
    acting: str | None = None


def _label(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)


class TrajectoryIndex:
    """Per-trajectory arrays of a trajectory storage (see the module docstring).

    Args:
        root: the storage directory (iteration files).
        success_threshold: a non-dummy trajectory is successful when its final
            reward is >= this.

    Raises:
        StorageError: no iteration files under ``root``, or a file is damaged.

    Cost: the headers of every file, plus two step lines per trajectory (5.4 s
    for 100,000 trajectories of 10 steps, 1.8 GB of JSONL, on a loaded 2-core
    machine: ``benchmarks/view.py``); about 20 MB of memory per million steps.

    A trajectory is *blocked* when its last step's reward has ``is_blocked``
    (as the rollout collector records an anti-bot page).
    """

    def __init__(self, root: str | Path, *, success_threshold: float = 1.0) -> None:
        self.root = Path(root)
        self.storage = TrajectoryStorage(self.root, stale_temp_age_s=None)
        self.success_threshold = float(success_threshold)
        files = self.storage.readable_files()
        if not files:
            raise StorageError(f"no trajectory iteration files (iteration_*.jsonl) under {root}")
        self.files: list[Path] = []
        self._headers: list[Header] = []  # each file's header (format 3 pages read frames)
        traj_parts: dict[str, list[NDArray[Any]]] = {k: [] for k in _TRAJECTORY_COLUMNS}
        step_parts: dict[str, list[NDArray[Any]]] = {k: [] for k in _STEP_COLUMNS}
        edges = _EdgeFacts()
        first_pos = 0
        for file_id, f in enumerate(files):
            # The format's one header reader: it checks size, last line and checksums.
            header = read_header(f)
            self.files.append(f.path)
            self._headers.append(header)
            for key, column in _trajectory_columns(header, file_id, f.iteration, first_pos).items():
                traj_parts[key].append(column)
            for key, column in _step_columns(header).items():
                step_parts[key].append(column)
            # the first and last step of each trajectory (any format version)
            for first, last in self.storage.edge_records(header):
                edges.add(first, last)
            first_pos += header.num_steps
        self._set_columns(
            {k: np.concatenate(v) for k, v in traj_parts.items()},
            {k: np.concatenate(v) for k, v in step_parts.items()},
            edges,
        )
        self._set_summaries()
        logger.info(
            "indexed %d trajectories (%d steps) in %d files under %s",
            self.num_trajectories,
            self.num_steps,
            len(self.files),
            self.root,
        )

    def _set_columns(
        self, traj: dict[str, NDArray[Any]], steps: dict[str, NDArray[Any]], edges: _EdgeFacts
    ) -> None:
        """The per-trajectory and per-step arrays, from every file's columns
        (concatenated) and the facts of each trajectory's first and last step."""
        self.traj_file: NDArray[np.int32] = traj["file"]
        self.traj_local: NDArray[np.int32] = traj["local"]
        self.traj_first: NDArray[np.int64] = traj["first"].astype(np.int64)
        self.traj_length: NDArray[np.int64] = traj["length"]
        self.traj_iteration: NDArray[np.int64] = traj["iteration"]
        self.traj_reward: NDArray[np.float64] = traj["reward"]
        self.traj_dummy: NDArray[np.bool_] = traj["dummy"]
        self.traj_blocked = np.array(edges.blocked, dtype=bool)
        self.step_offset: NDArray[np.int64] = steps["offset"]
        self.step_crc: NDArray[np.int64] = steps["crc"]
        self.step_same: NDArray[np.bool_] = steps["same"]
        self.step_file: NDArray[np.int32] = np.repeat(self.traj_file, self.traj_length)
        self.task_names = edges.names
        # (policy, checkpoint, observation) per trajectory; None where not recorded.
        self.traj_producer = edges.producers
        #: The loop's own number of each trajectory's iteration (``loop_iteration`` in its
        #: metadata: the file's iteration number minus one), -1 where not recorded.
        self.traj_loop_iteration = np.array(edges.loop_iterations, dtype=np.int64)
        #: What acted, as the list shows and filters it: ``"demonstrations"``,
        #: ``"model checkpoints/000"``, ``"-"`` where the producer did not say.
        self.actings, self.traj_acting = _codes([_acting(p, c) for p, c, _ in edges.producers])
        self._names_lower = np.array([n.lower() for n in edges.names], dtype=str)
        self.websites, self.traj_website = _codes(edges.websites)
        self.difficulties, self.traj_difficulty = _codes(edges.difficulties)

    def _set_summaries(self) -> None:
        """What pages filter and count by, derived from the columns: success, the
        same-screenshot steps of each trajectory, the iterations."""
        with np.errstate(invalid="ignore"):
            self.traj_success = (
                ~self.traj_dummy
                & np.isfinite(self.traj_reward)
                & (self.traj_reward >= self.success_threshold)
            )
        ends = self.traj_first + self.traj_length
        same_cum = np.concatenate([[0], np.cumsum(self.step_same, dtype=np.int64)])
        self.traj_same = same_cum[ends] - same_cum[self.traj_first]
        self.iterations = sorted(set(self.traj_iteration.tolist()))

    # ------------------------------------------------------------------ counts

    @property
    def num_trajectories(self) -> int:
        return int(self.traj_file.size)

    @property
    def num_steps(self) -> int:
        return int(self.step_offset.size)

    def _rates(self, codes: NDArray[Any], n: int) -> tuple[NDArray[np.float64], NDArray[Any]]:
        valid = ~self.traj_dummy
        total = np.bincount(codes[valid], minlength=n)
        won = np.bincount(codes[valid & self.traj_success], minlength=n)
        with np.errstate(invalid="ignore", divide="ignore"):
            rate = np.where(total > 0, won / np.maximum(total, 1), np.nan)
        return rate, np.stack([won, total], axis=1)

    def overview(self) -> dict[str, Any]:
        """Counts and success rates (non-dummy trajectories) per iteration, website, difficulty.

        Returns:
            ``{"trajectories", "steps", "dummy", "successful", "success_rate",
            "blocked_trajectories", "blocked_sites": [names], "same_screenshot_steps",
            "by_iteration" | "by_website" | "by_difficulty": [(label, rate, won, total)]}``.

        Cost: a few ``bincount`` passes over the trajectory arrays, O(trajectories).
        """
        its = np.array(self.iterations)
        it_codes = np.searchsorted(its, self.traj_iteration)
        out: dict[str, Any] = {}
        for key, codes, labels in (
            ("by_iteration", it_codes, self.iteration_labels()),
            ("by_website", self.traj_website, self.websites),
            ("by_difficulty", self.traj_difficulty, self.difficulties),
        ):
            rate, counts = self._rates(codes, len(labels))
            out[key] = [
                (label, float(r), int(c[0]), int(c[1]))
                for label, r, c in zip(labels, rate.tolist(), counts.tolist(), strict=True)
            ]
        valid = int((~self.traj_dummy).sum())
        won = int(self.traj_success.sum())
        blocked_sites = np.unique(self.traj_website[self.traj_blocked])
        out.update(
            trajectories=self.num_trajectories,
            steps=self.num_steps,
            dummy=int(self.traj_dummy.sum()),
            successful=won,
            success_rate=success_rate(won, valid, empty=math.nan),
            blocked_trajectories=int(self.traj_blocked.sum()),
            blocked_sites=[self.websites[i] for i in blocked_sites.tolist()],
            same_screenshot_steps=int(self.step_same.sum()),
        )
        return out

    def iteration_labels(self) -> list[str]:
        """A label per stored iteration (:attr:`iterations` order), numbered as the
        producer numbers it, with what acted in it.

        A loop run's files are iterations 1, 2... while the loop (its summary, its logs)
        says 0, 1...: where every trajectory of a file carries one ``loop_iteration``,
        that number is shown, with what acted (``"0: demonstrations"``, ``"1: model
        checkpoints/000"``); otherwise the file's own number (and what acted when it is
        one thing).
        """
        out = []
        for number in self.iterations:
            rows = self.traj_iteration == number
            loops = np.unique(self.traj_loop_iteration[rows])
            actings = np.unique(self.traj_acting[rows])
            shown = str(int(loops[0])) if loops.size == 1 and loops[0] >= 0 else str(number)
            acting = self.actings[int(actings[0])] if actings.size == 1 else ""
            out.append(f"{shown}: {acting}" if acting and acting != "-" else shown)
        return out

    # ------------------------------------------------------------------ filtering

    def select(self, f: TrajectoryFilter) -> NDArray[np.int64]:
        """Trajectory ids (ascending, i.e. collection order) that pass ``f``.

        Cost: vectorised comparisons over the trajectory arrays, O(trajectories);
        the text search is NumPy's substring search over the lower-cased names.
        """
        mask = np.ones(self.num_trajectories, dtype=bool)
        if f.iteration is not None:
            mask &= self.traj_iteration == f.iteration
        if f.website is not None:
            code = self.websites.index(f.website) if f.website in self.websites else -1
            mask &= self.traj_website == code
        if f.difficulty is not None:
            code = (
                self.difficulties.index(f.difficulty) if f.difficulty in self.difficulties else -1
            )
            mask &= self.traj_difficulty == code
        if f.success is not None:
            mask &= self.traj_success == f.success
        if f.blocked is not None:
            mask &= self.traj_blocked == f.blocked
        if f.acting is not None:
            code = self.actings.index(f.acting) if f.acting in self.actings else -1
            mask &= self.traj_acting == code
        with np.errstate(invalid="ignore"):
            if f.min_reward is not None:
                mask &= self.traj_reward >= f.min_reward
            if f.max_reward is not None:
                mask &= self.traj_reward <= f.max_reward
        if f.text:
            ids = np.flatnonzero(mask)
            hits = np.char.find(self._names_lower[ids], f.text.lower()) >= 0
            return ids[hits].astype(np.int64)
        return np.flatnonzero(mask).astype(np.int64)

    def summary(self, tid: int) -> dict[str, Any]:
        """The list row of trajectory ``tid`` (no file read)."""
        reward = float(self.traj_reward[tid])
        return {
            "id": int(tid),
            "iteration": int(self.traj_iteration[tid]),
            "file": self.files[int(self.traj_file[tid])].name,
            "local": int(self.traj_local[tid]),
            "task": self.task_names[tid],
            "website": self.websites[int(self.traj_website[tid])],
            "difficulty": self.difficulties[int(self.traj_difficulty[tid])],
            "steps": int(self.traj_length[tid]),
            "reward": None if math.isnan(reward) else reward,
            "success": bool(self.traj_success[tid]),
            "blocked": bool(self.traj_blocked[tid]),
            "dummy": bool(self.traj_dummy[tid]),
            "same_steps": int(self.traj_same[tid]),
            "acting": self.actings[int(self.traj_acting[tid])],
            "loop_iteration": (
                None if self.traj_loop_iteration[tid] < 0 else int(self.traj_loop_iteration[tid])
            ),
            "policy": self.traj_producer[tid][0],
            "checkpoint": self.traj_producer[tid][1],
            "observation": self.traj_producer[tid][2],
        }

    # ------------------------------------------------------------------ reading steps

    def read_steps(
        self, tid: int, first: int = 0, count: int | None = None
    ) -> list[dict[str, Any]]:
        """Steps ``first .. first+count-1`` of trajectory ``tid`` (all by default), decoded.

        Each step is a WebGym mapping with component objects (screenshot paths
        absolute); every line's CRC32 is checked (version 2 files).

        Raises:
            IndexError: ``tid`` or the step range is out of range.
            StorageError: a line is damaged, or its file changed or vanished since indexing.
        """
        if not 0 <= tid < self.num_trajectories:
            raise IndexError(f"trajectory {tid} out of range (0..{self.num_trajectories - 1})")
        length = int(self.traj_length[tid])
        count = length - first if count is None else count
        if first < 0 or count < 0 or first + count > length:
            raise IndexError(f"steps {first}..{first + count - 1} out of range for {length} steps")
        path = self.files[int(self.traj_file[tid])]
        pos = int(self.traj_first[tid]) + first
        if self.step_offset[pos] < 0:  # format 3: the trajectory's frame
            try:
                steps = self.storage.trajectory_steps(
                    self._headers[int(self.traj_file[tid])],
                    int(self.traj_local[tid]),
                    first,
                    count,
                    f"trajectory {tid} ({path.name})",
                )
            except FileNotFoundError:
                raise StorageError(
                    f"{path} was removed after the viewer indexed it (merge or cleanup): "
                    "restart the viewer"
                ) from None
            for i, step in enumerate(steps):
                step["same_as_next_screenshot"] = bool(self.step_same[pos + i])
            return steps
        try:
            with open(path, "rb") as handle:
                handle.seek(int(self.step_offset[pos]))
                lines = [handle.readline() for _ in range(count)]
        except FileNotFoundError:
            raise StorageError(
                f"{path} was removed after the viewer indexed it (merge or cleanup): "
                "restart the viewer"
            ) from None
        out = []
        for i, line in enumerate(lines):
            where = f"trajectory {tid} step {first + i} ({path.name})"
            t, s, step = self.storage.decode_line(line, where, int(self.step_crc[pos + i]))
            if t != int(self.traj_local[tid]) or s != first + i:
                raise StorageError(f"{where}: the file changed after the viewer indexed it")
            step["same_as_next_screenshot"] = bool(self.step_same[pos + i])
            out.append(step)
        return out


def _get(record: Mapping[str, Any], *keys: str) -> Mapping[str, Any]:
    value: Any = record
    for key in keys:
        value = value.get(key) if isinstance(value, Mapping) else None
    return value if isinstance(value, Mapping) else {}


def _acting(policy: str | None, checkpoint: str | None) -> str:
    """What acted, as one label: the policy, and the checkpoint a model was served from."""
    if policy is None and checkpoint is None:
        return "-"
    return " ".join(part for part in (policy, checkpoint) if part)


def _text_or_none(value: Any) -> str | None:
    """A metadata value as display text (None when absent or empty)."""
    return None if value is None or value == "" else str(value)


def _codes(labels: list[str]) -> tuple[list[str], NDArray[np.int64]]:
    """Sorted distinct labels and each item's code into them."""
    uniq, codes = np.unique(np.array(labels, dtype=object).astype(str), return_inverse=True)
    return [str(u) for u in uniq.tolist()], codes.astype(np.int64)


#: The per-trajectory columns each file adds (:func:`_trajectory_columns`).
_TRAJECTORY_COLUMNS = ("file", "local", "first", "length", "iteration", "reward", "dummy")
#: The per-step columns each file adds (:func:`_step_columns`).
_STEP_COLUMNS = ("offset", "crc", "same")


def _final_rewards(values: Sequence[Any]) -> NDArray[np.float64]:
    """Final rewards as floats: a bool as 0/1, anything not a finite number as NaN."""
    return np.array(
        [
            float(r)
            if isinstance(r, int | float) and not isinstance(r, bool) and math.isfinite(r)
            else float(bool(r))
            if isinstance(r, bool)
            else math.nan
            for r in values
        ],
        dtype=float,
    )


def _trajectory_columns(
    header: Header, file_id: int, iteration: int, first_pos: int
) -> dict[str, NDArray[Any]]:
    """The :data:`_TRAJECTORY_COLUMNS` of one file's trajectories, from its ``header``;
    ``first_pos``: the global position of the file's first step."""
    n_traj = int(header.lengths.size)
    lengths = header.lengths.astype(np.int64)
    starts = np.cumsum(lengths) - lengths
    return {
        "file": np.full(n_traj, file_id, dtype=np.int32),
        "local": np.arange(n_traj, dtype=np.int32),
        "first": first_pos + starts,
        "length": lengths,
        "iteration": np.full(n_traj, iteration, dtype=np.int64),
        "reward": _final_rewards(header.final_rewards),
        "dummy": header.dummy.astype(bool),
    }


def _step_columns(header: Header) -> dict[str, NDArray[Any]]:
    """The :data:`_STEP_COLUMNS` of one file's steps: each step line's byte offset (-1
    for format 3-4 steps, read from frames), its CRC and its same-screenshot flag."""
    if header.frame_lengths is not None:
        offsets = np.full(header.num_steps, -1, dtype=np.int64)
    else:
        line_off = header.body_start + np.cumsum(header.line_lengths) - header.line_lengths
        offsets = line_off.astype(np.int64)
    return {
        "offset": offsets,
        "crc": header.line_crc.astype(np.int64),
        "same": header.same.astype(bool),
    }


@dataclass(slots=True)
class _EdgeFacts:
    """What the first and last step of each trajectory say, one entry per trajectory:
    its task (name, website, difficulty), whether it was blocked, its producer
    (policy, checkpoint, observation) and its loop iteration (-1: not recorded)."""

    names: list[str] = field(default_factory=list)
    websites: list[str] = field(default_factory=list)
    difficulties: list[str] = field(default_factory=list)
    blocked: list[bool] = field(default_factory=list)
    producers: list[tuple[str | None, str | None, str | None]] = field(default_factory=list)
    loop_iterations: list[int] = field(default_factory=list)

    def add(self, first: Mapping[str, Any], last: Mapping[str, Any]) -> None:
        """One trajectory's facts, from its ``first`` and ``last`` step records."""
        task = _get(first, "step", "observation", "task")
        self.names.append(str(task.get("task_name") or ""))
        self.websites.append(_label(task.get("website")))
        self.difficulties.append(_label(task.get("difficulty")))
        self.blocked.append(bool(_get(last, "step", "reward").get("is_blocked")))
        meta = _get(last, "step", "trajectory_metadata")
        self.producers.append(
            (
                _text_or_none(meta.get("policy")),
                _text_or_none(meta.get("checkpoint")),
                _text_or_none(meta.get("observation")),
            )
        )
        number = meta.get("loop_iteration")
        self.loop_iterations.append(
            number if isinstance(number, int) and not isinstance(number, bool) else -1
        )
