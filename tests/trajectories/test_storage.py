"""TrajectoryStorage: immutable JSONL iteration files, atomic, mergeable, indexable."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from replaystore.errors import StorageError, TrajectoryError
from replaystore.trajectories import ReplayBuffer, TrajectoryStorage, step_to_dict

from .conftest import FakeAgent, TrajectoryFactory


def _actions(trajectories: list[list[dict]]) -> list[str]:
    return [step["response"].raw_response for traj in trajectories for step in traj]


def test_save_writes_one_json_lines_file_per_iteration_and_rank(
    trajectory_factory: TrajectoryFactory,
) -> None:
    storage = TrajectoryStorage(trajectory_factory.root / "store")
    path = storage.save_iteration(3, [trajectory_factory.trajectory(2)], rank=1)
    assert path.name == "iteration_000003.rank001.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines()
    header = json.loads(lines[0])
    assert header["format"] == "replaystore.trajectories"
    assert header["iteration"] == 3 and header["rank"] == 1
    assert header["num_steps"] == 2 == len(lines) - 1
    assert [json.loads(line)["s"] for line in lines[1:]] == [0, 1]
    assert [p.name for p in storage.root.iterdir()] == [path.name]  # no temporary left


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
    storage = TrajectoryStorage(root)
    path = storage.save_iteration(1, [traj])
    stored = [json.loads(line) for line in path.read_text().splitlines()[1:]]
    assert stored[0]["step"]["observation"]["image_path"].startswith("screenshots/")
    assert stored[1]["step"]["observation"]["image_path"] == str(outside)
    moved = tmp_path.parent / f"{tmp_path.name}-moved"
    shutil.move(str(root), moved)
    loaded = TrajectoryStorage(moved).load_all()[0]
    assert Path(loaded[0]["observation"].image_path).parent == moved / "screenshots"
    assert Path(loaded[0]["observation"].image_path).is_file()
    outside.unlink()


def test_missing_same_screenshot_flags_are_computed_at_save(
    trajectory_factory: TrajectoryFactory,
) -> None:
    traj = trajectory_factory.trajectory(3, screens=[2, 2, 3], precomputed=False)
    storage = TrajectoryStorage(trajectory_factory.root)
    storage.save_iteration(1, [traj])
    loaded = storage.load_all()[0]
    assert [s.get("same_as_next_screenshot") for s in loaded] == [True, False, None]


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


def test_merge_ranks_combines_rank_files_in_rank_order(
    trajectory_factory: TrajectoryFactory,
) -> None:
    storage = TrajectoryStorage(trajectory_factory.root)
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
    assert [json.loads(line)["t"] for line in merged.read_text().splitlines()[1:]] == [
        0, 0, 1, 2, 2, 3, 4, 4, 5,
    ]  # fmt: skip
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


def test_a_concurrent_reader_never_sees_a_partial_file(
    trajectory_factory: TrajectoryFactory,
) -> None:
    storage = TrajectoryStorage(trajectory_factory.root / "store")
    batch = [trajectory_factory.trajectory(4) for _ in range(25)]
    expected_steps = 100
    errors: list[BaseException] = []
    observed: list[int] = []
    done = threading.Event()

    def reader() -> None:
        reading = TrajectoryStorage(storage.root)
        while not done.is_set():
            try:
                loaded = reading.load_all()
                stats = reading.stats()
                steps = sum(len(t) for t in loaded)
                assert steps % expected_steps == 0
                assert all(row["steps"] == expected_steps for row in stats["iterations"])
                observed.append(len(loaded))
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)
                return

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for it in range(1, 13):
            storage.save_iteration(it, batch, rank=it % 2)
            if it % 4 == 0:
                storage.merge_ranks(it)
    finally:
        done.set()
        thread.join()
    assert not errors, errors[0]
    assert observed  # the reader did run
    assert len(storage.load_all()) == 12 * 25


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
    buffer = ReplayBuffer.from_storage(storage.root)
    source = buffer._source
    assert not hasattr(source, "trajectories")
    arrays = [v for v in vars(buffer).values() if isinstance(v, np.ndarray)]
    arrays += [getattr(source, name) for name in ("file_of_step", "offsets")]
    assert sum(a.nbytes for a in arrays) / buffer.stats.samples < 80


def test_from_storage_names_a_none_final_reward_with_its_file(
    trajectory_factory: TrajectoryFactory,
) -> None:
    storage = TrajectoryStorage(trajectory_factory.root)
    storage.save_iteration(1, [trajectory_factory.trajectory(1)])
    storage.save_iteration(2, [trajectory_factory.trajectory(2, final_reward=None)])
    with pytest.raises(TrajectoryError, match=r"trajectory 1 .*iteration_000002.*reward None"):
        ReplayBuffer.from_storage(storage.root)


def test_from_storage_on_an_empty_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="no iteration files"):
        ReplayBuffer.from_storage(tmp_path)


def test_from_storage_reports_a_file_removed_after_opening(
    stored: tuple[TrajectoryStorage, list[list[dict]]],
) -> None:
    storage, _ = stored
    buffer = ReplayBuffer.from_storage(storage.root)
    assert buffer[0]["action"]
    storage.cleanup_old_iterations(keep_last_n=1)
    with pytest.raises(StorageError, match="removed after the buffer was opened"):
        buffer[0]


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
