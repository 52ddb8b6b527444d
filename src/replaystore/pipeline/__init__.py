"""Utilities around the trajectory buffer (WebGym's ``webgym/utils``).

* :class:`TaskHistory` (``task_history``): attempt levels 0-5 per task, level weights.
* :class:`TaskSampler` (``task_sampler``): which tasks the next rollout runs.
* :class:`Blocklist` (``blocklist``): websites that blocked the agent, with expiry.
* ``images``: image files as base64 data URLs or ``file://`` URLs, in message lists
  (a compatibility name for :mod:`replaystore.images`).

WebGym's ``webgym.utils`` names, as drop-in layers over the above (same module
names, parameters and return shapes; DataFrames need the ``pandas`` extra):
``trajectory_storage`` (:func:`load_all_trajectories`,
:func:`save_trajectories_incremental`, ...), ``image_utils``
(:func:`encode_image_to_base64`, :func:`encode_image_to_file_url`,
:func:`convert_messages_to_path_format`), ``rollout_sampler``
(:class:`RolloutSampler`), ``task_history_manager`` (:class:`TaskHistoryManager`),
``blocklist_manager`` (:class:`BlocklistManager`).

Names are resolved lazily, so importing one module does not pay for the others;
no module of this package imports torch (``from replaystore.pipeline import
TaskHistory`` loads NumPy and the trajectory components only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from replaystore._lazy import lazy_exports

__all__ = [
    "DEFAULT_LEVEL_WEIGHTS",
    "Blocklist",
    "BlocklistManager",
    "RolloutSampler",
    "TaskHistory",
    "TaskHistoryManager",
    "TaskSampler",
    "cleanup_old_iterations",
    "convert_messages_to_path_format",
    "encode_image_to_base64",
    "encode_image_to_file_url",
    "get_next_iteration_number",
    "get_trajectory_stats",
    "load_all_trajectories",
    "load_last_iteration_trajectories",
    "load_tasks",
    "normalize_domain",
    "save_trajectories_incremental",
]

_TRAJECTORY_STORAGE = "replaystore.pipeline.trajectory_storage"
_IMAGE_UTILS = "replaystore.pipeline.image_utils"

_LAZY = {
    "Blocklist": "replaystore.pipeline.blocklist",
    "BlocklistManager": "replaystore.pipeline.blocklist_manager",
    "normalize_domain": "replaystore.pipeline.blocklist",
    "TaskHistory": "replaystore.pipeline.task_history",
    "DEFAULT_LEVEL_WEIGHTS": "replaystore.pipeline.task_history",
    "TaskSampler": "replaystore.pipeline.task_sampler",
    "load_tasks": "replaystore.pipeline.task_sampler",
    "RolloutSampler": "replaystore.pipeline.rollout_sampler",
    "TaskHistoryManager": "replaystore.pipeline.task_history_manager",
    "encode_image_to_base64": _IMAGE_UTILS,
    "encode_image_to_file_url": _IMAGE_UTILS,
    "convert_messages_to_path_format": _IMAGE_UTILS,
    "get_next_iteration_number": _TRAJECTORY_STORAGE,
    "save_trajectories_incremental": _TRAJECTORY_STORAGE,
    "load_all_trajectories": _TRAJECTORY_STORAGE,
    "load_last_iteration_trajectories": _TRAJECTORY_STORAGE,
    "cleanup_old_iterations": _TRAJECTORY_STORAGE,
    "get_trajectory_stats": _TRAJECTORY_STORAGE,
}

if TYPE_CHECKING:
    from replaystore.pipeline.blocklist import Blocklist, normalize_domain
    from replaystore.pipeline.blocklist_manager import BlocklistManager
    from replaystore.pipeline.image_utils import (
        convert_messages_to_path_format,
        encode_image_to_base64,
        encode_image_to_file_url,
    )
    from replaystore.pipeline.rollout_sampler import RolloutSampler
    from replaystore.pipeline.task_history import DEFAULT_LEVEL_WEIGHTS, TaskHistory
    from replaystore.pipeline.task_history_manager import TaskHistoryManager
    from replaystore.pipeline.task_sampler import TaskSampler, load_tasks
    from replaystore.pipeline.trajectory_storage import (
        cleanup_old_iterations,
        get_next_iteration_number,
        get_trajectory_stats,
        load_all_trajectories,
        load_last_iteration_trajectories,
        save_trajectories_incremental,
    )


__getattr__, __dir__ = lazy_exports("replaystore.pipeline", globals(), _LAZY)
