"""The untrained model is counted over the tasks the model's iterations are counted over:
iteration 0's tasks less the sites its rollout put on the blocklist (the bundled suite's
anti-bot site), not all 16."""

from __future__ import annotations

import json
from pathlib import Path

from replaystore.trajectories.storage import TrajectoryStorage

from .fake_tools import loop_command, make_fake_model, make_fake_tools


def test_the_untrained_model_plays_the_tasks_left_after_the_blocklist(
    tmp_path: Path, chromium: str | None
) -> None:
    config = {
        "out": "run",
        "iterations": 1,
        "tools_dir": str(make_fake_tools(tmp_path)),
        "bootstrap": {"source": "scripted"},
        "model": {"path": str(make_fake_model(tmp_path / "base")), "evaluate_untrained": True},
        # One step is enough to meet the wall (its first page) and keeps the test short.
        "rollout": {
            "workers": 4,
            "viewport": [400, 300],
            "max_steps": {"easy": 1, "medium": 1, "hard": 1},
        },
        "serve": {"startup_timeout_s": 30.0},
        "policy": {"max_retries": 0},
        "train": {"final": False},
    }
    done = loop_command(tmp_path, config, env={"FAKE_TASKS": str(tmp_path / "run" / "tasks.jsonl")})
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["iterations"][0]["num_tasks"] == 16  # the demonstrations met the wall
    untrained = summary["untrained"]
    assert untrained["num_tasks"] == 14, untrained
    played = TrajectoryStorage(tmp_path / "run" / "baseline" / "storage").load_all()
    sites = {t[0]["observation"].task.website.split("//")[1].split(".")[0] for t in played}
    assert "botwall" not in sites and len(played) == 14
