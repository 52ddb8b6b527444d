"""``--resume`` with a changed config: what changes finished work is refused, the rest is taken.

Iteration 0 imports demonstrations and trains with the fake tools (no browser). A
resume whose ``model.path`` differs is refused with one line naming the key and both
paths, and leaves the run as it was; a resume with more ``iterations`` goes on (its
iteration 1 rolls out the fake server's answers in Chromium) and the journal records
the change.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

import replaystore.rollouts.sites
from replaystore.errors import ConfigError
from replaystore.loop import LoopConfig
from replaystore.loop.config import resume_changes
from replaystore.loop.journal import Journal

from .fake_tools import loop_command, make_fake_model, make_fake_tools, read_calls
from .test_failures import demonstrations

SUITE_TASKS = Path(replaystore.rollouts.sites.__file__).parent / "tasks.jsonl"


def loop(tmp_path: Path, config: dict, *extra: str) -> subprocess.CompletedProcess[str]:
    return loop_command(tmp_path, config, *extra, env={"FAKE_TASKS": str(SUITE_TASKS)}, timeout=200)


def first_run(tmp_path: Path) -> dict:
    """A finished one-iteration run (demonstrations, one training); its config."""
    config = {
        "out": "run",
        "iterations": 1,
        "tasks_per_iteration": 2,
        "tools_dir": str(make_fake_tools(tmp_path)),
        "bootstrap": {"source": "demos"},  # relative to the config file
        "model": {"path": "base", "evaluate_untrained": False},
        "serve": {"startup_timeout_s": 30.0},
        "policy": {"max_retries": 0},
    }
    demonstrations(tmp_path)
    make_fake_model(tmp_path / "base")
    result = loop(tmp_path, config)
    assert result.returncode == 0, result.stdout + result.stderr
    return config


def test_a_resume_with_another_model_path_is_refused_naming_both_paths(tmp_path):
    config = first_run(tmp_path)
    journal = tmp_path / "run" / "journal.json"
    before = journal.read_bytes()
    make_fake_model(tmp_path / "other")
    changed = {**config, "iterations": 2, "model": {**config["model"], "path": "other"}}
    result = loop(tmp_path, changed, "--resume")
    assert result.returncode == 2, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("replaystore loop: error: --resume: the config changes ")
    assert f"model.path: '{tmp_path / 'base'}' in the run, '{tmp_path / 'other'}' now" in lines[0]
    assert "iterations" not in lines[0]  # a resumable key is not reported
    assert journal.read_bytes() == before  # nothing of the run changed
    assert [c["event"] for c in read_calls(tmp_path) if c["tool"] == "train"] == [
        "start",
        "done",
    ]


def test_a_resume_with_more_iterations_goes_on_and_is_recorded(tmp_path, chromium):
    config = first_run(tmp_path)
    result = loop(tmp_path, {**config, "iterations": 2, "rollout": {"workers": 2}}, "--resume")
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert [row["policy"] for row in summary["iterations"]] == ["demonstrations", "model"]
    data = json.loads((tmp_path / "run" / "journal.json").read_text())
    (resume,) = data["resumes"]
    assert resume["changed"] == {"iterations": [1, 2], "rollout.workers": [4, 2]}
    assert data["config"]["iterations"] == 2
    # The run's own copy of its config holds absolute paths: --resume --out RUN, which
    # reads it from another directory, finds the same model and demonstrations.
    saved = yaml.safe_load((tmp_path / "run" / "loop.yaml").read_text())
    assert saved["model"]["path"] == str(tmp_path / "base")
    assert saved["bootstrap"]["source"] == str(tmp_path / "demos")


def test_resume_changes_names_every_changed_key_by_its_dotted_path() -> None:
    base = LoopConfig.from_mapping({"train": {"overrides": {"learning_rate": 1e-3}}}).resolved()
    new = LoopConfig.from_mapping(
        {
            "seed": 1,
            "observation": "text",
            "iterations": 9,
            "logger": "tensorboard",
            "train": {"overrides": {"learning_rate": 2e-3}, "env": {"OMP_NUM_THREADS": "2"}},
            "prompt": {"history_window": 1},
        }
    ).resolved()
    refused, accepted = resume_changes(base, new)
    assert refused == {
        "seed": (0, 1),
        "train.overrides.learning_rate": (1e-3, 2e-3),
        "prompt.history_window": (4, 1),
    }
    assert accepted == {
        "iterations": (3, 9),
        "logger": ("none", "tensorboard"),
        "train.env.OMP_NUM_THREADS": (None, "2"),
    }


def test_the_same_file_named_from_another_directory_is_no_change(tmp_path) -> None:
    (tmp_path / "a").mkdir()
    out = str(tmp_path / "run")
    one = LoopConfig.from_mapping({"out": out, "model": {"path": "../base"}}, tmp_path / "a")
    two = LoopConfig.from_mapping({"out": out, "model": {"path": str(tmp_path / "base")}}, "/")
    assert resume_changes(one.resolved(), two.resolved()) == ({}, {})


def test_a_journal_written_before_absolute_paths_compares_the_config_as_given(tmp_path) -> None:
    config = LoopConfig.from_mapping({"model": {"path": "base"}}, base_dir=tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    old = {"format": 1, "run_token": "t", "suite_port": None, "config": config.data,
           "baseline": None, "iterations": []}  # fmt: skip
    (run / "journal.json").write_text(json.dumps(old))
    journal = Journal.open(run, resume=True, config=config)
    assert journal.data["config"]["model"]["path"] == str(tmp_path / "base")
    assert "resumes" not in journal.data
    other = LoopConfig.from_mapping({"model": {"path": "other"}}, base_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"model\.path: .*base.* in the run, .*other.* now"):
        Journal.open(run, resume=True, config=other)
