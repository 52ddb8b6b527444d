"""Shared fixtures-as-functions for the experience tests: rows, stand-in AWorld models."""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, Field

from replaystore.experience import DataRow, Experience, ExpMeta


class Observation(BaseModel):
    """Stand-in for ``aworld.core.common.Observation`` (a pydantic model)."""

    content: Any = None
    info: dict[str, Any] = Field(default_factory=dict)


class ActionModel(BaseModel):
    """Stand-in for ``aworld.core.common.ActionModel`` (a pydantic model)."""

    agent_name: str | None = None
    tool_name: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)


def make_row(
    task_id: str = "task_1",
    step: int = 0,
    *,
    agent_id: str | None = "agent_1",
    task_name: str | None = "my_task",
    state: Any = None,
    reward: float | None = None,
    execute_time: float | None = None,
    row_id: str | None = None,
) -> DataRow:
    meta = ExpMeta(
        task_id=task_id,
        task_name=task_name,
        agent_id=agent_id,
        step=step,
        execute_time=time.time() if execute_time is None else execute_time,
    )
    exp = Experience(state=state if state is not None else {"step": step}, actions=[{"a": step}])
    exp.reward_t = reward
    return DataRow(meta, exp) if row_id is None else DataRow(meta, exp, row_id)


def episode(task_id: str, n_steps: int, agent_id: str = "agent_1", **kw: Any) -> list[DataRow]:
    return [
        make_row(task_id, s, agent_id=agent_id, execute_time=float(s), **kw) for s in range(n_steps)
    ]
