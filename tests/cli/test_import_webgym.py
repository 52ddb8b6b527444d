"""``replaystore import-webgym``: WebGym .pt files in, JSONL iteration files out, no code run."""

from __future__ import annotations

import json

from replaystore.trajectories.storage import TrajectoryStorage

from .conftest import Evil, assert_one_line_error, run_cli, save_webgym_file


def test_import_writes_iteration_files_and_prints_counts(tmp_path, monkeypatch):
    source = tmp_path / "logs"
    save_webgym_file(source / "train_trajectories.pt.iteration1", monkeypatch, [2, 1])
    save_webgym_file(source / "train_trajectories.pt.iteration2", monkeypatch, [3])
    out = tmp_path / "store"
    proc = run_cli(
        "import-webgym",
        source / "train_trajectories.pt.iteration1",
        source / "train_trajectories.pt.iteration2",
        "--out",
        out,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == (
        f"imported 2 file(s) into {out.resolve()}: 3 trajectories, 6 steps"
    )
    assert "-> iteration 2 rank 0: 1 trajectories, 3 steps" in proc.stdout
    storage = TrajectoryStorage(out)
    assert storage.iterations() == [1, 2]
    loaded = storage.load_all()
    assert [len(t) for t in loaded] == [2, 1, 3]
    assert loaded[0][1]["reward"].reward == 1.0
    assert loaded[0][0]["observation"].task.task_name == "Buy socks"

    stats = json.loads(run_cli("stats", out, "--json").stdout)
    assert stats["total_trajectories"] == 3


def test_import_of_a_directory(tmp_path, monkeypatch):
    source = tmp_path / "train_trajectories"
    save_webgym_file(source / "train_trajectories.pt.iteration4", monkeypatch, [1])
    proc = run_cli("import-webgym", source, "--out", tmp_path / "store")
    assert proc.returncode == 0, proc.stderr
    assert TrajectoryStorage(tmp_path / "store").iterations() == [4]


def test_malicious_file_is_refused_naming_the_global_and_nothing_runs(tmp_path, monkeypatch):
    marker = tmp_path / "pwned"
    path = save_webgym_file(tmp_path / "evil.pt.iteration1", monkeypatch, [1], evil=Evil(marker))
    proc = run_cli("import-webgym", path, "--out", tmp_path / "store")
    line = assert_one_line_error(proc, "import-webgym", str(path))
    assert "posix.system" in line or "os.system" in line or "nt.system" in line
    assert not marker.exists()
    assert TrajectoryStorage(tmp_path / "store").iterations() == []


def test_missing_file_is_a_one_line_error(tmp_path):
    proc = run_cli("import-webgym", tmp_path / "nope.pt", "--out", tmp_path / "store")
    assert_one_line_error(proc, "import-webgym", "does not exist")


def test_file_that_is_not_a_torch_archive_is_a_one_line_error(tmp_path):
    path = tmp_path / "x.pt"
    path.write_bytes(b"not a zip")
    proc = run_cli("import-webgym", path, "--out", tmp_path / "store")
    assert_one_line_error(proc, "import-webgym", "not a torch zip archive")


def test_taken_iteration_is_refused_before_writing(tmp_path, monkeypatch):
    path = save_webgym_file(tmp_path / "a.pt.iteration1", monkeypatch, [1])
    assert run_cli("import-webgym", path, "--out", tmp_path / "store").returncode == 0
    proc = run_cli("import-webgym", path, "--out", tmp_path / "store")
    assert_one_line_error(proc, "import-webgym", "already has iteration 1")
