"""Demo part ``distributed``: Ape-X style Double DQN on Ray (opt-in: ``--part distributed``).

K CartPole actor processes (Ray actors) step epsilon-greedy policies whose
weights the learner broadcasts (one ``ray.put`` per broadcast, read by every
actor) and feed a sharded prioritized buffer through batching writers; one
learner samples prioritized batches over the shards, trains Double DQN (the
transitions demo's network and hyperparameters) and routes the new priorities
back by global index. One rate limiter for all shards keeps them in step
(Reverb's ``SampleToInsertRatio``): the learner waits for ``learning_starts``
transitions, then for actors when it gets more than half a chunk of updates
ahead of one update per new transition, and actors wait for the learner when
they get that far ahead. The full run trains until the average return of the last 20
episodes reaches 195; quick mode is a smoke run that prints the throughput in
and out, the samples per insert the limiter kept and the per-shard fill.

Needs the ``ray`` extra (``pip install "replaystore[ray]"``) and gymnasium
(the ``demo`` extra). Starts a local Ray runtime when none is connected.
"""

from __future__ import annotations

import copy
import logging
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from replaystore.demos.transitions import (
    SOLVED_RETURN,
    WINDOW,
    DQNConfig,
    plot_returns,
    q_network,
    td_update,
)

__all__ = ["CartPoleActor", "run"]

logger = logging.getLogger(__name__)


class CartPoleActor:
    """One rollout worker: a CartPole-v1 env, a Q-network copy, a batching writer.

    Args:
        buffer: the ShardedReplayBuffer client (its batches go round-robin to shards).
        seed: env and exploration seed of this worker.
        hidden: Q-network width (the learner's).
    """

    def __init__(self, buffer: Any, seed: int, hidden: int) -> None:
        import gymnasium as gym

        from replaystore.distributed import BatchingWriter

        torch.set_num_threads(1)
        self.env = gym.make("CartPole-v1")
        self.q = q_network(4, 2, hidden)
        self.rng = np.random.default_rng(seed)
        self.writer = BatchingWriter(buffer, batch_size=64, max_delay_s=0.05, max_in_flight=4)
        self.obs, _ = self.env.reset(seed=seed)
        self.episode_return = 0.0

    def set_weights(self, state: dict[str, np.ndarray]) -> None:
        """Load the learner's broadcast weights (NumPy arrays from the object store)."""
        self.q.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in state.items()})

    def run(self, steps: int, eps: float) -> list[float]:
        """Step ``steps`` times epsilon-greedily; returns the returns of finished episodes."""
        finished = []
        for _ in range(steps):
            if self.rng.random() < eps:
                action = int(self.rng.integers(2))
            else:
                with torch.no_grad():
                    action = int(self.q(torch.as_tensor(self.obs)).argmax())
            next_obs, reward, terminated, truncated, _ = self.env.step(action)
            self.writer.add(
                {
                    "obs": np.asarray(self.obs, dtype=np.float32),
                    "action": np.int64(action),
                    "reward": np.float32(reward),
                    "next_obs": np.asarray(next_obs, dtype=np.float32),
                    "done": bool(terminated),
                }
            )
            self.episode_return += float(reward)
            self.obs = next_obs
            if terminated or truncated:
                finished.append(self.episode_return)
                self.episode_return = 0.0
                self.obs, _ = self.env.reset()
        self.writer.flush()
        return finished


def _limiter_line(counted: Any, min_size: int, spi: float, error_buffer: float) -> str:
    """What the rate limiter kept: samples per insert after the first ``min_size``."""
    after = counted.inserts - min_size
    achieved = f"{counted.samples / after:.1f}" if after > 0 else "n/a (no insert after it)"
    return (
        f"rate limiter: {counted.inserts:,} inserts, {counted.samples:,} samples: "
        f"{achieved} samples per insert after the first {min_size:,} (target {spi:g}, "
        f"error buffer {error_buffer:g} samples)"
    )


def _state(q: nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in q.state_dict().items()}


def run(out: Path, quick: bool, *, num_actors: int = 2, num_shards: int = 2) -> list[str]:
    """Run the demo; returns the summary lines the CLI prints.

    Raises:
        ImportError: Ray or gymnasium is not installed (the message says which extra).
    """
    from replaystore.distributed import ShardedReplayBuffer
    from replaystore.distributed._ray import import_ray
    from replaystore.transitions import RateLimiter

    ray = import_ray()
    out.mkdir(parents=True, exist_ok=True)
    started = not ray.is_initialized()
    if started:
        ray.init(
            num_cpus=num_actors + 1,
            include_dashboard=False,
            object_store_memory=200 * 1024 * 1024,
            log_to_driver=False,
            configure_logging=False,
        )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    cfg = DQNConfig()
    chunk = 50  # env steps per actor between weight broadcasts
    max_steps = 1_200 if quick else cfg.max_steps
    learning_starts = 400 if quick else cfg.learning_starts
    eps_steps = 1_000 if quick else cfg.eps_fraction_steps
    # One update of batch_size per new transition: batch_size samples per insert.
    # The error buffer is half a chunk of transitions: within a chunk the learner
    # may run that far ahead of the actors' inserts (or they of its samples),
    # then it waits for them (or they for it).
    spi = float(cfg.batch_size)
    error_buffer = spi * chunk * num_actors / 2
    limiter = RateLimiter(learning_starts, samples_per_insert=spi, error_buffer=error_buffer)
    buf = ShardedReplayBuffer(
        num_shards,
        cfg.buffer_size // num_shards,
        sampler="prioritized",
        alpha=cfg.alpha,
        beta=cfg.beta_start,
        seed=cfg.seed,
        rate_limiter=limiter,
    )
    actor_cls = ray.remote(CartPoleActor).options(num_cpus=0)
    actors = [actor_cls.remote(buf, cfg.seed + 1 + i, cfg.hidden) for i in range(num_actors)]
    try:
        torch.manual_seed(cfg.seed)
        q = q_network(4, 2, cfg.hidden)
        target = copy.deepcopy(q)
        optim = torch.optim.Adam(q.parameters(), lr=cfg.lr)
        returns: list[float] = []
        recent: deque[float] = deque(maxlen=WINDOW)
        steps = updates = 0
        sample_s = 0.0
        start = time.perf_counter()
        while steps < max_steps:
            weights = ray.put(_state(q))  # one copy in the object store, read by all
            frac = min(1.0, steps / eps_steps)
            eps = cfg.eps_start + frac * (cfg.eps_end - cfg.eps_start)
            for a in actors:
                a.set_weights.remote(weights)
            pending = [a.run.remote(chunk, eps) for a in actors]
            new_steps = chunk * num_actors
            # The learner trains while the actors step: one update per new transition.
            if steps >= learning_starts:
                for _ in range(new_steps):
                    buf_beta = cfg.beta_start + (1.0 - cfg.beta_start) * min(1.0, steps / max_steps)
                    if updates % 100 == 0:
                        buf.beta = buf_beta
                    t0 = time.perf_counter()
                    batch = buf.sample_batch(cfg.batch_size)
                    sample_s += time.perf_counter() - t0
                    with torch.no_grad():
                        nxt = q(batch["next_obs"]).argmax(dim=1, keepdim=True)
                        next_q = target(batch["next_obs"]).gather(1, nxt).squeeze(1)
                        y = batch["reward"] + cfg.gamma * next_q * (~batch["done"]).float()
                    td = td_update(q, optim, batch, y, cfg.grad_clip)
                    t0 = time.perf_counter()
                    buf.update_priorities(batch["index"], td.detach().abs())
                    sample_s += time.perf_counter() - t0
                    updates += 1
                    if updates % cfg.target_every == 0:
                        target.load_state_dict(q.state_dict())
            for finished in ray.get(pending):
                returns.extend(finished)
                recent.extend(finished)
            steps += new_steps
            if not quick and len(recent) == WINDOW and np.mean(recent) >= SOLVED_RETURN:
                break
        seconds = time.perf_counter() - start
        fill = buf.shard_sizes()
        stored = sum(fill)
        counted = buf.rate_limiter  # a copy of the shared limiter's counters
        assert counted is not None
    finally:
        for a in actors:
            ray.kill(a)
        buf.terminate()
        torch.set_num_threads(threads)
        if started:
            ray.shutdown()

    average = float(np.mean(returns[-WINDOW:])) if returns else 0.0
    solved = average >= SOLVED_RETURN and len(returns) >= WINDOW
    curve = out / "learning_curve.png"
    title = f"Ape-X style Double DQN on Ray: {num_actors} actors, {num_shards} shards"
    if quick:
        title += "\nquick mode: a smoke run, not meant to reach 195"
    plot_returns(returns, curve, title)
    if not quick and not solved:
        logger.warning("the distributed DQN demo did not reach an average return of 195")
    note = (
        " (solved: >= 195)"
        if solved
        else " (quick mode: a smoke run, not meant to solve CartPole)"
        if quick
        else " (NOT solved)"
    )
    return [
        f"{num_actors} CartPole actors -> {num_shards} prioritized shards -> 1 Double DQN learner",
        f"episodes: {len(returns)} in {steps} environment steps ({seconds:.1f} s)",
        f"average return of the last {min(WINDOW, len(returns))} episodes: {average:.1f}{note}",
        f"transitions in: {stored / seconds:,.0f}/s "
        "(paced by the learner: one update per new transition)",
        f"samples out during training: {updates * cfg.batch_size / max(sample_s, 1e-9):,.0f}/s "
        f"({updates} batches of {cfg.batch_size}, sample + update_priorities, "
        "waits on the rate limiter included)",
        _limiter_line(counted, learning_starts, spi, error_buffer),
        "per-shard fill: "
        + ", ".join(
            f"shard {i} {n:,}/{cfg.buffer_size // num_shards:,}" for i, n in enumerate(fill)
        ),
        f"learning curve: {curve}",
    ]
