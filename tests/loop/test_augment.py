"""Name swaps (``train.name_swaps``): copies of SFT records with the goal's quoted names
replaced everywhere by other words, so that copying the name fits the data and
remembering it does not."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from replaystore.errors import ConfigError
from replaystore.loop import LoopConfig
from replaystore.loop.augment import quoted_names, swap_names


def _record(goal: str, page: str, reply: str) -> dict[str, Any]:
    return {
        "conversations": [
            {"from": "human", "value": f"Task: {goal}\nAccessibility tree:\n{page}"},
            {"from": "gpt", "value": reply},
        ],
        "system": 'Actions: click("12"), fill("12", "text").',
        "images": [],
    }


BUTTON = _record(
    'Click on the "Ok" button.',
    "button 'Okay' id=1\nbutton 'Ok' id=2\nStaticText 'ipsum Ok' id=3",
    "<think>Click the 'Ok' button. Target: button 'Ok' id=2</think>\nAction: click(\"2\")",
)
ENTER = _record(
    'Enter "Agustina" into the text field and press Submit.',
    "textbox '' id=1\nbutton 'Submit' id=2",
    '<think>Type the name.</think>\nAction: fill("1", "Agustina")',
)
FOCUS = _record("Focus into the 2nd input box.", "textbox '' id=1\ntextbox '' id=2", "click")
WORDS = ["Joye", "lorem", "dolor", "Kenda", "ipsum", "Ok"]


def test_quoted_names_are_the_goals_double_quoted_strings_once_each() -> None:
    assert quoted_names('Click on the "Ok" button.') == ["Ok"]
    assert quoted_names('Enter "a b" and "c", then "a b".') == ["a b", "c"]
    assert quoted_names("Focus into the 2nd input box.") == []


def test_each_copy_swaps_the_name_everywhere_and_keeps_the_record_valid() -> None:
    out = swap_names([BUTTON, ENTER, FOCUS], WORDS, 3, np.random.default_rng(0))
    assert out[:3] == [BUTTON, ENTER, FOCUS]  # the originals first, unchanged
    assert len(out) == 3 + 3 + 3  # no copies of a record without a quoted name
    for copy in out[3:6]:
        human, gpt = (t["value"] for t in copy["conversations"])
        (new,) = quoted_names(human.split("\n", 1)[0])
        assert new not in ("Ok", "ipsum")  # a word the record did not hold already
        assert f"button '{new}' id=2" in human and "button 'Okay' id=1" in human
        assert f"StaticText 'ipsum {new}' id=3" in human  # whole words, everywhere
        assert f"Target: button '{new}' id=2" in gpt and 'click("2")' in gpt
        assert copy["system"] == BUTTON["system"] and "Ok'" not in human
    names = {quoted_names(c["conversations"][0]["value"].split("\n", 1)[0])[0] for c in out[3:6]}
    assert len(names) > 1  # drawn, not one word for all
    for copy in out[6:9]:
        human, gpt = (t["value"] for t in copy["conversations"])
        (new,) = quoted_names(human.split("\n", 1)[0])
        assert gpt.endswith(f'fill("1", "{new}")')


def test_no_copies_and_too_small_a_vocabulary_leave_the_records_as_they_are() -> None:
    assert swap_names([BUTTON], WORDS, 0, np.random.default_rng(0)) == [BUTTON]
    assert swap_names([BUTTON], ["Ok", "ipsum"], 2, np.random.default_rng(0)) == [BUTTON]
    with pytest.raises(ValueError, match="copies must be >= 0"):
        swap_names([BUTTON], WORDS, -1, np.random.default_rng(0))


def test_the_config_key_needs_miniwob_tasks(tmp_path: Any) -> None:
    config = LoopConfig.from_mapping(
        {"out": "run", "tasks": "miniwob:quick", "train": {"name_swaps": 4}}, base_dir=tmp_path
    )
    assert config["train"]["name_swaps"] == 4
    with pytest.raises(ConfigError, match=r"train\.name_swaps .* needs MiniWoB"):
        LoopConfig.from_mapping({"out": "run", "train": {"name_swaps": 4}}, base_dir=tmp_path)
    with pytest.raises(ConfigError, match="name_swaps"):
        LoopConfig.from_mapping(
            {"out": "run", "tasks": "miniwob:quick", "train": {"name_swaps": -1}},
            base_dir=tmp_path,
        )
