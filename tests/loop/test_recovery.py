"""Outputs finished before the loop died (but not yet journaled) are kept, with their facts.

No browser: iteration 0 imports demonstrations (see :mod:`.test_failures`).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import yaml

from .fake_tools import loop_command, make_fake_model, make_fake_tools, read_calls
from .test_failures import demonstrations


def loop(tmp_path: Path, *extra: str, **env: str) -> subprocess.CompletedProcess[str]:
    return loop_command(tmp_path, None, *extra, env=env, timeout=100)


def test_a_checkpoint_renamed_before_the_journal_is_kept_with_its_losses(tmp_path):
    config = {
        "out": "run",
        "iterations": 1,
        "tasks_per_iteration": 2,
        "tools_dir": str(make_fake_tools(tmp_path)),
        "bootstrap": {"source": str(demonstrations(tmp_path))},
        "model": {"path": str(make_fake_model(tmp_path / "base")), "evaluate_untrained": False},
    }
    (tmp_path / "loop.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    run = tmp_path / "run"
    failed = loop(tmp_path, FAKE_TRAIN_EXIT="1")
    assert failed.returncode == 1, failed.stderr
    # What a loop killed between the checkpoint's rename and the journal's write leaves:
    # the trainer ran on the loop's YAML, and its output was renamed into place.
    cli = tmp_path / "tools" / "llamafactory" / "bin" / "llamafactory-cli"
    yaml_path = run / "iterations" / "000" / "train.yaml"
    subprocess.run([str(cli), "train", str(yaml_path)], check=True, capture_output=True)
    os.replace(run / "checkpoints" / "000.partial", run / "checkpoints" / "000")

    resumed = loop(tmp_path, "--resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "already trained; not redone" in resumed.stdout
    starts = [c for c in read_calls(tmp_path) if c["tool"] == "train" and c["event"] == "start"]
    assert len(starts) == 2  # the failed try and the one run by hand: none by the resumed loop
    (row,) = json.loads((run / "summary.json").read_text())["iterations"]
    assert row["trained_checkpoint"] == "checkpoints/000"
    # The checkpoint's trainer_log.jsonl is there: the summary reports its losses as it
    # does for a training the journal saw finish.
    assert row["train_loss"] == {"first": 2.0, "last": 1.0}
