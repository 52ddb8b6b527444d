"""Utilities around the trajectory buffer (WebGym's ``webgym/utils``).

* :class:`TaskHistory` (``task_history``): attempt levels 0-5 per task, level weights.
* :class:`TaskSampler` (``task_sampler``): which tasks the next rollout runs.
* :class:`Blocklist` (``blocklist``): websites that blocked the agent, with expiry.
* ``images``: image files as base64 data URLs or ``file://`` URLs, in message lists.

Names are resolved lazily, so ``import replaystore.pipeline.images`` does not pay
for the others (the task sampler imports torch through the trajectory package).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from replaystore._lazy import lazy_exports

__all__ = [
    "DEFAULT_LEVEL_WEIGHTS",
    "Blocklist",
    "BlocklistManager",
    "TaskHistory",
    "TaskSampler",
    "load_tasks",
    "normalize_domain",
]

_LAZY = {
    "Blocklist": "replaystore.pipeline.blocklist",
    "BlocklistManager": "replaystore.pipeline.blocklist",
    "normalize_domain": "replaystore.pipeline.blocklist",
    "TaskHistory": "replaystore.pipeline.task_history",
    "DEFAULT_LEVEL_WEIGHTS": "replaystore.pipeline.task_history",
    "TaskSampler": "replaystore.pipeline.task_sampler",
    "load_tasks": "replaystore.pipeline.task_sampler",
}

if TYPE_CHECKING:
    from replaystore.pipeline.blocklist import Blocklist, BlocklistManager, normalize_domain
    from replaystore.pipeline.task_history import DEFAULT_LEVEL_WEIGHTS, TaskHistory
    from replaystore.pipeline.task_sampler import TaskSampler, load_tasks


__getattr__, __dir__ = lazy_exports("replaystore.pipeline", globals(), _LAZY)
