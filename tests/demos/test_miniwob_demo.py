"""The ``miniwob`` demo part: the loop on MiniWoB++, measured on seeds never trained on.

The quick run (module fixture, marked slow: CI's one real learning test) runs four easy
tasks with the real tools: the experts' demonstrations, LLaMA-Factory training of the
tiny model, vLLM serving it, the trained model acting alone, and every policy played on
one fixed held-out set of seeds, scored by the pages' own reward.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from cli_runner import run_cli
from replaystore.demos import OPT_IN_PARTS, PARTS
from replaystore.demos.miniwob import quick_config
from replaystore.rollouts.miniwob import QUICK_TASKS, parse_seeds
from replaystore.trajectories.storage import TrajectoryStorage

pytest.importorskip("miniwob", reason="the miniwob extra brings the MiniWoB++ pages")


def test_part_is_opt_in() -> None:
    assert "miniwob" in OPT_IN_PARTS and "miniwob" not in PARTS


@pytest.fixture(scope="module")
def miniwob_demo(
    tmp_path_factory: pytest.TempPathFactory, real_tools: Any, chromium: str | None
) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("demo")
    # One OpenMP thread per child: beside the other xdist worker's tests on 2 cores the
    # trainer's threads otherwise wait on each other (see tests/demos/test_loop_demo.py).
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")
        result = run_cli("demo", "--quick", "--part", "miniwob", "--out", out)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SKIPPED" not in result.stdout, result.stdout
    return out / "miniwob", result.stdout


def _seeds(root: Path) -> dict[int, set[tuple[str, int]]]:
    """(task, seed) pairs per stored iteration of a trajectory storage."""
    storage = TrajectoryStorage(root)
    out: dict[int, set[tuple[str, int]]] = {}
    for file in storage.files():
        for trajectory in storage.read_file(file):
            reference = trajectory[0]["observation"].task.evaluator_reference
            out.setdefault(file.iteration, set()).add((reference["miniwob"], reference["seed"]))
    return out


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_trained_model_solves_held_out_seeds(miniwob_demo: tuple[Path, str]) -> None:
    out, stdout = miniwob_demo
    summary = json.loads((out / "summary.json").read_text())
    rows = summary["iterations"]
    assert [r["policy"] for r in rows] == ["demonstrations", "model"]
    experts, model = rows[0]["eval"], rows[1]["eval"]
    assert sorted(model["tasks"]) == sorted(QUICK_TASKS)
    assert experts["mean"] >= 0.95, experts
    untrained = summary["untrained"]["eval"]
    assert untrained["mean"] <= 0.3, untrained  # the untrained model, on the same set
    assert model["mean"] >= 0.6, (model, untrained)
    assert model["episodes"] == len(QUICK_TASKS) * 10
    assert "held-out" in stdout and "measured" in stdout
    with Image.open(out / "learning_curve.png") as image:
        assert image.format == "PNG" and image.size[0] > 300


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_training_and_evaluation_seeds_never_overlap(miniwob_demo: tuple[Path, str]) -> None:
    out, _ = miniwob_demo
    summary = json.loads((out / "summary.json").read_text())
    trained = _seeds(out / "storage")
    held_out = _seeds(out / "heldout" / "storage")
    trained_seeds = {seed for pairs in trained.values() for _, seed in pairs}
    held_seeds = {seed for pairs in held_out.values() for _, seed in pairs}
    assert trained_seeds and held_seeds and not trained_seeds & held_seeds
    evaluation = parse_seeds(quick_config()["evaluation"]["seeds"])
    assert held_seeds == set(evaluation) and summary["evaluation"]["seeds"] == "100000-100009"
    # One fixed held-out set for every policy; fresh training seeds in every iteration.
    assert len({frozenset(pairs) for pairs in held_out.values()}) == 1
    assert len(held_out) == 2
    assert not trained[1] & trained[2]
    untrained = _seeds(out / "baseline" / "storage")
    assert set(untrained) == {1} and untrained[1] == held_out[1]
