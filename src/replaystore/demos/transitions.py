"""Demo of ``replaystore.transitions``: Double DQN with prioritized replay on CartPole-v1.

The actor (epsilon-greedy policy) steps the environment and adds each transition
to a prioritized :class:`~replaystore.transitions.ReplayBuffer` (memory-mapped
on the CPU, ObjectRL's default); the learner samples batches, weights the Huber
TD loss by the importance weights and feeds the absolute TD errors back with
``update_priorities``. Actor and learner alternate in one thread so a seed
gives the same run every time.

Two runs share everything (seed, network, hyperparameters) but the target: the
1-step run regresses on ``reward + gamma * Q'(next_obs)``, the 3-step run on
the buffer's n-step entries (``ReplayBuffer(..., n_step=3)``):
``n_step_return + n_step_discount * Q'(n_step_next_obs)``, with no bootstrap
after a termination (a time-limit truncation ends the window but still
bootstraps). The full run trains each until the average return of its last 20
episodes reaches 195 (CartPole's classic "solved" bar), the 3-step run for at
most as many environment steps as the 1-step run took, so both curves cover the
same budget; the quick run splits a few thousand steps between them, a smoke run
that checks everything works and is not meant to solve (it ends well below 195,
and says so). Both modes plot both learning curves in one PNG, print them as
text, save the 1-step buffer's checkpoint and check it loads back bit-exact. On
a terminal a progress bar (stderr) shows steps, episodes and the recent average
return.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import itertools
import logging
import shutil
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from replaystore.atomic import atomic_write_bytes
from replaystore.transitions import ReplayBuffer

__all__ = ["DQNConfig", "run", "train_dqn"]

logger = logging.getLogger(__name__)

SOLVED_RETURN = 195.0
WINDOW = 20

EpisodeCallback = Callable[[int, list[float]], None]
"""Called after each episode with the environment steps so far and every return so far."""


@dataclass(slots=True)
class DQNConfig:
    """Hyperparameters of the demo (tuned for CartPole-v1 on one CPU thread)."""

    seed: int = 3
    max_steps: int = 100_000
    stop_when_solved: bool = True
    buffer_size: int = 50_000
    batch_size: int = 64
    learning_starts: int = 1_000
    gamma: float = 0.99
    lr: float = 1e-3
    hidden: int = 128
    target_every: int = 500
    eps_start: float = 1.0
    eps_end: float = 0.02
    eps_fraction_steps: int = 10_000
    alpha: float = 0.6
    beta_start: float = 0.4
    grad_clip: float = 10.0
    n_step: int = 1
    """Horizon of the TD target: 1 (one-step Double DQN) or n (the buffer's n-step entries)."""


@dataclass(slots=True)
class DQNResult:
    """What a training run produced."""

    returns: list[float]
    episode_ends: list[int]
    """The environment step at which each episode of ``returns`` ended."""
    steps: int
    seconds: float
    samples: int
    replay_seconds: float
    buffer: ReplayBuffer

    @property
    def final_average(self) -> float:
        tail = self.returns[-WINDOW:]
        return float(np.mean(tail)) if tail else 0.0


_QUICK_NOTE = (
    " (quick mode is a smoke run, not meant to solve CartPole; the full run, without "
    "--quick, trains until this reaches 195)"
)
N_STEP = 3
"""The horizon of the demo's n-step run."""
QUICK_STEPS = 3_000
"""Environment steps of the quick mode, split evenly between the 1-step and the n-step run."""


def td_update(
    q: nn.Module, optim: torch.optim.Optimizer, batch: Any, y: torch.Tensor, grad_clip: float
) -> torch.Tensor:
    """One importance-weighted Huber step of ``q`` towards the targets ``y`` on ``batch``
    (``obs``, ``action``, ``weight``); the TD errors, for the priorities."""
    q_taken = q(batch["obs"]).gather(1, batch["action"].unsqueeze(1)).squeeze(1)
    td = y - q_taken
    loss = (batch["weight"] * nn.functional.smooth_l1_loss(q_taken, y, reduction="none")).mean()
    optim.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(q.parameters(), grad_clip)
    optim.step()
    return td


def q_network(obs_dim: int, n_actions: int, hidden: int) -> nn.Module:
    """The demos' Q-network: two hidden layers of ``hidden`` units, one output per action."""
    return nn.Sequential(
        nn.Linear(obs_dim, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, n_actions),
    )


def train_dqn(
    cfg: DQNConfig, buffer_path: Path | None = None, on_episode: EpisodeCallback | None = None
) -> DQNResult:
    """Train Double DQN with prioritized replay on CartPole-v1; returns episode returns.

    Args:
        cfg: hyperparameters; ``max_steps`` bounds the environment steps;
            ``n_step > 1`` trains on the buffer's n-step entries.
        buffer_path: directory for the memory-mapped buffer (a temporary one if None).
        on_episode: called after every episode with ``(steps, returns)`` (e.g. to
            drive a progress bar); it must not keep ``returns``, which keeps growing.
    """
    import gymnasium as gym

    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    env = gym.make("CartPole-v1")
    obs_space, act_space = env.observation_space, env.action_space
    if not isinstance(obs_space, gym.spaces.Box) or not isinstance(act_space, gym.spaces.Discrete):
        raise TypeError(f"CartPole-v1 spaces: {obs_space} / {act_space}; expected Box / Discrete")
    obs_dim = obs_space.shape[0]
    n_actions = int(act_space.n)
    q = q_network(obs_dim, n_actions, cfg.hidden)
    target = copy.deepcopy(q)
    optim = torch.optim.Adam(q.parameters(), lr=cfg.lr)
    buf = ReplayBuffer(
        torch.device("cpu"),
        torch.device("cpu"),
        cfg.buffer_size,
        sampler="prioritized",
        alpha=cfg.alpha,
        beta=cfg.beta_start,
        path=buffer_path,
        seed=cfg.seed,
        n_step=cfg.n_step,
        gamma=cfg.gamma,
    )

    returns: list[float] = []
    episode_ends: list[int] = []
    recent: deque[float] = deque(maxlen=WINDOW)
    obs, _ = env.reset(seed=cfg.seed)
    episode_return = 0.0
    samples = 0
    replay_seconds = 0.0
    start = time.perf_counter()
    step = 0
    for step in range(1, cfg.max_steps + 1):
        # Actor: epsilon-greedy step, one transition into the buffer.
        frac = min(1.0, step / cfg.eps_fraction_steps)
        eps = cfg.eps_start + frac * (cfg.eps_end - cfg.eps_start)
        if rng.random() < eps:
            action = int(rng.integers(n_actions))
        else:
            with torch.no_grad():
                action = int(q(torch.as_tensor(obs)).argmax())
        next_obs, reward, terminated, truncated, _ = env.step(action)
        buf.add(
            {
                "obs": obs,
                "action": action,
                "reward": float(reward),
                "next_obs": next_obs,
                # The episode ends at either; only a termination stops the bootstrap.
                "done": bool(terminated or truncated),
                "terminated": bool(terminated),
            }
        )
        episode_return += float(reward)
        obs = next_obs
        if terminated or truncated:
            returns.append(episode_return)
            episode_ends.append(step)
            recent.append(episode_return)
            episode_return = 0.0
            obs, _ = env.reset()
            if on_episode is not None:
                on_episode(step, returns)
            if cfg.stop_when_solved and len(recent) == WINDOW and np.mean(recent) >= SOLVED_RETURN:
                break

        # Learner: one prioritized batch, importance-weighted Double DQN update.
        if step < cfg.learning_starts:
            continue
        buf.beta = cfg.beta_start + (1.0 - cfg.beta_start) * min(1.0, step / cfg.max_steps)
        t0 = time.perf_counter()
        batch = buf.sample_batch(cfg.batch_size)
        replay_seconds += time.perf_counter() - t0
        if cfg.n_step > 1:
            reward, discount = batch["n_step_return"], batch["n_step_discount"]
            bootstrap_obs, terminal = batch["n_step_next_obs"], batch["n_step_terminated"]
        else:
            reward, discount = batch["reward"], cfg.gamma
            bootstrap_obs, terminal = batch["next_obs"], batch["terminated"]
        with torch.no_grad():
            next_action = q(bootstrap_obs).argmax(dim=1, keepdim=True)
            next_q = target(bootstrap_obs).gather(1, next_action).squeeze(1)
            y = reward + discount * next_q * (~terminal).float()
        td = td_update(q, optim, batch, y, cfg.grad_clip)
        t0 = time.perf_counter()
        buf.update_priorities(batch["index"], td.detach().abs())
        replay_seconds += time.perf_counter() - t0
        samples += cfg.batch_size
        if step % cfg.target_every == 0:
            target.load_state_dict(q.state_dict())
    env.close()
    return DQNResult(
        returns=returns,
        episode_ends=episode_ends,
        steps=step,
        seconds=time.perf_counter() - start,
        samples=samples,
        replay_seconds=replay_seconds,
        buffer=buf,
    )


def _label(n_step: int) -> str:
    return "1-step" if n_step == 1 else f"{n_step}-step"


def _moving_average(returns: list[float]) -> list[float]:
    return [float(np.mean(returns[max(0, i - WINDOW + 1) : i + 1])) for i in range(len(returns))]


def _save_png(fig: Any, path: Path) -> None:
    import matplotlib.pyplot as plt

    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100)
    plt.close(fig)
    atomic_write_bytes(path, png.getvalue())


def plot_returns(returns: list[float], path: Path, title: str) -> None:
    """One run's returns per episode and their moving average (the distributed demo's curve)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    x = np.arange(1, len(returns) + 1)
    ax.plot(x, returns, color="0.7", linewidth=0.8, label="episode return")
    if len(returns) >= 2:
        ax.plot(x, _moving_average(returns), color="C0", label=f"average of last {WINDOW}")
    ax.axhline(SOLVED_RETURN, color="C3", linestyle="--", linewidth=0.8, label="solved (195)")
    ax.set_xlabel("episode")
    ax.set_ylabel("return")
    ax.set_title(title)
    ax.legend(loc="upper left")
    fig.tight_layout()
    _save_png(fig, path)


def _plot_runs(runs: list[tuple[str, DQNResult]], path: Path, title: str) -> None:
    """Several runs' returns against environment steps: each episode faint, the average bold."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (label, result) in enumerate(runs):
        color = f"C{i}"
        ax.plot(result.episode_ends, result.returns, color=color, alpha=0.25, linewidth=0.7)
        if result.returns:
            avg = _moving_average(result.returns)
            ax.plot(
                result.episode_ends, avg, color=color, label=f"{label}: average of last {WINDOW}"
            )
    ax.axhline(SOLVED_RETURN, color="C3", linestyle="--", linewidth=0.8, label="solved (195)")
    ax.set_xlabel("environment step")
    ax.set_ylabel("episode return")
    ax.set_title(title)
    ax.legend(loc="upper left")
    fig.tight_layout()
    _save_png(fig, path)


def text_curve(result: DQNResult, steps: int, bins: int = 10) -> str:
    """The average return of the episodes that ended in each of ``bins`` equal spans of
    ``steps`` environment steps (``-`` where none ended), as one line of numbers."""
    ends = np.asarray(result.episode_ends)
    returns = np.asarray(result.returns)
    edges = np.linspace(0, steps, bins + 1)
    cells = []
    for lo, hi in itertools.pairwise(edges):
        inside = returns[(ends > lo) & (ends <= hi)]
        cells.append(f"{inside.mean():6.1f}" if inside.size else "     -")
    return " ".join(cells)


def _progress_bar(cfg: DQNConfig) -> Any:
    """A tqdm bar over environment steps on stderr, shown only when stderr is a terminal."""
    from tqdm import tqdm

    return tqdm(
        total=None if cfg.stop_when_solved else cfg.max_steps,
        desc=f"{_label(cfg.n_step)} DQN on CartPole"
        + (f" (until avg {SOLVED_RETURN:.0f})" if cfg.stop_when_solved else ""),
        unit="step",
        disable=not sys.stderr.isatty(),
        leave=False,
    )


def _train_with_progress(cfg: DQNConfig, buffer_path: Path) -> DQNResult:
    """One training run with a progress bar, in a fresh memory-mapped buffer at ``buffer_path``."""
    bar = _progress_bar(cfg)

    def on_episode(step: int, returns: list[float]) -> None:
        bar.update(step - bar.n)
        recent = returns[-WINDOW:]
        bar.set_postfix_str(
            f"episodes {len(returns)}, return {returns[-1]:.0f}, "
            f"avg of last {len(recent)} {np.mean(recent):.1f}"
        )

    try:
        shutil.rmtree(buffer_path, ignore_errors=True)  # a fresh buffer, not a previous run's
        return train_dqn(cfg, buffer_path=buffer_path, on_episode=on_episode)
    finally:
        bar.close()


def _verdict(result: DQNResult, quick: bool, budget_note: str = "") -> str:
    if result.final_average >= SOLVED_RETURN and len(result.returns) >= WINDOW:
        return f"{result.final_average:.1f} (solved: >= 195)"
    if quick:
        return f"{result.final_average:.1f}"
    return f"{result.final_average:.1f} (NOT solved{budget_note})"


def _replay_line(label: str, result: DQNResult, what: str) -> str:
    per_sample_us = 1e6 * result.replay_seconds / max(result.samples, 1)
    return (
        f"replay ({label} run): {result.samples} transitions sampled, "
        f"{result.samples / max(result.replay_seconds, 1e-9):,.0f} samples/s "
        f"({what} + update_priorities, {per_sample_us:.2f} us per transition)"
    )


def run(out: Path, quick: bool) -> list[str]:
    """Train the 1-step and the n-step run, plot, checkpoint and reload; returns the summary
    lines the CLI prints."""
    out.mkdir(parents=True, exist_ok=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    one = DQNConfig()
    if quick:
        one.max_steps = QUICK_STEPS // 2
        one.learning_starts = 300
        one.eps_fraction_steps = QUICK_STEPS // 2
        one.stop_when_solved = False
    memmap_dir = out / "replay-memmap"
    nstep_dir = out / f"replay-memmap-{N_STEP}step"
    try:
        result = _train_with_progress(one, memmap_dir)
        # The n-step run gets at most the 1-step run's environment steps: one budget for both.
        multi = dataclasses.replace(one, n_step=N_STEP, max_steps=result.steps)
        nstep = _train_with_progress(multi, nstep_dir)
    finally:
        torch.set_num_threads(threads)
    nstep.buffer.close()
    label = _label(N_STEP)
    buf = result.buffer
    curve = out / "learning_curve.png"
    title = f"Double DQN + prioritized replay, CartPole-v1 (seed {one.seed}): 1-step vs {label}"
    if quick:
        title += f"\nquick mode: {one.max_steps:,}-step smoke runs, not meant to reach 195"
    runs = [("1-step target", result), (f"{label} target (n_step={N_STEP})", nstep)]
    _plot_runs(runs, curve, title)

    ckpt = out / "checkpoint" / "buffer"
    buf.save(ckpt)
    restored = ReplayBuffer("cpu", "cpu", buf.buffer_size, sampler="prioritized", storage="memory")
    restored.load(ckpt)
    original, loaded = buf.sample_all(), restored.sample_all()
    exact = all(torch.equal(original[k], loaded[k]) for k in original.keys())  # noqa: SIM118
    exact = exact and np.array_equal(buf.priorities(), restored.priorities())
    if not exact:
        raise RuntimeError(f"checkpoint {ckpt} did not load back bit-exact")
    same_draws = torch.equal(buf.sample_batch(32)["index"], restored.sample_batch(32)["index"])
    stored = restored.size
    buf.flush()
    buf.close()
    restored.close()

    budget = f" within the 1-step run's {result.steps:,} steps"
    draws = "identical" if same_draws else "DIFFERENT"
    span = max(result.steps, nstep.steps)
    lines = [
        f"1-step run: {len(result.returns)} episodes in {result.steps} environment steps "
        f"({result.seconds:.1f} s)",
        f"{label} run (n_step={N_STEP}): {len(nstep.returns)} episodes in {nstep.steps} "
        f"environment steps ({nstep.seconds:.1f} s)",
        f"average return of the last {WINDOW} episodes: 1-step {_verdict(result, quick)}, "
        f"{label} {_verdict(nstep, quick, budget)}" + (_QUICK_NOTE if quick else ""),
        f"learning curves: average return of the episodes ending in each tenth of "
        f"{span:,} environment steps",
        f"  1-step: {text_curve(result, span)}",
        f"  {label}: {text_curve(nstep, span)}",
        _replay_line("1-step", result, "sample"),
        _replay_line(label, nstep, f"sample with {label} entries"),
        f"checkpoint (1-step run's buffer): {ckpt.with_name('buffer.metadata')} ({stored} "
        f"transitions; reloaded bit-exact, next draws {draws})",
        f"memory-mapped buffer directories: {memmap_dir} (1-step), {nstep_dir} ({label})",
        f"learning curves (both runs): {curve}",
    ]
    if not quick and result.final_average < SOLVED_RETURN:
        logger.warning("the DQN demo did not reach an average return of %s", SOLVED_RETURN)
    return lines
