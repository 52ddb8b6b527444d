"""Tensor transition replay: ObjectRL's ``ReplayBuffer`` API with full checkpoints.

``replaystore.TransitionBuffer`` and ``replaystore.transitions.ReplayBuffer`` are
the same class. See :class:`~replaystore.transitions.buffer.ReplayBuffer`.

Modules: ``schema`` (columns and validation), ``storage`` (where the columns
live: RAM / memmap / CUDA), ``writer`` (where new items go: the ring cursor and
the checked copy of adds), ``sampler`` (which items are picked: random draws,
epochs, gathers), ``prioritized`` (proportional priorities over a SumTree),
``checkpoint`` (atomic save/load), ``buffer`` (the composition and its API).
"""

from __future__ import annotations

from replaystore.transitions.buffer import ReplayBuffer
from replaystore.transitions.schema import FieldSpec

TransitionBuffer = ReplayBuffer

__all__ = ["FieldSpec", "ReplayBuffer", "TransitionBuffer"]
