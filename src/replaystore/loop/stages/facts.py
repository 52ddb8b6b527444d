"""Facts the stages record about stored trajectories: statuses, success, success per task."""

from __future__ import annotations

from collections import Counter
from typing import Any

__all__ = ["per_task", "rates", "success", "trajectory_status"]


def trajectory_status(trajectory: list[dict[str, Any]]) -> str | None:
    """The status the collector stored with a trajectory (None: none)."""
    meta = trajectory[-1].get("trajectory_metadata") if trajectory else None
    return meta.get("status") if isinstance(meta, dict) else None


def success(trajectories: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Success facts of stored trajectories, by the buffer's own rules: dummy trajectories
    (a website that did not load) are not attempts; success is a final reward >= 1."""
    from replaystore.trajectories.index import (
        count_successes,
        final_reward,
        is_dummy_trajectory,
        success_rate,
    )

    statuses = Counter(trajectory_status(t) or "unknown" for t in trajectories)
    dummy = [is_dummy_trajectory(t) for t in trajectories]
    rewards = [
        0.0 if d else final_reward(t, f"trajectory {i}")
        for i, (t, d) in enumerate(zip(trajectories, dummy, strict=True))
    ]
    successful, n = count_successes(rewards, dummy, 1.0)
    return {
        "num_tasks": n,
        "successful": successful,
        "success_rate": success_rate(successful, n),
        "statuses": dict(statuses),
    }


def per_task(trajectories: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Held-out success per MiniWoB++ task (``Task.subdomain``) and the mean over tasks."""
    from replaystore.trajectories.index import final_reward, is_successful

    by_task: dict[str, list[bool]] = {}
    for i, trajectory in enumerate(trajectories):
        task = trajectory[0]["observation"].task
        won = is_successful(final_reward(trajectory, f"trajectory {i}"), 1.0)
        by_task.setdefault(str(task.subdomain), []).append(bool(won))
    tasks = {
        name: {"success_rate": sum(wins) / len(wins), "episodes": len(wins)}
        for name, wins in sorted(by_task.items())
    }
    mean = sum(t["success_rate"] for t in tasks.values()) / len(tasks) if tasks else 0.0
    return {"tasks": tasks, "mean": mean, "episodes": len(trajectories)}


def rates(facts: dict[str, Any]) -> str:
    """``name 50%, other 100%``: the per-task rates of :func:`per_task`'s facts."""
    return ", ".join(f"{n} {t['success_rate']:.0%}" for n, t in facts["tasks"].items())
