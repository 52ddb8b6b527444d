"""The ``trajectories`` demo part: the web-agent loop in a real Chromium, quick mode.

The no-browser path and the demo's configuration are fast tests here. The checks on
a real run's files (Chromium) are in ``tests/demos/test_quick_demo.py``, on the one
quick ``replaystore demo`` run that also feeds the other parts' checks.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from replaystore.demos import PARTS
from replaystore.demos.trajectories import DemoConfig, run
from replaystore.rollouts.scripted import ScriptedPolicy


def test_part_is_registered_between_transitions_and_experience() -> None:
    assert PARTS.index("transitions") < PARTS.index("trajectories")
    if "experience" in PARTS:
        assert PARTS.index("trajectories") < PARTS.index("experience")


def test_the_scripted_policy_gets_better_with_every_iteration_of_the_demo() -> None:
    """The demo's learning curve comes from the policy's skill schedule: fewer wasted
    clicks and wrong answers every iteration, at every difficulty."""
    for cfg in (DemoConfig(), DemoConfig.quick()):
        policy = ScriptedPolicy(
            mistake_rate=cfg.mistake_rate,
            wrong_answer_rate=cfg.wrong_answer_rate,
            improvement=cfg.improvement,
        )
        for difficulty in (1, 2, 3):
            skills = [policy.skill(it, difficulty) for it in range(1, cfg.iterations + 1)]
            mistakes = [m for m, _ in skills]
            wrong = [w for _, w in skills]
            assert all(a > b for a, b in itertools.pairwise(wrong)), (cfg, wrong)
            assert all(a >= b for a, b in itertools.pairwise(mistakes))
            assert wrong[0] - wrong[-1] >= 0.4  # a clear rise, not noise
        assert policy.skill(1, 3)[1] > policy.skill(1, 1)[1]  # harder tasks fail more


def test_without_a_browser_the_part_says_how_to_get_one_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("playwright")
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.delenv("REPLAYSTORE_CHROMIUM", raising=False)
    monkeypatch.setenv("PATH", str(empty))  # no chromium on PATH
    monkeypatch.setenv("PLAYWRIGHT_BROWSERS_PATH", str(empty))  # no Playwright-managed one
    out = tmp_path / "trajectories"
    (out / "storage").mkdir(parents=True)
    lines = run(out, quick=True)
    assert lines[0].startswith("SKIPPED (no browser): no Chromium found: install one")
    assert "apt-get install chromium" in lines[0]
    assert "other parts still run" in lines[1]
    assert [p.name for p in out.iterdir()] == ["storage"]  # an earlier run's outputs are kept
