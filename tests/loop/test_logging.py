"""The loop logs what ``summary.json`` holds to the ExperimentLogger (TensorBoard here).

Iteration 0 imports demonstrations and trains with the fake trainer: no browser, no server.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replaystore.loop import LoopConfig, run_loop

from .fake_tools import make_fake_model, make_fake_tools
from .test_failures import demonstrations


def test_loop_writes_success_rate_loss_and_stage_seconds_to_tensorboard(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = LoopConfig.from_mapping(
        {
            "out": str(tmp_path / "run"),
            "iterations": 1,
            "logger": "tensorboard",
            "tools_dir": str(make_fake_tools(tmp_path)),
            "bootstrap": {"source": str(demonstrations(tmp_path))},
            "model": {"path": str(make_fake_model(tmp_path / "base")), "evaluate_untrained": False},
        }
    )
    summary = run_loop(config)
    row = summary["iterations"][0]
    assert row["policy"] == "demonstrations" and row["success_rate"] == 1.0
    assert row["train_loss"]["first"] > row["train_loss"]["last"]
    assert json.loads((tmp_path / "run" / "summary.json").read_text()) == summary

    events = list((tmp_path / "run" / "logs" / "tensorboard").rglob("events.out.tfevents.*"))
    assert events
    acc = EventAccumulator(str(events[0].parent))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"loop/success_rate", "loop/train_loss_first", "loop/train_loss_last"} <= tags
    assert "loop/seconds/train" in tags
    (event,) = acc.Scalars("loop/train_loss_last")
    assert event.step == 1 and event.value == pytest.approx(row["train_loss"]["last"])


def test_overhead_share_is_everything_outside_the_tools_over_the_wall_time() -> None:
    from replaystore.loop.runner import _overhead_share

    stages = {
        "sample": {"done": True, "seconds": 0.2},
        "serve": {"done": True, "seconds": 30.0},
        "rollout": {"done": True, "seconds": 20.0, "timings": {"overhead": 0.3}},
        "export": {"done": True, "seconds": 0.5},
        "train": {"done": True, "seconds": 49.0},
    }
    # Tools: 30 + 20 + 49 - 0.3 (the collector's own work) = 98.7 s of 100 s of wall time.
    assert _overhead_share(stages, 100.0) == pytest.approx(0.013)
    # An older journal without wall time: the stages' sum stands in for it.
    assert _overhead_share(stages) == pytest.approx(1.0 / 99.7, abs=1e-5)
