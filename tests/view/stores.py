"""Small, deterministic stores of every kind for the viewer's tests.

:func:`make_trajectory_storage` writes demo-like trajectories (the local suite's
websites, difficulties 1-3, click/answer actions with stored prompts, an
anti-bot site whose rollouts end blocked at the first step, repeated
screenshots) with real PNG screenshots inside the storage directory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from replaystore.experience import ExperienceBuffer
from replaystore.experience.rows import DataRow, Experience, ExpMeta
from replaystore.experience.storage.sqlite import SqliteStorage
from replaystore.trajectories import TrajectoryStorage
from replaystore.trajectories.components import Action, Observation, Response, Reward, Task
from replaystore.transitions import TransitionBuffer

WEBSITES = ("http://shop.localhost", "http://travel.localhost", "http://botwall.localhost")
ITERATIONS = 3
PER_ITERATION = 8
SHOT_SIZE = (320, 200)


def _png(path: Path, color: tuple[int, int, int], mark: int) -> None:
    pixels = np.zeros((SHOT_SIZE[1], SHOT_SIZE[0], 3), dtype=np.uint8)
    pixels[:] = color
    pixels[20:40, 10 + 10 * mark : 30 + 10 * mark] = 255  # a white box that moves per step
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)


def _prompt(task: Task, step: int, image: Path) -> str:
    return json.dumps(
        [
            {"role": "system", "content": "You are a web agent."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": f"Task: {task.task_name}\nCurrent step: {step + 1}"},
                    {"type": "image_url", "image_url": {"url": image.as_uri()}},
                ],
            },
        ]
    )


def make_trajectory_storage(root: Path) -> dict[str, Any]:
    """Write 3 iterations of 8 trajectories under ``root``; returns what was written.

    Trajectory number ``t`` (0-based over all iterations): website ``t % 3`` (2 is
    the anti-bot site: one blocked step), difficulty ``t % 3 + 1`` shifted by the
    iteration, ``t % 4 + 2`` steps, final reward 1.0 when ``t % 2 == 0`` (and not
    blocked). Every step clicks at (40 + 20 s, 30 + 10 s) and the last answers;
    step 1 of every trajectory repeats step 0's screenshot. Trajectory 5 has no
    stored prompt (the viewer rebuilds it, as the exporter does).
    """
    storage = TrajectoryStorage(root)
    expected: list[dict[str, Any]] = []
    t = 0
    for iteration in range(1, ITERATIONS + 1):
        trajectories = []
        for _ in range(PER_ITERATION):
            website = WEBSITES[t % 3]
            blocked = website.startswith("http://botwall")
            difficulty = (t + iteration) % 3 + 1
            task = Task(
                f"task {t}: find item {t} on {website.split('//')[1]}",
                "shopping",
                "stores",
                website,
                difficulty,
                None,
                f"answer {t}",
                task_id=f"t{t}",
            )
            n_steps = 1 if blocked else t % 4 + 2
            success = not blocked and t % 2 == 0
            steps = []
            for s in range(n_steps):
                shot = root / "shots" / f"{t:03d}_{s}.png"
                _png(shot, ((37 * t) % 200, 90, 140), 0 if s == 1 else s)
                last = s == n_steps - 1
                if blocked:
                    action = Action({"key": "stop", "reason": "blocked"}, "stop [blocked]")
                    reward = Reward(0.0, {"status": "blocked"}, is_blocked=True)
                elif last:
                    action = Action(
                        {"key": "answer", "text": f"answer {t}"}, f'answer("answer {t}")'
                    )
                    reward = Reward(
                        1.0 if success else 0.0,
                        {"status": "evaluated", "match": success},
                        submit=True,
                    )
                else:
                    x, y = 40 + 20 * s, 30 + 10 * s
                    action = Action(
                        {"key": "click", "x": float(x), "y": float(y)}, f"click({x}, {y})"
                    )
                    reward = Reward(0.0, None)
                raw = f"<think>step {s} of task {t}</think>\nAction: {action.action_string}"
                steps.append(
                    {
                        "observation": Observation(
                            task, str(shot), None, {"title": f"page {s}", "url": f"{website}/{s}"}
                        ),
                        "action": action,
                        "response": Response(raw, None, "" if t == 7 else _prompt(task, s, shot)),
                        "reward": reward,
                        "same_as_next_screenshot": s == 0 and n_steps > 1,
                    }
                )
            trajectories.append(steps)
            expected.append(
                {
                    "id": t,
                    "iteration": iteration,
                    "website": website,
                    "difficulty": str(difficulty),
                    "steps": n_steps,
                    "success": success,
                    "blocked": blocked,
                    "task": task.task_name,
                }
            )
            t += 1
        storage.save_iteration(iteration, trajectories, rank=None)
    return {"root": root, "trajectories": expected}


def experience_rows() -> list[DataRow]:
    """12 tasks x 3 steps by two agents (odd tasks: browser); reward 1 at the last step of
    every third task."""
    rows = []
    for task in range(12):
        for step in range(3):
            rows.append(
                DataRow(
                    ExpMeta(
                        f"task-{task:02d}",
                        "web_nav",
                        "browser" if task % 2 else "planner",
                        step,
                        1_700_000_000.0 + 10 * task + step,
                    ),
                    Experience(
                        state={"url": f"http://site/{task}", "step": step},
                        actions=[{"click": step}],
                        reward_t=1.0 if (task % 3 == 0 and step == 2) else 0.0,
                    ),
                    id=f"row-{task:02d}-{step}",
                )
            )
    return rows


def make_experience_store(path: Path) -> Path:
    """A SQLite experience store holding :func:`experience_rows`."""
    storage = SqliteStorage(path)
    ExperienceBuffer(storage).store_batch(experience_rows())
    storage.close()
    return path


def make_transitions(directory: Path) -> dict[str, Path]:
    """A prioritized memmap buffer (40 transitions, episodes of 5 steps, reward 1 per
    step) and its checkpoint; returns both paths."""
    memmap = directory / "memmap"
    buf = TransitionBuffer("cpu", "cpu", 64, sampler="prioritized", path=memmap, seed=0)
    for i in range(40):
        buf.add(
            {
                "obs": np.full(4, i, dtype=np.float32),
                "action": np.int64(i % 2),
                "reward": np.float32(1.0),
                "done": np.bool_(i % 5 == 4),
            }
        )
    buf.save(directory / "ckpt" / "buffer")
    buf.flush()
    buf.close()
    return {"memmap": memmap, "checkpoint": directory / "ckpt" / "buffer.metadata"}


#: The tasks of :func:`make_loop_run` (MiniWoB++ pages on a loopback port, as the loop
#: stores them: the port is in the website, the display leaves it out).
LOOP_TASKS = ("click-button", "click-link", "enter-text", "focus-text-2", "login-user")


def make_loop_run(out: Path) -> dict[str, Any]:
    """A loop run's directory as ``replaystore loop`` leaves it: ``out/storage`` with
    iteration 1 (loop iteration 0, the demonstrations) and 2 (loop iteration 1, the model
    served from ``checkpoints/000``), ``out/journal.json`` and ``out/summary.json``.

    Each iteration holds one trajectory per task of :data:`LOOP_TASKS`; the
    demonstrations all succeed, the model on the first two tasks only.
    """
    storage = TrajectoryStorage(out / "storage")
    for number, (policy, checkpoint) in enumerate(
        [("demonstrations", None), ("model", "checkpoints/000")], start=1
    ):
        trajectories = []
        for i, name in enumerate(LOOP_TASKS):
            website = f"http://127.0.0.1:41234/miniwob/{name}.html"
            task = Task(f"goal of {name}", "miniwob", name, website, "easy", None, None)
            won = policy == "demonstrations" or i < 2
            shot = out / "storage" / "shots" / f"{number}_{i}.png"
            _png(shot, (90, 40 * i, 140), i)
            trajectories.append(
                [
                    {
                        "observation": Observation(task, str(shot), None, {"url": website}),
                        "action": Action({"key": "click", "element": "3"}, 'click("3")'),
                        "response": Response('<think>t</think>\nAction: click("3")', None, ""),
                        "reward": Reward(1.0 if won else 0.0, {"source": "miniwob"}),
                        "trajectory_metadata": {
                            "policy": policy,
                            "checkpoint": checkpoint,
                            "loop_iteration": number - 1,
                        },
                    }
                ]
            )
        storage.save_iteration(number, trajectories, rank=None)
    rates = {name: (1.0 if i < 2 else 0.0) for i, name in enumerate(LOOP_TASKS)}
    summary = {
        "iterations": [
            {
                "iteration": 0,
                "policy": "demonstrations",
                "checkpoint": None,
                "success_rate": 1.0,
                "num_tasks": 5,
                "successful": 5,
                "eval": {"tasks": dict.fromkeys(LOOP_TASKS, 1.0), "mean": 1.0, "episodes": 50},
            },
            {
                "iteration": 1,
                "policy": "model",
                "checkpoint": "checkpoints/000",
                "success_rate": 0.4,
                "num_tasks": 5,
                "successful": 2,
                "eval": {"tasks": rates, "mean": 0.4, "episodes": 50},
            },
        ],
        "untrained": {"success_rate": 0.0, "eval": {"tasks": {}, "mean": 0.1}},
        "evaluation": {"tasks": "miniwob:...", "seeds": "100000-100009"},
    }
    (out / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    (out / "journal.json").write_text(json.dumps({"iterations": []}), encoding="utf-8")
    return {"out": out, "storage": out / "storage", "summary": summary}
