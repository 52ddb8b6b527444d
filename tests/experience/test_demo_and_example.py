"""The demo part and the example script run end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from replaystore.demos import experience as demo
from replaystore.experience import SqliteStorage

ROOT = Path(__file__).resolve().parents[2]


def test_demo_quick_run_writes_a_consistent_store_and_summary(tmp_path):
    lines = demo.run(tmp_path, quick=True)
    summary = json.loads((tmp_path / "samples.json").read_text())
    store = SqliteStorage(tmp_path / "experience.sqlite")
    assert summary["rows"] == store.size() > 0
    assert store.integrity_check() == "ok"
    assert len(store.task_ids()) == 4 * 150
    assert any("rows/s" in line for line in lines)
    assert summary["solved_tasks_sampled"]


def test_example_script_runs(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "experience_multiprocess.py"),
            str(tmp_path / "exp.sqlite"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "stored 1000 rows; sample() returned 1000 rows" in result.stdout
    assert "task_1_3 has 10 steps: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]" in result.stdout
    assert "rows matching the nested condition: 250" in result.stdout
