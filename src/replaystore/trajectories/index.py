"""The trajectory rules and the step index, shared by storage and the buffer.

What a trajectory *is* for every consumer (storage, its ``stats``, the replay
buffer, ``from_storage``, export, the CLI) is decided here, once:

* a **dummy** trajectory (:func:`is_dummy_trajectory`) is WebGym's placeholder
  for an invalid URL; it is stored but never trained on or counted as an attempt
  outcome;
* the **final reward** of every other trajectory must be a finite real number
  (``bool`` counts as 0/1): :func:`final_reward_value`. A final reward of
  ``None`` means "success undefined": :meth:`TrajectoryStorage.save_iteration
  <replaystore.trajectories.storage.TrajectoryStorage.save_iteration>` refuses
  it (nothing is written), and an iteration file that already holds one
  (written before the rule) is refused by every reader with the same
  :class:`~replaystore.errors.TrajectoryError` (stats, ``load_all``,
  ``from_storage``, export, the CLI);
* a trajectory is **successful** when that reward is ``>= success_threshold``
  (:func:`is_successful`); a **success rate** is the successful share of the
  trajectories that are not dummies (:func:`count_successes`,
  :func:`success_rate`), which the storage's ``stats``, ``replaystore stats``, the
  viewer and the loop all report;
* its **keypoints** are the steps whose reward says ``submit``
  (:func:`keypoint_steps`);
* a **record step** (:func:`is_record_step`) only records how a task ended
  (an anti-bot wall, a navigation error): no model answered it, so it is
  stored and counts for its trajectory's outcome but is never a training sample.

:class:`StepIndex` is the per-step NumPy index a buffer is built on; both
:mod:`~replaystore.trajectories.storage` (from file headers) and
:mod:`~replaystore.trajectories.buffer` (from in-memory trajectories) produce
it. This module imports neither of them, nor torch: ``storage`` and ``stats``
stay torch-free.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from replaystore.errors import TrajectoryError
from replaystore.trajectories.components import Step

__all__ = [
    "SAME_KEY",
    "StepIndex",
    "StepSource",
    "count_successes",
    "final_reward",
    "final_reward_value",
    "final_reward_values",
    "is_dummy_trajectory",
    "is_record_step",
    "is_successful",
    "keypoint_steps",
    "success_rate",
]

#: The per-step key of the same-as-next-screenshot flag.
SAME_KEY = "same_as_next_screenshot"


def field_of(obj: Any, name: str) -> Any:
    """A field of a component given as an object or as its dict form (None if absent)."""
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def step_part(step: Any, key: str) -> Any:
    """``step[key]`` for a step mapping, ``step.key`` for a :class:`Step`, else None."""
    if isinstance(step, Mapping):
        return step.get(key)
    if isinstance(step, Step):
        return getattr(step, key)
    return None


def is_dummy_trajectory(trajectory: Sequence[Any]) -> bool:
    """WebGym's placeholder for an invalid URL: exactly one step whose action key is
    ``invalid_url``, whose observation has an empty image path, or whose action
    string contains "Invalid URL"."""
    if len(trajectory) != 1:
        return False
    step = trajectory[0]
    observation = step_part(step, "observation")
    if observation is not None and field_of(observation, "image_path") == "":
        return True
    action = step_part(step, "action")
    if action is None:
        return False
    inner = field_of(action, "action")
    if isinstance(inner, Mapping) and inner.get("key") == "invalid_url":
        return True
    text = field_of(action, "action_string")
    return isinstance(text, str) and "Invalid URL" in text


#: Action keys of the collector's steps that record an ending, not a model's action.
RECORD_ACTION_KEYS = frozenset(
    {"invalid_url", "timeout", "step_timeout", "error", "interrupted", "grace_expired"}
)


def is_record_step(step: Any) -> bool:
    """Whether ``step`` only records how its task ended: not a training sample.

    True when its response has an empty ``raw_response`` (no model answered it)
    and its reward says ``is_blocked`` (an anti-bot wall) or its action key is
    one of :data:`RECORD_ACTION_KEYS` (navigation error, timeout, ...). Such a
    step is the last of its trajectory: the buffer leaves it out of the samples
    and the trajectory still counts (its final reward is the task's outcome).
    Accepts a step mapping (components or their dicts) or a :class:`Step`.
    """
    response = step_part(step, "response")
    if response is None or field_of(response, "raw_response"):
        return False
    reward = step_part(step, "reward")
    if reward is not None and field_of(reward, "is_blocked"):
        return True
    action = step_part(step, "action")
    inner = field_of(action, "action") if action is not None else None
    return isinstance(inner, Mapping) and inner.get("key") in RECORD_ACTION_KEYS


def final_reward_value(value: Any, where: str, last: int) -> float:
    """THE final-reward rule: ``value`` as a float, or a :class:`TrajectoryError`.

    Applies to non-dummy trajectories only. Accepted: any finite real number
    (``int``, ``float``, NumPy scalars; ``True``/``False`` count as 1/0).

    Args:
        value: the ``reward`` field of the trajectory's final step.
        where: names the trajectory in the error (``"trajectory 3"``, plus the
            file when read from storage).
        last: the final step's number (for the error).

    Raises:
        TrajectoryError: ``value`` is None (success undefined), not a real
            number, or not finite. Every consumer raises this same error.
    """
    if value is None:
        raise TrajectoryError(
            f"{where}: final step {last} has reward None, so success is undefined "
            "(WebGym raises AttributeError here); set a numeric final reward or drop "
            "the trajectory"
        )
    if not isinstance(value, numbers.Real):
        raise TrajectoryError(f"{where}: final step {last} has a non-numeric reward {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise TrajectoryError(f"{where}: final step {last} has a non-finite reward {number}")
    return number


# What JSON gives for a number (and bool): converted by NumPy as float() converts them.
_PLAIN_REWARD_TYPES = frozenset({int, float, bool})


def final_reward_values(
    values: Sequence[Any], lasts: NDArray[np.integer[Any]], where: Callable[[int], str]
) -> NDArray[np.float64]:
    """:func:`final_reward_value` of many final rewards: ``values[k]`` is the reward of a
    trajectory whose final step is ``lasts[k]`` and ``where(k)`` names it (called only
    for an error). The same floats, and the same first error, as one call per value.

    Cost: one C pass when every value is a plain ``int``, ``float`` or ``bool`` (what
    a JSON header holds), about 1 µs per 20 values; else one call per value.

    Raises:
        TrajectoryError: the first value that breaks the rule.
    """
    if set(map(type, values)) <= _PLAIN_REWARD_TYPES:
        try:
            out = np.array(values, dtype=np.float64)
        except OverflowError:  # an int beyond float: float() names it, below
            pass
        else:
            if bool(np.isfinite(out).all()):
                return out
    return np.array(
        [final_reward_value(v, where(k), int(lasts[k])) for k, v in enumerate(values)],
        dtype=np.float64,
    )


def final_reward(trajectory: Sequence[Any], where: str) -> float:
    """The final step's reward of an in-memory trajectory, by :func:`final_reward_value`.

    Raises:
        TrajectoryError: the trajectory is empty, its final step has no reward
            component, or the reward breaks :func:`final_reward_value`.
    """
    if len(trajectory) == 0:
        raise TrajectoryError(f"{where} has no steps")
    last = len(trajectory) - 1
    reward = step_part(trajectory[last], "reward")
    if reward is None:
        raise TrajectoryError(f"{where}: final step {last} has no 'reward'")
    return final_reward_value(field_of(reward, "reward"), where, last)


def is_successful(reward: float, success_threshold: float) -> bool:
    """Whether a (checked) final reward counts as a success: ``reward >= success_threshold``."""
    return reward >= success_threshold


def count_successes(
    final_rewards: Sequence[float] | NDArray[np.float64],
    dummy: Sequence[bool] | NDArray[np.bool_],
    success_threshold: float,
) -> tuple[int, int]:
    """``(successful, attempts)`` of trajectories given by their (checked) final rewards
    and dummy flags: attempts are the trajectories that are not dummies, successful
    those of them whose reward :func:`is_successful`. One vectorised pass."""
    rewards = np.asarray(final_rewards, dtype=np.float64)
    attempts = ~np.asarray(dummy, dtype=bool)
    if rewards.shape != attempts.shape:
        raise ValueError(f"{rewards.size} final rewards for {attempts.size} dummy flags")
    return int((attempts & (rewards >= success_threshold)).sum()), int(attempts.sum())


def success_rate(successful: int, attempts: int, empty: float = 0.0) -> float:
    """``successful / attempts``: the success rate of :func:`count_successes`' figures;
    ``empty`` when there was no attempt (0.0; a reader that must tell "no attempt" from
    "none succeeded" passes NaN)."""
    return successful / attempts if attempts else empty


def keypoint_steps(steps: Sequence[Mapping[str, Any]]) -> list[int]:
    """The step numbers whose reward says ``submit`` (steps in their dict form)."""
    return [s for s, d in enumerate(steps) if (d.get("reward") or {}).get("submit")]


class StepSource(Protocol):
    """Where the step objects behind the index live (memory or iteration files)."""

    def step(self, pos: int, traj: int, step: int) -> Mapping[str, Any]:
        """The step mapping (component objects) at collection position ``pos``."""
        ...

    def history(self, pos: int, traj: int, step: int) -> Sequence[Mapping[str, Any]]:
        """The mappings of steps ``0 .. step-1`` of the same trajectory (a new list)."""
        ...

    def describe(self, traj: int, step: int) -> str:
        """Human words for a step: ``"trajectory 3 step 1"`` (+ the file, if any)."""
        ...


@dataclass(slots=True)
class StepIndex:
    """Per-step facts of a collection, in collection order (what a buffer is built on).

    Attributes:
        traj: trajectory id per step (the source's numbering), int64.
        step: step number within its trajectory, int32.
        reward: the trajectory's final reward per step, float64.
        same: same-as-next-screenshot per step (False on last steps), bool.
        trajectory_rewards: final reward per kept (non-dummy) trajectory, float64.
        dummy_trajectories: dummy trajectories dropped.
        computed_steps: steps whose flag was computed from the pixels.
        missing_screenshots: screenshot lookups that found no readable file.
        source: where the step objects are read from on access.
        has_prompt: per step, whether it stores a non-empty ``response.raw_prompt``
            (bool); ``None`` when the source cannot tell without reading the steps
            (then a missing prompt is found on access).
    """

    traj: NDArray[np.int64]
    step: NDArray[np.int32]
    reward: NDArray[np.float64]
    same: NDArray[np.bool_]
    trajectory_rewards: NDArray[np.float64]
    dummy_trajectories: int
    computed_steps: int
    missing_screenshots: int
    source: StepSource
    has_prompt: NDArray[np.bool_] | None = None
