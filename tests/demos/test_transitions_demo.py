"""The ``transitions`` demo part (DQN): progress on a terminal only, and an honest quick mode.

The runs here are the real demo with its environment steps cut to a few hundred
(``train_dqn`` wrapped to shorten the config), so each takes about a second.
"""

from __future__ import annotations

import dataclasses
import io
import sys
from pathlib import Path

import pytest
import torch

from replaystore.demos import transitions as demo

pytest.importorskip("gymnasium")
pytest.importorskip("matplotlib")

SHORT_STEPS = 400


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def short_training(monkeypatch):
    """The demo's own training loop, stopped after SHORT_STEPS environment steps."""
    real = demo.train_dqn

    def shortened(cfg, **kwargs):
        cfg = dataclasses.replace(cfg, max_steps=SHORT_STEPS, learning_starts=100)
        return real(cfg, **kwargs)

    monkeypatch.setattr(demo, "train_dqn", shortened)


@pytest.fixture
def one_thread():
    """As the demo trains: one torch thread (many threads on tiny nets only contend)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_train_dqn_reports_every_episode(one_thread):
    seen: list[tuple[int, int, float]] = []
    cfg = demo.DQNConfig(max_steps=300, learning_starts=100, stop_when_solved=False)
    result = demo.train_dqn(
        cfg, on_episode=lambda step, returns: seen.append((step, len(returns), returns[-1]))
    )
    assert [n for _, n, _ in seen] == list(range(1, len(result.returns) + 1))
    steps = [s for s, _, _ in seen]
    assert steps == sorted(steps) and steps[-1] <= result.steps
    assert [r for _, _, r in seen] == result.returns
    # CartPole gives +1 per step, so the returns add up to the steps of finished episodes.
    assert sum(result.returns) == steps[-1]
    result.buffer.close()


def test_quick_mode_says_it_is_not_meant_to_solve(tmp_path: Path, short_training):
    lines = demo.run(tmp_path, quick=True)
    (average,) = [line for line in lines if line.startswith("average return")]
    assert "quick mode is a smoke run, not meant to solve CartPole" in average
    assert "without --quick, trains until this reaches 195" in average
    assert (tmp_path / "learning_curve.png").is_file()


def test_progress_bar_on_a_terminal_shows_episodes_and_return(
    tmp_path: Path, short_training, monkeypatch
):
    terminal = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    demo.run(tmp_path, quick=True)
    drawn = terminal.getvalue()
    assert "DQN on CartPole" in drawn
    assert "episodes " in drawn and "avg of last" in drawn
    assert f"/{3_000}" in drawn  # quick mode: a bar over its known number of steps


def test_no_progress_output_when_stderr_is_not_a_terminal(tmp_path: Path, short_training, capsys):
    demo.run(tmp_path, quick=True)
    assert capsys.readouterr().err == ""
