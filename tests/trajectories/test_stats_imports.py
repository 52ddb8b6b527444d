"""``replaystore stats PATH`` reads every store kind without importing torch, pandas, PIL
or the experience package (a plain path needs no URL helpers).

Each kind's summary reader runs in a fresh interpreter (``cli.main`` called from
``python -c``), which then reports the heavy modules it loaded; the trajectory
store is also summarised in-process to check the numbers.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from replaystore import cli
from replaystore.trajectories import TrajectoryStorage

from .conftest import TrajectoryFactory

HEAVY = ("torch", "pandas", "PIL", "tensordict", "replaystore.experience")


def _stats_in_fresh_interpreter(path: Path) -> tuple[dict, list[str]]:
    code = (
        "import contextlib, io, json, sys\n"
        "from replaystore import cli\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        f"    rc = cli.main(['stats', {str(path)!r}, '--json'])\n"
        f"print(json.dumps([rc, out.getvalue(), [m for m in {HEAVY!r} if m in sys.modules]]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    rc, out, loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert rc == 0, out
    return json.loads(out), loaded


@pytest.fixture
def stores(trajectory_factory: TrajectoryFactory, tmp_path: Path) -> dict[str, Path]:
    storage = TrajectoryStorage(tmp_path / "trajectories")
    storage.save_iteration(
        1, [trajectory_factory.trajectory(3), trajectory_factory.trajectory(2, success=False)]
    )
    sqlite_file = tmp_path / "experience.sqlite"
    with sqlite3.connect(sqlite_file) as conn:
        conn.execute("CREATE TABLE rows (task_id, task_name, agent_id, step, execute_time)")
        conn.execute("INSERT INTO rows VALUES ('t1', 'search', 'a0', 0, 1.5e9)")
    conn.close()
    memmap = tmp_path / "memmap"
    memmap.mkdir()
    (memmap / "buffer.json").write_text(json.dumps({"capacity": 8, "size": 0, "pointer": 0}))
    checkpoint = tmp_path / "run.metadata"
    checkpoint.write_text(json.dumps({"buffer_size": 8, "data_size": 0, "pointer": 0}))
    return {
        "trajectory_storage": storage.root,
        "sqlite_experience_store": sqlite_file,
        "transitions_memmap": memmap,
        "transitions_checkpoint": checkpoint,
    }


def test_stats_imports_no_heavy_module_for_any_kind(stores: dict[str, Path]) -> None:
    for kind, path in stores.items():
        summary, loaded = _stats_in_fresh_interpreter(path)
        assert summary["kind"] == kind
        assert loaded == [], f"stats on a {kind} imports {loaded}"


def test_trajectory_stats_in_process(
    stores: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["stats", str(stores["trajectory_storage"]), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["kind"] == "trajectory_storage"
    assert (summary["total_trajectories"], summary["total_steps"]) == (2, 5)
    assert summary["successful_trajectories"] == 1
