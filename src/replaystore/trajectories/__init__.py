"""WebGym-style web-agent trajectories: components, replay buffer, storage, prompts, export.

* :class:`ReplayBuffer` (alias :data:`TrajectoryBuffer`): the training-sample dataset.
* :class:`TrajectoryStorage`: immutable JSONL iteration files; ``ReplayBuffer.from_storage``.
* components: :class:`Task`, :class:`Observation`, :class:`Action`, :class:`Response`,
  :class:`Reward`, :class:`Step` and their JSON converters.
* :class:`ConversationBuilder`, :func:`decompose_raw_response`, :func:`get_action_string`:
  prompts and response parsing.
* :func:`export_llamafactory`, :func:`export_buffer`: LLaMA-Factory datasets.
* :func:`import_webgym`: safe import of WebGym ``.pt`` iteration files.
* ``index``: the trajectory rules (dummy, final reward, success, keypoints) and
  the step index, shared by storage and the buffer.

Names are resolved lazily: ``import replaystore.trajectories.storage`` (or the
components) does not import torch; the buffer and the WebGym importer do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from replaystore._lazy import lazy_exports

__all__ = [
    "Action",
    "BufferStats",
    "ConversationBuilder",
    "ExportReport",
    "JSONResponseParser",
    "Observation",
    "ReplayBuffer",
    "Response",
    "Reward",
    "SampleList",
    "Step",
    "TagParser",
    "Task",
    "ThinkActionParser",
    "TrajectoryBuffer",
    "TrajectoryStorage",
    "decompose_raw_response",
    "export_buffer",
    "export_llamafactory",
    "get_action_string",
    "import_webgym",
    "load_webgym_file",
    "step_from_dict",
    "step_to_dict",
    "trajectory_from_dicts",
    "trajectory_to_dicts",
]

_LAZY = {
    "Action": "replaystore.trajectories.components",
    "BufferStats": "replaystore.trajectories.buffer",
    "ConversationBuilder": "replaystore.trajectories.context",
    "ExportReport": "replaystore.trajectories.export",
    "JSONResponseParser": "replaystore.trajectories.response_decomposer",
    "Observation": "replaystore.trajectories.components",
    "ReplayBuffer": "replaystore.trajectories.buffer",
    "Response": "replaystore.trajectories.components",
    "Reward": "replaystore.trajectories.components",
    "SampleList": "replaystore.trajectories.buffer",
    "Step": "replaystore.trajectories.components",
    "TagParser": "replaystore.trajectories.response_decomposer",
    "Task": "replaystore.trajectories.components",
    "ThinkActionParser": "replaystore.trajectories.response_decomposer",
    "TrajectoryBuffer": "replaystore.trajectories.buffer",
    "TrajectoryStorage": "replaystore.trajectories.storage",
    "decompose_raw_response": "replaystore.trajectories.response_decomposer",
    "export_buffer": "replaystore.trajectories.export",
    "export_llamafactory": "replaystore.trajectories.export",
    "get_action_string": "replaystore.trajectories.response_decomposer",
    "import_webgym": "replaystore.trajectories.webgym_import",
    "load_webgym_file": "replaystore.trajectories.webgym_import",
    "step_from_dict": "replaystore.trajectories.components",
    "step_to_dict": "replaystore.trajectories.components",
    "trajectory_from_dicts": "replaystore.trajectories.components",
    "trajectory_to_dicts": "replaystore.trajectories.components",
}

if TYPE_CHECKING:
    from replaystore.trajectories.buffer import (
        BufferStats,
        ReplayBuffer,
        SampleList,
        TrajectoryBuffer,
    )
    from replaystore.trajectories.components import (
        Action,
        Observation,
        Response,
        Reward,
        Step,
        Task,
        step_from_dict,
        step_to_dict,
        trajectory_from_dicts,
        trajectory_to_dicts,
    )
    from replaystore.trajectories.context import ConversationBuilder
    from replaystore.trajectories.export import ExportReport, export_buffer, export_llamafactory
    from replaystore.trajectories.response_decomposer import (
        JSONResponseParser,
        TagParser,
        ThinkActionParser,
        decompose_raw_response,
        get_action_string,
    )
    from replaystore.trajectories.storage import TrajectoryStorage
    from replaystore.trajectories.webgym_import import import_webgym, load_webgym_file


__getattr__, __dir__ = lazy_exports("replaystore.trajectories", globals(), _LAZY)
