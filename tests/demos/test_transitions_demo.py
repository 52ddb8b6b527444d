"""The ``transitions`` demo part (DQN): progress on a terminal only, and an honest quick mode.

The runs here are the real demo with its environment steps cut to a few hundred
(``train_dqn`` wrapped to shorten the config), so each takes about a second; the
demo trains twice (the 1-step and the n-step target), SHORT_STEPS each.
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

SHORT_STEPS = 200


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


def test_quick_mode_reports_both_runs_and_says_it_is_not_meant_to_solve(
    tmp_path: Path, short_training
):
    lines = demo.run(tmp_path, quick=True)
    (average,) = [line for line in lines if line.startswith("average return")]
    assert "quick mode is a smoke run, not meant to solve CartPole" in average
    assert "without --quick, trains until this reaches 195" in average
    assert (tmp_path / "learning_curve.png").is_file()
    assert lines[0].startswith("1-step run: ") and f"in {SHORT_STEPS} environment steps" in lines[0]
    assert lines[1].startswith("3-step run (n_step=3): ")
    assert f"in {SHORT_STEPS} environment steps" in lines[1]
    assert average.startswith("average return of the last 20 episodes: 1-step ")
    assert ", 3-step " in average
    header = lines.index(
        f"learning curves: average return of the episodes ending in each tenth of "
        f"{SHORT_STEPS:,} environment steps"
    )
    for offset, label in ((1, "1-step"), (2, "3-step")):
        cells = lines[header + offset].split(":", 1)[1].split()
        assert lines[header + offset].startswith(f"  {label}: ") and len(cells) == 10
        assert all(cell == "-" or float(cell) > 0 for cell in cells)
    assert any(line.startswith("replay (3-step run): ") for line in lines)
    assert (tmp_path / "replay-memmap-3step").is_dir()


def test_the_n_step_run_trains_on_the_buffers_n_step_entries(one_thread, monkeypatch):
    seen: list[set[str]] = []
    real = demo.ReplayBuffer.sample_batch

    def spy(self, batch_size, **kwargs):
        batch = real(self, batch_size, **kwargs)
        seen.append(set(batch.keys()))
        return batch

    monkeypatch.setattr(demo.ReplayBuffer, "sample_batch", spy)
    cfg = demo.DQNConfig(max_steps=150, learning_starts=100, stop_when_solved=False, n_step=3)
    result = demo.train_dqn(cfg)
    result.buffer.close()
    assert seen and all({"n_step_return", "n_step_terminated"} <= keys for keys in seen)


def test_text_curve_averages_the_episodes_ending_in_each_span():
    result = demo.DQNResult(
        returns=[10.0, 20.0, 30.0],
        episode_ends=[5, 8, 30],
        steps=30,
        seconds=0.0,
        samples=0,
        replay_seconds=0.0,
        buffer=None,  # type: ignore[arg-type]
    )
    assert demo.text_curve(result, 30, bins=3).split() == ["15.0", "-", "30.0"]


def test_progress_bar_on_a_terminal_shows_episodes_and_return(
    tmp_path: Path, short_training, monkeypatch
):
    terminal = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    demo.run(tmp_path, quick=True)
    drawn = terminal.getvalue()
    assert "1-step DQN on CartPole" in drawn and "3-step DQN on CartPole" in drawn
    assert "episodes " in drawn and "avg of last" in drawn
    # quick mode: a bar over each run's known number of steps
    assert f"/{demo.QUICK_STEPS // 2}" in drawn


def test_no_progress_output_when_stderr_is_not_a_terminal(tmp_path: Path, short_training, capsys):
    demo.run(tmp_path, quick=True)
    assert capsys.readouterr().err == ""
