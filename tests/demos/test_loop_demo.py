"""The ``loop`` demo part on the bundled suite: opt-in, and its skip line (fast).

Its stages run with stand-in tools in step 1 (tests/loop/: the suite's experts, the
blocklist, the baseline over the tasks left after it, resume, failures). The one run of
the loop with the real tools in CI is on MiniWoB++ (tests/demos/test_miniwob_demo.py,
slow), where learning is measured on held-out seeds: on the suite, training and
evaluation share their 16 instances, so a success rate there would be memorisation.
``replaystore demo --part loop`` runs the suite with the real tools (docs/loop.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from replaystore.demos import OPT_IN_PARTS, PARTS
from replaystore.demos.loop import run


def test_part_is_opt_in_so_plain_demo_keeps_its_time() -> None:
    assert "loop" in OPT_IN_PARTS and "loop" not in PARTS


def test_without_tool_environments_one_skipped_line_names_the_setup_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REPLAYSTORE_LOOP_TOOLS", str(tmp_path / "no-tools"))
    lines = run(tmp_path / "loop", quick=True)
    assert len(lines) == 1
    assert lines[0].startswith("SKIPPED") and "bash .ci/install-loop-tools" in lines[0]
    assert not (tmp_path / "loop").exists()
