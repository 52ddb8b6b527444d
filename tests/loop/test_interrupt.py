"""Ctrl-C (SIGINT) or SIGTERM stops the loop and its children, and keeps finished stages."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from replaystore.loop.processes import MARKER_VAR

from .fake_tools import make_fake_model, make_fake_tools, read_calls
from .test_failures import demonstrations


def _marked(token: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if f"{MARKER_VAR}={token}:".encode() in environ:
            found.append(int(entry.name))
    return found


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_mid_training_stops_the_trainer_and_exits_130(
    tmp_path: Path, sig: signal.Signals
) -> None:
    if not Path("/proc").is_dir():
        pytest.skip("needs /proc")
    config = {
        "out": "run",
        "iterations": 1,
        "tools_dir": str(make_fake_tools(tmp_path)),
        "bootstrap": {"source": str(demonstrations(tmp_path))},
        "model": {"path": str(make_fake_model(tmp_path / "base")), "evaluate_untrained": False},
    }
    path = tmp_path / "loop.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    loop = subprocess.Popen(
        [sys.executable, "-m", "replaystore.cli", "loop", "--config", str(path)],
        env={**os.environ, "FAKE_TRAIN_SLEEP": "60"},
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not any(c.get("tool") == "train" for c in read_calls(tmp_path)):
            assert loop.poll() is None, loop.communicate()
            assert time.monotonic() < deadline, "the trainer never started"
            time.sleep(0.1)
        token = json.loads((tmp_path / "run" / "journal.json").read_text())["run_token"]
        assert _marked(token), "the trainer carries the run's marker"
        loop.send_signal(sig)
        _, stderr = loop.communicate(timeout=60)
    finally:
        if loop.poll() is None:
            loop.kill()
    assert loop.returncode == 130, stderr
    assert "--resume" in stderr and "Traceback" not in stderr
    assert _marked(token) == []  # the trainer (its whole group) is gone
    journal = json.loads((tmp_path / "run" / "journal.json").read_text())
    stages = journal["iterations"][0]["stages"]
    assert stages["rollout"]["done"] and stages["export"]["done"] and "train" not in stages
