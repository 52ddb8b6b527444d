"""WebGym-style web-agent trajectories: components, replay buffer, storage, prompts, export.

* :class:`ReplayBuffer` (alias :data:`TrajectoryBuffer`): the training-sample dataset.
* :class:`TrajectoryStorage`: immutable JSONL iteration files; ``ReplayBuffer.from_storage``.
* components: :class:`Task`, :class:`Observation`, :class:`Action`, :class:`Response`,
  :class:`Reward`, :class:`Step` and their JSON converters.
* :class:`ConversationBuilder`, :func:`decompose_raw_response`, :func:`get_action_string`:
  prompts and response parsing.
* :func:`export_llamafactory`, :func:`export_buffer`: LLaMA-Factory datasets.
* :func:`import_webgym`: safe import of WebGym ``.pt`` iteration files.
"""

from __future__ import annotations

from replaystore.trajectories.buffer import BufferStats, ReplayBuffer, SampleList, TrajectoryBuffer
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
