"""The untrained model is counted over the tasks the model's iterations are counted over:
iteration 0's tasks less the sites its rollout put on the blocklist (the bundled suite's
anti-bot site), not all 16."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from replaystore.trajectories.storage import TrajectoryStorage

from .fake_tools import make_fake_model, make_fake_tools


def test_the_untrained_model_plays_the_tasks_left_after_the_blocklist(
    tmp_path: Path, chromium: str | None
) -> None:
    config = {
        "out": "run",
        "iterations": 1,
        "tools_dir": str(make_fake_tools(tmp_path)),
        "bootstrap": {"source": "scripted"},
        "model": {"path": str(make_fake_model(tmp_path / "base")), "evaluate_untrained": True},
        # Two steps are enough to meet the wall (its first page) and keep the test short.
        "rollout": {
            "workers": 4,
            "viewport": [400, 300],
            "max_steps": {"easy": 2, "medium": 2, "hard": 2},
        },
        "serve": {"startup_timeout_s": 30.0},
        "policy": {"max_retries": 0},
        "train": {"final": True},
    }
    (tmp_path / "loop.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "replaystore.cli", "loop", "--config", "loop.yaml"],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "FAKE_TASKS": str(tmp_path / "run" / "tasks.jsonl")},
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["iterations"][0]["num_tasks"] == 16  # the demonstrations met the wall
    untrained = summary["untrained"]
    assert untrained["num_tasks"] == 14, untrained
    played = TrajectoryStorage(tmp_path / "run" / "baseline" / "storage").load_all()
    sites = {t[0]["observation"].task.website.split("//")[1].split(".")[0] for t in played}
    assert "botwall" not in sites and len(played) == 14
