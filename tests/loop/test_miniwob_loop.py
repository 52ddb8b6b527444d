"""The loop's held-out protocol on MiniWoB++, end to end with the fake tools (fast): the
experts' demonstrations, a served model that always answers a string (a degenerate
model), every policy played on one fixed held-out set, scored by the pages themselves.

The real tools run the same loop in tests/demos/test_miniwob_demo.py (slow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from replaystore.trajectories.storage import TrajectoryStorage

from .fake_tools import loop_command, make_fake_model, make_fake_tools

pytest.importorskip("miniwob", reason="the miniwob extra brings the MiniWoB++ pages")


def _pairs(root: Path) -> dict[int, set[tuple[str, int]]]:
    storage = TrajectoryStorage(root)
    out: dict[int, set[tuple[str, int]]] = {}
    for file in storage.files():
        for trajectory in storage.read_file(file):
            reference = trajectory[0]["observation"].task.evaluator_reference
            out.setdefault(file.iteration, set()).add((reference["miniwob"], reference["seed"]))
    return out


def test_every_policy_is_measured_on_one_held_out_set_it_never_trained_on(
    tmp_path: Path, chromium: str | None
) -> None:
    config = {
        "out": "run",
        "iterations": 2,
        "tasks": "miniwob:click-test,focus-text",
        "train_seeds": "0-999",
        "seeds_per_iteration": 2,
        "evaluation": {"seeds": "5000-5002"},
        "tools_dir": str(make_fake_tools(tmp_path)),
        "bootstrap": {"source": "scripted", "repeats": 2},
        "model": {"path": str(make_fake_model(tmp_path / "base")), "evaluate_untrained": True},
        "rollout": {
            "workers": 2,
            "viewport": [400, 300],
            "max_steps": {"easy": 2},
            "settle_s": 0.05,  # MiniWoB++ pages do not navigate (as the MiniWoB demo)
        },
        "serve": {"startup_timeout_s": 30.0},
        "policy": {"max_retries": 0},
        "train": {"final": False},
    }
    done = loop_command(tmp_path, config, env={"OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    run = tmp_path / "run"
    summary = json.loads((run / "summary.json").read_text())
    rows = summary["iterations"]
    assert [r["policy"] for r in rows] == ["demonstrations", "model"]
    # The experts solve the held-out set; the fake model answers a string, which the
    # pages do not score (no string matching): 0 on every task.
    assert rows[0]["eval"]["tasks"] == {"click-test": 1.0, "focus-text": 1.0}
    assert rows[0]["eval"]["mean"] == 1.0 and rows[0]["eval"]["episodes"] == 6
    for row in rows[1:]:
        assert row["eval"]["mean"] == 0.0 and row["eval"]["seeds"] == "5000-5002"
    assert summary["untrained"]["eval"]["mean"] == 0.0
    # The untrained model's figures have the iterations' shape (task -> rate).
    assert summary["untrained"]["eval"]["tasks"] == {"click-test": 0.0, "focus-text": 0.0}
    assert summary["evaluation"] == {
        "tasks": "miniwob:click-test,focus-text",
        "seeds": "5000-5002",
        "train_seeds": "0-999",
        "scored_by": "the pages' own reward (WOB_RAW_REWARD_GLOBAL > 0), greedy decoding",
    }
    # Fresh training seeds every iteration (the demonstrations: repeats x 2 of them).
    assert [r["train_seeds"] for r in rows] == [[0, 3], [4, 5]]
    trained = _pairs(run / "storage")
    held = _pairs(run / "heldout" / "storage")
    baseline = _pairs(run / "baseline" / "storage")
    train_seeds = {seed for pairs in trained.values() for _, seed in pairs}
    assert train_seeds == set(range(6))
    expected = {(t, s) for t in ("click-test", "focus-text") for s in (5000, 5001, 5002)}
    assert set(held) == {1, 2} and all(pairs == expected for pairs in held.values())
    assert baseline == {1: expected}
    # The curve beside the summary, and the journal's stage.
    with Image.open(run / "learning_curve.png") as image:
        assert image.format == "PNG"
    journal = json.loads((run / "journal.json").read_text())
    assert all(it["stages"]["heldout"]["done"] for it in journal["iterations"])
    assert "held-out success 100%" in done.stdout + done.stderr
    # The viewer on the run's storage draws the loop's held-out curve from its summary,
    # iterations numbered as the loop numbers them, labelled by what acted.
    pytest.importorskip("httpx")
    from starlette.testclient import TestClient

    from replaystore.view import build_app

    html = TestClient(build_app("trajectory_storage", run / "storage")).get("/").text
    loop = html[html.index('id="loop"') : html.index("</section>")]
    assert "held-out success per iteration (seeds 5000-5002)" in loop
    assert "0: demonstrations" in loop and "1: model checkpoints/000" in loop
