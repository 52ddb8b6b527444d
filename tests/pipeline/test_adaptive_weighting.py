"""``apply_adaptive_weighted_sampling``: WebGym's weighting, on TaskHistory and TaskHistoryManager.

WebGym's rule: ``level_weights=None`` is the default table (0:100 ... 5:0.001); a
mapping is the whole table, and a level it does not name weighs 1.0 (so ``{}`` is
uniform). The native rule (a mapping overrides the default table for the levels it
names) stays under :meth:`TaskHistory.weighted_order`.

The expected values below are WebGym's own outputs, recorded (not vendored, and not
read at test time, so the test stays offline): microsoft/webgym at commit
574a205e1176a295decde84879d94057ca763946, ``webgym/utils/task_history_manager.py``,
``TaskHistoryManager.compute_attempt_levels_from_trajectories`` on one-step
trajectories ``(task_id, final reward)`` over six tasks with ids 0..5, then
``apply_adaptive_weighted_sampling`` with each ``level_weights``; ``PROBABILITIES`` is
the ``p`` its ``np.random.choice(len(tasks), len(tasks), replace=False, p=p)`` got.
Both draw by successive weighted sampling without replacement, so our order for a
seed must be the order :func:`weighted_sample_without_replacement` draws from
WebGym's ``p`` with that seed.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pipeline.test_task_history import make_task, traj
from replaystore.pipeline.task_history import TaskHistory, webgym_level_weights
from replaystore.pipeline.task_history_manager import TaskHistoryManager
from replaystore.sampling import weighted_sample_without_replacement

HISTORIES: dict[str, list[tuple[int, float]]] = {
    "spread": [(0, 1), (1, 0), (1, 0), (3, 0), *[(4, 0)] * 4, *[(5, 0)] * 5],
    "solved_late": [(2, 0), (2, 0), (2, 1), (0, 0), (0, 0), (0, 0), (4, 0)],
}
#: WebGym's attempt_level column for each history.
LEVELS = {"spread": [5, 2, 0, 1, 4, 5], "solved_late": [3, 0, 5, 0, 1, 0]}

_SIXTH = [1 / 6] * 6
# (history, level_weights, WebGym's p), as recorded.
PROBABILITIES: list[tuple[str, dict[int, float] | None, list[float]]] = [
    (
        "spread",
        None,
        [9.008035e-06, 0.009008035167, 0.900803516737, 0.090080351674, 9.0080352e-05, 9.008035e-06],
    ),
    ("spread", {}, _SIXTH),
    ("spread", {0: 5.0}, [0.1, 0.1, 0.5, 0.1, 0.1, 0.1]),
    (
        "spread",
        {2: 3.0, 4: 0.5},
        [0.133333333333, 0.4, 0.133333333333, 0.133333333333, 0.066666666667, 0.133333333333],
    ),
    (
        "spread",
        {1: 0.2, 3: 7.0, 5: 0.05},
        [
            0.015151515152,
            0.30303030303,
            0.30303030303,
            0.060606060606,
            0.30303030303,
            0.015151515152,
        ],
    ),
    (
        "solved_late",
        None,
        [
            0.000322475581,
            0.322475580537,
            3.224756e-06,
            0.322475580537,
            0.032247558054,
            0.322475580537,
        ],
    ),
    ("solved_late", {}, _SIXTH),
    (
        "solved_late",
        {0: 5.0},
        [
            0.055555555556,
            0.277777777778,
            0.055555555556,
            0.277777777778,
            0.055555555556,
            0.277777777778,
        ],
    ),
    ("solved_late", {2: 3.0, 4: 0.5}, _SIXTH),
    (
        "solved_late",
        {1: 0.2, 3: 7.0, 5: 0.05},
        [
            0.682926829268,
            0.09756097561,
            0.00487804878,
            0.09756097561,
            0.019512195122,
            0.09756097561,
        ],
    ),
]
SEEDS = range(8)


def _webgym_order(p: list[float], seed: int) -> list[int]:
    """The order WebGym's distribution gives for ``seed`` (our sampler, WebGym's ``p``)."""
    return weighted_sample_without_replacement(np.array(p), len(p), seed).tolist()


def _history(name: str) -> tuple[list, TaskHistory]:
    tasks = [make_task(i) for i in range(6)]
    history = TaskHistory()
    history.update([traj(tasks[i], reward) for i, reward in HISTORIES[name]])
    return tasks, history


@pytest.mark.parametrize("name", sorted(HISTORIES))
def test_attempt_levels_are_webgyms(name: str) -> None:
    tasks, history = _history(name)
    assert history.levels(tasks).tolist() == LEVELS[name]


@pytest.mark.parametrize(("name", "level_weights", "p"), PROBABILITIES)
def test_task_history_weighs_as_webgym(
    name: str, level_weights: dict[int, float] | None, p: list[float]
) -> None:
    tasks, history = _history(name)
    for seed in SEEDS:
        got = history.apply_adaptive_weighted_sampling(tasks, level_weights, seed=seed)
        assert [int(t.task_id) for t in got] == _webgym_order(p, seed), seed


@pytest.mark.parametrize(("name", "level_weights", "p"), PROBABILITIES)
def test_task_history_manager_weighs_as_webgym(
    tmp_path, name: str, level_weights: dict[int, float] | None, p: list[float]
) -> None:
    frame = pd.DataFrame({"task_id": range(6), "attempt_level": LEVELS[name]})
    manager = TaskHistoryManager(str(tmp_path))
    for seed in SEEDS:
        got = manager.apply_adaptive_weighted_sampling(frame, level_weights, seed=seed)
        assert got["task_id"].tolist() == _webgym_order(p, seed), seed


def test_webgym_level_weights_gives_unnamed_levels_weight_one() -> None:
    assert webgym_level_weights({0: 5.0}).tolist() == [5, 1, 1, 1, 1, 1]
    assert webgym_level_weights({}).tolist() == [1.0] * 6
    assert webgym_level_weights(None).tolist() == [100, 10, 1, 0.1, 0.01, 0.001]
    with pytest.raises(ValueError, match=r"levels are 0\.\.5"):
        webgym_level_weights({6: 1.0})


def test_weighted_order_keeps_the_native_override_rule() -> None:
    tasks, history = _history("spread")
    override = [5, 10, 1, 0.1, 0.01, 0.001]  # {0: 5.0}: the other levels keep the defaults
    weights = np.array(override)[LEVELS["spread"]]
    for seed in SEEDS:
        got = history.weighted_order(tasks, {0: 5.0}, seed=seed)
        expected = weighted_sample_without_replacement(weights, 6, seed).tolist()
        assert [int(t.task_id) for t in got] == expected
