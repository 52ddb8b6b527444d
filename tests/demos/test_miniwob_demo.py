"""The ``miniwob`` demo part: its configurations and its skip line (fast).

The loop it runs is tested end to end with the fake tools in
tests/loop/test_miniwob_loop.py; with the real tools it is a benchmark
(``benchmarks/miniwob_loop.py``), not a CI test: its quick form takes about 9 min on
2 idle cores, over CI's slow-step budget (issue 37's closing note)."""

from __future__ import annotations

from pathlib import Path

import pytest

from replaystore.demos import OPT_IN_PARTS, PARTS
from replaystore.demos.miniwob import full_config, quick_config, run, summary_lines
from replaystore.loop import LoopConfig
from replaystore.rollouts.miniwob import EXPERT_TASKS, QUICK_TASKS, parse_task_names

pytest.importorskip("miniwob", reason="the miniwob extra brings the MiniWoB++ pages")


def test_part_is_opt_in() -> None:
    assert "miniwob" in OPT_IN_PARTS and "miniwob" not in PARTS


@pytest.mark.parametrize("make", [quick_config, full_config])
def test_configurations_check_and_keep_training_and_held_out_seeds_apart(make) -> None:
    config = LoopConfig.from_mapping(make())
    assert config.on_miniwob
    held = set(range(100000, 100050))
    drawn = {s for k in range(config["iterations"]) for s in config.train_seeds(k)}
    assert drawn and not drawn & held
    names = parse_task_names(config["tasks"])
    assert names == list(QUICK_TASKS if make is quick_config else EXPERT_TASKS)


def test_without_tool_environments_one_skipped_line_names_the_setup_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REPLAYSTORE_LOOP_TOOLS", str(tmp_path / "no-tools"))
    lines = run(tmp_path / "miniwob", quick=True)
    assert len(lines) == 1
    assert lines[0].startswith("SKIPPED") and "bash .ci/install-loop-tools" in lines[0]
    assert not (tmp_path / "miniwob").exists()


def test_summary_lines_say_what_acted_and_where_it_was_measured(tmp_path: Path) -> None:
    summary = {
        "evaluation": {"tasks": "miniwob:quick", "seeds": "100000-100009", "train_seeds": "0-9"},
        "untrained": {"eval": {"mean": 0.0}},
        "iterations": [
            {
                "iteration": 0,
                "policy": "demonstrations",
                "checkpoint": None,
                "eval": {"tasks": {"click-button": 1.0}, "mean": 1.0},
                "successful": 4,
                "num_tasks": 4,
                "seconds": {"rollout": 3.0},
            },
            {
                "iteration": 1,
                "policy": "model",
                "checkpoint": "checkpoints/000",
                "eval": {"tasks": {"click-button": 0.5}, "mean": 0.5},
                "successful": 1,
                "num_tasks": 4,
                "seconds": {"rollout": 2.0},
            },
        ],
    }
    lines = summary_lines(summary, tmp_path)
    assert "held-out seeds 100000-100009" in lines[0]
    assert "untrained model: held-out 0%" in lines
    assert lines[3].startswith("iteration 0: experts (demonstrations): held-out 100%")
    assert lines[4].startswith("iteration 1: model checkpoints/000: held-out 50%")
    assert lines[-1] == f"measured: {tmp_path / 'summary.json'}"
