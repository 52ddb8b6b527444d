"""``replaystore view`` from the command line, and the demo's closing view commands."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from replaystore.cli import main
from replaystore.cli.demo import demo_view_paths
from replaystore.cli.view import view_target
from replaystore.view import host_warning


def test_detects_each_store_kind(
    traj_store: dict[str, Any], exp_store: Path, transitions: dict[str, Path]
) -> None:
    root = traj_store["root"]
    assert view_target(str(root)) == ("trajectory_storage", str(root), None)
    # a run directory with the storage in storage/: screenshots allowed from the whole directory
    assert view_target(str(root.parent)) == ("trajectory_storage", str(root), root.parent)
    assert view_target(str(exp_store))[:2] == ("sqlite_experience_store", str(exp_store))
    assert view_target(f"sqlite:///{exp_store}")[0] == "sqlite_experience_store"
    assert view_target(str(transitions["memmap"]))[0] == "transitions_memmap"
    assert view_target(str(transitions["checkpoint"]))[0] == "transitions_checkpoint"
    assert view_target("postgresql://u@h/db")[:2] == (
        "postgres_experience_store",
        "postgresql://u@h/db",
    )


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["view", "/no/such/store"], "/no/such/store does not exist"),
        (["view", "{exp}", "--image-root", "/tmp"], "--image-root applies to a trajectory storage"),
        (["view", "{traj}", "--image-root", "/no/such/dir"], "is not a directory"),
        (["view", "{traj}", "--port", "-1"], "must be >= 0"),
        (["view", "{traj}", "--port", "70000"], "--port must be <= 65535"),
    ],
)
def test_usage_errors_are_one_line_with_status_2(
    argv: list[str],
    says: str,
    traj_store: dict[str, Any],
    exp_store: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [a.format(exp=exp_store, traj=traj_store["root"]) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


def test_detection_leaves_abandoned_temporary_files_alone(tmp_path: Path) -> None:
    from .stores import make_trajectory_storage

    root = make_trajectory_storage(tmp_path / "storage")["root"]
    stale = root / ".iteration_000009.jsonl.abc123.tmp"  # what a killed writer leaves
    stale.write_text("partial")
    os.utime(stale, (0, 0))  # older than any stale-file age
    assert view_target(str(root))[0] == "trajectory_storage"
    assert view_target(str(tmp_path))[0] == "trajectory_storage"
    assert stale.exists()


def test_a_port_in_use_is_a_one_line_error(
    traj_store: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["view", str(traj_store["root"]), "--port", str(port)]) == 2
    assert f"cannot serve on 127.0.0.1:{port}" in capsys.readouterr().err


def test_only_loopback_hosts_bind_without_a_warning() -> None:
    for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        assert host_warning(host) is None
    for host in ("0.0.0.0", "192.168.1.5", "::", "myhost.example"):
        warning = host_warning(host)
        assert warning is not None and "anyone who can reach" in warning


def test_view_command_serves_until_interrupted(traj_store: dict[str, Any]) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "replaystore.cli", "view", str(traj_store["root"]), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith("replaystore view: trajectory storage ")
        url = proc.stdout.readline().split("serving on ", 1)[1].split()[0]
        assert url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.status == 200
            assert "Trajectory storage" in response.read().decode()
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert "Traceback" not in err


def test_demo_prints_a_view_command_for_each_viewable_output(tmp_path: Path) -> None:
    (tmp_path / "trajectories" / "storage").mkdir(parents=True)
    (tmp_path / "experience").mkdir()
    (tmp_path / "experience" / "experience.sqlite").write_bytes(b"")
    (tmp_path / "transitions" / "checkpoint").mkdir(parents=True)
    (tmp_path / "transitions" / "checkpoint" / "buffer.metadata").write_text("{}")
    (tmp_path / "other").mkdir()
    parts = [tmp_path / p for p in ("transitions", "trajectories", "experience", "other")]
    assert demo_view_paths(parts) == [
        tmp_path / "transitions" / "checkpoint" / "buffer.metadata",
        tmp_path / "trajectories",
        tmp_path / "experience" / "experience.sqlite",
    ]


def test_demo_command_ends_with_the_view_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--quick", "--part", "experience", "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.rstrip().splitlines()
    store = tmp_path / "experience" / "experience.sqlite"
    assert lines[-1] == f"  replaystore view {store.resolve()}"
    assert lines[-2].startswith("look at the outputs in a browser")
