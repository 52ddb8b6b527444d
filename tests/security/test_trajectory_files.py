"""Issue 16, items 4, 5 and 7: damaged, truncated and abandoned trajectory files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from replaystore.errors import StorageError
from replaystore.trajectories.buffer import ReplayBuffer
from replaystore.trajectories.components import Action, Observation, Response, Reward, Task
from replaystore.trajectories.storage import TrajectoryStorage


def trajectory(name: str, n: int, reward: float = 1.0) -> list[dict]:
    task = Task(name, "shopping", "", "shop.example", 1, None, None)
    return [
        {
            "observation": Observation(task, f"shots/{name}_{s}.png", f"tree {name} {s}"),
            "action": Action({"type": "click"}, f"click {s}"),
            "response": Response(
                f"I click {s}", None, json.dumps([{"role": "user", "content": f"{name} {s}"}])
            ),
            "reward": Reward(reward if s == n - 1 else 0.0, None, submit=s == n - 1),
            "same_as_next_screenshot": False,
        }
        for s in range(n)
    ]


def saved(tmp_path: Path, rank: int | None = 0, version: int = 2) -> tuple[TrajectoryStorage, Path]:
    """Three trajectories in one file; version 2 (step lines) unless asked otherwise: the
    byte-level checks below edit lines (format 3 has its own in test_trajectory_format_v3)."""
    storage = TrajectoryStorage(tmp_path / "store", format_version=version)
    path = storage.save_iteration(
        1, [trajectory("alpha", 3), trajectory("bravo", 4), trajectory("charlie", 2)], rank=rank
    )
    return storage, path


def flip(path: Path, old: bytes, new: bytes, occurrence: int = 0) -> None:
    """Replace the ``occurrence``-th ``old`` in the file's body by ``new`` (same length)."""
    assert len(old) == len(new)
    data = path.read_bytes()
    body = data.index(b"\n") + 1
    at = body
    for _ in range(occurrence + 1):
        at = data.index(old, at + 1)
    path.write_bytes(data[:at] + new + data[at + len(old) :])


def as_version_1(path: Path) -> None:
    """Rewrite a file as replaystore wrote it before checksums (format version 1)."""
    header_line, body = path.read_bytes().split(b"\n", 1)
    header = json.loads(header_line)
    header["version"] = 1
    del header["index"]["line_crc32"]
    path.write_bytes(json.dumps(header).encode() + b"\n" + body)


# -- item 4: truncation is refused at open ----------------------------------------------


def test_truncated_iteration_file_is_refused_at_open(tmp_path):
    storage, path = saved(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 700])  # cut inside the last trajectory
    with pytest.raises(StorageError, match=r"iteration_000001\.rank000\.jsonl is truncated"):
        ReplayBuffer.from_storage(storage.root)
    with pytest.raises(StorageError, match="truncated"):
        storage.stats()


def test_file_cut_exactly_at_a_line_boundary_is_refused_at_open(tmp_path):
    storage, path = saved(tmp_path)
    lines = path.read_bytes().split(b"\n")[:-1]
    path.write_bytes(b"\n".join(lines[:-2]) + b"\n")  # two whole steps missing
    with pytest.raises(StorageError, match="header announces 9 steps"):
        ReplayBuffer.from_storage(storage.root)


def test_extended_file_and_swapped_last_line_are_refused_at_open(tmp_path):
    storage, path = saved(tmp_path)
    original = path.read_bytes()
    path.write_bytes(original + original.split(b"\n")[1] + b"\n")
    with pytest.raises(StorageError, match="longer than its header says"):
        ReplayBuffer.from_storage(storage.root)
    # Same size, last line damaged: its checksum (v2) or its position (v1) gives it away.
    path.write_bytes(original)
    flip(path, b"tree charlie 1", b"tree charliE 1")
    with pytest.raises(StorageError, match=r"last step line \(line 10\) fails its CRC32"):
        ReplayBuffer.from_storage(storage.root)


def test_version_1_file_truncated_is_also_refused_at_open(tmp_path):
    storage, path = saved(tmp_path)
    as_version_1(path)
    lines = path.read_bytes().split(b"\n")[:-1]
    path.write_bytes(b"\n".join(lines[:-1]) + b"\n")
    with pytest.raises(StorageError, match="truncated"):
        ReplayBuffer.from_storage(storage.root)


# -- item 5: a changed byte mid-file is caught on read ----------------------------------


def test_changed_byte_mid_file_raises_on_read_not_altered_data(tmp_path):
    storage, path = saved(tmp_path)
    flip(path, b"tree bravo 1", b"tree bravO 1")  # still valid JSON, same length
    buffer = ReplayBuffer.from_storage(storage.root)  # open stays cheap: headers + last lines
    assert len(buffer) == 9
    with pytest.raises(StorageError, match=r"trajectory 1 step 1 .*rank000\.jsonl.*CRC32"):
        list(buffer)
    with pytest.raises(StorageError, match=r"line 6: step line fails its CRC32 check"):
        storage.load_all()
    assert [buffer[i]["message"] for i in range(3)]  # undamaged steps still read


def test_damaged_rank_file_is_not_merged_with_a_fresh_checksum(tmp_path):
    storage, path = saved(tmp_path, rank=0)
    flip(path, b"I click 2", b"I click 9")
    with pytest.raises(StorageError, match=r"line 4: .*CRC32.*nothing was merged"):
        storage.merge_ranks(1)
    assert path.exists()
    assert not (storage.root / "iteration_000001.jsonl").exists()


def test_version_1_files_without_checksums_still_load(tmp_path):
    storage, path = saved(tmp_path)
    expected = storage.load_all()
    as_version_1(path)
    assert storage.load_all() == expected
    buffer = ReplayBuffer.from_storage(storage.root)
    assert len(list(buffer)) == 9
    assert storage.merge_ranks(1).name == "iteration_000001.jsonl"
    assert json.loads(storage.files()[0].path.read_bytes().split(b"\n")[0])["version"] == 2


def test_checksums_survive_merge_ranks(tmp_path):
    storage = TrajectoryStorage(tmp_path / "store", format_version=2)
    storage.save_iteration(1, [trajectory("a", 2)], rank=0)
    storage.save_iteration(1, [trajectory("b", 3)], rank=1)
    merged = storage.merge_ranks(1)
    assert len(storage.load_all()) == 2
    flip(merged, b"tree b 0", b"tree B 0")
    with pytest.raises(StorageError, match="CRC32"):
        storage.load_all()


# -- item 7: abandoned temporaries of ours are removed at open --------------------------


def test_temporary_left_by_a_killed_save_is_removed_when_old(tmp_path):
    root = tmp_path / "store"
    root.mkdir()
    script = (
        "import os, signal, sys\n"
        "from replaystore.atomic import atomic_open\n"
        "with atomic_open(sys.argv[1], 'wb') as handle:\n"
        "    handle.write(b'{\"format\": partial')\n"
        "    handle.flush()\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    target = root / "iteration_000001.rank000.jsonl"
    run = subprocess.run([sys.executable, "-c", script, str(target)], check=False)
    assert run.returncode == -9
    leftovers = [p for p in root.iterdir() if p.name.endswith(".tmp")]
    assert len(leftovers) == 1 and leftovers[0].name.startswith(".iteration_000001.rank000.jsonl.")
    # A fresh one may belong to a writer still running in another process: kept.
    TrajectoryStorage(root)
    assert leftovers[0].exists()
    old = time.time() - 7200
    os.utime(leftovers[0], (old, old))
    # Other hidden .tmp files are not ours to judge, whatever their age.
    foreign = [root / ".notes.txt.abc123.tmp", root / ".iteration_1.jsonl.x.tmp"]
    for p in foreign:
        p.write_text("keep me")
        os.utime(p, (old, old))
    storage = TrajectoryStorage(root)
    assert not leftovers[0].exists()
    assert all(p.exists() for p in foreign)
    assert storage.files() == []
    storage.save_iteration(1, [trajectory("a", 2)])  # the slot is usable
    assert len(storage.load_all()) == 1


def test_stale_temporary_age_is_configurable_and_can_be_disabled(tmp_path):
    root = tmp_path / "store"
    root.mkdir()
    temp = root / ".iteration_000002.jsonl.k3j_9x2a.tmp"
    temp.write_text("partial")
    old = time.time() - 120
    os.utime(temp, (old, old))
    TrajectoryStorage(root, stale_temp_age_s=None)
    TrajectoryStorage(root)  # default: one hour
    assert temp.exists()
    assert TrajectoryStorage(root, stale_temp_age_s=None).remove_stale_temporaries(60) == [temp]
    assert not temp.exists()
    with pytest.raises(ValueError, match="stale_temp_age_s"):
        TrajectoryStorage(root, stale_temp_age_s=-1)
