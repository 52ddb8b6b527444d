"""TrajectoryStorage: immutable JSONL iteration files, atomic, mergeable, indexable."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import replaystore.trajectories.files.writer as writer_module
from replaystore.errors import StorageError, TrajectoryError
from replaystore.trajectories import ReplayBuffer, TrajectoryStorage, step_to_dict
from replaystore.trajectories.files.lines import first_line

from .conftest import FakeAgent, TrajectoryFactory


def _actions(trajectories: list[list[dict]]) -> list[str]:
    return [step["response"].raw_response for traj in trajectories for step in traj]


def test_save_writes_one_json_lines_file_per_iteration_and_rank(
    trajectory_factory: TrajectoryFactory,
) -> None:
    # Format version 2 (step lines); format 3's layout: tests/trajectories/test_format_v3.py
    storage = TrajectoryStorage(trajectory_factory.root / "store", format_version=2)
    path = storage.save_iteration(3, [trajectory_factory.trajectory(2)], rank=1)
    assert path.name == "iteration_000003.rank001.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines()
    header = json.loads(lines[0])
    assert header["format"] == "replaystore.trajectories"
    assert header["iteration"] == 3 and header["rank"] == 1
    assert header["num_steps"] == 2 == len(lines) - 1
    assert [json.loads(line)["s"] for line in lines[1:]] == [0, 1]
    assert [p.name for p in storage.root.iterdir()] == [path.name]  # no temporary left


@pytest.mark.parametrize("size", [0, 1, 2**16 - 1, 2**16, 2**16 + 1, 3 * 2**16 + 7, 2**20])
def test_first_line_reads_what_readline_reads(tmp_path: Path, size: int) -> None:
    # The header's reader: lines at, before and after its chunk boundaries, and none.
    line = b"x" * size + b"\n"
    for content in (line + b"rest\n", line, b"y" * size, b""):
        path = tmp_path / "file"
        path.write_bytes(content)
        with open(path, "rb") as handle:
            assert first_line(path) == handle.readline()


def test_iteration_files_are_immutable(trajectory_factory: TrajectoryFactory) -> None:
    storage = TrajectoryStorage(trajectory_factory.root)
    storage.save_iteration(1, [trajectory_factory.trajectory(1)])
    with pytest.raises(StorageError, match="immutable"):
        storage.save_iteration(1, [trajectory_factory.trajectory(1)])
    storage.save_iteration(1, [trajectory_factory.trajectory(1)], rank=1)  # another rank is fine


def test_round_trip_keeps_every_field(trajectory_factory: TrajectoryFactory) -> None:
    trajs = [trajectory_factory.trajectory(3), trajectory_factory.trajectory(2, success=False)]
    storage = TrajectoryStorage(trajectory_factory.root, keep_page_metadata=True)
    storage.save_iteration(1, trajs)
    loaded = storage.load_all()
    assert len(loaded) == 2
    for original, back in zip(trajs, loaded, strict=True):
        for i, (a, b) in enumerate(zip(original, back, strict=True)):
            expected = step_to_dict(a)
            if i == 0:
                expected["trajectory_metadata"] = {"keypoint_step_ids": [len(original) - 1]}
            assert step_to_dict(b) == expected


def test_saving_does_not_modify_the_callers_trajectories(
    trajectory_factory: TrajectoryFactory,
) -> None:
    traj = trajectory_factory.trajectory(2, precomputed=False)
    before = [step_to_dict(step) for step in traj]
    TrajectoryStorage(trajectory_factory.root).save_iteration(1, [traj])
    assert [step_to_dict(step) for step in traj] == before


def test_page_metadata_is_stripped_to_title_and_url(trajectory_factory: TrajectoryFactory) -> None:
    storage = TrajectoryStorage(trajectory_factory.root)
    storage.save_iteration(1, [trajectory_factory.trajectory(1)])
    page = storage.load_all()[0][0]["observation"].page_metadata
    assert page == {"title": "Store page 0", "url": "https://example.com/page/0"}


def test_keep_page_metadata_per_call(trajectory_factory: TrajectoryFactory) -> None:
    storage = TrajectoryStorage(trajectory_factory.root)
    storage.save_iteration(1, [trajectory_factory.trajectory(1)], keep_page_metadata=True)
    page = storage.load_all()[0][0]["observation"].page_metadata
    assert set(page) == {"title", "url", "microdata", "meta_tags"}


def test_iterating_one_file_at_a_time_and_reading_metadata(
    trajectory_factory: TrajectoryFactory,
) -> None:
    storage = TrajectoryStorage(trajectory_factory.root)
    storage.save_iteration(1, [trajectory_factory.trajectory(1)], metadata={"model": "m1"})
    storage.save_iteration(2, [trajectory_factory.trajectory(2)] * 2, metadata={"model": "m2"})
    assert [(it, len(t)) for it, t in storage.iter_trajectories()] == [(1, 1), (2, 2), (2, 2)]
    assert storage.metadata(2)[0]["model"] == "m2"
    assert "timestamp" in storage.metadata(1)[0]


def test_keypoint_step_ids_are_recorded_per_trajectory(
    trajectory_factory: TrajectoryFactory,
) -> None:
    traj = trajectory_factory.trajectory(4)
    traj[1]["reward"].submit = True
    traj[0]["trajectory_metadata"] = {"source": "rollout-7"}
    no_submit = trajectory_factory.trajectory(2, submit_last=False)
    storage = TrajectoryStorage(trajectory_factory.root)
    storage.save_iteration(1, [traj, no_submit])
    first, second = storage.load_all()
    assert first[0]["trajectory_metadata"] == {"source": "rollout-7", "keypoint_step_ids": [1, 3]}
    assert second[0]["trajectory_metadata"] == {"keypoint_step_ids": []}


def test_screenshot_paths_are_relative_to_the_root_so_the_directory_can_move(
    trajectory_factory: TrajectoryFactory, tmp_path: Path
) -> None:
    root = trajectory_factory.root
    outside = tmp_path.parent / f"{tmp_path.name}-outside.png"
    shutil.copy(trajectory_factory.screenshot(1), outside)
    traj = trajectory_factory.trajectory(2)
    traj[1]["observation"].image_path = str(outside)
    storage = TrajectoryStorage(root, format_version=2)  # its step lines are read below
    path = storage.save_iteration(1, [traj])
    storage.format_version = 3
    storage.save_iteration(2, [traj])
    stored = [json.loads(line) for line in path.read_text().splitlines()[1:]]
    assert stored[0]["step"]["observation"]["image_path"].startswith("screenshots/")
    assert stored[1]["step"]["observation"]["image_path"] == str(outside)
    moved = tmp_path.parent / f"{tmp_path.name}-moved"
    shutil.move(str(root), moved)
    for loaded in TrajectoryStorage(moved).load_all():  # format 2, then format 3
        assert Path(loaded[0]["observation"].image_path).parent == moved / "screenshots"
        assert Path(loaded[0]["observation"].image_path).is_file()
        assert loaded[1]["observation"].image_path == str(outside)
    outside.unlink()


def test_missing_same_screenshot_flags_are_computed_at_save(
    trajectory_factory: TrajectoryFactory,
) -> None:
    traj = trajectory_factory.trajectory(3, screens=[2, 2, 3], precomputed=False)
    storage = TrajectoryStorage(trajectory_factory.root)
    storage.save_iteration(1, [traj])
    loaded = storage.load_all()[0]
    assert [s.get("same_as_next_screenshot") for s in loaded] == [True, False, None]


def test_numpy_bool_flags_are_stored_as_json_bools(trajectory_factory: TrajectoryFactory) -> None:
    traj = trajectory_factory.trajectory(3, screens=[2, 2, 3])
    for step in traj:
        step["same_as_next_screenshot"] = np.bool_(step["same_as_next_screenshot"])
    storage = TrajectoryStorage(trajectory_factory.root)
    storage.save_iteration(1, [traj])
    assert [s["same_as_next_screenshot"] for s in storage.load_all()[0]] == [True, False, False]
    traj[0]["same_as_next_screenshot"] = "maybe"
    with pytest.raises(TrajectoryError, match="trajectory 0 step 0: same_as_next_screenshot"):
        storage.save_iteration(2, [traj])


def test_load_all_last_n_and_load_last(trajectory_factory: TrajectoryFactory) -> None:
    storage = TrajectoryStorage(trajectory_factory.root)
    batches = {it: [trajectory_factory.trajectory(1)] for it in (1, 2, 3)}
    for it, trajs in batches.items():
        storage.save_iteration(it, trajs)
    assert _actions(storage.load_all()) == _actions(batches[1] + batches[2] + batches[3])
    assert _actions(storage.load_all(last_n_iterations=2)) == _actions(batches[2] + batches[3])
    assert _actions(storage.load_last()) == _actions(batches[3])
    assert storage.iterations() == [1, 2, 3]
    assert storage.next_iteration() == 4
    assert TrajectoryStorage(trajectory_factory.root / "empty").load_last() == []
    with pytest.raises(ValueError, match="last_n_iterations"):
        storage.load_all(last_n_iterations=0)


def test_save_without_an_iteration_number_takes_the_next(
    trajectory_factory: TrajectoryFactory,
) -> None:
    storage = TrajectoryStorage(trajectory_factory.root)
    assert storage.save_iteration(None, [trajectory_factory.trajectory(1)]).name.startswith(
        "iteration_000001."
    )
    assert storage.save_iteration(None, [trajectory_factory.trajectory(1)]).name.startswith(
        "iteration_000002."
    )


def test_cleanup_keeps_the_last_n_iterations(trajectory_factory: TrajectoryFactory) -> None:
    storage = TrajectoryStorage(trajectory_factory.root)
    for it in range(1, 6):
        storage.save_iteration(it, [trajectory_factory.trajectory(1)])
        storage.save_iteration(it, [trajectory_factory.trajectory(1)], rank=1)
    removed = storage.cleanup_old_iterations(keep_last_n=2)
    assert len(removed) == 6
    assert storage.iterations() == [4, 5]
    assert storage.cleanup_old_iterations(keep_last_n=2) == []
    with pytest.raises(ValueError, match="keep_last_n"):
        storage.cleanup_old_iterations(-1)


@pytest.mark.parametrize("version", [2, 3])
def test_merge_ranks_combines_rank_files_in_rank_order(
    trajectory_factory: TrajectoryFactory, version: int
) -> None:
    storage = TrajectoryStorage(trajectory_factory.root, format_version=version)
    by_rank = {
        r: [trajectory_factory.trajectory(2), trajectory_factory.trajectory(1)] for r in (0, 1, 2)
    }
    for rank in (2, 0, 1):
        storage.save_iteration(4, by_rank[rank], rank=rank)
    before = _actions(storage.load_all())
    assert before == _actions(by_rank[0] + by_rank[1] + by_rank[2])
    merged = storage.merge_ranks(4)
    assert [f.path for f in storage.files()] == [merged]
    assert merged.name == "iteration_000004.jsonl"
    assert _actions(storage.load_all()) == before
    if version == 2:  # step lines name their trajectory (format 3 frames do not)
        assert [json.loads(line)["t"] for line in merged.read_text().splitlines()[1:]] == [
            0, 0, 1, 2, 2, 3, 4, 4, 5,
        ]  # fmt: skip
    assert [len(t) for t in storage.load_all()] == [2, 1, 2, 1, 2, 1]
    assert storage.merge_ranks(4) == merged  # idempotent
    with pytest.raises(StorageError, match="immutable"):
        storage.save_iteration(4, [trajectory_factory.trajectory(1)], rank=3)
    with pytest.raises(StorageError, match="no files"):
        storage.merge_ranks(9)


def test_stats_count_from_headers(trajectory_factory: TrajectoryFactory) -> None:
    storage = TrajectoryStorage(trajectory_factory.root)
    storage.save_iteration(
        1, [trajectory_factory.trajectory(3), trajectory_factory.dummy_trajectory()]
    )
    storage.save_iteration(2, [trajectory_factory.trajectory(2, success=False)])
    stats = storage.stats()
    assert stats["total_iterations"] == 2
    assert stats["total_trajectories"] == 3
    assert stats["total_steps"] == 6
    assert stats["successful_trajectories"] == 1
    assert stats["dummy_trajectories"] == 1
    assert stats["total_size_bytes"] == sum(f.path.stat().st_size for f in storage.files())
    assert [row["steps"] for row in stats["iterations"]] == [4, 2]
    assert TrajectoryStorage(trajectory_factory.root / "none").stats()["total_iterations"] == 0


def test_a_malformed_step_writes_nothing_and_names_it(
    trajectory_factory: TrajectoryFactory,
) -> None:
    storage = TrajectoryStorage(trajectory_factory.root / "store")
    bad = trajectory_factory.trajectory(3)
    bad[2]["response"].answering_tokens = object()  # not JSON
    with pytest.raises(TrajectoryError, match="trajectory 1 step 2 cannot be stored as JSON"):
        storage.save_iteration(1, [trajectory_factory.trajectory(1), bad])
    broken = trajectory_factory.trajectory(2)
    del broken[1]["action"]
    with pytest.raises(TrajectoryError, match="trajectory 0 step 1 is malformed"):
        storage.save_iteration(1, [broken])
    assert storage.files() == []
    assert not any(storage.root.iterdir())


def test_foreign_files_are_refused_not_executed(trajectory_factory: TrajectoryFactory) -> None:
    storage = TrajectoryStorage(trajectory_factory.root)
    (storage.root / "iteration_000001.jsonl").write_bytes(b"\x80\x04\x95 pickle bytes")
    with pytest.raises(StorageError, match="not a replaystore iteration file"):
        storage.load_all()


class _CheckingHandle:
    """Wraps the writer's file handle: after every write, a reader loads everything."""

    def __init__(self, handle: Any, check: Callable[[], None]) -> None:
        self._handle = handle
        self._check = check

    def write(self, data: bytes) -> int:
        written = self._handle.write(data)
        self._handle.flush()
        self._check()
        return written

    def writelines(self, lines: list[bytes]) -> None:
        for line in lines:
            self.write(line)


def test_a_reader_during_a_write_never_sees_a_partial_file(
    trajectory_factory: TrajectoryFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = TrajectoryStorage(trajectory_factory.root / "store")
    batch = [trajectory_factory.trajectory(3) for _ in range(4)]
    storage.save_iteration(1, batch)
    seen: list[int] = []

    def reader_check() -> None:
        reader = TrajectoryStorage(storage.root)
        loaded = reader.load_all()
        assert sum(len(t) for t in loaded) % 12 == 0, "a reader saw part of an iteration"
        assert all(row["steps"] % 12 == 0 for row in reader.stats()["iterations"])
        seen.append(len(loaded))

    real_open = writer_module.atomic_open

    @contextlib.contextmanager
    def checking_open(path: Path, mode: str = "wb", **kwargs: Any) -> Iterator[Any]:
        with real_open(path, mode, **kwargs) as handle:
            yield _CheckingHandle(handle, reader_check)

    monkeypatch.setattr(writer_module, "atomic_open", checking_open)
    storage.save_iteration(2, batch, rank=0)
    storage.save_iteration(2, batch, rank=1)
    storage.merge_ranks(2)
    # While rank 0 writes: iteration 1 only; rank 1: + rank 0; the merge: + both ranks.
    assert set(seen) == {4, 8, 12}
    assert len(storage.load_all()) == 12


_READER = """
import sys
from pathlib import Path
from replaystore.trajectories import TrajectoryStorage
root, stop, steps_per_file = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
storage = TrajectoryStorage(root)
reads = 0
while not stop.exists() or reads == 0:
    for row in storage.stats()["iterations"]:
        if row["steps"] != steps_per_file:
            raise SystemExit(f"partial iteration: {row}")
    total = sum(len(t) for t in storage.load_all()) if storage.files() else 0
    if total % steps_per_file:
        raise SystemExit(f"partial data: {total} steps")
    reads += 1
print(reads)
"""


@pytest.mark.slow
def test_a_reader_process_polling_while_another_writes_and_merges(
    trajectory_factory: TrajectoryFactory,
) -> None:
    # Real parallelism: the reader is another process, the writer writes and
    # merges iteration files as fast as it can.
    storage = TrajectoryStorage(trajectory_factory.root / "store")
    storage.root.mkdir()
    stop = trajectory_factory.root / "stop"
    batch = [trajectory_factory.trajectory(4) for _ in range(40)]
    reader = subprocess.Popen(
        [sys.executable, "-c", _READER, str(storage.root), str(stop), "160"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(0.5)  # let the reader start polling
        for it in range(1, 25):
            storage.save_iteration(it, batch, rank=it % 2)
            if it % 4 == 0:
                storage.merge_ranks(it)
    finally:
        stop.touch()
        out, err = reader.communicate(timeout=120)
    assert reader.returncode == 0, err[-2000:]
    assert int(out) > 0
    assert len(storage.load_all()) == 24 * 40


# ------------------------------------------------------------------ from_storage


@pytest.fixture
def stored(trajectory_factory: TrajectoryFactory) -> tuple[TrajectoryStorage, list[list[dict]]]:
    f = trajectory_factory
    storage = TrajectoryStorage(f.root)
    first = [
        f.trajectory(3),
        f.trajectory(2, success=False),
        f.dummy_trajectory(),
        f.trajectory(4, screens=[1, 1, 2, 3], precomputed=False),
    ]
    second = [f.trajectory(3, raw_prompt=False), f.trajectory(2, success=False)]
    third = [f.trajectory(2), f.trajectory(3, screens=[4, 5, 5])]
    storage.save_iteration(1, first)
    storage.save_iteration(2, second[:1], rank=0)
    storage.save_iteration(2, second[1:], rank=1)
    storage.save_iteration(3, third)
    return storage, first + second + third


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"filter_successful_only": True},
        {"capacity": 9, "filter_successful_only": True, "shuffle": True, "seed": 2},
        {"include_reward_in_sample": False, "filter_same_screenshot": False},
    ],
)
def test_from_storage_equals_the_in_memory_buffer_sample_for_sample(
    stored: tuple[TrajectoryStorage, list[list[dict]]], options: dict
) -> None:
    storage, _ = stored
    on_disk = ReplayBuffer.from_storage(storage.root, agent=FakeAgent(), **options)
    in_memory = ReplayBuffer(storage.load_all(), agent=FakeAgent(), **options)
    assert len(on_disk) == len(in_memory) > 0
    assert [on_disk[i] for i in range(len(on_disk))] == [
        in_memory[i] for i in range(len(in_memory))
    ]
    assert on_disk.stats.as_dict() | {"computed_screenshot_steps": 0} == (
        in_memory.stats.as_dict() | {"computed_screenshot_steps": 0}
    )
    for power in (1.0, 2.0):
        a = on_disk.get_training_samples(3, power, seed=5)
        b = in_memory.get_training_samples(3, power, seed=5)
        assert list(a) == list(b)
    assert list(on_disk.get_training_samples()) == list(in_memory.get_training_samples())


def test_from_storage_last_n_iterations(stored: tuple[TrajectoryStorage, list[list[dict]]]) -> None:
    storage, _ = stored
    on_disk = ReplayBuffer.from_storage(storage.root, last_n_iterations=1)
    in_memory = ReplayBuffer(storage.load_all(last_n_iterations=1))
    assert [s["action"] for s in on_disk] == [s["action"] for s in in_memory]
    assert len(on_disk) == 5


def test_from_storage_holds_only_an_index(
    stored: tuple[TrajectoryStorage, list[list[dict]]],
) -> None:
    storage, _ = stored
    buffer = ReplayBuffer.from_storage(storage.root, agent=FakeAgent())
    source = buffer._source
    assert not hasattr(source, "trajectories")
    arrays = [v for v in vars(buffer).values() if isinstance(v, np.ndarray)]
    arrays += [getattr(source, name) for name in ("file_of_step", "offsets")]
    assert sum(a.nbytes for a in arrays) / buffer.stats.samples < 80


def test_from_storage_names_a_none_final_reward_with_its_file(
    trajectory_factory: TrajectoryFactory,
) -> None:
    # save_iteration refuses a None final reward (test_reward_rule.py); a file
    # written before that rule is refused on reading, naming the trajectory and file.
    from .test_reward_rule import set_header_final_reward

    storage = TrajectoryStorage(trajectory_factory.root)
    storage.save_iteration(1, [trajectory_factory.trajectory(1)])
    path = storage.save_iteration(2, [trajectory_factory.trajectory(2)])
    set_header_final_reward(path, 0, None)
    with pytest.raises(TrajectoryError, match=r"trajectory 0 of .*iteration_000002.*reward None"):
        ReplayBuffer.from_storage(storage.root)


def test_from_storage_on_an_empty_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="no iteration files"):
        ReplayBuffer.from_storage(tmp_path)


def test_from_storage_reports_a_file_removed_after_opening(
    stored: tuple[TrajectoryStorage, list[list[dict]]],
) -> None:
    storage, _ = stored
    buffer = ReplayBuffer.from_storage(storage.root, agent=FakeAgent())
    assert buffer[0]["action"]
    storage.cleanup_old_iterations(keep_last_n=1)
    # buffer[0]'s trajectory frame was read (and checked) before: kept in memory, it
    # still reads; a step of the removed file not read yet cannot be.
    with pytest.raises(StorageError, match="removed after the buffer was opened"):
        list(buffer)


def test_from_storage_malformed_prompt_names_trajectory_step_and_file(
    trajectory_factory: TrajectoryFactory,
) -> None:
    traj = trajectory_factory.trajectory(2)
    traj[1]["response"].raw_prompt = "{broken"
    storage = TrajectoryStorage(trajectory_factory.root)
    storage.save_iteration(1, [trajectory_factory.trajectory(1), traj])
    buffer = ReplayBuffer.from_storage(storage.root)
    with pytest.raises(
        TrajectoryError, match=r"trajectory 1 step 1 \(trajectory 1 of .*iteration_000001"
    ):
        buffer[2]
