"""Fixtures for the CLI tests: small real stores of every kind, and ways to run the command.

``run_cli`` (``tests/cli_runner.py``) calls ``replaystore.cli.main(argv)`` in
this process with stdout and stderr captured (the directory ran in ~52 s with a
subprocess per call; now a few seconds); ``run_cli_subprocess`` runs the real
``python -m replaystore.cli`` for the few tests about the process itself. The
fixtures build their inputs with the library itself.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image, ImageDraw

from cli_runner import CliResult, run_cli, run_cli_subprocess
from replaystore.trajectories.components import Action, Observation, Response, Reward, Task
from replaystore.trajectories.context import ConversationBuilder
from replaystore.trajectories.storage import TrajectoryStorage

__all__ = ["CliResult", "assert_one_line_error", "run_cli", "run_cli_subprocess"]


def assert_one_line_error(proc: CliResult, command: str, *needles: str) -> str:
    """Exit status 2, nothing on stdout, exactly one stderr line naming the command."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"replaystore {command}: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


# --------------------------------------------------------------------------- trajectories


def _screen(path: Path, screen_id: int) -> Path:
    image = Image.new("RGB", (64, 48), (240, 240, 240))
    draw = ImageDraw.Draw(image)
    draw.rectangle((4, 4, 10 + 6 * screen_id, 20), fill=(20, 90, 200))
    draw.text((4, 26), f"page {screen_id}", fill=(0, 0, 0))
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)
    return path


def _task(number: int) -> Task:
    return Task(
        task_name=f"Find the opening hours of store {number}",
        domain="Shopping",
        subdomain="Stores",
        website="https://shop.example.test/",
        difficulty=1 + number % 3,
        evaluator_reference=[{"description": "hours shown", "facts": ["9-5"]}],
        reference_answer="9-5",
        task_id=f"task-{number}",
        max_steps=5,
    )


def _trajectory(
    task: Task, shots: list[Path], success: bool, builder: ConversationBuilder | None
) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = []
    for s, shot in enumerate(shots):
        observation = Observation(
            task,
            str(shot),
            "[1] link 'Hours'\n[2] text '<image> in page text'",
            {"url": f"https://shop.example.test/{s}", "title": f"Page {s}"},
        )
        last = s == len(shots) - 1
        prompt = "" if builder is None else json.dumps(builder.build(task, steps, observation))
        action = "answer [9-5]" if last else f"click [{s + 1}]"
        steps.append(
            {
                "observation": observation,
                "action": Action({"key": action.split()[0]}, action),
                "response": Response(
                    f"<think>step {s}</think>\nAction: {action}", {"action": action}, prompt
                ),
                "reward": Reward(float(success) if last else 0.0, None, submit=last),
            }
        )
    return steps


@pytest.fixture(scope="session")
def trajectory_store(tmp_path_factory) -> Path:
    """Two iterations: 3 real trajectories (2 successful) and 1 dummy, 7 real steps.

    Iteration 1: task-1 succeeds over screens [0, 1, 1] with stored prompts (its
    step 1 repeats the next screenshot); task-2 fails over [0, 2] without
    prompts; one dummy (invalid URL). Iteration 2: task-3 succeeds over [2, 3]
    without prompts. Training-eligible steps: 2 + 2 = 4.
    """
    root = tmp_path_factory.mktemp("trajectory_store")
    shots = root / "screens"
    s = [_screen(shots / f"s{i}.png", i) for i in range(4)]
    s.append(_screen(shots / "s1_again.png", 1))  # same pixels as s1, another file
    builder = ConversationBuilder(history_window=2)
    dummy = [
        {
            "observation": Observation(_task(9), "", None),
            "action": Action({"key": "invalid_url"}, "Invalid URL"),
            "response": Response("", None),
            "reward": Reward(0.0, None),
        }
    ]
    storage = TrajectoryStorage(root / "store")
    storage.save_iteration(
        1,
        [
            _trajectory(_task(1), [s[0], s[1], s[4]], True, builder),
            _trajectory(_task(2), [s[0], s[2]], False, None),
            dummy,
        ],
    )
    storage.save_iteration(2, [_trajectory(_task(3), [s[2], s[3]], True, None)])
    return root / "store"


# --------------------------------------------------------------------------- experience


@pytest.fixture(scope="session")
def sqlite_store(tmp_path_factory) -> Path:
    """A SQLite experience store: 3 tasks (2, 3 and 4 steps) by 2 agents, 9 rows."""
    from replaystore.experience import DataRow, Experience, ExpMeta, SqliteStorage

    path = tmp_path_factory.mktemp("sqlite") / "experience.sqlite"
    storage = SqliteStorage(path)
    rows = []
    for t, (agent, length) in enumerate([("planner", 2), ("browser", 3), ("planner", 4)]):
        for step in range(length):
            rows.append(
                DataRow(
                    ExpMeta(f"task-{t}", "web_nav", agent, step, 1_767_225_600.0 + 60 * t + step),
                    Experience(state={"url": f"https://x.test/{step}"}, actions=["click"]),
                )
            )
    storage.add_batch(rows)
    storage.close()
    return path


# --------------------------------------------------------------------------- transitions


@pytest.fixture(scope="session")
def transitions_checkpoint(tmp_path_factory) -> Path:
    """The prefix of a prioritized transitions checkpoint: capacity 8, 5 items stored."""
    from replaystore.transitions import ReplayBuffer

    prefix = tmp_path_factory.mktemp("ckpt") / "buffer"
    buf = ReplayBuffer("cpu", "cpu", 8, sampler="prioritized", storage="memory", seed=0)
    for i in range(5):
        buf.add({"obs": torch.full((4,), float(i)), "action": i, "reward": 1.0})
    buf.save(prefix)
    return prefix


@pytest.fixture(scope="session")
def memmap_dir(tmp_path_factory) -> Path:
    """A memory-mapped transitions buffer directory: capacity 16, 6 items, flushed."""
    from replaystore.transitions import ReplayBuffer

    directory = tmp_path_factory.mktemp("memmap") / "buffer"
    buf = ReplayBuffer("cpu", "cpu", 16, path=directory, seed=0)
    for i in range(6):
        buf.add({"obs": torch.zeros(3, 2), "action": i})
    buf.flush()
    buf.close()
    return directory


# --------------------------------------------------------------------------- WebGym files

WEBGYM_MODULE = "webgym.data.components"


class WebGymTask:
    def __init__(self, task_name, domain, subdomain, website, difficulty, ref, answer, **kw):
        self.task_name, self.domain, self.subdomain = task_name, domain, subdomain
        self.website, self.difficulty = website, difficulty
        self.evaluator_reference, self.reference_answer = ref, answer
        self.attempt_level = kw.get("attempt_level", 0)
        self.task_id = kw.get("task_id")
        self.max_steps = kw.get("max_steps")
        self.trajectory_index = kw.get("trajectory_index")


class WebGymObservation:
    def __init__(self, task, image_path, ac_tree, submit=None, page_metadata=None):
        self.task, self.image_path, self.ac_tree = task, image_path, ac_tree
        self.page_metadata = page_metadata or {}


class WebGymAction:
    def __init__(self, action, action_string):
        self.action, self.action_string = action, action_string


class WebGymResponse:
    def __init__(self, raw_response, answering_tokens, raw_prompt=""):
        self.raw_response, self.answering_tokens = raw_response, answering_tokens
        self.raw_prompt = raw_prompt


class WebGymReward:
    def __init__(self, reward, evaluation, is_blocked=False, submit=False, judgment=None):
        self.reward, self.evaluation, self.is_blocked = reward, evaluation, is_blocked
        self.submit, self.submission_judgment = submit, judgment


WEBGYM_CLASSES = {
    "Task": WebGymTask,
    "Observation": WebGymObservation,
    "Action": WebGymAction,
    "Response": WebGymResponse,
    "Reward": WebGymReward,
}


class Evil:
    """Pickles as a call to ``os.system``: what a malicious .pt file does."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def save_webgym_file(
    path: Path, monkeypatch, trajectory_lengths: list[int], evil: Any = None
) -> Path:
    """``torch.save`` a WebGym iteration file whose classes live in ``webgym.data.components``.

    The fake WebGym module exists only while saving: the CLI, run afterwards in
    this process, cannot import it, as a user's environment without WebGym cannot.
    """
    module = types.ModuleType(WEBGYM_MODULE)
    for name, cls in WEBGYM_CLASSES.items():
        cls.__module__, cls.__qualname__, cls.__name__ = WEBGYM_MODULE, name, name
        setattr(module, name, cls)
    package, data = types.ModuleType("webgym"), types.ModuleType("webgym.data")
    package.data, data.components = data, module
    for name, mod in (("webgym", package), ("webgym.data", data), (WEBGYM_MODULE, module)):
        monkeypatch.setitem(sys.modules, name, mod)
    task = WebGymTask("Buy socks", "Lifestyle", "Shopping", "shop.example", 2, [{"f": 1}], "ok")
    trajectories = []
    for n in trajectory_lengths:
        steps = []
        for i in range(n):
            last = i == n - 1
            steps.append(
                {
                    "observation": WebGymObservation(
                        task, f"/shots/{i}.png", f"[1] link {i}", None, {"url": f"https://shop/{i}"}
                    ),
                    "action": WebGymAction({"key": "click", "element": i}, f"click [{i}]"),
                    "response": WebGymResponse(f"Action: click [{i}]", {"action": f"click [{i}]"}),
                    "reward": WebGymReward(float(last), {"judge": "x"}, False, last, None),
                }
            )
        trajectories.append(steps)
    if evil is not None:
        trajectories[0][0]["reward"].evaluation = evil
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"trajectories": trajectories, "metadata": {"iteration": 1}}, path)
    for name in ("webgym", "webgym.data", WEBGYM_MODULE):
        monkeypatch.delitem(sys.modules, name)
    return path
