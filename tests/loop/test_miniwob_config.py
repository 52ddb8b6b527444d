"""The loop's MiniWoB++ keys: training and held-out seeds never meet, fresh training seeds
every iteration, and clear errors for what does not fit."""

from __future__ import annotations

import pytest

from replaystore.errors import ConfigError
from replaystore.loop import LoopConfig

pytest.importorskip("miniwob", reason="the miniwob extra brings the MiniWoB++ pages")


def _config(**given: object) -> LoopConfig:
    return LoopConfig.from_mapping({"tasks": "miniwob:click-test,enter-text", **given})


def test_overlapping_training_and_held_out_seeds_are_refused_naming_them() -> None:
    with pytest.raises(ConfigError) as caught:
        _config(train_seeds="0-999", evaluation={"seeds": "990-1004"})
    message = str(caught.value)
    assert "share 10 seed(s): 990, 991, 992" in message and "never be trained on" in message
    assert "'0-999'" in message and "'990-1004'" in message


def test_each_iteration_takes_fresh_training_seeds_and_none_is_held_out() -> None:
    config = _config(
        iterations=4,
        seeds_per_iteration=3,
        bootstrap={"repeats": 2},
        train_seeds="0-99",
        evaluation={"seeds": "1000-1009"},
    )
    drawn = [config.train_seeds(k) for k in range(4)]
    assert drawn[0] == [0, 1, 2, 3, 4, 5]  # demonstrations: repeats x seeds_per_iteration
    assert drawn[1:] == [[6, 7, 8], [9, 10, 11], [12, 13, 14]]
    every = [seed for seeds in drawn for seed in seeds]
    assert len(every) == len(set(every))
    assert not set(every) & set(range(1000, 1010))
    assert config.on_miniwob and config.evaluation_tasks() == "miniwob:click-test,enter-text"


def test_too_few_training_seeds_for_the_iterations_is_an_error() -> None:
    with pytest.raises(ConfigError, match="holds 5 seeds"):
        _config(train_seeds="0-4", seeds_per_iteration=2, iterations=3)


@pytest.mark.parametrize(
    ("given", "words"),
    [
        ({"tasks": "miniwob:no-such-task"}, "unknown MiniWoB"),
        ({"evaluation": {"tasks": "suite"}}, "evaluation.tasks must be 'miniwob:"),
        ({"evaluation": {"seeds": "9-1"}}, "evaluation.seeds: seeds '9-1'"),
        ({"train_seeds": "x"}, "train_seeds: seeds 'x'"),
        ({"tasks_per_iteration": 4}, "tasks_per_iteration is not for MiniWoB"),
        ({"seeds_per_iteration": 0}, "seeds_per_iteration must be an integer >= 1"),
    ],
)
def test_bad_miniwob_settings_are_named(given: dict, words: str) -> None:
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace("+", r"\+")):
        _config(**given)


def test_held_out_tasks_need_miniwob_training_tasks() -> None:
    with pytest.raises(ConfigError, match=r"evaluation\.tasks is for MiniWoB"):
        LoopConfig.from_mapping({"evaluation": {"tasks": "miniwob:click-test"}})


def test_a_miniwob_task_list_is_not_a_path() -> None:
    resolved = _config().resolved()
    assert resolved["tasks"] == "miniwob:click-test,enter-text"
