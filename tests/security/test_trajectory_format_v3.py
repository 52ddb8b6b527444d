"""Damaged, truncated and half-written trajectory files of formats 3 and 4 (issue 25).

Both keep format 2's guarantees (tests/security/test_trajectory_files.py): a
truncated or extended file is refused at open (size and last frame checked; format
4: and its last text), a changed byte is refused when read (the frame's CRC32, then
each step's; format 4's texts: tests/trajectories/test_format_v4.py), a damaged
rank file is not merged, and a writer killed at any instant leaves the store
readable (every file is written to a temporary and renamed). A format 4 sample is
read from the file's texts alone, so a damaged frame shows when a step is read.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from replaystore.errors import StorageError
from replaystore.trajectories.buffer import ReplayBuffer
from replaystore.trajectories.storage import TrajectoryStorage

from .test_trajectory_files import trajectory

VERSIONS = pytest.mark.parametrize("version", [3, 4])


def saved(tmp_path: Path, version: int, rank: int | None = 0) -> tuple[TrajectoryStorage, Path]:
    storage = TrajectoryStorage(tmp_path / "store", format_version=version)
    path = storage.save_iteration(
        1, [trajectory("alpha", 3), trajectory("bravo", 4), trajectory("charlie", 2)], rank=rank
    )
    assert json.loads(path.read_bytes().split(b"\n", 1)[0])["version"] == version
    return storage, path


def frames(path: Path) -> tuple[int, list[int]]:
    """(body start, frame lengths) of a format 3 or 4 file."""
    header_line = path.read_bytes().split(b"\n", 1)[0]
    lengths = np.frombuffer(
        __import__("base64").b64decode(json.loads(header_line)["index"]["frame_lengths"]), "<i8"
    )
    return len(header_line) + 1, lengths.tolist()


def flip_in_frame(path: Path, t: int) -> None:
    """Change one byte in the middle of trajectory ``t``'s frame."""
    start, lengths = frames(path)
    at = start + sum(lengths[:t]) + lengths[t] // 2
    data = bytearray(path.read_bytes())
    data[at] ^= 0x20
    path.write_bytes(bytes(data))


@VERSIONS
def test_truncated_file_is_refused_at_open(tmp_path: Path, version: int) -> None:
    storage, path = saved(tmp_path, version)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 40])
    with pytest.raises(StorageError, match=r"rank000\.jsonl is truncated: .* 3 trajectory frames"):
        ReplayBuffer.from_storage(storage.root)
    with pytest.raises(StorageError, match="truncated"):
        storage.stats()


@VERSIONS
def test_file_cut_at_a_frame_boundary_or_extended_is_refused_at_open(
    tmp_path: Path, version: int
) -> None:
    storage, path = saved(tmp_path, version)
    original = path.read_bytes()
    start, lengths = frames(path)
    path.write_bytes(original[: start + sum(lengths[:2])])  # the last frame missing
    with pytest.raises(StorageError, match="truncated"):
        storage.load_all()
    path.write_bytes(original + original[start : start + lengths[0]])
    with pytest.raises(StorageError, match="longer than its header says"):
        ReplayBuffer.from_storage(storage.root)


@VERSIONS
def test_damaged_last_frame_is_refused_at_open(tmp_path: Path, version: int) -> None:
    storage, path = saved(tmp_path, version)
    flip_in_frame(path, 2)
    with pytest.raises(StorageError, match=r"last trajectory \(2\) fails its CRC32"):
        ReplayBuffer.from_storage(storage.root)


@VERSIONS
def test_changed_byte_mid_file_raises_on_read_naming_the_trajectory(
    tmp_path: Path, version: int
) -> None:
    storage, path = saved(tmp_path, version)
    flip_in_frame(path, 1)
    buffer = ReplayBuffer.from_storage(storage.root)  # open stays cheap: header + last frame
    assert len(buffer) == 9
    if version == 3:
        with pytest.raises(StorageError, match=r"trajectory 1 .*rank000\.jsonl.*CRC32"):
            list(buffer)
    else:  # samples come from the texts; the damaged frame shows when a step is read
        assert len(list(buffer)) == 9
        with pytest.raises(StorageError, match=r"rank000\.jsonl trajectory 1: .*CRC32"):
            buffer.trajectories[1]
    with pytest.raises(StorageError, match=r"trajectory 1: its frame fails its CRC32 check"):
        storage.load_all()
    assert [buffer[i]["message"] for i in range(3)]  # undamaged trajectories still read


@VERSIONS
def test_damaged_step_inside_a_frame_with_a_matching_frame_checksum_is_caught(
    tmp_path: Path, version: int
) -> None:
    """A frame rewritten whole (its frame CRC32 updated) still fails the step's CRC32."""
    import base64
    import zlib

    import zstandard

    storage, path = saved(tmp_path, version)
    header_line, body = path.read_bytes().split(b"\n", 1)
    header = json.loads(header_line)
    _, lengths = frames(path)
    first = body[: lengths[0]]
    decoded = zstandard.ZstdDecompressor().decompress(first)
    changed = zstandard.ZstdCompressor().compress(decoded.replace(b"tree alpha 1", b"tree alphA 1"))
    crcs = np.frombuffer(base64.b64decode(header["index"]["frame_crc32"]), "<u4").copy()
    crcs[0] = zlib.crc32(changed)
    new_lengths = np.array([len(changed), *lengths[1:]], "<i8")
    header["index"]["frame_crc32"] = base64.b64encode(crcs.tobytes()).decode()
    header["index"]["frame_lengths"] = base64.b64encode(new_lengths.tobytes()).decode()
    path.write_bytes(json.dumps(header).encode() + b"\n" + changed + body[lengths[0] :])
    with pytest.raises(StorageError, match=r"trajectory 0 step 1: step fails its CRC32"):
        storage.load_all()
    buffer = ReplayBuffer.from_storage(storage.root)
    with pytest.raises(StorageError, match=r"trajectory 0 step 1: step fails its CRC32"):
        buffer.trajectories[0]
    assert buffer[0]["message"]  # step 0 of the same frame is intact


@VERSIONS
def test_damaged_rank_file_is_not_merged(tmp_path: Path, version: int) -> None:
    storage, path = saved(tmp_path, version, rank=0)
    flip_in_frame(path, 0)
    with pytest.raises(StorageError, match="CRC32"):
        storage.merge_ranks(1)
    assert path.exists()
    assert not (storage.root / "iteration_000001.jsonl").exists()


_KILLED_WRITER = """
import os, signal, sys
from replaystore import atomic
from replaystore.trajectories.storage import TrajectoryStorage
sys.path.insert(0, sys.argv[2])
from tests.security.test_trajectory_files import trajectory

real = atomic.atomic_open

class Dying:
    def __init__(self, handle):
        self.handle = handle
    def write(self, data):
        return self.handle.write(data)
    def writelines(self, lines):
        lines = list(lines)
        self.handle.writelines(lines[: len(lines) // 2])
        self.handle.flush()
        os.kill(os.getpid(), signal.SIGKILL)  # killed half way through the frames

class Opener:
    def __init__(self, *args, **kwargs):
        self.inner = real(*args, **kwargs)
    def __enter__(self):
        return Dying(self.inner.__enter__())
    def __exit__(self, *exc):
        return self.inner.__exit__(*exc)

import replaystore.trajectories.files.writer as writer_module
writer_module.atomic_open = Opener
storage = TrajectoryStorage(sys.argv[1])
if sys.argv[3] == "save":
    storage.save_iteration(2, [trajectory("late", 5), trajectory("later", 3)])
else:
    storage.upgrade()
"""


@pytest.mark.parametrize("what", ["save", "upgrade"])
def test_a_writer_killed_mid_write_leaves_a_readable_store(tmp_path: Path, what: str) -> None:
    root = tmp_path / "store"
    old = TrajectoryStorage(root, format_version=2 if what == "upgrade" else 3)
    old.save_iteration(1, [trajectory("alpha", 3), trajectory("bravo", 2)])
    before = TrajectoryStorage(root).load_all()
    repo = str(Path(__file__).resolve().parents[2])
    run = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(root), repo, what], check=False)
    assert run.returncode == -9
    storage = TrajectoryStorage(root)
    assert [f.path.name for f in storage.files()] == ["iteration_000001.rank000.jsonl"]
    assert storage.load_all() == before  # the old file, whole and untouched
    assert len(list(ReplayBuffer.from_storage(root))) == 5
    if what == "upgrade":  # the upgrade runs again from the start
        assert len(storage.upgrade()) == 1 and storage.load_all() == before
