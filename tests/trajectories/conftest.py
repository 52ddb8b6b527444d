"""Shared fixtures for the trajectory tests: WebGym-shaped trajectories with real PNG screenshots.

The :class:`TrajectoryFactory` (fixture ``trajectory_factory``) draws screenshots with
Pillow under ``tmp_path`` and builds steps exactly as WebGym's rollout stores them:
``{"observation": Observation, "action": Action, "response": Response, "reward": Reward,
"same_as_next_screenshot": bool?}``. Screen ids name pixel contents: two screenshots
with the same id have identical pixels (even when saved as different files with
different PNG compression), different ids always differ.

Typical use::

    def test_x(trajectory_factory):
        ok = trajectory_factory.trajectory(3, success=True)
        failed = trajectory_factory.trajectory(2, success=False)
        repeated = trajectory_factory.trajectory(3, screens=[7, 7, 8], precomputed=False)
        dummy = trajectory_factory.dummy_trajectory()

``RecordingBuilder`` / ``FakeAgent`` stand in for a conversation builder with the
contract ``build(task, history, observation) -> list[message]``.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from PIL import Image, ImageDraw

from replaystore.trajectories.components import Action, Observation, Response, Reward, Task

SCREEN_SIZE = (64, 48)


def screen_pixels(screen_id: int, size: tuple[int, int] = SCREEN_SIZE) -> Image.Image:
    """An RGB image whose pixels are a function of ``screen_id`` only (injective)."""
    image = Image.new("RGB", size, (240, 240, 240))
    draw = ImageDraw.Draw(image)
    draw.rectangle((4, 4, 4 + screen_id % 50, 20), fill=(20, 90, 200))
    draw.text((6, 26), f"screen {screen_id}", fill=(0, 0, 0))
    # The id itself in the first pixel makes the mapping injective for any id < 2**24.
    image.putpixel((0, 0), (screen_id & 255, (screen_id >> 8) & 255, (screen_id >> 16) & 255))
    return image


def prompt_messages(task_name: str, step_index: int, image_path: str | Path) -> list[dict]:
    """The chat messages WebGym stores (JSON-encoded) in ``Response.raw_prompt``."""
    return [
        {"role": "system", "content": "You are a web agent. Answer with one action."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": f"Task: {task_name}\nStep {step_index}"},
                {"type": "image_url", "image_url": {"url": Path(image_path).as_uri()}},
            ],
        },
    ]


class TrajectoryFactory:
    """Builds WebGym-shaped trajectories with Pillow-drawn PNG screenshots under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.screens_dir = self.root / "screenshots"
        self.screens_dir.mkdir(parents=True, exist_ok=True)
        self._files = itertools.count()
        self._tasks = itertools.count()
        # Fresh screen ids for trajectories that do not name their own (never collide
        # with small ids a test picks by hand).
        self._fresh_screens = itertools.count(10_000)

    def screenshot(
        self, screen_id: int, *, compress_level: int = 6, name: str | None = None
    ) -> Path:
        """Write a new PNG file with the pixels of ``screen_id``; returns its absolute path."""
        path = self.screens_dir / (name or f"shot_{next(self._files):05d}.png")
        screen_pixels(screen_id).save(path, format="PNG", compress_level=compress_level)
        return path

    def task(self, task_name: str | None = None, **overrides: Any) -> Task:
        number = next(self._tasks)
        fields: dict[str, Any] = {
            "task_name": task_name or f"Find the opening hours of store {number}",
            "domain": "shopping",
            "subdomain": "stores",
            "website": "https://example.com",
            "difficulty": 1,
            "evaluator_reference": [{"description": "opening hours shown", "facts": ["9-5"]}],
            "reference_answer": "9-5",
            "task_id": f"task-{number}",
            "max_steps": 10,
        }
        fields.update(overrides)
        return Task(**fields)

    def step(
        self,
        task: Task,
        image_path: str | Path,
        *,
        index: int = 0,
        reward: float | None = 0.0,
        submit: bool = False,
        raw_prompt: bool | str = True,
        same_as_next: bool | None = None,
        page_metadata: dict[str, Any] | None = None,
        action: Action | None = None,
    ) -> dict[str, Any]:
        """One step mapping. ``raw_prompt``: True -> stored messages, False -> "", str -> as is."""
        if raw_prompt is True:
            prompt = json.dumps(prompt_messages(task.task_name, index, image_path))
        elif raw_prompt is False:
            prompt = ""
        else:
            prompt = raw_prompt
        if page_metadata is None:
            page_metadata = {
                "title": f"Store page {index}",
                "url": f"https://example.com/page/{index}",
                "microdata": [{"type": "Store", "name": "x" * 200}],
                "meta_tags": {"description": "long description " * 20},
            }
        step: dict[str, Any] = {
            "observation": Observation(
                task=task,
                image_path=str(image_path),
                ac_tree=f"[1] link 'Home'\n[{index + 2}] button 'Next'",
                page_metadata=page_metadata,
            ),
            "action": action
            or Action(
                action={"key": "click", "element": index + 2}, action_string=f"click [{index + 2}]"
            ),
            "response": Response(
                raw_response=(
                    f"<think>step {index} of {task.task_name}</think>\nAction: click [{index + 2}]"
                ),
                answering_tokens=[101, 102, 103 + index],
                raw_prompt=prompt,
            ),
            "reward": Reward(
                reward=reward,
                evaluation={"judge": "done" if submit else "pending"},
                submit=submit,
            ),
        }
        if same_as_next is not None:
            step["same_as_next_screenshot"] = same_as_next
        return step

    def trajectory(
        self,
        n_steps: int = 3,
        *,
        success: bool = True,
        final_reward: float | str | None = "auto",
        screens: Sequence[int] | None = None,
        raw_prompt: bool = True,
        precomputed: bool = True,
        submit_last: bool = True,
        task: Task | None = None,
        compress_levels: Sequence[int] | None = None,
    ) -> list[dict[str, Any]]:
        """A trajectory of ``n_steps`` steps.

        Args:
            success: final reward 1.0 when True, 0.0 when False (unless ``final_reward``).
            final_reward: explicit final reward (may be None to test bad input).
            screens: screen id per step (equal ids = identical pixels); fresh ids by default.
            raw_prompt: store the prompt messages in ``Response.raw_prompt`` (else "").
            precomputed: set ``same_as_next_screenshot`` from ``screens`` (else leave it out).
            submit_last: the last step's reward has ``submit=True`` (a keypoint).
            compress_levels: PNG compression per step (pixels do not depend on it).
        """
        if screens is None:
            screens = [next(self._fresh_screens) for _ in range(n_steps)]
        if len(screens) != n_steps:
            raise ValueError(f"screens has {len(screens)} ids for {n_steps} steps")
        task = task or self.task()
        last_reward = (1.0 if success else 0.0) if final_reward == "auto" else final_reward
        steps = []
        for i, screen in enumerate(screens):
            level = compress_levels[i] if compress_levels is not None else 6
            image = self.screenshot(screen, compress_level=level)
            is_last = i == n_steps - 1
            same = None
            if precomputed:
                same = (not is_last) and screens[i] == screens[i + 1]
            steps.append(
                self.step(
                    task,
                    image,
                    index=i,
                    reward=last_reward if is_last else 0.0,
                    submit=is_last and submit_last,
                    raw_prompt=raw_prompt,
                    same_as_next=same,
                )
            )
        return steps

    def dummy_trajectory(self, kind: str = "action") -> list[dict[str, Any]]:
        """WebGym's placeholder for an invalid URL: one step, never trained on.

        ``kind``: "action" (action key ``invalid_url``), "image" (empty image path) or
        "string" (action string says Invalid URL); each alone marks a dummy.
        """
        task = self.task("Visit a site that does not resolve")
        image: str | Path = "" if kind == "image" else self.screenshot(next(self._fresh_screens))
        key = "invalid_url" if kind == "action" else "noop"
        text = "Invalid URL: http://nope.invalid" if kind == "string" else "noop"
        step = self.step(
            task,
            image,
            reward=None,
            raw_prompt=False,
            action=Action(action={"key": key}, action_string=text),
        )
        return [step]


class RecordingBuilder:
    """A conversation builder that records its calls and returns simple messages."""

    def __init__(self) -> None:
        self.calls: list[tuple[Task, list[Any], Observation]] = []

    def build(self, task: Task, history: list[Any], observation: Observation) -> list[dict]:
        self.calls.append((task, list(history), observation))
        return [
            {"role": "system", "content": "built"},
            {
                "role": "user",
                "content": f"{task.task_name} | history={len(history)} | {observation.image_path}",
            },
        ]


class FakeAgent:
    """An agent exposing ``conversation_builder`` like WebGym's WebAgent."""

    def __init__(self) -> None:
        self.conversation_builder = RecordingBuilder()


@pytest.fixture
def trajectory_factory(tmp_path: Path) -> TrajectoryFactory:
    return TrajectoryFactory(tmp_path)


@pytest.fixture
def fake_agent() -> FakeAgent:
    return FakeAgent()
