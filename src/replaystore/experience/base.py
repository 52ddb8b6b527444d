"""AWorld's ``aworld.replay_buffer.base``: the same names, from :mod:`replaystore.experience`.

Every AWorld test and example imports from that module, so switching is a
change of the module path only::

    # from aworld.replay_buffer.base import DataRow, ExpMeta, Experience, ReplayBuffer
    from replaystore.experience.base import DataRow, ExpMeta, Experience, ReplayBuffer

The classes are replaystore's own (see :mod:`replaystore.experience`):
:class:`ReplayBuffer` takes any storage (``InMemoryStorage`` by default, a new
one per buffer, where AWorld's default argument shares one between buffers),
samplers take a seed, and storages check rows at ``store``.
``QueryCondition`` and ``QueryFilter`` are here because AWorld's ``base``
imports them too. ``TaskSampler`` is AWorld's name for
:class:`~replaystore.experience.sampling.TaskBatchSampler` (the same class; here,
and only here, without a deprecation warning).
"""

from __future__ import annotations

from typing import TypeVar

from replaystore.experience.buffer import ReplayBuffer
from replaystore.experience.query_filter import QueryCondition, QueryFilter
from replaystore.experience.rows import DataRow, Experience, ExpMeta
from replaystore.experience.sampling import (
    Converter,
    DefaultConverter,
    RandomTaskSample,
    Sampler,
)
from replaystore.experience.sampling import TaskBatchSampler as TaskSampler
from replaystore.experience.storage import InMemoryStorage, Storage

T = TypeVar("T")

__all__ = [
    "Converter",
    "DataRow",
    "DefaultConverter",
    "ExpMeta",
    "Experience",
    "InMemoryStorage",
    "QueryCondition",
    "QueryFilter",
    "RandomTaskSample",
    "ReplayBuffer",
    "Sampler",
    "Storage",
    "T",
    "TaskSampler",
]
