"""Ctrl-C (SIGINT) in the middle of an iteration keeps every finished trajectory.

The collector runs in a child process on the local suite: the quick tasks
answer at once, the others wait on a model that never answers. Once the quick
tasks are evaluated, the test sends SIGINT (once, twice 50 ms apart, or to the
whole process group as a terminal does); the child must exit with 130 after
writing the finished trajectories (and nothing else), name the cut tasks in
the file's ``skipped_task_ids``, and leave no screenshots of them behind.
``replaystore rollout`` interrupted before any task finished says nothing was saved.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from replaystore.trajectories.storage import TrajectoryStorage

TASK_IDS = ("shop-004", "news-001", "travel-001", "recipes-001")
QUICK = ("news-001", "recipes-001")
STALLED = ("shop-004", "travel-001")

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
QUICK = set(sys.argv[3].split(","))
WIND_DOWN_S = float(sys.argv[4])  # how long a cut request takes to end

class Policy:
    async def respond(self, request):
        if request.task.task_id in QUICK:
            return '<think>done</think>\nAction: answer("x")'
        (out / f"stalled-{request.task.task_id}").touch()
        try:
            await asyncio.sleep(120)
        except asyncio.CancelledError:
            await asyncio.sleep(WIND_DOWN_S)  # a request that takes a while to end
            raise
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

# ``replaystore rollout`` on the suite with a scripted policy that never answers.
CLI_CHILD = r"""
import asyncio, sys
from pathlib import Path
from replaystore.rollouts import scripted

marker = Path(sys.argv[1])

async def never_answers(self, request):
    (marker / f"stalled-{request.task.task_id}").touch()
    await asyncio.sleep(120)

scripted.ScriptedPolicy.respond = never_answers
from replaystore.cli import main
sys.exit(main(sys.argv[2:]))
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


def _start(
    tmp_path: Path, chromium: str | None, *, group: bool = False, wind_down_s: float = 0.0
) -> subprocess.Popen[str]:
    """The child, once its quick tasks are evaluated and the others wait on the model
    (a cut request of theirs takes ``wind_down_s`` to end)."""
    script = tmp_path / "child.py"
    script.write_text(CHILD, encoding="utf-8")
    args = [str(script), str(tmp_path), chromium or "", ",".join(QUICK), str(wind_down_s)]
    proc = subprocess.Popen(
        [sys.executable, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        start_new_session=group,
    )
    markers = [tmp_path / f"evaluated-{i}" for i in QUICK]
    markers += [tmp_path / f"stalled-{i}" for i in STALLED]
    _wait_for(markers, proc, 60)
    return proc


def _finish(proc: subprocess.Popen[str]) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


def _assert_only_the_finished_were_saved(tmp_path: Path) -> None:
    storage = TrajectoryStorage(tmp_path / "storage")
    stored = storage.load_all()
    assert sorted(t[0]["observation"].task.task_id for t in stored) == list(QUICK)
    for trajectory in stored:
        assert trajectory[-1]["trajectory_metadata"]["status"] == "answered"
    metadata = storage.metadata(1)[0]
    assert metadata["interrupted"] is True
    assert sorted(metadata["skipped_task_ids"]) == list(STALLED)


def test_sigint_mid_iteration_keeps_every_finished_trajectory(
    chromium: str | None, tmp_path: Path
) -> None:
    proc = _start(tmp_path, chromium)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = _finish(proc)
    assert proc.returncode == 130, (stdout, stderr)
    assert "Ctrl-C" in stderr
    _assert_only_the_finished_were_saved(tmp_path)


def test_two_ctrl_c_50_ms_apart_keep_every_finished_trajectory(
    chromium: str | None, tmp_path: Path
) -> None:
    # The cut tasks' requests take 2 s to end, so the second Ctrl-C comes while the
    # collector waits for them (with requests that end at once, on Chromium's headless
    # shell the whole interrupted iteration is stored and over in under 50 ms, and the
    # second Ctrl-C is the caller's: a KeyboardInterrupt after run_iteration returned).
    proc = _start(tmp_path, chromium, wind_down_s=2.0)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = _finish(proc)
    assert proc.returncode == 130, (stdout, stderr)
    assert "Traceback" not in stderr, stderr
    assert "Ctrl-C again: not waiting for the cut tasks" in stderr, stderr
    _assert_only_the_finished_were_saved(tmp_path)


def test_ctrl_c_to_the_process_group_ends_without_a_driver_error(
    chromium: str | None, tmp_path: Path
) -> None:
    proc = _start(tmp_path, chromium, group=True)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal does: the browser driver gets it too
    stdout, stderr = _finish(proc)
    assert proc.returncode == 130, (stdout, stderr)
    assert "never retrieved" not in stderr and "Traceback" not in stderr, stderr
    _assert_only_the_finished_were_saved(tmp_path)


def test_tasks_cut_by_ctrl_c_leave_no_screenshots(chromium: str | None, tmp_path: Path) -> None:
    proc = _start(tmp_path, chromium)
    proc.send_signal(signal.SIGINT)
    _finish(proc)
    rank = tmp_path / "storage" / "screenshots" / "iteration_000001" / "rank000"
    folders = sorted(p.name for p in rank.iterdir())
    assert folders == ["0001_news-001", "0003_recipes-001"]
    assert all(any((rank / f).iterdir()) for f in folders)


def test_ctrl_c_before_any_task_finished_says_nothing_was_saved(
    chromium: str | None, tmp_path: Path
) -> None:
    script = tmp_path / "cli_child.py"
    script.write_text(CLI_CHILD, encoding="utf-8")
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path), "rollout", "--out", str(out),
         "--workers", "2", "--max-tasks", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    suite_ids = ("shop-001", "shop-002")
    _wait_for([tmp_path / f"stalled-{i}" for i in suite_ids], proc, 60)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = _finish(proc)
    assert proc.returncode == 130, (stdout, stderr)
    assert "were saved" not in stderr and "will be saved" not in stderr, stderr
    assert "interrupted: no task had finished; nothing was saved" in stderr, stderr
    assert TrajectoryStorage(out / "storage").files() == []
    assert not (out / "storage" / "screenshots").exists() or not any(
        (out / "storage" / "screenshots").rglob("*.png")
    )
