"""WebGym's outer loop, closed for real: rollouts -> buffer -> LLaMA-Factory -> vLLM -> rollouts.

``replaystore loop --config loop.yaml`` (or :func:`run_loop`) runs iterations of
sample -> serve -> roll out -> evaluate -> store -> buffer -> export -> train, each
stage journaled so that ``--resume`` continues after a crash. LLaMA-Factory and
vLLM run as child processes from their own virtual environments (see
:mod:`replaystore.loop.tools`); nothing here imports them. Guide: ``docs/loop.md``.
"""

from __future__ import annotations

from .config import DEFAULTS, LoopConfig, default_tools_dir, load_config
from .runner import LoopInterrupted, LoopRunner, run_loop
from .tools import LoopStageError, ToolsMissingError, find_tools, make_tiny_model

__all__ = [
    "DEFAULTS",
    "LoopConfig",
    "LoopInterrupted",
    "LoopRunner",
    "LoopStageError",
    "ToolsMissingError",
    "default_tools_dir",
    "find_tools",
    "load_config",
    "make_tiny_model",
    "run_loop",
]
