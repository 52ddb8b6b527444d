"""``replaystore stats PATH``: detects what PATH is and summarises it, read-only."""

from __future__ import annotations

import hashlib
import json
import sqlite3

from .conftest import assert_one_line_error, run_cli


def stats_json(path) -> dict:
    proc = run_cli("stats", path, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_trajectory_storage_summary(trajectory_store):
    proc = run_cli("stats", trajectory_store)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == f"trajectory storage: {trajectory_store.resolve()}"
    assert "iterations: 2 (1-2)" in proc.stdout
    assert "trajectories: 4 (1 dummy), successful: 2 (66.7% of non-dummy" in proc.stdout


def test_trajectory_storage_json_counts(trajectory_store):
    summary = stats_json(trajectory_store)
    assert summary["kind"] == "trajectory_storage"
    assert summary["total_iterations"] == 2
    assert summary["total_trajectories"] == 4
    assert summary["dummy_trajectories"] == 1
    assert summary["successful_trajectories"] == 2
    assert summary["total_steps"] == 3 + 2 + 1 + 2
    assert [row["steps"] for row in summary["iterations"]] == [6, 2]


def test_success_threshold_option_changes_what_counts_as_success(trajectory_store):
    proc = run_cli("stats", trajectory_store, "--json", "--success-threshold", "2")
    assert json.loads(proc.stdout)["successful_trajectories"] == 0


def test_stats_leaves_a_trajectory_storage_as_it_found_it(trajectory_store):
    """A read-only command: a writer's stale temporary file (an old ``.iteration_*.tmp``)
    is still there afterwards, and no file of the directory was added or changed."""
    import os

    stale = trajectory_store / ".iteration_000009.jsonl.abc123.tmp"
    stale.write_bytes(b"a writer's unfinished file")
    os.utime(stale, (1_000_000_000, 1_000_000_000))  # far older than STALE_TEMP_AGE_S

    def listing() -> dict[str, tuple[int, int]]:
        return {
            p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in trajectory_store.iterdir()
        }

    before = listing()
    for argv in (("stats", trajectory_store), ("stats", trajectory_store, "--json")):
        proc = run_cli(*argv)
        assert proc.returncode == 0, proc.stderr
    assert listing() == before


def test_sqlite_store_summary_counts_rows_tasks_and_agents(sqlite_store):
    summary = stats_json(sqlite_store)
    assert summary["kind"] == "sqlite_experience_store"
    assert (summary["rows"], summary["tasks"], summary["agents"]) == (9, 3, 2)
    assert summary["steps"] == [0, 3]
    assert summary["per_agent"] == [
        {"agent_id": "planner", "rows": 6, "tasks": 2},
        {"agent_id": "browser", "rows": 3, "tasks": 1},
    ]
    text = run_cli("stats", sqlite_store).stdout
    assert "rows: 9, tasks: 3, task names: 1, agents: 2" in text


def test_stats_does_not_modify_the_sqlite_file(sqlite_store):
    before = hashlib.sha256(sqlite_store.read_bytes()).hexdigest()
    assert run_cli("stats", sqlite_store).returncode == 0
    assert hashlib.sha256(sqlite_store.read_bytes()).hexdigest() == before


def test_sqlite_file_that_is_not_an_experience_store_is_refused_untouched(tmp_path):
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (x)")
    conn.close()
    proc = run_cli("stats", path)
    assert_one_line_error(proc, "stats", "not a replaystore experience store")
    with sqlite3.connect(path) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master")]
    conn.close()
    assert tables == ["t"]


def test_transitions_checkpoint_by_prefix_or_metadata_file(transitions_checkpoint):
    by_prefix = stats_json(transitions_checkpoint)
    by_file = stats_json(transitions_checkpoint.with_name("buffer.metadata"))
    assert by_prefix == by_file
    assert by_prefix["kind"] == "transitions_checkpoint"
    assert (by_prefix["buffer_size"], by_prefix["data_size"], by_prefix["pointer"]) == (8, 5, 5)
    assert by_prefix["sampler"]["kind"] == "prioritized"
    assert [f["name"] for f in by_prefix["fields"]] == ["obs", "action", "reward"]
    assert by_prefix["fields"][0]["shape"] == [4]
    assert by_prefix["data_files_complete"] is True


def test_checkpoint_with_a_truncated_data_file_is_reported(tmp_path, transitions_checkpoint):
    import shutil

    copy = tmp_path / "ckpt"
    shutil.copytree(transitions_checkpoint.parent, copy)
    data_dir = next(p for p in copy.iterdir() if p.is_dir())
    column = data_dir / "0.bin"
    column.write_bytes(column.read_bytes()[:-4])
    proc = run_cli("stats", copy / "buffer")
    assert proc.returncode == 0, proc.stderr
    assert "INCOMPLETE" in proc.stdout


def test_objectrl_metadata_only_checkpoint(tmp_path):
    path = tmp_path / "old.metadata"
    path.write_text(json.dumps({"buffer_size": 100, "data_size": 7, "pointer": 7}))
    summary = stats_json(path)
    assert summary["data_size"] == 7
    assert "metadata only" in summary["note"]


def test_objectrl_torch_save_metadata_is_read_without_unpickling(tmp_path):
    import torch

    path = tmp_path / "buffer.metadata"
    torch.save({"buffer_size": 100, "data_size": 7, "pointer": 7}, path)  # ObjectRL's save
    summary = stats_json(path)
    assert summary["kind"] == "transitions_checkpoint"
    assert (summary["buffer_size"], summary["data_size"], summary["pointer"]) == (100, 7, 7)
    assert summary["format"] == "objectrl-metadata-only"
    assert "metadata only" in summary["note"]
    text = run_cli("stats", tmp_path)  # the directory, as for any checkpoint
    assert text.returncode == 0, text.stderr
    assert "buffer_size: 100, data_size: 7, pointer: 7" in text.stdout


def test_a_torch_save_metadata_file_holding_code_is_refused_in_one_line(tmp_path):
    import torch

    path = tmp_path / "evil.metadata"
    torch.save({"buffer_size": 100, "data_size": 7, "pointer": print}, path)
    assert_one_line_error(run_cli("stats", path), "stats", "evil.metadata")


def test_checkpoint_format_tag_matches_what_the_transitions_buffer_writes():
    from replaystore.formats.transitions_checkpoint import FORMAT_PREFIX
    from replaystore.transitions.checkpoint import CHECKPOINT_FORMAT

    assert CHECKPOINT_FORMAT.startswith(FORMAT_PREFIX)


def test_metadata_file_of_an_unknown_format_is_a_one_line_error(tmp_path):
    path = tmp_path / "x.metadata"
    path.write_text(json.dumps({"buffer_size": 1, "data_size": 0, "pointer": 0, "format": "v9"}))
    assert_one_line_error(run_cli("stats", path), "stats", "unknown checkpoint format 'v9'")


def test_memmap_buffer_directory(memmap_dir):
    summary = stats_json(memmap_dir)
    assert summary["kind"] == "transitions_memmap"
    assert (summary["buffer_size"], summary["data_size"]) == (16, 6)
    assert summary["fields"][0] == {"name": "obs", "dtype": "float32", "shape": [3, 2]}
    assert summary["file_bytes"] == 16 * (3 * 2 * 4 + 8)


def test_missing_path_is_a_one_line_error(tmp_path):
    assert_one_line_error(run_cli("stats", tmp_path / "nope"), "stats", "does not exist")


def test_unknown_file_is_a_one_line_error(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("hello")
    assert_one_line_error(run_cli("stats", path), "stats", "cannot tell what")


def test_directory_of_something_else_is_a_one_line_error(tmp_path):
    (tmp_path / "a.txt").write_text("x")
    assert_one_line_error(run_cli("stats", tmp_path), "stats", "no trajectory iteration files")


def test_memmap_buffer_json_file_names_its_directory(memmap_dir):
    assert stats_json(memmap_dir / "buffer.json") == stats_json(memmap_dir)


def test_a_single_iteration_file_points_to_its_directory(trajectory_store):
    path = sorted(trajectory_store.glob("iteration_*.jsonl"))[0]
    assert_one_line_error(run_cli("stats", path), "stats", f"pass its directory ({path.parent})")
