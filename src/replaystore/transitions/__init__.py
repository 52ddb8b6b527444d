"""Tensor transition replay: ObjectRL's ``ReplayBuffer`` API with full checkpoints.

``replaystore.TransitionBuffer`` and ``replaystore.transitions.ReplayBuffer`` are
the same class. See :class:`~replaystore.transitions.buffer.ReplayBuffer`.

Modules: ``schema`` (columns and validation), ``storage`` (where the columns
live: RAM / memmap / CUDA), ``writer`` (where new items go: the ring cursor and
the checked copy of adds), ``sampler`` (which items are picked: the ``Sampler``
protocol, uniform and prioritized samplers, random draws, epochs, gathers),
``slices`` (``SliceSampler``: slices of consecutive steps within episodes),
``prioritized`` (proportional priorities over a SumTree),
``nstep`` (n-step returns computed at sample time, ``ReplayBuffer(n_step=)``),
``rate_limiter`` (actors and learner in step: Reverb's ``MinSize`` and
``SampleToInsertRatio``), ``checkpoint`` (atomic save/load), ``buffer`` (the
composition and its API).
"""

from __future__ import annotations

from replaystore.errors import RateLimitTimeout
from replaystore.transitions.buffer import ReplayBuffer
from replaystore.transitions.nstep import nstep_fields
from replaystore.transitions.rate_limiter import RateLimiter
from replaystore.transitions.sampler import (
    Draw,
    PrioritizedSampler,
    RingState,
    Sampler,
    UniformSampler,
)
from replaystore.transitions.schema import FieldSpec
from replaystore.transitions.slices import SliceSampler

TransitionBuffer = ReplayBuffer

__all__ = [
    "Draw",
    "FieldSpec",
    "PrioritizedSampler",
    "RateLimitTimeout",
    "RateLimiter",
    "ReplayBuffer",
    "RingState",
    "Sampler",
    "SliceSampler",
    "TransitionBuffer",
    "UniformSampler",
    "nstep_fields",
]
