"""The ``loop`` demo part: demonstrations, LLaMA-Factory training, vLLM serving, the model acts.

The quick run (module fixture, several minutes on 2 cores: marked slow) is what CI runs
with the real tools; the skip line without tool environments is a fast test.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cli_runner import run_cli
from replaystore.demos import OPT_IN_PARTS, PARTS
from replaystore.demos.loop import run
from replaystore.trajectories.storage import TrajectoryStorage


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


@pytest.fixture(scope="module")
def loop_demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    from replaystore.loop import ToolsMissingError, default_tools_dir, find_tools

    try:
        find_tools(default_tools_dir())
    except ToolsMissingError as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true and {exc}", pytrace=False)
        pytest.skip(str(exc))
    out = tmp_path_factory.mktemp("demo")
    result = run_cli("demo", "--quick", "--part", "loop", "--out", out)
    assert result.returncode == 0, result.stdout + result.stderr
    if "SKIPPED (no browser)" in result.stdout and os.environ.get("CI", "").lower() != "true":
        pytest.skip("no browser for the loop demo")
    return out / "loop", result.stdout


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_quick_loop_trains_a_model_that_solves_a_quarter_of_the_suite(
    loop_demo: tuple[Path, str],
) -> None:
    out, stdout = loop_demo
    summary = json.loads((out / "summary.json").read_text())
    rows = summary["iterations"]
    assert [r["policy"] for r in rows] == ["demonstrations", "model"]
    assert rows[0]["checkpoint"] is None and rows[1]["checkpoint"] == "checkpoints/000"
    loss = rows[0]["train_loss"]
    assert loss["last"] < loss["first"]
    assert rows[-1]["success_rate"] >= 0.25, rows
    assert "no scripted policy" in stdout and "measured" in stdout


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_quick_loop_records_which_policy_and_checkpoint_produced_each_trajectory(
    loop_demo: tuple[Path, str],
) -> None:
    out, _ = loop_demo
    trajectories = TrajectoryStorage(out / "storage").load_all()
    policies = {
        (t[-1]["trajectory_metadata"]["policy"], t[-1]["trajectory_metadata"]["checkpoint"])
        for t in trajectories
    }
    assert policies == {("demonstrations", None), ("model", "checkpoints/000")}
    prompts = [
        json.loads(s["response"].raw_prompt)
        for t in trajectories
        for s in t
        if s["response"].raw_prompt
    ]
    assert prompts and all(isinstance(m["content"], str) for p in prompts for m in p)
