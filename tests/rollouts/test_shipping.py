"""A finished task shipped as bytes (JSON + PNGs, no pickle) and written on the driver's side;
an actor's tasks moved to its own server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replaystore.errors import SchemaError
from replaystore.rollouts.outcomes import TaskOutcome
from replaystore.rollouts.ray_worker import localize_task, worker_spec
from replaystore.rollouts.shipping import MAGIC, pack_outcome, unpack_outcome
from replaystore.trajectories.components import Action, Observation, Response, Reward, Task

TASK = Task("Buy", "shop", "cart", "http://shop.localhost:4000/", "easy", None, "ok", task_id="t1")


def _outcome(root: Path) -> TaskOutcome:
    folder = root / "iteration_000001" / "rank000" / "0003_t1"
    folder.mkdir(parents=True)
    steps = []
    for i in range(2):
        png = folder / f"step_{i:03d}.png"
        png.write_bytes(b"\x89PNG fake %d" % i)
        prompt = json.dumps([{"role": "user", "content": [{"image_url": png.as_uri()}]}])
        steps.append(
            {
                "observation": Observation(TASK, str(png), "tree", {"url": TASK.website}),
                "action": Action({"key": "click"}, "click [1]"),
                "response": Response("Action: click [1]", {"action": "click [1]"}, prompt),
                "reward": Reward(0.0 if i == 0 else 1.0, None),
            }
        )
    steps[-1]["trajectory_metadata"] = {"status": "answered"}
    return TaskOutcome(TASK, "answered", steps, 1.0, None, 2.5)


def test_an_outcome_round_trips_with_its_screenshots_moved_to_the_drivers_root(
    tmp_path: Path,
) -> None:
    actor, driver = tmp_path / "actor", tmp_path / "driver"
    data = pack_outcome(_outcome(actor), actor, index=3, timings={"policy": 0.5})
    assert data.startswith(MAGIC)
    shipped = unpack_outcome(data)
    assert shipped.index == 3 and shipped.steps == 2
    assert shipped.header["timings"] == {"policy": 0.5}
    outcome = shipped.write(driver)
    assert (outcome.status, outcome.reward, outcome.seconds) == ("answered", 1.0, 2.5)
    for i, step in enumerate(outcome.trajectory):
        path = Path(step["observation"].image_path)
        assert path == driver / "iteration_000001" / "rank000" / "0003_t1" / f"step_{i:03d}.png"
        assert path.read_bytes() == b"\x89PNG fake %d" % i
        assert path.as_uri() in step["response"].raw_prompt
        assert str(actor) not in step["response"].raw_prompt
    assert outcome.trajectory[-1]["trajectory_metadata"] == {"status": "answered"}


def test_a_step_without_a_screenshot_ships_no_image(tmp_path: Path) -> None:
    step = {
        "observation": Observation(TASK, "", None, {"url": TASK.website, "title": ""}),
        "action": Action({"key": "invalid_url"}, "Invalid URL"),
        "response": Response("", {"action": ""}),
        "reward": Reward(0.0, None),
    }
    outcome = TaskOutcome(TASK, "navigation_error", [step], 0.0, "refused", 0.1)
    shipped = unpack_outcome(pack_outcome(outcome, tmp_path, index=0))
    assert shipped.images == {}
    assert shipped.write(tmp_path / "d").trajectory[0]["observation"].image_path == ""


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"XXXX" + bytes(8),
        MAGIC + (99).to_bytes(8, "big") + b"{}",
        MAGIC + (2).to_bytes(8, "big") + b"{x",
    ],
)
def test_bytes_that_are_not_a_packed_outcome_are_refused(data: bytes) -> None:
    with pytest.raises(SchemaError, match="packed rollout outcome"):
        unpack_outcome(data)


def test_an_image_name_that_leaves_the_root_is_refused() -> None:
    header = json.dumps({"index": 0, "images": [["../evil.png", 0, 1]]}).encode()
    with pytest.raises(SchemaError, match="out of bounds"):
        unpack_outcome(MAGIC + len(header).to_bytes(8, "big") + header + b"x")


def test_suite_tasks_move_to_the_actors_port() -> None:
    moved = localize_task(TASK.to_dict(), "suite", "http://localhost:5555")
    assert moved["website"] == "http://shop.localhost:5555/"
    assert TASK.website == "http://shop.localhost:4000/"


def test_miniwob_tasks_move_to_the_actors_server() -> None:
    task = {"domain": "miniwob", "website": "http://127.0.0.1:1/miniwob/click-button.html"}
    moved = localize_task(task, "miniwob", "http://127.0.0.1:7777")
    assert moved["website"] == "http://127.0.0.1:7777/miniwob/click-button.html"


def test_real_websites_are_left_alone() -> None:
    task = {"domain": "web", "website": "https://example.com/a"}
    assert localize_task(task, "suite", "http://localhost:1") == task
    assert localize_task(task, None, "") == task


def test_a_worker_spec_names_a_known_policy_and_server() -> None:
    spec = worker_spec(policy="scripted", serve="suite", browsers=2, scripted={"seed": 3})
    assert json.loads(json.dumps(spec)) == spec  # JSON-compatible: nothing is pickled
    with pytest.raises(Exception, match="unknown rollout policy"):
        worker_spec(policy="nope", serve=None, browsers=1)
    with pytest.raises(Exception, match="needs base_url and model"):
        worker_spec(policy="openai", serve=None, browsers=1)
    with pytest.raises(Exception, match="browsers per actor"):
        worker_spec(policy="scripted", serve=None, browsers=0)
