"""``replaystore demo`` without a browser: the trajectories part is one SKIPPED line.

The quick demo through the real entry point, every part, is one run in
``tests/demos/test_quick_demo.py`` (slow), whose outputs feed the checks of every part.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import run_cli


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
