"""``train.stage: kto | dpo``: an iteration trains on its successes and failures through
LLaMA-Factory's preference stages. With the fake trainer (no browser: iteration 0 imports
a small storage of successful and failed attempts made here), the generated YAML names
the stage and its beta, the dataset carries the preference columns, the summary says
what each iteration trained, and a DPO iteration without a pair stops in one line with
the counts."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from PIL import Image

from replaystore.errors import ConfigError
from replaystore.loop import LoopConfig
from replaystore.trajectories.components import Action, Observation, Response, Reward, Task
from replaystore.trajectories.storage import TrajectoryStorage

from .fake_tools import loop_command, make_fake_model, make_fake_tools


def _attempt(task: Task, answer: str, reward: float, shot: Path) -> list[dict[str, Any]]:
    prompt = [
        {"role": "system", "content": "You are a web agent."},
        {"role": "user", "content": f"Task: {task.task_name}\nCurrent step: 1"},
    ]
    return [
        {
            "observation": Observation(task=task, image_path=str(shot), ac_tree="[1] text"),
            "action": Action(action={"key": "answer", "text": answer}, action_string=answer),
            "response": Response(
                raw_response=f'Action: answer("{answer}")',
                answering_tokens=[1],
                raw_prompt=json.dumps(prompt),
            ),
            "reward": Reward(reward=reward, evaluation={"judge": "done"}, submit=True),
            "same_as_next_screenshot": False,
        }
    ]


def _attempts(root: Path, *, with_failures: bool) -> Path:
    """Two tasks, each answered right once; with failures, each answered wrong once too."""
    trajectories = []
    shot = root / "screenshots" / "page.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (16, 16), (200, 0, 0)).save(shot)
    for i in range(2):
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
        trajectories.append(_attempt(task, str(i), 1.0, shot))
        if with_failures:
            trajectories.append(_attempt(task, "9", 0.0, shot))
    storage = root / "attempts"
    TrajectoryStorage(storage).save_iteration(1, trajectories)
    return storage


def _loop(tmp_path: Path, stage: Any, *, with_failures: bool) -> subprocess.CompletedProcess[str]:
    config = {
        "out": "run",
        "iterations": 1,
        "tools_dir": str(make_fake_tools(tmp_path)),
        "bootstrap": {"source": str(_attempts(tmp_path, with_failures=with_failures))},
        "model": {"path": str(make_fake_model(tmp_path / "base")), "evaluate_untrained": False},
        "train": {"final": True, "stage": stage, "overrides": {"pref_beta": 0.2}},
    }
    return loop_command(tmp_path, config, timeout=120)


def _trained(tmp_path: Path) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    iteration = tmp_path / "run" / "iterations" / "000"
    arguments = yaml.safe_load((iteration / "train.yaml").read_text())
    info = json.loads((iteration / "dataset" / "dataset_info.json").read_text())
    records = json.loads((iteration / "dataset" / info["webagent"]["file_name"]).read_text())
    return arguments, records, info["webagent"]


def test_a_kto_iteration_trains_on_every_step_tagged_by_its_outcome(tmp_path: Path) -> None:
    done = _loop(tmp_path, "kto", with_failures=True)
    assert done.returncode == 0, done.stdout + done.stderr
    arguments, records, entry = _trained(tmp_path)
    assert arguments["stage"] == "kto" and arguments["pref_beta"] == 0.2  # the override kept
    assert "mask_history" not in arguments  # SFT-only: LLaMA-Factory refuses it here
    assert entry["columns"]["kto_tag"] == "kto_tag"
    assert sorted(r["kto_tag"] for r in records) == [False, False, True, True]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["iterations"][0]["train_stage"] == "kto"


def test_a_dpo_iteration_pairs_the_right_answer_with_the_wrong_one(tmp_path: Path) -> None:
    done = _loop(tmp_path, ["dpo"], with_failures=True)
    assert done.returncode == 0, done.stdout + done.stderr
    arguments, records, entry = _trained(tmp_path)
    assert arguments["stage"] == "dpo" and arguments["pref_loss"] == "sigmoid"
    assert entry["ranking"] is True
    pairs = sorted((r["chosen"]["value"], r["rejected"]["value"]) for r in records)
    assert pairs == [('Action: answer("0")', 'Action: answer("9")'),
                     ('Action: answer("1")', 'Action: answer("9")')]  # fmt: skip
    journal = json.loads((tmp_path / "run" / "journal.json").read_text())
    assert journal["iterations"][0]["stages"]["buffer"]["pairs"]["pairs"] == 2


def test_a_dpo_iteration_without_a_pair_says_so_with_the_counts(tmp_path: Path) -> None:
    done = _loop(tmp_path, "dpo", with_failures=False)
    assert done.returncode == 1
    line = done.stderr.strip().splitlines()[0]
    assert "train (iteration 0): nothing to train dpo on (2 steps, 2 of them successful" in line
    assert "'only_successful': 2" in line


def test_the_stage_of_each_iteration_and_bad_values(tmp_path: Path) -> None:
    config = LoopConfig.from_mapping(
        {"out": "run", "train": {"stage": ["sft", "kto"]}}, base_dir=tmp_path
    )
    assert [config.train_stage(k) for k in range(4)] == ["sft", "kto", "kto", "kto"]
    assert LoopConfig.from_mapping({"out": "run"}, base_dir=tmp_path).train_stage(3) == "sft"
    for bad in ("ppo", [], ["sft", "orpo"]):
        with pytest.raises(ConfigError, match=r"train\.stage must be one of sft, kto, dpo"):
            LoopConfig.from_mapping({"out": "run", "train": {"stage": bad}}, base_dir=tmp_path)
