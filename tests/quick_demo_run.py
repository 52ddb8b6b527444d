"""One run of ``replaystore demo --quick`` per test session, shared by the files that check
its outputs (``tests/demos/test_quick_demo.py``: every part and the files' modes;
``tests/view/test_demo_browser.py``: the viewer over its trajectories part).

The run is a child process under umask 022, into a folder where an earlier run's outputs
lie (the demo must replace them). The first file to ask runs it, under a lock every
pytest-xdist worker of the session shares; the others wait for it and read the same
folder (they only read). A run that failed is not kept: the next file runs it again and
fails on its own. CI's slow step is a budget (``.ci/run``): one run instead of two.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from pathlib import Path

import pytest

from cli_runner import run_cli_subprocess

#: The whole quick demo must finish well within this (about 40 s on 2 idle cores).
DEMO_TIMEOUT_S = 300

#: Names of the earlier run's outputs the demo must replace.
STALE = "stale-from-an-earlier-run"


def quick_demo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """``(OUT, stdout)`` of the session's ``replaystore demo --quick --out OUT``.

    Raises:
        AssertionError: the demo exited non-zero (its stderr is the message).
    """
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "quick-demo"
    root.mkdir(parents=True, exist_ok=True)
    out, stdout_file = root / "out", root / "stdout.json"
    with open(root / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other workers wait for the first run
        if stdout_file.exists():
            return out, json.loads(stdout_file.read_text(encoding="utf-8"))
        shutil.rmtree(out, ignore_errors=True)
        earlier = out / "trajectories"
        (earlier / "llamafactory").mkdir(parents=True)
        (earlier / "llamafactory" / f"{STALE}.json").write_text("[]")
        (earlier / "tasks.jsonl").write_text(json.dumps({"task_id": STALE}) + "\n")
        proc = run_cli_subprocess(
            "demo", "--quick", "--out", out, timeout=DEMO_TIMEOUT_S, umask=0o022
        )
        assert proc.returncode == 0, proc.stderr
        stdout_file.write_text(json.dumps(proc.stdout), encoding="utf-8")
        return out, proc.stdout
