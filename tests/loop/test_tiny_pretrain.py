"""The tiny model's optional pre-training on synthetic find-and-copy text
(``model.tiny.pretrain_steps``): its examples hold their own answers, their names are
made of the words given (random letters by default, never a page's text), and the
builder runs it in the LLaMA-Factory environment and records what it reached in
``tiny_model.json``."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import pytest

from replaystore.errors import ConfigError
from replaystore.loop import LoopConfig
from replaystore.loop.tiny_model import synthetic_example, training_segments
from replaystore.loop.tools import make_tiny_model

_LINE = re.compile(r"^(\S+) '(.*)' id=(\d+)$")


def _page(prompt: str) -> dict[tuple[str, str], str]:
    return {
        (m.group(1), m.group(2)): m.group(3)
        for m in map(_LINE.match, prompt.splitlines())
        if m is not None
    }


def test_each_kind_of_example_holds_its_answer_in_its_prompt() -> None:
    rng = random.Random(0)
    for _ in range(200):
        prompt, answer = synthetic_example(rng, 0)  # find the id of the named line
        role, name = re.search(r"Target: (\S+) '(.*)' id=$", prompt).groups()  # type: ignore[union-attr]
        assert answer == _page(prompt)[(role, name)] + "\n"
        prompt, answer = synthetic_example(rng, 1)  # copy the goal's quoted words
        quoted = re.search(r'Task: .*? "(.*)"\.\nReply: "$', prompt).group(1)  # type: ignore[union-attr]
        assert answer == f'{quoted}"\n'
        prompt, answer = synthetic_example(rng, 2)  # copy the goal's name, then its id
        role, name = re.search(r'the (\S+) "(.*)"\.\n', prompt).groups()  # type: ignore[union-attr]
        assert prompt.endswith(f"Target: {role} '")
        assert answer == f"{name}' id={_page(prompt)[(role, name)]}\n"


def test_a_training_page_is_asked_for_several_of_its_lines_each_id_a_target() -> None:
    rng = random.Random(3)
    asked = []
    for _ in range(300):
        segments = training_segments(rng)
        assert not segments[0][1] and all(isinstance(t, str) for t, _ in segments)
        if not segments[0][0].endswith("\n") or segments[0][0].startswith("Task: "):
            continue  # the other two kinds: one prompt, one answer
        page = _page(segments[0][0])
        queries = segments[1:]
        assert len(queries) % 2 == 0
        pairs = list(zip(queries[::2], queries[1::2], strict=True))
        asked.append(len(pairs))
        for (query, is_target), (answer, answer_is_target) in pairs:
            assert not is_target and answer_is_target
            role, name = re.fullmatch(r"Target: (\S+) '(.*)' id=", query).groups()  # type: ignore[union-attr]
            assert answer == page[(role, name)] + "\n"
        assert len({q for (q, _), _ in pairs}) == len(pairs)  # distinct lines
    assert asked and max(asked) == 4 and min(asked) >= 2


def test_names_are_made_of_the_given_words_else_random_letters() -> None:
    rng = random.Random(1)
    text = " ".join(" ".join(synthetic_example(rng)) for _ in range(300))
    for word in ("Submit", "Cancel", "Agustina", "Lorem"):  # words of MiniWoB++ pages
        assert f"'{word}'" not in text and f'"{word}"' not in text
    words = ["alpha", "Beta", "gamma"]
    for _ in range(50):
        prompt, _answer = synthetic_example(rng, 0, words)
        for line in prompt.splitlines()[:-1]:
            name = _LINE.match(line).group(2)  # type: ignore[union-attr]
            # a word may be capitalised or end in a punctuation mark, as a page's words do
            assert {w.rstrip(".,:").lower() for w in name.split()} <= {"alpha", "beta", "gamma"}


def test_pretrain_steps_is_a_checked_setting(tmp_path: Path) -> None:
    config = LoopConfig.from_mapping(
        {"out": "run", "model": {"tiny": {"pretrain_steps": 5}}}, base_dir=tmp_path
    )
    assert config["model"]["tiny"]["pretrain_steps"] == 5
    with pytest.raises(ConfigError, match=r"model\.tiny\.pretrain_steps must be an integer >= 0"):
        LoopConfig.from_mapping(
            {"out": "run", "model": {"tiny": {"pretrain_steps": -1}}}, base_dir=tmp_path
        )


def test_the_builder_pretrains_and_records_the_accuracy(tmp_path: Path, real_tools: Any) -> None:
    settings = make_tiny_model(
        real_tools.train_python,
        tmp_path / "model",
        layers=1,
        hidden=128,
        heads=2,
        vocab=300,
        pretrain_steps=3,
    )
    pretrain = settings["pretrain"]
    assert pretrain["steps"] == 3 and pretrain["loss_last"] > 0
    assert set(pretrain["accuracy"]) == {"find the id", "copy the quote", "copy then find"}
    assert all(0.0 <= v <= 1.0 for v in pretrain["accuracy"].values())
    saved = json.loads((tmp_path / "model" / "tiny_model.json").read_text())
    assert saved["pretrain"] == pretrain
    log = (tmp_path / "model.log").read_text()
    assert "pretrain step 3/3" in log
