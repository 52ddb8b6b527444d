"""Ctrl-C (SIGINT) in the middle of an iteration keeps every finished trajectory.

The collector runs in a child process on the local suite: two tasks answer at
once, two wait on a model that never answers. Once both quick tasks are
evaluated, the test sends SIGINT; the child must exit with 130 after writing
the two finished trajectories (and nothing else).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from replaystore.trajectories.storage import TrajectoryStorage

CHILD = r"""
import asyncio, sys
from pathlib import Path
from replaystore.rollouts.browser import BrowserPool
from replaystore.rollouts.collector import RolloutCollector
from replaystore.rollouts.evaluator import Evaluator
from replaystore.rollouts.policy import WebAgent
from replaystore.rollouts.sites import LocalSuite
from replaystore.trajectories.storage import TrajectoryStorage

out = Path(sys.argv[1])
chromium = sys.argv[2] or None
QUICK = {"news-001", "recipes-001"}

class Policy:
    async def respond(self, request):
        if request.task.task_id in QUICK:
            return '<think>done</think>\nAction: answer("x")'
        (out / f"stalled-{request.task.task_id}").touch()
        await asyncio.sleep(120)
        return '<think>late</think>\nAction: answer("y")'
    async def aclose(self):
        pass

class MarkingEvaluator(Evaluator):
    async def evaluate(self, task, answer, steps, *, blocked=False):
        reward = await super().evaluate(task, answer, steps, blocked=blocked)
        (out / f"evaluated-{task.task_id}").touch()
        return reward

async def main():
    with LocalSuite() as suite:
        by_id = {t.task_id: t for t in suite.tasks()}
        tasks = [by_id[i] for i in ("shop-004", "news-001", "travel-001", "recipes-001")]
        async with BrowserPool(4, executable_path=chromium, viewport=(640, 420)) as pool:
            collector = RolloutCollector(
                WebAgent(Policy(), image_urls="file"), MarkingEvaluator(),
                TrajectoryStorage(out / "storage"), pool=pool, num_workers=4, progress=False,
            )
            result = await collector.run_iteration(tasks, 1)
    print("statuses", result.status_counts(), flush=True)
    return 130 if result.interrupted else 0

sys.exit(asyncio.run(main()))
"""


def _wait_for(paths: list[Path], proc: subprocess.Popen[str], limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while not all(p.exists() for p in paths):
        if proc.poll() is not None:
            raise AssertionError(f"child exited early: {proc.communicate()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"timed out waiting for {paths}: {proc.communicate()}")
        time.sleep(0.05)


def test_sigint_mid_iteration_keeps_every_finished_trajectory(
    chromium: str | None, tmp_path: Path
) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD, encoding="utf-8")
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path), chromium or ""],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    markers = [tmp_path / f"evaluated-{i}" for i in ("news-001", "recipes-001")]
    markers += [tmp_path / f"stalled-{i}" for i in ("shop-004", "travel-001")]
    _wait_for(markers, proc, 60)
    proc.send_signal(signal.SIGINT)
    try:
        stdout, stderr = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert proc.returncode == 130, (stdout, stderr)
    assert "Ctrl-C" in stderr
    stored = TrajectoryStorage(tmp_path / "storage").load_all()
    ids = sorted(t[0]["observation"].task.task_id for t in stored)
    assert ids == ["news-001", "recipes-001"]
    for trajectory in stored:
        assert trajectory[-1]["trajectory_metadata"]["status"] == "answered"
    metadata = TrajectoryStorage(tmp_path / "storage").metadata(1)[0]
    assert metadata["interrupted"] is True
