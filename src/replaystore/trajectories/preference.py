"""Preference data from trajectories: failures as training signal, for KTO and DPO.

The SFT export (:mod:`replaystore.trajectories.export`) learns from successful
trajectories only. LLaMA-Factory (0.9.5, through TRL) also trains on preferences, and
both kinds are built here from a trajectory storage, successes and failures alike:

* **KTO** (:func:`kto_samples`): every model step of every (non-dummy) trajectory, with
  ``kto_tag`` true when its trajectory succeeded (final reward >= ``success_threshold``)
  and false when it failed. A step is judged by its trajectory's outcome, as KTO's
  desirable/undesirable labels are meant: no per-step credit is invented.
* **DPO** (:func:`dpo_pairs`): pairs at one **state**, the same task (``task_id``) and
  the same prompt the model saw (its messages; an image counts by its bytes, not its
  file name). At a state reached by at least one successful and one failed trajectory,
  ``chosen`` is the action the successful trajectories took there (the most frequent;
  the earliest stored on a tie) and each distinct action a failed trajectory took there
  that no successful one took becomes a ``rejected``: one pair per such action. An
  action taken in both a success and a failure is no evidence either way and makes no
  pair. :class:`PairReport` counts what was made and why the other states made none.

Pairs need two attempts that reached the same state, which greedy rollouts on fresh
task instances rarely do past the first step: repeated attempts at the same instances
(``bootstrap.repeats``, sampling temperature > 0) are what produce them.

Only prompts stored at rollout time are used (``response.raw_prompt``, which
replaystore's collector always stores): a preference compares what the model saw, and
a prompt rebuilt later might differ. A step without one is an error naming it. Steps
that only record how a task ended (:func:`~replaystore.trajectories.index.is_record_step`:
timeouts, anti-bot pages) are not actions and are left out.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replaystore.errors import ImageError, TrajectoryError
from replaystore.images import decode_data_url, file_url_to_path, image_part_url
from replaystore.trajectories.buffer import parse_prompt
from replaystore.trajectories.index import (
    field_of,
    final_reward_value,
    is_dummy_trajectory,
    is_record_step,
    step_part,
)

__all__ = [
    "PairReport",
    "PreferenceStep",
    "dpo_pairs",
    "kto_samples",
    "preference_steps",
    "storage_trajectories",
]


@dataclass(frozen=True, slots=True)
class PreferenceStep:
    """One model step and its trajectory's outcome.

    Attributes:
        task_id: the task the step belongs to.
        message: the chat messages of the prompt the model saw.
        action: the model's raw response (what is learned or ranked).
        success: the trajectory's final reward >= the success threshold.
        where: ``"<file> trajectory T step S"``, for messages.
    """

    task_id: str
    message: list[dict[str, Any]]
    action: str
    success: bool
    where: str


@dataclass(slots=True)
class PairReport:
    """What :func:`dpo_pairs` made, and why the other states made no pair.

    Attributes:
        states: distinct states (task and prompt) over all steps.
        pairs: pairs made.
        states_with_pairs: states that gave at least one pair.
        only_successful: states reached only by successful trajectories.
        only_failed: states reached only by failed trajectories.
        same_actions: states reached by both where every failed action was also taken
            by a successful trajectory.
    """

    states: int = 0
    pairs: int = 0
    states_with_pairs: int = 0
    only_successful: int = 0
    only_failed: int = 0
    same_actions: int = 0

    def as_dict(self) -> dict[str, int]:
        """The counts by name."""
        return {name: getattr(self, name) for name in self.__slots__}


def preference_steps(
    trajectories: Iterable[tuple[str, Sequence[Any]]], *, success_threshold: float = 1.0
) -> list[PreferenceStep]:
    """The model steps of ``trajectories`` with their outcome, in order.

    Args:
        trajectories: ``(name, trajectory)`` pairs, a trajectory being the step
            mappings a :class:`~replaystore.trajectories.TrajectoryStorage` reads (see
            :func:`storage_trajectories`). Dummy trajectories are skipped.
        success_threshold: a trajectory succeeded when its final reward is at least this
            (the trajectory buffer's rule and default).

    Raises:
        TrajectoryError: a final reward that is missing or not a number, a step without
            a stored prompt or response, or a prompt that is not chat messages (each
            named with its trajectory and step).
    """
    steps: list[PreferenceStep] = []
    for name, trajectory in trajectories:
        if not trajectory or is_dummy_trajectory(trajectory):
            continue
        last = trajectory[-1]
        reward = step_part(last, "reward")
        value = field_of(reward, "reward") if reward is not None else None
        success = final_reward_value(value, name, len(trajectory) - 1) >= success_threshold
        for s, step in enumerate(trajectory):
            if is_record_step(step):
                continue
            where = f"{name} step {s}"
            response = step_part(step, "response")
            raw_prompt = field_of(response, "raw_prompt") if response is not None else None
            action = field_of(response, "raw_response") if response is not None else None
            if not raw_prompt:
                raise TrajectoryError(
                    f"{where} has no stored prompt (response.raw_prompt): preference data "
                    "compares the prompts the model saw, so it is made only from steps "
                    "that stored theirs (replaystore's rollouts always do)"
                )
            if not isinstance(action, str) or not action:
                raise TrajectoryError(f"{where} has no model response (response.raw_response)")
            observation = step_part(step, "observation")
            task = field_of(observation, "task") if observation is not None else None
            task_id = field_of(task, "task_id") if task is not None else None
            steps.append(
                PreferenceStep(
                    task_id=str(task_id) if task_id is not None else "",
                    message=parse_prompt(raw_prompt, where),
                    action=action,
                    success=success,
                    where=where,
                )
            )
    return steps


def storage_trajectories(
    storage: Any, last_n_iterations: int | None = None
) -> Iterable[tuple[str, Sequence[Any]]]:
    """``(name, trajectory)`` pairs of a :class:`~replaystore.trajectories.TrajectoryStorage`,
    one iteration file in memory at a time; a name is ``"iteration I trajectory T"``."""
    counts: Counter[int] = Counter()
    for iteration, trajectory in storage.iter_trajectories(last_n_iterations):
        yield f"iteration {iteration} trajectory {counts[iteration]}", trajectory
        counts[iteration] += 1


def kto_samples(steps: Sequence[PreferenceStep]) -> list[dict[str, Any]]:
    """One sample per step: ``{"message", "action", "kto_tag"}`` (``kto_tag``: the step's
    trajectory succeeded), in the shape :func:`~replaystore.trajectories.export_kto`
    writes."""
    return [{"message": s.message, "action": s.action, "kto_tag": s.success} for s in steps]


def dpo_pairs(steps: Sequence[PreferenceStep]) -> tuple[list[dict[str, Any]], PairReport]:
    """Pairs at shared states (the construction is in the module docstring).

    Returns:
        ``([{"message", "chosen", "rejected"}, ...], report)``: the pairs in the order
        their states were first met (and, within a state, their rejected actions'), and
        the counts.

    Raises:
        TrajectoryError: an image in a prompt cannot be read (its bytes identify the state).
    """
    digests: dict[str, str] = {}
    states: dict[str, _State] = {}
    for step in steps:
        key = _state_key(step, digests)
        state = states.get(key)
        if state is None:
            state = states[key] = _State(step.message)
        (state.succeeded if step.success else state.failed).append(step.action)
    report = PairReport(states=len(states))
    pairs: list[dict[str, Any]] = []
    for state in states.values():
        if not state.failed:
            report.only_successful += 1
            continue
        if not state.succeeded:
            report.only_failed += 1
            continue
        counts = Counter(state.succeeded)
        top = max(counts.values())
        chosen = next(a for a in state.succeeded if counts[a] == top)  # earliest on a tie
        rejected = [a for a in dict.fromkeys(state.failed) if a not in counts]
        if not rejected:
            report.same_actions += 1
            continue
        report.states_with_pairs += 1
        report.pairs += len(rejected)
        pairs += [{"message": state.message, "chosen": chosen, "rejected": r} for r in rejected]
    return pairs, report


@dataclass(slots=True)
class _State:
    message: list[dict[str, Any]]
    succeeded: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def _state_key(step: PreferenceStep, digests: dict[str, str]) -> str:
    """The task and the prompt as one string, each image replaced by its bytes' digest."""

    def canonical(value: Any) -> Any:
        if isinstance(value, Mapping):
            try:
                url = image_part_url(value)
            except ImageError:
                url = None
            if url is not None:
                if url not in digests:
                    digests[url] = _image_digest(url, step.where)
                return {"image_sha256": digests[url]}
            return {str(k): canonical(v) for k, v in value.items()}
        if isinstance(value, list):
            return [canonical(v) for v in value]
        return value

    return json.dumps([step.task_id, canonical(step.message)], sort_keys=True)


def _image_digest(url: str, where: str) -> str:
    try:
        if url.startswith("data:"):
            data = decode_data_url(url)[1]
        else:
            path = file_url_to_path(url) if url.startswith("file:") else Path(url)
            data = Path(os.fspath(path)).read_bytes()
    except (ImageError, OSError) as exc:
        raise TrajectoryError(
            f"{where}: the prompt's image {url[:80]!r} cannot be read to compare states: {exc}"
        ) from None
    return hashlib.sha256(data).hexdigest()
