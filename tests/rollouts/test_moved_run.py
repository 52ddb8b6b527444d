"""A rollout's run directory can be moved (issue 23, item 5).

The collector's prompts name their screenshots by ``file://`` URL; the storage
keeps those under its directory relative to it (like ``observation.image_path``)
and resolves them when a step is read, so ``mv run moved/run`` loses nothing.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from replaystore.cli import main
from replaystore.images import file_url_to_path, image_part_url
from replaystore.rollouts.collector import RolloutCollector
from replaystore.rollouts.evaluator import Evaluator
from replaystore.rollouts.policy import WebAgent
from replaystore.rollouts.sites import LocalSuite
from replaystore.trajectories.buffer import ReplayBuffer
from replaystore.trajectories.components import Action, Observation, Response, Reward, Task
from replaystore.trajectories.files.load import frames_of
from replaystore.trajectories.storage import TrajectoryStorage
from replaystore.view.trajectories import TrajectoryIndex

from .conftest import TEST_MAX_STEPS, ReplayPolicy, pool, reply, run


def _image_urls(raw_prompt: str) -> list[str]:
    urls = []
    for message in json.loads(raw_prompt):
        content = message["content"]
        for part in content if isinstance(content, list) else []:
            url = image_part_url(part)
            if url is not None:
                urls.append(url)
    return urls


@pytest.fixture(scope="module")
def moved(browser: Any, suite: LocalSuite, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A two-task rollout in ``<tmp>/run``, then moved to ``<tmp>/moved/run``."""
    base = tmp_path_factory.mktemp("move")
    by_id = {t.task_id: t for t in suite.tasks()}
    tasks = [by_id["news-001"], by_id["recipes-001"]]
    replies = {t.task_id: [reply("scroll(down)"), reply('answer("x")')] for t in tasks}

    async def collect() -> None:
        async with pool(browser, 2) as contexts:
            collector = RolloutCollector(
                WebAgent(ReplayPolicy(replies), image_urls="file"),
                Evaluator(),
                TrajectoryStorage(base / "run" / "storage"),
                pool=contexts,
                num_workers=2,
                max_steps_by_difficulty=TEST_MAX_STEPS,
                progress=False,
                handle_sigint=False,
            )
            await collector.run_iteration(tasks, 1)

    run(collect())
    (base / "moved").mkdir()
    shutil.move(base / "run", base / "moved" / "run")
    return base / "moved" / "run"


def _stored_text(root: Path) -> str:
    """The one iteration file under ``root`` as stored: its header and, for format 3
    (compressed frames), every frame decoded."""
    storage = TrajectoryStorage(root)
    (file,) = storage.files()
    header = storage.read_header(file)
    if header.version < 3:
        return file.path.read_text(encoding="utf-8")
    parts = [file.path.read_bytes().split(b"\n", 1)[0]]
    for _, frame in frames_of(header):
        parts += [message.encode("utf-8") for message in frame.messages] + frame.lines
    return b"\n".join(parts).decode("utf-8")


def test_the_iteration_file_names_no_absolute_screenshot_path(moved: Path) -> None:
    text = _stored_text(moved / "storage")
    assert '"u":true' in text  # the prompts' screenshots are stored relative
    assert "file://" not in text
    assert str(moved.parent.parent) not in text


def test_prompts_of_a_moved_run_point_at_its_screenshots(moved: Path) -> None:
    trajectories = TrajectoryStorage(moved / "storage").load_all()
    urls = [u for t in trajectories for s in t for u in _image_urls(s["response"].raw_prompt)]
    assert len(urls) >= 4
    for url in urls:
        path = file_url_to_path(url)
        assert path.is_file() and path.is_relative_to(moved), url


def test_a_moved_run_exports(moved: Path, tmp_path: Path) -> None:
    assert main(["export", str(moved / "storage"), "--all", "--out", str(tmp_path / "lf")]) == 0
    records = json.loads((tmp_path / "lf" / "replaystore.json").read_text(encoding="utf-8"))
    images = [tmp_path / "lf" / p for r in records for p in r["images"]]
    assert len(records) == 4 and images and all(p.is_file() for p in images)


def test_a_moved_run_samples_and_shows_its_screenshots(moved: Path) -> None:
    buffer = ReplayBuffer.from_storage(moved / "storage")
    assert len(buffer.samples) >= 4
    for sample in buffer.samples:
        for message in sample["message"]:
            content = message["content"]
            for part in content if isinstance(content, list) else []:
                url = image_part_url(part)
                assert url is None or file_url_to_path(url).is_file()
    index = TrajectoryIndex(moved / "storage")
    for step in index.read_steps(0):
        assert all(file_url_to_path(u).is_file() for u in _image_urls(step["response"].raw_prompt))


def test_a_prompt_with_absolute_urls_outside_the_storage_keeps_them(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere" / "shot.png"
    url = outside.as_uri()
    part = {"type": "image_url", "image_url": {"url": url}}
    prompt = json.dumps([{"role": "user", "content": [part]}])
    task = Task("t", "d", "s", "https://x.test/", 1, None, None, task_id="t1")
    step = {
        "observation": Observation(task, str(outside), None, {"url": "https://x.test/"}),
        "action": Action({"key": "answer", "text": "x"}, 'answer("x")'),
        "response": Response('Action: answer("x")', {"action": 'answer("x")'}, prompt),
        "reward": Reward(1.0, None),
        "same_as_next_screenshot": False,
    }
    storage = TrajectoryStorage(tmp_path / "storage")
    storage.save_iteration(1, [[step]])
    (loaded,) = storage.load_all()
    assert loaded[0]["response"].raw_prompt == prompt
