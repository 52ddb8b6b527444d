"""``replaystore loop`` killed with SIGKILL at every stage and resumed ends as one clean run.

The loop runs for real (the local website suite, headless Chromium, the journal)
with fake tools (:mod:`.fake_tools`): a trainer that writes a checkpoint at once
and a server that answers every task with its reference answer. The run is
killed mid-rollout and mid-training of iteration 0, mid-serve of iteration 1 and
right after iteration 1's checkpoint appears; each time ``--resume`` continues it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

import replaystore.rollouts.sites
from replaystore.loop.processes import MARKER_VAR
from replaystore.trajectories.storage import TrajectoryStorage

from .fake_tools import make_fake_model, make_fake_tools, read_calls

pytestmark = pytest.mark.slow

SUITE_TASKS = Path(replaystore.rollouts.sites.__file__).parent / "tasks.jsonl"


def marked_processes(token: str) -> dict[int, str]:
    """Live processes whose environment marks them for loop run ``token``: pid -> marker."""
    prefix = f"{MARKER_VAR}={token}:".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        for var in environ.split(b"\0"):
            if var.startswith(prefix):
                found[int(entry.name)] = var.split(b"=", 1)[1].decode()
    return found


class Loop:
    """Starts ``replaystore loop`` runs over one run directory, output appended to a log."""

    def __init__(self, tmp_path: Path, config: dict) -> None:
        self.tmp_path = tmp_path
        self.config_path = tmp_path / "loop.yaml"
        self.config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
        self.out = tmp_path / config["out"]
        self.log = tmp_path / "loop-output.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *, resume: bool, **env: str) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "replaystore.cli", "loop", "--config", str(self.config_path)]
        with open(self.log, "ab") as log:
            log.write(f"\n#### {'resume' if resume else 'start'} {env}\n".encode())
            self.proc = subprocess.Popen(
                [*argv, "--resume"] if resume else argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "FAKE_TASKS": str(SUITE_TASKS), **env},
                cwd=self.tmp_path,
            )
        return self.proc

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, what: str, condition: Callable[[], bool], timeout_s: float = 240) -> None:
        """Poll ``condition``; fail (with the loop's output) if the loop exits or time runs out."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while not condition():
            if self.proc.poll() is not None:
                pytest.fail(
                    f"the loop exited ({self.proc.returncode}) before {what}:\n"
                    + self.output()[-4000:]
                )
            if time.monotonic() > deadline:
                pytest.fail(f"no {what} after {timeout_s} s:\n" + self.output()[-4000:])
            time.sleep(0.05)

    def kill(self) -> int:
        """SIGKILL the loop process; its pid."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        assert self.proc.wait(30) == -signal.SIGKILL
        return self.proc.pid

    def token(self) -> str:
        return json.loads((self.out / "journal.json").read_text())["run_token"]


def trainings(calls: list[dict], event: str) -> Counter[str]:
    """Trainings per output directory name (``000.partial`` ...) with the given event."""
    return Counter(
        Path(c["output_dir"]).name for c in calls if c["tool"] == "train" and c["event"] == event
    )


def assert_no_stray_of(token: str, dead_pids: list[int], current_pid: int) -> None:
    """No process marked by a killed loop of this run is alive (the resumed one killed them)."""
    deadline = time.monotonic() + 10
    while True:
        left = {
            pid: marker
            for pid, marker in marked_processes(token).items()
            if marker.rsplit(":", 1)[1] != str(current_pid)
        }
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not left, f"processes of killed loops {dead_pids} survive: {left}"


@pytest.mark.timeout(600)
def test_loop_killed_at_every_stage_resumes_to_one_clean_run(tmp_path, chromium):
    calls_root = tmp_path / "fake"
    config = {
        "out": "run",
        "iterations": 3,
        "tasks_per_iteration": 4,
        "tools_dir": str(make_fake_tools(calls_root)),
        "model": {"path": str(make_fake_model(tmp_path / "base")), "evaluate_untrained": False},
        "rollout": {
            "workers": 2,
            "viewport": [400, 300],
            "max_steps": {"easy": 5, "medium": 6, "hard": 8},
        },
        "serve": {"startup_timeout_s": 120.0},
        "policy": {"max_retries": 0},
    }
    loop = Loop(tmp_path, config)
    out = loop.out
    calls = lambda: read_calls(calls_root)  # noqa: E731
    killed: list[int] = []

    # (a) mid-rollout of iteration 0 (the scripted expert)
    loop.start(resume=False)
    loop.wait_for(
        "iteration 0's screenshots",
        lambda: (out / "storage" / "screenshots" / "iteration_000001").exists(),
    )
    killed.append(loop.kill())
    token = loop.token()

    # (b) mid-training of iteration 0
    proc = loop.start(resume=True, FAKE_TRAIN_SLEEP="30")
    loop.wait_for("iteration 0's training", lambda: trainings(calls(), "start")["000.partial"])
    assert_no_stray_of(token, killed, proc.pid)
    killed.append(loop.kill())

    # (c) mid-serve of iteration 1
    proc = loop.start(resume=True, FAKE_SERVE_SLEEP="30")
    loop.wait_for(
        "iteration 1's server", lambda: any(c["tool"] == "serve" for c in calls()), timeout_s=120
    )
    assert_no_stray_of(token, killed, proc.pid)
    killed.append(loop.kill())

    # (d) right after iteration 1's checkpoint is in place
    proc = loop.start(resume=True)
    loop.wait_for("checkpoints/001", lambda: (out / "checkpoints" / "001").exists())
    killed.append(loop.kill())

    # the last resume runs to the end
    proc = loop.start(resume=True)
    assert proc.wait(300) == 0, loop.output()[-4000:]
    assert "success rate per iteration" in loop.output()
    assert_no_stray_of(token, killed, -1)  # every marked process is gone, the last loop's too

    storage = TrajectoryStorage(out / "storage")
    files = storage.files()
    assert [f.iteration for f in files] == [1, 2, 3], files
    for file in files:
        trajectories = storage.read_file(file)
        assert len(trajectories) == 4
        ids = [t[0]["observation"].task.task_id for t in trajectories]
        assert len(set(ids)) == 4, ids

    all_calls = calls()
    # every iteration trained to completion once; only the killed training ran twice
    assert trainings(all_calls, "done") == {"000.partial": 1, "001.partial": 1, "002.partial": 1}
    assert trainings(all_calls, "start") == {"000.partial": 2, "001.partial": 1, "002.partial": 1}
    served = [Path(c["model"]).name for c in all_calls if c["tool"] == "serve"]
    # Iteration 1's killed serve and its retry, then iteration 2's: once, or twice when the
    # kill at (d) came after that serve had started (the poll for checkpoints/001 can see it
    # late on a loaded machine: CI met ["000", "000", "001", "001"] once).
    assert served in (["000", "000", "001"], ["000", "000", "001", "001"]), served
    assert all(c["name"] == "policy" for c in all_calls if c["tool"] == "serve")

    summary = json.loads((out / "summary.json").read_text())
    rows = summary["iterations"]
    assert [r["policy"] for r in rows] == ["demonstrations", "model", "model"]
    assert [r["checkpoint"] for r in rows] == [None, "checkpoints/000", "checkpoints/001"]
    assert [r["trained_checkpoint"] for r in rows] == [f"checkpoints/{k:03d}" for k in range(3)]
    journal = json.loads((out / "journal.json").read_text())
    for row, record in zip(rows, journal["iterations"], strict=True):
        if record["stages"]["train"].get("recovered"):
            continue  # killed between the rename and the journal: see test_recovery
        assert row["train_loss"] == {"first": 2.0, "last": 1.0}
    # the fake model answers each task with its reference answer: every task it could see
    # (not the suite's anti-bot page) succeeds
    for file in files[1:]:
        for trajectory in storage.read_file(file):
            last = trajectory[-1]
            status = last["trajectory_metadata"]["status"]
            assert status == "blocked" or last["reward"].reward == 1.0, last
    for k in range(3):
        assert (out / "checkpoints" / f"{k:03d}" / "model.safetensors").is_file()
        assert not (out / "checkpoints" / f"{k:03d}.partial").exists()

    # The run directory can be moved: its storage keeps screenshot paths relative to itself,
    # its journal keeps paths relative to the run; a resume there finds every stage done.
    moved = tmp_path / "elsewhere" / "run"
    moved.parent.mkdir()
    out.rename(moved)
    moved_storage = TrajectoryStorage(moved / "storage")
    shots = [s["observation"].image_path for t in moved_storage.load_all() for s in t]
    assert shots and all(Path(p).is_file() and Path(p).is_relative_to(moved) for p in shots if p)
    again = subprocess.run(
        [sys.executable, "-m", "replaystore.cli", "loop", "--resume", "--out", str(moved)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert again.returncode == 0, again.stderr
    assert [f.iteration for f in moved_storage.files()] == [1, 2, 3]
    assert trainings(calls(), "done") == {"000.partial": 1, "001.partial": 1, "002.partial": 1}
