"""CI's slow step names what its bound stopped: the running-tests record and its report.

``tests/conftest.py`` keeps ``REPLAYSTORE_RUNNING_TESTS`` up to date from pytest's
report hooks (here called as pytest-xdist's controller calls them);
``.ci/running-report`` turns it into one line per test still running.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from conftest import _RunningTests

ROOT = Path(__file__).resolve().parents[1]


def test_the_record_holds_the_tests_running_now_and_their_phase(tmp_path: Path) -> None:
    path = tmp_path / "running.json"
    record = _RunningTests(str(path))
    record.pytest_xdist_node_collection_finished(node=None, ids=["a", "b", "c"])
    record.pytest_runtest_logstart(nodeid="a", location=None)
    record.pytest_runtest_logstart(nodeid="b", location=None)
    record.pytest_runtest_logreport(SimpleNamespace(nodeid="a", when="setup", duration=61.24))
    record.pytest_runtest_logreport(SimpleNamespace(nodeid="b", when="setup", duration=0.1))
    record.pytest_runtest_logreport(SimpleNamespace(nodeid="b", when="call", duration=2.0))
    record.pytest_runtest_logfinish(nodeid="b", location=None)
    state = json.loads(path.read_text())
    assert state["total"] == 3 and state["finished"] == 1
    assert set(state["running"]) == {"a"}
    assert state["running"]["a"]["phase"] == "call" and state["running"]["a"]["setup_s"] == 61.2


def test_the_report_names_each_running_test_its_phase_and_time(tmp_path: Path) -> None:
    now = time.time()
    state = {
        "started": now - 780,
        "total": 47,
        "finished": 45,
        "running": {
            "tests/demos/test_loop_demo.py::test_a": {"started": now - 615, "phase": "setup"},
            "tests/x.py::test_y": {"started": now - 20, "phase": "call", "setup_s": 1.5},
        },
    }  # fmt: skip
    path = tmp_path / "running.json"
    path.write_text(json.dumps(state))
    proc = subprocess.run(
        [sys.executable, str(ROOT / ".ci" / "running-report"), str(path), "780"],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(".ci/run: the slow step reached its 780 s bound after 78")
    assert "45 of 47 tests had finished, 2 were still running:" in lines[0]
    assert lines[1].startswith("  tests/demos/test_loop_demo.py::test_a: in setup after 61")
    assert lines[2] == "  tests/x.py::test_y: in call after 20 s, its setup took 1.5 s"


def test_the_report_without_a_record_still_names_the_bound(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / ".ci" / "running-report"), str(tmp_path / "none"), "780"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert proc.stdout.startswith(".ci/run: the slow step reached its 780 s bound; no record")
