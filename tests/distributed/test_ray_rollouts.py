"""Ray rollouts' driver on a local Ray (fake actors, no browser): every task stored exactly
once when actors die, one clear error when none is left, Ctrl-C stops the actors."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from replaystore.errors import ConfigError
from replaystore.rollouts.ray_rollout import RayOptions, ray_rollout
from replaystore.rollouts.task_ledger import NoActorsLeftError
from replaystore.trajectories.components import Task
from replaystore.trajectories.storage import TrajectoryStorage

TASKS = [
    Task(f"task {i}", "d", "s", f"https://example.com/{i}", "easy", None, None, task_id=f"t{i}")
    for i in range(8)
]
SPEC: dict[str, Any] = {}


def fake_worker(
    markers: Path,
    *,
    die_on: tuple[int, ...] = (),
    die_always: bool = False,
    sleep_s: float = 0.0,
    fail_start: bool = False,
) -> type:
    """An actor class with RolloutWorker's methods and no browser (defined in a function, so
    Ray ships it by value). It dies (os._exit) on a task of ``die_on`` the first time any
    actor meets that task; reward = index % 2."""

    class FakeWorker:
        def __init__(self, spec: dict[str, Any]) -> None:
            self.spec = spec

        def start(self) -> dict[str, Any]:
            if fail_start:
                raise RuntimeError("no Chromium on this node")
            import ray

            return {"host": "fake", "node": ray.get_runtime_context().get_node_id(), "origin": ""}

        def run(self, index: int, task: dict[str, Any], iteration: int, rank: int) -> bytes:
            import time

            from replaystore.rollouts.outcomes import TaskOutcome
            from replaystore.rollouts.shipping import pack_outcome
            from replaystore.trajectories.components import Action, Observation, Response, Reward

            marker = markers / f"died-on-{index}"
            if die_always or (index in die_on and not marker.exists()):
                marker.touch()
                os._exit(1)
            time.sleep(sleep_s)
            t = Task.from_dict(task)
            step = {
                "observation": Observation(t, "", "tree", {"url": t.website, "title": ""}),
                "action": Action({"key": "answer", "text": "x"}, "answer [x]"),
                "response": Response("Action: answer [x]", {"action": "answer [x]"}),
                "reward": Reward(float(index % 2), None),
            }
            outcome = TaskOutcome(t, "answered", [step], float(index % 2), None, 0.01)
            return pack_outcome(outcome, markers, index=index)

        def stop(self) -> None:
            (markers / f"stopped-{os.getpid()}").touch()

    return FakeWorker


def _options(**kwargs: Any) -> RayOptions:
    return RayOptions(address=None, num_cpus=0, startup_timeout_s=60, **kwargs)


def _stored(storage: TrajectoryStorage) -> dict[str, float]:
    rewards: dict[str, float] = {}
    for trajectory in storage.load_all():
        task_id = trajectory[-1]["observation"].task.task_id
        assert task_id not in rewards, f"{task_id} stored twice"
        rewards[task_id] = float(trajectory[-1]["reward"].reward)
    return rewards


@pytest.mark.usefixtures("ray_session")
def test_a_dead_actors_tasks_go_to_the_others_and_each_is_stored_once(tmp_path: Path) -> None:
    storage = TrajectoryStorage(tmp_path / "storage")
    result = ray_rollout(
        TASKS,
        storage,
        1,
        spec=SPEC,
        options=_options(actors=2, browsers_per_actor=2),
        worker=fake_worker(tmp_path, die_on=(3,), sleep_s=0.05),
    )
    assert _stored(storage) == {f"t{i}": float(i % 2) for i in range(8)}
    assert result.ray["lost_actors"] == ["actor-0"] or result.ray["lost_actors"] == ["actor-1"]
    assert result.ray["reassigned"] >= 1
    assert result.ray["duplicates"] == 0
    assert sum(a["tasks"] for a in result.ray["actors"].values()) == 8
    header = storage.files()[0]
    assert header.rank == 0


@pytest.mark.usefixtures("ray_session")
def test_no_actor_left_is_one_clear_error_and_stores_nothing(tmp_path: Path) -> None:
    storage = TrajectoryStorage(tmp_path / "storage")
    with pytest.raises(NoActorsLeftError, match=r"no rollout actor is left \(2 lost\): \d of 8"):
        ray_rollout(
            TASKS,
            storage,
            1,
            spec=SPEC,
            options=_options(actors=2, browsers_per_actor=1),
            worker=fake_worker(tmp_path, die_always=True),
        )
    assert storage.files() == []


@pytest.mark.usefixtures("ray_session")
def test_actors_that_cannot_start_are_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(NoActorsLeftError, match=r"no rollout actor started: actor-\d: no Chromium"):
        ray_rollout(
            TASKS,
            TrajectoryStorage(tmp_path / "storage"),
            1,
            spec=SPEC,
            options=_options(actors=2),
            worker=fake_worker(tmp_path, fail_start=True),
        )


@pytest.mark.usefixtures("ray_session")
def test_ctrl_c_stops_the_actors_and_keeps_the_finished_trajectories(tmp_path: Path) -> None:
    storage = TrajectoryStorage(tmp_path / "storage")
    timer = threading.Timer(3.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        result = ray_rollout(
            TASKS * 10,
            storage,
            1,
            spec=SPEC,
            options=_options(actors=2, browsers_per_actor=1),
            worker=fake_worker(tmp_path, sleep_s=0.3),
        )
    finally:
        timer.cancel()
    assert result.interrupted
    assert 0 < len(result.outcomes) < 80
    assert len(list(tmp_path.glob("stopped-*"))) == 2  # both actors were stopped
    assert len(storage.load_all()) == len(result.outcomes)


def test_bad_options_name_the_field() -> None:
    with pytest.raises(ConfigError, match="ray actors must be an int >= 1"):
        RayOptions(actors=0).check()
    with pytest.raises(ConfigError, match="placement must be spread or pack"):
        RayOptions(placement="anywhere").check()
    with pytest.raises(ConfigError, match="unknown key 'actor'"):
        RayOptions.from_mapping({"actor": 2})
