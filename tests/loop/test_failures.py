"""A failing tool stops ``replaystore loop`` with one line naming the stage and its log.

Iteration 0 imports demonstrations from a small trajectory storage made here
(``bootstrap.source``), so these tests need no browser: the trainer fails in
iteration 0, the server fails when iteration 1 serves, before any rollout.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from PIL import Image

from replaystore.trajectories.components import Action, Observation, Response, Reward, Task
from replaystore.trajectories.storage import TrajectoryStorage

from .fake_tools import loop_command, make_fake_model, make_fake_tools, read_calls


def demonstrations(root: Path, n: int = 2) -> Path:
    """A trajectory storage of ``n`` one-step successful answers (text prompts)."""
    trajectories = []
    for i in range(n):
        task = Task(
            task_name=f"What is answer {i}?",
            domain="Test",
            subdomain="Test",
            website="http://shop.localhost/",
            difficulty=1,
            evaluator_reference=[{"description": f"the answer is {i}", "facts": [str(i)]}],
            reference_answer=str(i),
            task_id=f"demo-{i}",
        )
        shot = root / "screenshots" / f"{i}.png"
        shot.parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (16, 16), (i * 40, 0, 0)).save(shot)
        prompt = [
            {"role": "system", "content": "You are a web agent."},
            {"role": "user", "content": f"Task: {task.task_name}\nCurrent step: 1"},
        ]
        step = {
            "observation": Observation(task=task, image_path=str(shot), ac_tree="[1] text"),
            "action": Action(action={"key": "answer", "text": str(i)}, action_string=f"answer {i}"),
            "response": Response(
                raw_response=f'Action: answer("{i}")',
                answering_tokens=[1, 2],
                raw_prompt=json.dumps(prompt),
            ),
            "reward": Reward(reward=1.0, evaluation={"judge": "done"}, submit=True),
            "same_as_next_screenshot": False,
        }
        trajectories.append([step])
    storage = root / "demos"
    TrajectoryStorage(storage).save_iteration(1, trajectories)
    return storage


def run_loop(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``replaystore loop`` over the fake tools: 2 iterations of 2 tasks, demonstrations first."""
    config = {
        "out": "run",
        "iterations": 2,
        "tasks_per_iteration": 2,
        "tools_dir": str(make_fake_tools(tmp_path)),
        "bootstrap": {"source": str(demonstrations(tmp_path))},
        "model": {"path": str(make_fake_model(tmp_path / "base")), "evaluate_untrained": False},
        "serve": {"startup_timeout_s": 30.0},
        "policy": {"max_retries": 0},
    }
    return loop_command(tmp_path, config, env=env, timeout=100)


def failure_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1, result.stdout + result.stderr
    assert len(lines) == 2, result.stderr
    assert lines[0].startswith("replaystore loop: failed: "), result.stderr
    assert lines[1].startswith("resume after fixing it: replaystore loop --config "), result.stderr
    assert lines[1].endswith(" --resume")
    return lines


def test_a_failing_trainer_names_the_stage_and_its_log(tmp_path):
    result = run_loop(tmp_path, {"FAKE_TRAIN_EXIT": "1"})
    line = failure_lines(result)[0]
    log = tmp_path / "run" / "logs" / "train-000.log"
    assert "train (iteration 0)" in line
    assert "exited with status 1" in line
    assert str(log) in line
    assert "failing with status 1 as asked" in log.read_text()
    assert not (tmp_path / "run" / "checkpoints" / "000").exists()


def test_a_trainer_without_weights_names_the_empty_checkpoint(tmp_path):
    result = run_loop(tmp_path, {"FAKE_TRAIN_NO_WEIGHTS": "1"})
    line = failure_lines(result)[0]
    assert "train (iteration 0)" in line
    assert "holds no weights" in line
    assert str(tmp_path / "run" / "logs" / "train-000.log") in line
    assert not (tmp_path / "run" / "checkpoints" / "000").exists()


def test_a_server_exiting_at_start_names_the_stage_and_its_log(tmp_path):
    result = run_loop(tmp_path, {"FAKE_SERVE_EXIT": "1"})
    line = failure_lines(result)[0]
    log = tmp_path / "run" / "logs" / "serve-001.log"
    assert "serve (iteration 1)" in line
    assert "exited with status 3 before it was ready" in line
    assert str(log) in line
    assert "exiting with status 3 as asked" in log.read_text()
    serves = [c for c in read_calls(tmp_path) if c["tool"] == "serve"]
    assert [Path(c["model"]).name for c in serves] == ["000"]
