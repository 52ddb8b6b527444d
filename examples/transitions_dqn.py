"""Double DQN with prioritized replay on CartPole-v1, top to bottom (CleanRL style).

    python examples/transitions_dqn.py                      # stops when solved (~40 s)
    python examples/transitions_dqn.py --total-steps 2000   # a smoke run

Needs gymnasium: pip install "replaystore[demo]"
"""

from __future__ import annotations

import argparse
import copy
import os
from collections import deque

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from replaystore import TransitionBuffer

parser = argparse.ArgumentParser()
parser.add_argument("--total-steps", type=int, default=int(os.environ.get("STEPS", 100_000)))
parser.add_argument("--seed", type=int, default=3)
parser.add_argument("--checkpoint", default="runs/cartpole-dqn/buffer")
args = parser.parse_args()

torch.set_num_threads(1)
torch.manual_seed(args.seed)
rng = np.random.default_rng(args.seed)
env = gym.make("CartPole-v1")

q = nn.Sequential(nn.Linear(4, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 2))
target = copy.deepcopy(q)
optim = torch.optim.Adam(q.parameters(), lr=1e-3)

# Transitions live in a memory map on the CPU; batches are TensorDicts on `device`.
rb = TransitionBuffer(
    device=torch.device("cpu"),
    storing_device=torch.device("cpu"),
    buffer_size=50_000,
    sampler="prioritized",  # proportional PER: alpha=0.6, beta=0.4 by default
    seed=args.seed,
)

obs, _ = env.reset(seed=args.seed)
ep_return, recent = 0.0, deque(maxlen=20)
for step in range(1, args.total_steps + 1):
    eps = max(0.02, 1.0 - step / 10_000)
    if rng.random() < eps:
        action = int(rng.integers(2))
    else:
        with torch.no_grad():
            action = int(q(torch.as_tensor(obs)).argmax())
    next_obs, reward, terminated, truncated, _ = env.step(action)
    rb.add({"obs": obs, "action": action, "reward": reward, "next_obs": next_obs,
            "done": terminated})  # fmt: skip
    obs, ep_return = next_obs, ep_return + reward
    if terminated or truncated:
        recent.append(ep_return)
        print(f"step {step}: return {ep_return:.0f}, average of last 20 {np.mean(recent):.1f}")
        obs, ep_return = env.reset()[0], 0.0
        if len(recent) == 20 and np.mean(recent) >= 195:
            print("solved")
            break

    if step < 1_000:
        continue
    rb.beta = 0.4 + 0.6 * step / args.total_steps  # anneal importance weights towards 1
    batch = rb.sample_batch(64)  # obs, action, reward, next_obs, done, index, weight
    with torch.no_grad():
        next_a = q(batch["next_obs"]).argmax(1, keepdim=True)  # Double DQN
        next_q = target(batch["next_obs"]).gather(1, next_a).squeeze(1)
        y = batch["reward"] + 0.99 * next_q * (~batch["done"]).float()
    q_sa = q(batch["obs"]).gather(1, batch["action"].unsqueeze(1)).squeeze(1)
    loss = (batch["weight"] * nn.functional.smooth_l1_loss(q_sa, y, reduction="none")).mean()
    optim.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(q.parameters(), 10.0)
    optim.step()
    rb.update_priorities(batch["index"], (y - q_sa).detach().abs())
    if step % 500 == 0:
        target.load_state_dict(q.state_dict())

# A full checkpoint: transitions, priorities and RNG state (atomic; no pickle).
rb.save(args.checkpoint)
restored = TransitionBuffer("cpu", "cpu", 50_000, sampler="prioritized")
restored.load(args.checkpoint)
print(f"saved and reloaded {len(restored)} transitions from {args.checkpoint}.metadata")
env.close()
