"""The loop with ``rollout.ray``: its rollouts run on Ray actors (a Ray the loop starts,
``address: local``): iteration 0's demonstrations (the suite's scripted expert on the
actors) are what the model trains on, and the model served beyond localhost behind the
generated key, which the actors carry and no file of the run holds, acts in iteration 1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import replaystore.rollouts.sites
from loop.fake_tools import loop_command, make_fake_model, make_fake_tools, read_calls
from replaystore.trajectories.storage import TrajectoryStorage

pytestmark = pytest.mark.slow

SUITE_TASKS = Path(replaystore.rollouts.sites.__file__).parent / "tasks.jsonl"


def test_the_loop_rolls_out_on_ray_actors_with_the_servers_key(
    tmp_path: Path, chromium: str | None
) -> None:
    config = {
        "out": "run",
        "iterations": 2,
        "tasks_per_iteration": 3,
        "tools_dir": str(make_fake_tools(tmp_path)),
        "bootstrap": {"source": "scripted", "repeats": 1},
        "model": {"path": "base", "evaluate_untrained": False},
        "serve": {"host": "0.0.0.0", "startup_timeout_s": 30.0},
        "policy": {"max_retries": 0},
        "rollout": {"ray": {"address": "local", "actors": 2, "browsers_per_actor": 1}},
        "train": {"final": False},
    }
    make_fake_model(tmp_path / "base")
    env = {"FAKE_TASKS": str(SUITE_TASKS), "RAY_AUTH_MODE": "disabled"}
    result = loop_command(tmp_path, config, env=env, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    run = tmp_path / "run"
    summary = json.loads((run / "summary.json").read_text())
    assert [row["policy"] for row in summary["iterations"]] == ["demonstrations", "model"]
    for number in (1, 2):  # both iterations were collected by the actors
        files = sorted((run / "storage").glob(f"iteration_{number:06d}*.jsonl"))
        assert files, f"iteration {number - 1} was not stored"
        with files[0].open("rb") as handle:
            header = json.loads(handle.readline())
        assert "replaystore.rollouts.ray" in json.dumps(header), header
    # The training of iteration 0 read the dataset exported from the actors' trajectories.
    storage = TrajectoryStorage(run / "storage")
    won = [t for t in storage.read_file(storage.files()[0]) if t[-1]["reward"].reward >= 1]
    assert won, "the scripted expert solved nothing on the actors"
    dataset = json.loads((run / "iterations" / "000" / "dataset" / "webagent.json").read_text())
    prompts = " ".join(r["conversations"][0]["value"] for r in dataset)
    assert all(t[0]["observation"].task.task_name in prompts for t in won)
    calls = read_calls(tmp_path)
    trained = [c for c in calls if c["tool"] == "train" and c.get("event") == "start"]
    assert trained, calls
    (key,) = {c["api_key"] for c in calls if c["tool"] == "serve" and c.get("api_key")}
    assert not [c for c in calls if c.get("event") == "unauthorized"]
    holding = [str(p) for p in run.rglob("*") if p.is_file() and key.encode() in p.read_bytes()]
    assert holding == []
    assert key not in result.stdout + result.stderr
