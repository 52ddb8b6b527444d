"""WebGym's ``webgym.utils`` names from replaystore's paths, replaying WebGym's own call sites.

Each test mirrors a call sequence of WebGym (574a205): ``scripts/rollout.py``,
``scripts/update_prepare.py``, ``scripts/checkpoint_utils.py``,
``webgym/environment/async_webgym.py``, ``webgym/models/web_agent.py``,
``webgym/models/qwen/conversation_builder.py``, with only the imports changed.
"""

from __future__ import annotations

import base64
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from replaystore.errors import ConfigError, ImageError, SchemaError, StorageError
from replaystore.trajectories.buffer import ReplayBuffer
from replaystore.trajectories.components import Observation, Reward, Task
from replaystore.trajectories.storage import TrajectoryStorage
from trajectories.conftest import TrajectoryFactory
from trajectories.test_webgym_import import PLAIN, save_webgym_file, webgym_step

# webgym/utils/__init__.py's __all__, verbatim.
WEBGYM_UTILS_ALL = [
    "BlocklistManager",
    "RolloutSampler",
    "TaskHistoryManager",
    "encode_image_to_base64",
    "encode_image_to_file_url",
    "convert_messages_to_path_format",
    "get_next_iteration_number",
    "save_trajectories_incremental",
    "load_all_trajectories",
    "load_last_iteration_trajectories",
    "cleanup_old_iterations",
    "get_trajectory_stats",
]

MODULE_NAMES = {
    "trajectory_storage": [
        "get_next_iteration_number",
        "save_trajectories_incremental",
        "load_last_iteration_trajectories",
        "load_all_trajectories",
        "cleanup_old_iterations",
        "get_trajectory_stats",
        "_strip_page_metadata",
        "_extract_keypoint_step_ids",
    ],
    "image_utils": [
        "encode_image_to_base64",
        "encode_image_to_file_url",
        "convert_messages_to_path_format",
    ],
    "rollout_sampler": ["RolloutSampler"],
    "task_history_manager": ["TaskHistoryManager"],
    "blocklist_manager": ["BlocklistManager"],
}


@pytest.fixture
def factory(tmp_path: Path) -> TrajectoryFactory:
    return TrajectoryFactory(tmp_path / "shots")


def _tasks_frame(n: int = 12, sites: int = 3) -> pd.DataFrame:
    """A task file as WebGym's rollout reads it (``pd.read_json(..., lines=True)``)."""
    return pd.DataFrame(
        {
            "task_id": list(range(n)),
            "task_name": [f"task {i}" for i in range(n)],
            "domain": ["Lifestyle & Leisure"] * n,
            "subdomain": ["Shopping"] * n,
            "website": [f"https://site{i % sites}.example" for i in range(n)],
            "difficulty": [1 + i % 6 for i in range(n)],
            "evaluator_reference": [[{"facts": ["x"]}]] * n,
            "reference_answer": ["x"] * n,
            "url": [f"https://site{i % sites}.example/start" for i in range(n)],
        }
    )


def _attempt(factory: TrajectoryFactory, task_id: int, success: bool) -> list[dict]:
    task = factory.task(task_name=f"task {task_id}", task_id=task_id)
    return factory.trajectory(2, success=success, task=task)


# ----------------------------------------------------------------------------- names


def test_every_webgym_utils_name_imports_from_replaystore_pipeline() -> None:
    import replaystore.pipeline as pipeline

    for name in WEBGYM_UTILS_ALL:
        assert callable(getattr(pipeline, name)), name
    for module, names in MODULE_NAMES.items():
        loaded = importlib.import_module(f"replaystore.pipeline.{module}")
        for name in names:
            assert callable(getattr(loaded, name)), f"{module}.{name}"
    assert pipeline.BlocklistManager is loaded.BlocklistManager


def test_pandas_is_imported_only_when_a_dataframe_api_is_called() -> None:
    code = (
        "import sys, replaystore.pipeline as p\n"
        "print('torch' in sys.modules, 'pandas' in sys.modules)\n"
        "[getattr(p, n) for n in p.__all__]\n"
        "print('pandas' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "False"]


def test_dataframe_apis_name_the_pandas_extra_when_pandas_is_missing(monkeypatch) -> None:
    from replaystore.pipeline.task_history_manager import TaskHistoryManager

    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match=r"replaystore\[pandas\]"):
        TaskHistoryManager("unused").compute_attempt_levels_from_trajectories([], [])


# ----------------------------------------------------------------------------- trajectory storage


def test_rollout_saves_then_update_prepare_builds_the_buffer(tmp_path, factory) -> None:
    from replaystore.pipeline import load_all_trajectories, save_trajectories_incremental

    save_path = str(tmp_path / "logs")
    first = [factory.trajectory(3, success=True), factory.trajectory(2, success=False), None]
    second = [factory.trajectory(4, success=True)]
    meta = {"solution_model": "qwen", "split": "train"}
    # scripts/rollout.py (no checkpointing): one call per rollout.
    p1 = save_trajectories_incremental(
        trajectories=first, base_dir=save_path, split="train", rank_suffix="", metadata=meta
    )
    p2 = save_trajectories_incremental(
        trajectories=second, base_dir=save_path, split="train", rank_suffix="", metadata=meta
    )
    assert Path(p1).parent == Path(save_path) / "train_trajectories"
    assert Path(p1).name == "iteration_000001.jsonl" and Path(p2).name == "iteration_000002.jsonl"
    assert meta == {"solution_model": "qwen", "split": "train"}  # not modified
    assert first[0][0]["observation"].page_metadata.get("microdata")  # inputs not stripped
    # scripts/update_prepare.py
    train_trajectories = load_all_trajectories(
        base_dir=save_path, split="train", last_n_iterations=4
    )
    assert len(train_trajectories) == 3
    replay_buffer = ReplayBuffer(
        agent=None,
        trajectories=train_trajectories,
        capacity=None,
        filter_successful_only=True,
        include_reward_in_sample=False,
        shuffle=False,
        filter_same_screenshot=True,
    )
    assert len(replay_buffer.samples) == 3 + 2 + 4
    assert len(replay_buffer) == 3 + 4  # successful steps, all screenshots differ
    assert set(replay_buffer[0]) == {"message", "action"}
    stored = train_trajectories[0][0]["observation"].page_metadata
    assert set(stored) == {"title", "url"}
    assert train_trajectories[0][0]["trajectory_metadata"]["keypoint_step_ids"] == [2]


def test_load_all_trajectories_options_and_file_list(tmp_path, factory) -> None:
    from replaystore.pipeline import load_all_trajectories, save_trajectories_incremental

    for n in (1, 2, 3):
        save_trajectories_incremental([factory.trajectory(n)], str(tmp_path), "train")
    trajs, files = load_all_trajectories(str(tmp_path), "train", return_file_list=True)
    assert [len(t) for t in trajs] == [1, 2, 3]
    assert [Path(f).name for f in files] == [f"iteration_00000{i}.jsonl" for i in (1, 2, 3)]
    sequential = load_all_trajectories(str(tmp_path), "train", parallel=False)
    assert [len(t) for t in sequential] == [1, 2, 3]
    last_two = load_all_trajectories(str(tmp_path), "train", last_n_iterations=2)
    assert [len(t) for t in last_two] == [2, 3]
    assert len(load_all_trajectories(str(tmp_path), "train", last_n_iterations=0)) == 3
    with pytest.raises(ValueError, match="num_workers"):
        load_all_trajectories(str(tmp_path), "train", num_workers=0)


def test_missing_directory_or_files_raise_file_not_found_as_in_webgym(tmp_path) -> None:
    from replaystore.pipeline import (
        get_next_iteration_number,
        load_all_trajectories,
        load_last_iteration_trajectories,
    )

    with pytest.raises(FileNotFoundError, match="train_trajectories"):
        load_all_trajectories(str(tmp_path), "train")
    assert get_next_iteration_number(str(tmp_path), "train") == 1  # creates the directory
    with pytest.raises(FileNotFoundError, match="No iteration files"):
        load_all_trajectories(str(tmp_path), "train")
    with pytest.raises(FileNotFoundError, match="No iteration files"):
        load_last_iteration_trajectories(str(tmp_path), "train")


def test_rank_files_share_an_iteration_until_merged(tmp_path, factory) -> None:
    from replaystore.pipeline import (
        get_next_iteration_number,
        load_all_trajectories,
        save_trajectories_incremental,
    )

    base = str(tmp_path)
    r0 = save_trajectories_incremental([factory.trajectory(1)], base, "train", "_rank_0")
    r1 = save_trajectories_incremental([factory.trajectory(2)], base, "train", "_rank_1")
    assert Path(r0).name == "iteration_000001.rank000.jsonl"
    assert Path(r1).name == "iteration_000001.rank001.jsonl"
    assert get_next_iteration_number(base, "train") == 1  # rank files do not count
    assert [len(t) for t in load_all_trajectories(base, "train")] == [1, 2]
    TrajectoryStorage(Path(base) / "train_trajectories").merge_ranks(1)
    assert get_next_iteration_number(base, "train") == 2
    assert [len(t) for t in load_all_trajectories(base, "train")] == [1, 2]
    with pytest.raises(ValueError, match="rank_suffix"):
        save_trajectories_incremental([factory.trajectory(1)], base, "train", "rank0")


def test_single_node_save_refuses_an_iteration_with_unmerged_rank_files(tmp_path, factory) -> None:
    from replaystore.pipeline import save_trajectories_incremental

    save_trajectories_incremental([factory.trajectory(1)], str(tmp_path), "train", "_rank_0")
    with pytest.raises(StorageError, match="rank files"):
        save_trajectories_incremental([factory.trajectory(1)], str(tmp_path), "train")


def test_webgym_pt_iteration_files_are_read_safely_beside_ours(
    tmp_path, monkeypatch, factory
) -> None:
    from replaystore.pipeline import (
        get_next_iteration_number,
        get_trajectory_stats,
        load_all_trajectories,
        load_last_iteration_trajectories,
        save_trajectories_incremental,
    )

    directory = tmp_path / "train_trajectories"
    directory.mkdir()

    def payload(C):
        return {
            "trajectories": [[webgym_step(C, 0), webgym_step(C, 1)], None],
            "metadata": {"solution_model": "m"},
        }

    save_webgym_file(directory / "train_trajectories.pt.iteration1", monkeypatch, PLAIN, payload)
    save_webgym_file(directory / "train_trajectories.pt.iteration2", monkeypatch, PLAIN, payload)
    # A rank file of a merged iteration and a checkpoint are not read.
    save_webgym_file(
        directory / "train_trajectories.pt.iteration2_rank_0", monkeypatch, PLAIN, payload
    )
    (directory / "train_trajectories.pt.iteration3_rank_0.checkpoint").write_bytes(b"junk")
    assert get_next_iteration_number(str(tmp_path), "train") == 3
    saved = save_trajectories_incremental([factory.trajectory(2)], str(tmp_path), "train")
    assert Path(saved).name == "iteration_000003.jsonl"

    trajs, files = load_all_trajectories(str(tmp_path), "train", return_file_list=True)
    assert [Path(f).name for f in files] == [
        "train_trajectories.pt.iteration1",
        "train_trajectories.pt.iteration2",
        "iteration_000003.jsonl",
    ]
    assert len(trajs) == 3
    assert isinstance(trajs[0][0]["observation"], Observation)
    assert isinstance(trajs[0][1]["reward"], Reward) and trajs[0][1]["reward"].submit

    last, meta = load_last_iteration_trajectories(str(tmp_path), "train", return_metadata=True)
    assert len(last) == 1 and meta["iteration"] == 3
    webgym_last = load_all_trajectories(str(tmp_path), "train", last_n_iterations=2)
    assert len(webgym_last) == 2

    stats = get_trajectory_stats(str(tmp_path), "train")
    assert set(stats) == {"total_iterations", "total_trajectories", "total_size_mb", "iterations"}
    assert stats["total_iterations"] == 3 and stats["total_trajectories"] == 3
    row = stats["iterations"][0]
    assert {"iteration", "filepath", "num_trajectories", "size_mb"} <= set(row)
    assert row["format"] == "webgym" and row["num_trajectories"] == 1


def test_an_iteration_in_both_formats_is_refused(tmp_path, monkeypatch, factory) -> None:
    from replaystore.pipeline import load_all_trajectories

    directory = tmp_path / "train_trajectories"
    directory.mkdir()
    save_webgym_file(
        directory / "train_trajectories.pt.iteration1",
        monkeypatch,
        PLAIN,
        lambda C: {"trajectories": [[webgym_step(C, 0)]], "metadata": {}},
    )
    TrajectoryStorage(directory).save_iteration(1, [factory.trajectory(1)], rank=None)
    with pytest.raises(StorageError, match="both formats"):
        load_all_trajectories(str(tmp_path), "train")


def test_cleanup_and_stats_as_webgym_calls_them(tmp_path, factory) -> None:
    from replaystore.pipeline import (
        cleanup_old_iterations,
        get_trajectory_stats,
        load_all_trajectories,
        save_trajectories_incremental,
    )

    base = str(tmp_path)
    assert get_trajectory_stats(base, "train") == {
        "total_iterations": 0,
        "total_trajectories": 0,
        "total_size_mb": 0,
        "iterations": [],
    }
    cleanup_old_iterations(base, "train")  # missing directory: nothing to do
    for _ in range(4):
        save_trajectories_incremental([factory.trajectory(1), factory.trajectory(2)], base, "train")
    stats = get_trajectory_stats(base, "train")
    assert stats["total_iterations"] == 4 and stats["total_trajectories"] == 8
    assert [r["iteration"] for r in stats["iterations"]] == [1, 2, 3, 4]
    assert stats["total_size_mb"] == pytest.approx(sum(r["size_mb"] for r in stats["iterations"]))
    removed = cleanup_old_iterations(base, "train", keep_last_n=1)
    assert len(removed) == 3
    assert get_trajectory_stats(base, "train")["total_iterations"] == 1
    assert len(load_all_trajectories(base, "train")) == 2
    cleanup_old_iterations(base, "train", keep_last_n=0)
    assert get_trajectory_stats(base, "train")["total_iterations"] == 0


def test_strip_and_keypoint_helpers_modify_in_place_as_checkpoint_utils_expects(factory) -> None:
    from replaystore.pipeline.trajectory_storage import (
        _extract_keypoint_step_ids,
        _strip_page_metadata,
    )

    new_trajectories = [factory.trajectory(3, submit_last=True), None]
    new_trajectories = _strip_page_metadata(new_trajectories)
    new_trajectories = _extract_keypoint_step_ids(new_trajectories)
    first = new_trajectories[0]
    assert set(first[0]["observation"].page_metadata) == {"title", "url"}
    assert first[0]["trajectory_metadata"]["keypoint_step_ids"] == [2]
    assert new_trajectories[1] is None


# ----------------------------------------------------------------------------- image utils


def test_image_utils_as_the_conversation_builder_and_web_agent_call_them(factory) -> None:
    from replaystore.pipeline import (
        convert_messages_to_path_format,
        encode_image_to_base64,
        encode_image_to_file_url,
    )

    shot = factory.screenshot(1)
    data_url = encode_image_to_base64(str(shot))
    assert data_url.startswith("data:image/png;base64,")
    assert base64.b64decode(data_url.split(",", 1)[1]) == shot.read_bytes()
    file_url = encode_image_to_file_url(str(shot))
    assert file_url == shot.absolute().as_uri()
    messages = [
        {"role": "system", "content": "You are a web agent."},
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": file_url}},
                {"type": "text", "text": "Task: x"},
            ],
        },
    ]
    raw_prompt = convert_messages_to_path_format(messages, [], {"image_path": str(shot)})
    assert raw_prompt == json.dumps(messages, indent=2, ensure_ascii=False)
    assert json.loads(convert_messages_to_path_format(messages[1])) == [messages[1]]
    inline = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url}}]}
    with pytest.raises(ValueError, match="base64"):
        convert_messages_to_path_format([inline])
    remote = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}
    with pytest.raises(ImageError, match=r"messages\[0\]\.content\[0\].*file://"):
        convert_messages_to_path_format([remote])
    with pytest.raises(ImageError, match="not found"):
        encode_image_to_file_url(str(shot) + ".missing")


# ----------------------------------------------------------------------------- blocklist


def test_blocklist_manager_replays_rollout_and_async_webgym_calls(tmp_path) -> None:
    from replaystore.pipeline import BlocklistManager

    now = [1_700_000_000.0]
    save_path = tmp_path / "new" / "run"
    blocklist_manager = BlocklistManager(str(save_path), clock=lambda: now[0])
    assert save_path.is_dir()  # created, as WebGym does
    assert blocklist_manager.blocklist_file == str(save_path / "blocklist.jsonl")
    assert blocklist_manager.get_blocked_domains() == set()
    blocklist_manager.record_blocked_website(
        url="https://www.shop.example/cart", task_id="7", screenshot_path="/s/7.png"
    )
    assert blocklist_manager.get_blocked_domains() == {"shop.example"}
    assert blocklist_manager.is_website_blocked("https://shop.example/other")
    # WebGym's rule: the domain on every scheme and port, subdomains included.
    assert blocklist_manager.is_website_blocked("http://shop.example:8080/other")
    assert blocklist_manager.is_website_blocked("http://api.shop.example/")
    assert blocklist_manager.is_website_blocked("http://shop.example/other")
    stats = blocklist_manager.get_blocklist_stats()
    assert stats["total_entries"] == 1 and stats["currently_blocked"] == 1
    assert stats["blocked_domains"] == ["shop.example"]
    blocklist_manager.block_duration_hours = 1  # WebGym's attribute, set per instance
    now[0] += 2 * 3600
    assert not blocklist_manager.is_website_blocked("https://shop.example")
    blocklist_manager.clean_expired_entries()
    assert blocklist_manager.get_blocklist_stats()["total_entries"] == 0


def test_blocklist_manager_keeps_webgyms_helper_methods(tmp_path) -> None:
    from replaystore.pipeline.blocklist_manager import BlocklistManager

    now = 1_700_000_000.0
    manager = BlocklistManager(tmp_path, clock=lambda: now)
    assert manager._extract_domain("https://WWW.Example.com/x") == "example.com"
    assert manager._extract_domain("example.com") == "example.com"  # WebGym gives ""
    stamp = manager._get_current_timestamp()
    assert not manager._is_timestamp_expired(stamp)
    assert manager._is_timestamp_expired("not a time")
    assert manager._is_timestamp_expired("2001-01-01T00:00:00")
    manager._append_to_blocklist({"domain": "a.example", "blocked_at": stamp})
    manager._append_to_blocklist({"domain": "b.example", "blocked_at": "2001-01-01T00:00:00"})
    assert [e["domain"] for e in manager._read_blocklist()] == ["a.example", "b.example"]
    assert manager.get_blocked_domains() == {"a.example"}
    manager._write_blocklist([{"domain": "c.example", "blocked_at": stamp}])
    assert manager.get_blocked_domains() == {"c.example"}
    with pytest.raises(ValueError, match="domain"):
        manager._append_to_blocklist({"url": "x"})
    (tmp_path / "a_file").write_text("")
    with pytest.raises(StorageError, match="not a directory"):
        BlocklistManager(tmp_path / "a_file")


def test_blocklist_manager_reads_a_file_written_by_webgym(tmp_path) -> None:
    from replaystore.pipeline import BlocklistManager

    blocked_at = "2030-01-01T00:00:00"  # naive local time, WebGym's form
    line = {"domain": "old.example", "url": "https://old.example", "blocked_at": blocked_at}
    (tmp_path / "blocklist.jsonl").write_text(json.dumps(line) + "\n")
    later = BlocklistManager(str(tmp_path), clock=lambda: _local_ts(blocked_at) + 13 * 3600)
    assert later.get_blocked_domains() == set()  # 12 hours are over
    inside = BlocklistManager(str(tmp_path), clock=lambda: _local_ts(blocked_at) + 60)
    assert inside.get_blocked_domains() == {"old.example"}


def _local_ts(text: str) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(text).timestamp()


# ----------------------------------------------------------------------------- rollout sampler


def _config(tmp_path: Path, **env) -> SimpleNamespace:
    defaults = {"train_tasks_rollout_size": 6, "test_tasks_rollout_size": 4}
    defaults.update(env)
    return SimpleNamespace(save_path=str(tmp_path), env_config=SimpleNamespace(**defaults))


def test_rollout_sampler_train_uniform_returns_distinct_rows_of_the_dataframe(tmp_path) -> None:
    from replaystore.pipeline import RolloutSampler

    config = _config(tmp_path, seed=3)
    tasks = _tasks_frame(12)
    rollout_sampler = RolloutSampler(config, config.save_path)
    sampled = rollout_sampler.sample_tasks(
        tasks,
        "train",
        cumulative_distribution=None,
        total_trajectories=0,
        multinode_rank=None,
        multinode_total_workers=None,
    )
    assert isinstance(sampled, pd.DataFrame) and len(sampled) == 6
    assert list(sampled.columns) == list(tasks.columns)
    assert sampled.index.is_unique
    pd.testing.assert_frame_equal(sampled, tasks.loc[sampled.index])
    again = RolloutSampler(config, config.save_path).sample_tasks(tasks, "train")
    pd.testing.assert_frame_equal(sampled, again)  # same seed, same draw
    # scripts/rollout.py then sorts by difficulty
    assert len(sampled.sort_values("difficulty", ascending=False).reset_index(drop=True)) == 6


def test_rollout_sampler_ratio_follows_difficulty_ranges(tmp_path) -> None:
    from replaystore.pipeline import RolloutSampler

    ratio = {
        "easy": {"range": [1, 2], "weight": 0.5},
        "hard": {"range": [5, 6], "weight": 0.5},
    }
    config = _config(tmp_path, train_tasks_sampler="ratio", difficulty_ratio=ratio, seed=1)
    sampled = RolloutSampler(config, str(tmp_path)).sample_tasks(_tasks_frame(24), "train")
    assert len(sampled) == 6 and list(sampled.index) == list(range(6))
    counts = sampled["difficulty"].map(lambda d: "easy" if d <= 2 else "hard").value_counts()
    assert counts.to_dict() == {"easy": 3, "hard": 3}
    bad = _config(tmp_path, train_tasks_sampler="weird")
    with pytest.raises(ValueError, match="Unknown train_tasks_sampler"):
        RolloutSampler(bad, str(tmp_path)).sample_tasks(_tasks_frame(), "train")


def test_rollout_sampler_multinode_shares_are_disjoint_and_cover_one_sample(tmp_path) -> None:
    from replaystore.pipeline import RolloutSampler

    tasks = _tasks_frame(30)
    config = _config(tmp_path, train_tasks_rollout_size=10, seed=5)
    shares = [
        RolloutSampler(config, str(tmp_path)).sample_tasks(
            tasks, "train", multinode_rank=r, multinode_total_workers=3
        )
        for r in range(3)
    ]
    ids = [set(s["task_id"]) for s in shares]
    assert sum(len(s) for s in shares) == 10 and len(set().union(*ids)) == 10
    assert (tmp_path / "multinode_flags" / "train_sampling_complete_rank_0").is_file()
    weighted = _config(
        tmp_path,
        train_tasks_rollout_size=12,
        seed=5,
        rank_load_weight=2,
        total_load_weight=3,
        all_rank_weights="2,1",
    )
    parts = [
        RolloutSampler(weighted, str(tmp_path)).sample_tasks(
            tasks, "train", multinode_rank=r, multinode_total_workers=2
        )
        for r in range(2)
    ]
    assert [len(p) for p in parts] == [8, 4]
    assert not set(parts[0]["task_id"]) & set(parts[1]["task_id"])
    unseeded = _config(tmp_path)
    with pytest.raises(ValueError, match="seed"):
        RolloutSampler(unseeded, str(tmp_path)).sample_tasks(
            tasks, "train", multinode_rank=0, multinode_total_workers=2
        )


def test_rollout_sampler_test_split_is_the_first_tasks_in_order(tmp_path) -> None:
    from replaystore.pipeline import RolloutSampler

    tasks = _tasks_frame(10)
    config = _config(tmp_path, test_tasks_rollout_size=4)
    sampled = RolloutSampler(config, str(tmp_path)).sample_tasks(tasks, "test")
    pd.testing.assert_frame_equal(sampled, tasks.iloc[:4])
    everything = _config(tmp_path, test_tasks_rollout_size=-1, test_tasks_repeat_times=2)
    repeated = RolloutSampler(everything, str(tmp_path)).sample_tasks(tasks, "test")
    assert list(repeated["task_id"]) == list(range(10)) * 2
    ranked = _config(tmp_path, test_tasks_rollout_size=7, test_rank=1, test_total_workers=2)
    share = RolloutSampler(ranked, str(tmp_path)).sample_tasks(tasks, "test")
    assert list(share["task_id"]) == [1, 3, 5]
    weighted = _config(
        tmp_path,
        test_tasks_rollout_size=8,
        test_rank=0,
        test_total_workers=2,
        rank_load_weight=2,
        total_load_weight=3,
        all_rank_weights="2,1",
    )
    share = RolloutSampler(weighted, str(tmp_path)).sample_tasks(tasks, "test")
    assert list(share["task_id"]) == [0, 1, 3, 4, 6, 7]  # WebGym's proportional round-robin


def test_rollout_sampler_deduplicates_tasks_already_in_trajectories(tmp_path, factory) -> None:
    from replaystore.pipeline import RolloutSampler, save_trajectories_incremental

    save_trajectories_incremental(
        [_attempt(factory, i, True) for i in range(8)], str(tmp_path), "train"
    )
    config = _config(tmp_path, deduplicate_across_iterations=True, seed=0)
    sampled = RolloutSampler(config, str(tmp_path)).sample_tasks(_tasks_frame(12), "train")
    assert set(sampled["task_id"]) == {8, 9, 10, 11}  # only 4 unseen tasks remain


def test_rollout_sampler_rejects_bad_input_at_the_boundary(tmp_path) -> None:
    from replaystore.pipeline import RolloutSampler

    with pytest.raises(ConfigError, match="env_config"):
        RolloutSampler(SimpleNamespace(), str(tmp_path))
    sampler = RolloutSampler(SimpleNamespace(env_config=SimpleNamespace()), str(tmp_path))
    with pytest.raises(ConfigError, match="train_tasks_rollout_size"):
        sampler.sample_tasks(_tasks_frame(), "train")
    with pytest.raises(TypeError, match="DataFrame"):
        sampler.sample_tasks(_tasks_frame().to_dict("records"), "train")
    missing = _tasks_frame().drop(columns=["website"])
    config = _config(tmp_path)
    with pytest.raises(SchemaError, match="website"):
        RolloutSampler(config, str(tmp_path)).sample_tasks(missing, "train")


# ----------------------------------------------------------------------------- task history


def test_task_history_manager_levels_distribution_and_adaptive_order(tmp_path, factory) -> None:
    from replaystore.pipeline import TaskHistoryManager

    tasks = _tasks_frame(6)
    trajectories = [
        _attempt(factory, 0, True),
        _attempt(factory, 1, False),
        _attempt(factory, 1, False),
        *[_attempt(factory, 2, False) for _ in range(6)],
        None,
    ]
    manager = TaskHistoryManager(str(tmp_path))
    leveled = manager.compute_attempt_levels_from_trajectories(tasks, trajectories)
    assert "attempt_level" not in tasks.columns  # input untouched
    assert list(leveled["attempt_level"]) == [5, 2, 5, 0, 0, 0]
    assert list(leveled.columns) == [*tasks.columns, "attempt_level"]
    cumulative = manager.compute_cumulative_distribution_from_trajectories(leveled, trajectories)
    assert cumulative == {5: 7, 2: 2}
    ordered = manager.apply_adaptive_weighted_sampling(
        leveled, cumulative_distribution=cumulative, total_trajectories=9, seed=4
    )
    assert sorted(ordered["task_id"]) == list(range(6)) and list(ordered.index) == list(range(6))
    assert set(ordered["task_id"][:3]) == {3, 4, 5}  # level 0 first (weights 100 vs <= 1)
    again = manager.apply_adaptive_weighted_sampling(leveled, seed=4)
    pd.testing.assert_frame_equal(ordered, again)
    zero = manager.apply_adaptive_weighted_sampling(leveled, level_weights={5: 0.0}, seed=1)
    assert set(zero["task_id"][-2:]) == {0, 2}  # weight 0 last, in input order
    assert list(zero["task_id"][-2:]) == [0, 2]
    with pytest.raises(SchemaError, match="attempt_level"):
        manager.compute_cumulative_distribution_from_trajectories(tasks, trajectories)
    bad = leveled.assign(attempt_level=[0, 1, 2, 3, 4, 9])
    with pytest.raises(SchemaError, match="row 5"):
        manager.apply_adaptive_weighted_sampling(bad)


def test_task_history_manager_without_task_id_uses_name_and_website(tmp_path, factory) -> None:
    from replaystore.pipeline import TaskHistoryManager

    tasks = _tasks_frame(3).drop(columns=["task_id"])
    task = factory.task(task_name="task 1", website="https://site1.example", task_id=None)
    solved = factory.trajectory(1, success=True, task=task)
    leveled = TaskHistoryManager(tmp_path).compute_attempt_levels_from_trajectories(tasks, [solved])
    assert list(leveled["attempt_level"]) == [0, 5, 0]
    assert np.issubdtype(leveled["attempt_level"].dtype, np.integer)


def test_rollout_sampler_has_webgyms_task_history_manager(tmp_path) -> None:
    from replaystore.pipeline import RolloutSampler, TaskHistoryManager

    sampler = RolloutSampler(_config(tmp_path), str(tmp_path))
    assert isinstance(sampler.task_history_manager, TaskHistoryManager)
    assert sampler.save_path == str(tmp_path) and sampler.deduplicate_across_iterations is False


def test_task_objects_in_tasks_history_keep_working(tmp_path) -> None:
    # WebGym's _get_task_id reads task_id from a Task object; ours compares ids as strings.
    from replaystore.pipeline import TaskHistoryManager

    task = Task("task 0", "d", "s", "https://site0.example", 1, None, None, task_id=0)
    obs = Observation(task=task, image_path="s.png", ac_tree=None)
    step = {"observation": obs, "reward": Reward(1.0, None)}
    leveled = TaskHistoryManager(os.fspath(tmp_path)).compute_attempt_levels_from_trajectories(
        _tasks_frame(2), [[step]]
    )
    assert list(leveled["attempt_level"]) == [5, 0]
