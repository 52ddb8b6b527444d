"""Shared fixtures for the transition-buffer tests.

``make_buffer`` builds a ReplayBuffer on the storage under test: every test that
uses it runs once on RAM storage and once on a memory map (``storage_kind``).
Transitions come from :func:`transition` / :func:`batch`, whose values are a
function of an integer id, so a stored row tells which add it came from:
``obs = [id, id+0.5, id+0.25]``, ``action = id % 5``, ``reward = id / 2``,
``done = id % 3 == 0``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from replaystore.transitions import ReplayBuffer

OBS_OFFSETS = np.array([0.0, 0.5, 0.25], dtype=np.float32)


def transition(i: int) -> dict[str, Any]:
    """One transition with id ``i`` (numpy arrays and Python scalars, like a gym loop)."""
    return {
        "obs": np.float32(i) + OBS_OFFSETS,
        "action": i % 5,
        "reward": i / 2,
        "done": i % 3 == 0,
    }


def batch(ids: np.ndarray | range | list[int]) -> dict[str, np.ndarray]:
    """Transitions with the given ids, as a mapping of stacked arrays."""
    a = np.asarray(ids, dtype=np.int64)
    return {
        "obs": a.astype(np.float32)[:, None] + OBS_OFFSETS,
        "action": a % 5,
        "reward": (a / 2).astype(np.float32),
        "done": a % 3 == 0,
    }


def ids_of(td: Any) -> np.ndarray:
    """The ids of the rows of a sampled TensorDict (checks every key agrees)."""
    obs = td["obs"].cpu().numpy()
    ids = obs[:, 0].astype(np.int64)
    np.testing.assert_array_equal(obs, ids.astype(np.float32)[:, None] + OBS_OFFSETS)
    np.testing.assert_array_equal(td["action"].cpu().numpy(), ids % 5)
    np.testing.assert_allclose(td["reward"].cpu().numpy(), ids / 2)
    np.testing.assert_array_equal(td["done"].cpu().numpy(), ids % 3 == 0)
    return ids


@pytest.fixture(params=["memory", "memmap"])
def storage_kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def make_buffer(storage_kind: str) -> Iterator[Callable[..., ReplayBuffer]]:
    """``make_buffer(buffer_size, **kwargs)`` on the storage under test; closed afterwards."""
    made: list[ReplayBuffer] = []

    def make(buffer_size: int = 10, **kwargs: Any) -> ReplayBuffer:
        kwargs.setdefault("seed", 0)
        buf = ReplayBuffer(
            torch.device("cpu"), torch.device("cpu"), buffer_size, storage=storage_kind, **kwargs
        )
        made.append(buf)
        return buf

    yield make
    for buf in made:
        buf.close()


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    """A checkpoint path prefix (``<ckpt>.metadata`` is what save writes)."""
    return tmp_path / "checkpoints" / "buffer"
