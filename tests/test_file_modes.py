"""Files we create get the mode ``open()`` gives under the process umask, from every writer.

``tempfile.mkstemp`` creates 0600 and the mode survives the rename, so before the
fix every atomically written file was private whatever the umask. Each test runs
under several umasks (set in a fixture, restored after); each writer's new files
must have mode ``0o666 & ~umask``. A file that is *replaced* keeps its own mode.
"""

from __future__ import annotations

import base64
import io
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from PIL import Image

from file_modes import assert_files_have_mode, mode_of
from replaystore import atomic
from replaystore.atomic import (
    atomic_open,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    current_umask,
    new_file_mode,
)
from replaystore.experience import DataRow, Experience, ExpMeta, SqliteStorage
from replaystore.pipeline.blocklist import Blocklist
from replaystore.pipeline.images import data_url_to_file
from replaystore.pipeline.task_history import TaskHistory
from replaystore.trajectories.components import Action, Observation, Response, Reward, Task
from replaystore.trajectories.export import export_llamafactory
from replaystore.trajectories.storage import TrajectoryStorage
from replaystore.transitions import TransitionBuffer

UMASKS = [0o022, 0o077, 0o002]


@pytest.fixture(params=UMASKS, ids=lambda m: f"umask{m:03o}")
def umask(request) -> Iterator[int]:
    """Set the process umask for one test; restore the previous one afterwards."""
    previous = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(previous)


# ---------------------------------------------------------------- the umask itself


def test_current_umask_reads_the_process_umask_without_changing_it(umask):
    assert current_umask() == umask
    assert current_umask() == umask  # reading did not change it
    assert new_file_mode() == 0o666 & ~umask


def test_current_umask_without_proc_falls_back_to_setting_and_restoring_it(umask, monkeypatch):
    monkeypatch.setattr(atomic, "_umask_from_proc", lambda: None)
    results: list[int] = []

    def read() -> None:
        results.extend(current_umask() for _ in range(200))

    threads = [threading.Thread(target=read) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [umask] * 800  # the lock keeps readers from seeing each other's 0o077
    assert current_umask() == umask


# ---------------------------------------------------------------- atomic writers


@pytest.mark.parametrize(
    "write",
    [
        lambda p: atomic_write_bytes(p, b"x"),
        lambda p: atomic_write_text(p, "x"),
        lambda p: atomic_write_json(p, {"x": 1}),
    ],
    ids=["bytes", "text", "json"],
)
def test_atomic_helpers_create_files_with_the_umask_mode(tmp_path, umask, write):
    target = tmp_path / "out"
    write(target)
    assert mode_of(target) == 0o666 & ~umask
    plain = tmp_path / "plain"
    plain.write_bytes(b"x")  # what open() gives, for comparison
    assert mode_of(target) == mode_of(plain)


def test_atomic_open_creates_with_umask_mode(tmp_path, umask):
    target = tmp_path / "out.bin"
    with atomic_open(target, "wb") as handle:
        handle.write(b"data")
    assert mode_of(target) == 0o666 & ~umask


def test_replacing_a_file_keeps_its_mode(tmp_path, umask):
    target = tmp_path / "shared.json"
    target.write_text("{}")
    for kept in (0o640, 0o600, 0o664):
        target.chmod(kept)
        atomic_write_json(target, {"mode": kept})
        assert mode_of(target) == kept
        assert json.loads(target.read_text()) == {"mode": kept}


def test_explicit_file_mode_wins_over_umask_and_old_mode(tmp_path, umask):
    target = tmp_path / "x.txt"
    atomic_write_text(target, "a", file_mode=0o640)
    assert mode_of(target) == 0o640
    atomic_write_text(target, "b", file_mode=0o604)
    assert mode_of(target) == 0o604


@pytest.mark.parametrize("bad", [0o1777, -1, "0644", 6.0, True])
def test_bad_file_mode_is_refused_before_anything_is_written(tmp_path, bad):
    target = tmp_path / "x.txt"
    with pytest.raises(ValueError, match="file_mode"):
        atomic_write_text(target, "a", file_mode=bad)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- transitions


def filled_buffer(path: Path | None = None) -> TransitionBuffer:
    buf = TransitionBuffer("cpu", "cpu", 16, path=path, seed=0)
    buf.add_batch(
        {
            "state": torch.arange(40, dtype=torch.float32).reshape(10, 4),
            "action": torch.arange(10),
            "reward": torch.ones(10),
        }
    )
    return buf


def test_transitions_checkpoint_files_follow_umask(tmp_path, umask):
    buf = filled_buffer()
    try:
        buf.save(tmp_path / "ckpt" / "replay")
    finally:
        buf.close()
    assert_files_have_mode(tmp_path / "ckpt", 0o666 & ~umask, at_least=3)


def test_transitions_memmap_files_follow_umask(tmp_path, umask):
    buf = filled_buffer(tmp_path / "mm")
    try:
        buf.flush()
    finally:
        buf.close()
    assert_files_have_mode(tmp_path / "mm", 0o666 & ~umask, at_least=3)


# ---------------------------------------------------------------- trajectories


def png_bytes(color: tuple[int, int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (8, 6), color).save(out, format="PNG")
    return out.getvalue()


def trajectory(root: Path, n: int = 2) -> list[dict]:
    task = Task(
        task_name="find the hours",
        domain="shopping",
        subdomain="stores",
        website="https://example.com",
        difficulty=1,
        evaluator_reference=[],
        reference_answer="9-5",
        task_id="t-1",
    )
    steps = []
    for i in range(n):
        shot = root / f"shot{i}.png"
        shot.write_bytes(png_bytes((i * 40, 10, 10)))
        messages = [
            {"role": "system", "content": "You are a web agent."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": f"step {i}"},
                    {"type": "image_url", "image_url": {"url": shot.as_uri()}},
                ],
            },
        ]
        steps.append(
            {
                "observation": Observation(task=task, image_path=str(shot), ac_tree="[1] link"),
                "action": Action(action={"key": "click"}, action_string="click [1]"),
                "response": Response(
                    raw_response="Action: click [1]",
                    answering_tokens=[1, 2],
                    raw_prompt=json.dumps(messages),
                ),
                "reward": Reward(reward=1.0 if i == n - 1 else 0.0, evaluation={}),
                "same_as_next_screenshot": False,
            }
        )
    return steps


def test_trajectory_iteration_files_follow_umask(tmp_path, umask):
    shots = tmp_path / "shots"
    shots.mkdir()
    storage = TrajectoryStorage(tmp_path / "store")
    storage.save_iteration(None, [trajectory(shots)])
    storage.save_iteration(None, [trajectory(shots)], rank=1)
    assert_files_have_mode(tmp_path / "store", 0o666 & ~umask, at_least=2)


def test_llamafactory_export_and_dataset_info_follow_umask(tmp_path, umask):
    shots = tmp_path / "shots"
    shots.mkdir()
    data_url = "data:image/png;base64," + base64.b64encode(png_bytes((1, 2, 3))).decode()
    samples = [
        {
            "message": [
                {"role": "system", "content": "sys"},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": f"q{i}"},
                        {"type": "image_url", "image_url": {"url": (shots / "a.png").as_uri()}},
                        {"type": "image_url", "image_url": {"url": data_url}},
                    ],
                },
            ],
            "action": f"click [{i}]",
        }
        for i in range(4)
    ]
    (shots / "a.png").write_bytes(png_bytes((9, 9, 9)))
    out = tmp_path / "dataset"
    export_llamafactory(samples, out, val_ratio=0.25, copy_images=True)
    files = assert_files_have_mode(out, 0o666 & ~umask, at_least=5)
    names = {p.name for p in files}
    assert "dataset_info.json" in names
    assert any(p.parent.name == "images" for p in files)


def test_images_from_data_urls_follow_umask(tmp_path, umask):
    url = "data:image/png;base64," + base64.b64encode(png_bytes((5, 5, 5))).decode()
    path = data_url_to_file(url, tmp_path / "imgs")
    assert mode_of(path) == 0o666 & ~umask


# ---------------------------------------------------------------- pipeline


def test_task_history_save_follows_umask(tmp_path, umask):
    history = TaskHistory()
    history.record_attempt({"task_name": "a", "website": "https://x.org"}, solved=True)
    history.save(tmp_path / "history.json")
    assert mode_of(tmp_path / "history.json") == 0o666 & ~umask


def test_blocklist_files_follow_umask(tmp_path, umask):
    now = [1000.0]
    blocklist = Blocklist(
        tmp_path / "blocklist.jsonl", block_duration_hours=1, clock=lambda: now[0]
    )
    blocklist.record_blocked_website("https://a.example/x")
    blocklist.record_blocked_website("https://b.example/y")
    assert_files_have_mode(tmp_path, 0o666 & ~umask, at_least=2)  # the file and its .lock
    now[0] += 1800
    blocklist.record_blocked_website("https://c.example/z")
    now[0] += 3000
    assert blocklist.clean_expired_entries() == 2  # rewrites the file atomically
    assert_files_have_mode(tmp_path, 0o666 & ~umask, at_least=2)


def test_blocklist_rewrite_keeps_a_mode_the_user_set(tmp_path, umask):
    now = [0.0]
    blocklist = Blocklist(tmp_path / "b.jsonl", block_duration_hours=1, clock=lambda: now[0])
    blocklist.record_blocked_website("https://a.example/x")
    now[0] = 1800.0
    blocklist.record_blocked_website("https://b.example/x")
    blocklist.path.chmod(0o640)
    now[0] = 4000.0
    assert blocklist.clean_expired_entries() == 1
    assert mode_of(blocklist.path) == 0o640


# ---------------------------------------------------------------- experience (SQLite)


def test_sqlite_store_and_its_wal_files_follow_umask(tmp_path, umask):
    store = SqliteStorage(tmp_path / "db" / "exp.sqlite")
    store.add(DataRow(ExpMeta("t", "n", "a", 0, 1.0), Experience(state={"x": 1}, actions=[])))
    try:
        assert_files_have_mode(tmp_path / "db", 0o666 & ~umask, at_least=1)
        assert store.get_all()[0].exp_data.state == {"x": 1}
    finally:
        store.close()


def test_sqlite_store_keeps_the_mode_of_an_existing_file(tmp_path, umask):
    path = tmp_path / "exp.sqlite"
    SqliteStorage(path).close()
    path.chmod(0o640)
    store = SqliteStorage(path)
    store.add(DataRow(ExpMeta("t", "n", "a", 0, 1.0), Experience(state=1, actions=[])))
    store.close()
    assert mode_of(path) == 0o640


# The demo's outputs under umask 022: tests/demos/test_quick_demo.py; under umask 077:
# tests/transitions/test_demo.py (each on a demo run those files make anyway).
