"""replaystore: experience storage and sampling for reinforcement learning.

Three buffers, one library:

* :class:`TransitionBuffer` (``replaystore.transitions``): fixed-shape tensor
  transitions in RAM, a memory map or on CUDA; uniform or prioritized sampling;
  full checkpoints. API of ObjectRL's ``replay_buffers``.
* :class:`ExperienceBuffer` (``replaystore.experience``): queryable agent
  experience rows in memory, SQLite or shared between processes. API of
  AWorld's ``replay_buffer``.
* :class:`TrajectoryBuffer` (``replaystore.trajectories``): multimodal web-agent
  trajectories that become fine-tuning data. API of WebGym's ``webgym/data``.

The buffers are imported lazily, so ``import replaystore`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from replaystore._lazy import lazy_exports

__version__ = "0.1.0"

__all__ = ["ExperienceBuffer", "TrajectoryBuffer", "TransitionBuffer", "__version__"]

_LAZY = {
    "TransitionBuffer": "replaystore.transitions",
    "ExperienceBuffer": "replaystore.experience",
    "TrajectoryBuffer": "replaystore.trajectories",
}

if TYPE_CHECKING:
    from replaystore.experience import ExperienceBuffer
    from replaystore.trajectories import TrajectoryBuffer
    from replaystore.transitions import TransitionBuffer


__getattr__, __dir__ = lazy_exports("replaystore", globals(), _LAZY)
