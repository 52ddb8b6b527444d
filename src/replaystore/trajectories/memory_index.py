"""Trajectories held in memory, indexed: the step index of a
:class:`~replaystore.trajectories.buffer.ReplayBuffer` built from a list.

* :func:`index_trajectories`: drop dummy trajectories and record steps, read the
  final rewards and the same-as-next flags (computing missing ones from pixels);
* :class:`MemorySource`: the index's step source over the caller's trajectories (a
  reference, no copy);
* :func:`as_step_mapping`: a step in any of its forms as WebGym's step mapping.

File-backed buffers index through
:meth:`~replaystore.trajectories.storage.TrajectoryStorage.build_index` instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from replaystore.errors import SchemaError, TrajectoryError
from replaystore.trajectories.components import Observation, Response, Step, step_from_dict
from replaystore.trajectories.index import (
    SAME_KEY,
    StepIndex,
    final_reward,
    is_dummy_trajectory,
    is_record_step,
)
from replaystore.trajectories.index import field_of as _field
from replaystore.trajectories.index import step_part as _step_part
from replaystore.trajectories.screenshots import (
    ScreenshotFingerprinter,
    default_fingerprinter,
    same_as_next_flags,
)

__all__ = ["MemorySource", "as_step_mapping", "index_trajectories"]

# Flag codes while indexing: 0 different, 1 same, 2 not precomputed.
_FLAG_CODES: dict[Any, int] = {False: 0, True: 1, None: 2}
_UNKNOWN = 2


def as_step_mapping(raw: Any, where: str) -> Mapping[str, Any]:
    """WebGym's step mapping with component objects, from a mapping, dict form or Step.

    Raises:
        TrajectoryError: ``raw`` is not a step or a component is malformed.
    """
    if isinstance(raw, Step):
        return raw.to_mapping()
    if isinstance(raw, Mapping):
        if isinstance(raw.get("response"), Response) and isinstance(
            raw.get("observation"), Observation
        ):
            return raw
        try:
            return step_from_dict(raw)
        except SchemaError as exc:
            raise TrajectoryError(f"{where} is malformed: {exc}") from None
    raise TrajectoryError(f"{where} is a {type(raw).__name__}, not a step mapping")


class MemorySource:
    """Steps of trajectories held by the caller (the buffer keeps a reference, no copy)."""

    __slots__ = ("trajectories",)

    def __init__(self, trajectories: Sequence[Sequence[Any]]) -> None:
        self.trajectories = trajectories

    def describe(self, traj: int, step: int) -> str:
        return f"trajectory {traj} step {step}"

    def step(self, pos: int, traj: int, step: int) -> Mapping[str, Any]:
        return as_step_mapping(self.trajectories[traj][step], self.describe(traj, step))

    def history(self, pos: int, traj: int, step: int) -> list[Mapping[str, Any]]:
        steps = self.trajectories[traj]
        return [as_step_mapping(steps[i], self.describe(traj, i)) for i in range(step)]


def _flag_codes(steps: Sequence[Any], where: str) -> list[int]:
    codes = []
    for i, step in enumerate(steps):
        value = _step_part(step, SAME_KEY)
        try:
            code = _FLAG_CODES.get(value)
        except TypeError:  # unhashable, e.g. a list
            code = None
        if code is None:
            raise TrajectoryError(
                f"{where} step {i}: {SAME_KEY} must be a bool or absent, got {value!r}"
            )
        codes.append(code)
    return codes


def index_trajectories(
    trajectories: Sequence[Sequence[Any]],
    fingerprinter: ScreenshotFingerprinter | None = None,
    *,
    prompt_flags: bool = True,
) -> StepIndex:
    """Index in-memory trajectories: drop dummies and record steps, read final rewards and flags.

    ``prompt_flags=False`` skips :attr:`StepIndex.has_prompt` (left None), which a
    buffer that can rebuild prompts does not need (saves ~0.5 us per step).

    Flags missing from steps (other than last steps) are computed from the
    screenshots' pixels. Cost: O(steps) Python-level lookups plus one decode per
    distinct uncached screenshot that needs comparing.

    Raises:
        TrajectoryError: an empty trajectory, a bad final reward, a bad flag.
    """
    if isinstance(trajectories, (str, bytes)) or not isinstance(trajectories, Sequence):
        trajectories = list(trajectories)
    kept, lengths, rewards, dummies = _kept(trajectories)
    n_traj = len(kept)
    length_arr = np.asarray(lengths, dtype=np.int64)
    total = int(length_arr.sum()) if n_traj else 0
    starts = np.cumsum(length_arr) - length_arr
    last = starts + length_arr - 1
    same, computed, missing = _same_flags(trajectories, kept, starts, last, total, fingerprinter)
    has_prompt = _prompt_flags(trajectories, kept, total) if prompt_flags else None
    traj_ids = np.repeat(np.asarray(kept, dtype=np.int64), length_arr)
    step_ids = (np.arange(total, dtype=np.int64) - np.repeat(starts, length_arr)).astype(np.int32)
    step_rewards = np.repeat(np.asarray(rewards, dtype=np.float64), length_arr)
    # Record steps (a wall, a navigation error) end a trajectory but are no samples.
    records = [int(last[o]) for o, t in enumerate(kept) if is_record_step(trajectories[t][-1])]
    if records:
        sample = np.ones(total, dtype=bool)
        sample[records] = False
        traj_ids, step_ids, step_rewards, same = (
            traj_ids[sample],
            step_ids[sample],
            step_rewards[sample],
            same[sample],
        )
        if has_prompt is not None:
            has_prompt = has_prompt[sample]
    return StepIndex(
        traj=traj_ids,
        step=step_ids,
        reward=step_rewards,
        same=same,
        trajectory_rewards=np.asarray(rewards, dtype=np.float64),
        dummy_trajectories=dummies,
        computed_steps=computed,
        missing_screenshots=missing,
        source=MemorySource(trajectories),
        has_prompt=has_prompt,
    )


def _kept(trajectories: Sequence[Sequence[Any]]) -> tuple[list[int], list[int], list[float], int]:
    """``(kept, lengths, final rewards, dummies)``: the trajectories that are not dummies.

    Raises:
        TrajectoryError: a trajectory is not a list of steps, or has a bad final reward.
    """
    kept: list[int] = []
    lengths: list[int] = []
    rewards: list[float] = []
    dummies = 0
    for t, traj in enumerate(trajectories):
        if isinstance(traj, (str, bytes, Mapping)) or not isinstance(traj, Sequence):
            raise TrajectoryError(
                f"trajectory {t} must be a list of steps, got {type(traj).__name__}"
            )
        if len(traj) == 1 and is_dummy_trajectory(traj):
            dummies += 1
            continue
        rewards.append(final_reward(traj, f"trajectory {t}"))
        kept.append(t)
        lengths.append(len(traj))
    return kept, lengths, rewards, dummies


def _same_flags(
    trajectories: Sequence[Sequence[Any]],
    kept: list[int],
    starts: NDArray[np.int64],
    last: NDArray[np.int64],
    total: int,
    fingerprinter: ScreenshotFingerprinter | None,
) -> tuple[NDArray[np.bool_], int, int]:
    """``(same-as-next flag per step, steps computed from pixels, screenshots missing)``:
    the steps' own flags, the others from their screenshots; a last step is never same.

    Raises:
        TrajectoryError: a flag that is neither a bool nor absent (named).
    """
    # One comprehension over all steps: dict steps (the common case) take the fast path.
    get = _FLAG_CODES.get
    try:
        codes = [
            get(s.get(SAME_KEY), -1) if type(s) is dict else get(_step_part(s, SAME_KEY), -1)
            for t in kept
            for s in trajectories[t]
        ]
    except TypeError:  # unhashable flag value
        codes = [-1]
    code_arr = np.asarray(codes, dtype=np.int8)
    if (code_arr < 0).any():  # find and name the culprit
        for t in kept:
            _flag_codes(trajectories[t], f"trajectory {t}")
    if total:
        code_arr[last] = 0  # the last step is never same-as-next
    same = code_arr == 1
    unknown = np.flatnonzero(code_arr == _UNKNOWN)
    missing = 0
    if unknown.size:
        traj_ord = np.searchsorted(starts, unknown, side="right") - 1
        paths: list[Any] = []
        next_paths: list[Any] = []
        for pos, o in zip(unknown.tolist(), traj_ord.tolist(), strict=True):
            steps = trajectories[kept[o]]
            s = pos - int(starts[o])
            paths.append(_field(_step_part(steps[s], "observation"), "image_path"))
            next_paths.append(_field(_step_part(steps[s + 1], "observation"), "image_path"))
        fp = fingerprinter if fingerprinter is not None else default_fingerprinter()
        missing_before = fp.missing
        same[unknown] = same_as_next_flags(paths, next_paths, fp)
        missing = fp.missing - missing_before
    return same, int(unknown.size), missing


def _prompt_flags(
    trajectories: Sequence[Sequence[Any]], kept: list[int], total: int
) -> NDArray[np.bool_]:
    """Whether each step of the kept trajectories has a ``raw_prompt``."""
    return np.fromiter(
        (
            bool(r.raw_prompt)
            if type(r := s.get("response") if type(s) is dict else _step_part(s, "response"))
            is Response
            else bool(_field(r, "raw_prompt"))
            for t in kept
            for s in trajectories[t]
        ),
        dtype=bool,
        count=total,
    )
