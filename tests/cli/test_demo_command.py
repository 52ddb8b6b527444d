"""``replaystore demo --quick`` through the real entry point: every part runs, outputs parse."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from PIL import Image

from replaystore.demos import PARTS
from replaystore.trajectories.export import validate_record
from replaystore.trajectories.storage import TrajectoryStorage

from .conftest import run_cli, run_cli_subprocess

# The whole quick demo must finish well within this (it takes ~15 s on one core).
DEMO_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("demo")
    proc = run_cli_subprocess("demo", "--quick", "--out", out, timeout=DEMO_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    return out, proc.stdout


def assert_png(path: Path) -> None:
    with Image.open(path) as image:
        assert image.format == "PNG"
        image.load()


@pytest.mark.slow
def test_every_part_runs_and_the_summary_says_where_outputs_are(demo_run):
    out, stdout = demo_run
    assert PARTS[:2] == ("transitions", "trajectories")
    for part in PARTS:
        assert f"\n== {part} ==\n" in stdout
    summary = stdout.split("\n== summary ==\n", 1)[1]
    for part in PARTS:
        assert str((out / part).resolve()) in summary
    assert "total " in summary


@pytest.mark.slow
def test_transitions_outputs(demo_run):
    out, _ = demo_run
    assert_png(out / "transitions" / "learning_curve.png")
    meta = json.loads((out / "transitions" / "checkpoint" / "buffer.metadata").read_text())
    assert meta["data_size"] > 0 and meta["buffer_size"] >= meta["data_size"]
    stats = json.loads(run_cli("stats", out / "transitions" / "checkpoint", "--json").stdout)
    assert stats["kind"] == "transitions_checkpoint" and stats["data_files_complete"]


def test_without_a_browser_the_trajectories_part_is_skipped_with_one_line(
    tmp_path: Path, monkeypatch
):
    pytest.importorskip("playwright")
    empty = tmp_path / "empty"
    empty.mkdir()
    # No browser anywhere: both lookups read the environment when the part runs
    # (Playwright's driver process inherits it).
    monkeypatch.delenv("REPLAYSTORE_CHROMIUM", raising=False)
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setenv("PLAYWRIGHT_BROWSERS_PATH", str(empty))
    proc = run_cli("demo", "--quick", "--part", "trajectories", "--out", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    part = proc.stdout.split("\n== trajectories ==\n", 1)[1]
    assert part.startswith("  SKIPPED (no browser): no Chromium found: install one"), part
    assert "apt-get install chromium" in part and "other parts still run" in part


@pytest.mark.slow
def test_trajectories_outputs(demo_run):
    out, stdout = demo_run
    root = out / "trajectories"
    assert "SKIPPED" not in stdout  # CI has Chromium: the real browser loop ran
    assert stdout.count(" browser rollouts on ") == 3
    assert_png(root / "success_rate.png")
    shots = list((root / "screenshots").rglob("step_*.png"))
    assert shots
    assert_png(shots[0])
    assert TrajectoryStorage(root / "storage").iterations() == [1, 2, 3]
    dataset = root / "llamafactory"
    info = json.loads((dataset / "dataset_info.json").read_text())
    records = json.loads((dataset / info["webagent_demo"]["file_name"]).read_text())
    assert records
    for record in records:
        assert validate_record(record, "sharegpt", dataset) == []
    stats = json.loads(run_cli("stats", root / "storage", "--json").stdout)
    assert stats["kind"] == "trajectory_storage" and stats["total_iterations"] == 3


@pytest.mark.slow
def test_experience_outputs(demo_run):
    if "experience" not in PARTS:
        pytest.skip("the experience part is not registered")
    out, _ = demo_run
    store = out / "experience" / "experience.sqlite"
    conn = sqlite3.connect(f"{store.resolve().as_uri()}?mode=ro", uri=True)
    try:
        (rows,) = conn.execute("SELECT COUNT(*) FROM rows").fetchone()
    finally:
        conn.close()
    assert rows > 0
    stats = json.loads(run_cli("stats", store, "--json").stdout)
    assert stats["kind"] == "sqlite_experience_store" and stats["rows"] == rows
