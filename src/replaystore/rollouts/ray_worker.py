"""What runs inside one Ray rollout actor: its own Chromium, its own local task server,
one :class:`~replaystore.rollouts.collector.RolloutCollector`, tasks in, bytes out.

:class:`RolloutWorker` is a plain class (Ray wraps it with ``ray.remote`` in
:mod:`~replaystore.rollouts.ray_rollout`; it works without Ray too, which is how its
tests drive it). Its spec is JSON-compatible (:func:`worker_spec`), so nothing of
ours is pickled: the agent is rebuilt from names and numbers on the actor's node.

Tasks name the driver's servers; an actor serves the bundled suite or the MiniWoB++
pages itself, on its own loopback port, and moves each task's website there
(:func:`localize_task`), so stored trajectories show the actor's port.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import socket
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from replaystore.errors import ConfigError

__all__ = ["POLICIES", "SERVES", "RolloutWorker", "localize_task", "worker_spec"]

logger = logging.getLogger("replaystore.rollouts.ray_worker")

#: How an actor's agent acts: the suite's scripted policy, the MiniWoB++ experts, or a
#: model behind the OpenAI chat-completions protocol (vLLM).
POLICIES = ("scripted", "miniwob_expert", "openai")
#: What an actor serves on its own loopback port (None: tasks on real websites).
SERVES = ("suite", "miniwob", None)


def worker_spec(
    *,
    policy: str,
    serve: str | None,
    browsers: int,
    observation: str = "screenshot",
    prompt: Mapping[str, Any] | None = None,
    scripted: Mapping[str, Any] | None = None,
    openai: Mapping[str, Any] | None = None,
    viewport: tuple[int, int] | list[int] | None = None,
    collector: Mapping[str, Any] | None = None,
    trajectory_metadata: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON-compatible description an actor builds its rollout from.

    Args:
        policy: one of :data:`POLICIES`.
        serve: one of :data:`SERVES`.
        browsers: browser contexts (tasks at once) in the actor.
        observation: ``"screenshot"`` or ``"text"``.
        prompt: :class:`~replaystore.trajectories.context.ConversationBuilder` keywords.
        scripted: :class:`~replaystore.rollouts.scripted.ScriptedPolicy` keywords.
        openai: :class:`~replaystore.rollouts.policy.OpenAIChatPolicy` keywords with
            ``base_url`` and ``model`` (an ``api_key`` travels to the actor in the
            spec; it is never logged).
        viewport: ``[width, height]`` of every page (None: the pool's default).
        collector: :class:`~replaystore.rollouts.collector.RolloutCollector` keywords
            (numbers and mappings: ``step_timeout_s``, ``max_steps_by_difficulty``...).
        trajectory_metadata: more keys for every trajectory's metadata.

    Raises:
        ConfigError: an unknown policy or serve, ``browsers`` < 1, ``openai`` without
            ``base_url``/``model``.
    """
    if policy not in POLICIES:
        raise ConfigError(f"unknown rollout policy {policy!r}; use one of {', '.join(POLICIES)}")
    if serve not in SERVES:
        raise ConfigError(f"unknown serve {serve!r}; use suite, miniwob or None")
    if isinstance(browsers, bool) or not isinstance(browsers, int) or browsers < 1:
        raise ConfigError(f"browsers per actor must be an int >= 1, got {browsers!r}")
    chat = dict(openai or {})
    if policy == "openai" and not (chat.get("base_url") and chat.get("model")):
        raise ConfigError("the openai policy needs base_url and model")
    return {
        "policy": policy,
        "serve": serve,
        "browsers": browsers,
        "observation": observation,
        "prompt": dict(prompt or {}),
        "scripted": dict(scripted or {}),
        "openai": chat,
        "viewport": None if viewport is None else [int(v) for v in viewport],
        "collector": dict(collector or {}),
        "trajectory_metadata": dict(trajectory_metadata or {}),
    }


def localize_task(task: Mapping[str, Any], serve: str | None, origin: str) -> dict[str, Any]:
    """``task`` (a Task's dict) with its website moved to this actor's server.

    ``serve="suite"``: a ``*.localhost`` host keeps its name and gets ``origin``'s
    port; ``serve="miniwob"``: a MiniWoB++ task's scheme, host and port become
    ``origin``'s; otherwise (or another website) the task is unchanged.
    """
    out = dict(task)
    website = str(out.get("website") or "")
    parts = urlsplit(website)
    mine = urlsplit(origin)
    if serve == "suite" and (parts.hostname or "").endswith(".localhost"):
        out["website"] = urlunsplit(parts._replace(netloc=f"{parts.hostname}:{mine.port}"))
    elif serve == "miniwob" and out.get("domain") == "miniwob" and parts.netloc:
        out["website"] = urlunsplit(parts._replace(scheme=mine.scheme, netloc=mine.netloc))
    return out


class RolloutWorker:
    """One actor's rollouts (see the module docstring): :meth:`start`, then
    :meth:`run` for each task (up to ``browsers`` at once), then :meth:`stop`.

    Args:
        spec: :func:`worker_spec`'s result.

    Nothing is started by the constructor (Ray would report a failing constructor
    as a dead actor, losing the error): :meth:`start` raises instead.
    """

    def __init__(self, spec: Mapping[str, Any]) -> None:
        self.spec = dict(spec)
        self.root = Path()
        self.origin = ""
        self.collector: Any = None
        self._stack = contextlib.AsyncExitStack()

    async def start(self) -> dict[str, Any]:
        """Start the server, the browsers and the collector; where this actor runs.

        Returns:
            ``{"host": hostname, "node": Ray node id or "", "origin": its server}``.

        Raises:
            BrowserUnavailableError: no Chromium on this node.
            ImportError: the ``miniwob`` package is missing (``serve="miniwob"``).
        """
        from replaystore.trajectories.storage import TrajectoryStorage

        from .browser import BrowserPool
        from .collector import RolloutCollector
        from .evaluator import Evaluator

        spec = self.spec
        try:
            self.root = Path(tempfile.mkdtemp(prefix="replaystore-rollout-actor-"))
            self._stack.callback(shutil.rmtree, self.root, True)
            self.origin = self._serve(spec["serve"])
            options: dict[str, Any] = {}
            if spec["viewport"] is not None:
                options["viewport"] = tuple(spec["viewport"])
            pool = await self._stack.enter_async_context(BrowserPool(spec["browsers"], **options))
            agent = _agent(spec)
            self._stack.push_async_callback(agent.aclose)
            self.collector = RolloutCollector(
                agent,
                Evaluator(),
                TrajectoryStorage(self.root / "storage"),
                pool=pool,
                num_workers=spec["browsers"],
                screenshot_root=self.root / "screenshots",
                progress=False,
                handle_sigint=False,
                trajectory_metadata=spec["trajectory_metadata"],
                **spec["collector"],
            )
        except BaseException:  # nothing half-started stays behind
            await self._stack.aclose()
            raise
        return {"host": socket.gethostname(), "node": _node_id(), "origin": self.origin}

    def _serve(self, serve: str | None) -> str:
        """Start this actor's task server; its origin (``""`` for none)."""
        if serve == "suite":
            from .sites import LocalSuite

            suite = self._stack.enter_context(LocalSuite())
            return f"http://localhost:{suite.port}"
        if serve == "miniwob":
            from .miniwob import MiniWoBServer

            return str(self._stack.enter_context(MiniWoBServer()).url)
        return ""

    async def run(self, index: int, task: Mapping[str, Any], iteration: int, rank: int) -> bytes:
        """Roll out one task; its outcome packed (:func:`~.shipping.pack_outcome`).

        Args:
            index: the task's key (its position in the driver's list).
            task: the task's dict as the driver has it (its website is localized).
            iteration: the iteration number stamped in its metadata and screenshot paths.
            rank: the driver's rank (the same).

        Raises:
            RuntimeError: :meth:`start` was not called.
        """
        from .screenshots import screenshot_folder
        from .shipping import pack_outcome

        if self.collector is None:
            raise RuntimeError("the rollout worker is not started: call start() first")
        timings: dict[str, float] = {}
        local = localize_task(task, self.spec["serve"], self.origin)
        outcome = await self.collector.run_task(
            local, iteration, rank=rank, index=index, timings=timings
        )
        root = self.collector.screenshot_root
        try:
            return pack_outcome(outcome, root, index=index, timings=timings)
        finally:
            # Shipped: the actor keeps no copy (one folder per task, named by its index).
            folder = screenshot_folder(root, iteration, rank)
            for path in folder.glob(f"{index:04d}_*"):
                shutil.rmtree(path, ignore_errors=True)

    async def stop(self) -> None:
        """Close the browsers, the agent and the server; remove the actor's files."""
        await self._stack.aclose()


def _agent(spec: Mapping[str, Any]) -> Any:
    """The actor's acting agent, built from the spec's names and numbers."""
    from replaystore.trajectories.context import ConversationBuilder

    from .policy import OpenAIChatPolicy, WebAgent

    builder = ConversationBuilder(observation=spec["observation"], **spec["prompt"])
    if spec["policy"] == "miniwob_expert":
        from .miniwob_experts import MiniWoBExpert

        return WebAgent(MiniWoBExpert(), conversation_builder=builder, image_urls="file")
    if spec["policy"] == "scripted":
        from .scripted import ScriptedPolicy

        policy = ScriptedPolicy(**spec["scripted"])
        return WebAgent(policy, conversation_builder=builder, image_urls="file")
    chat = dict(spec["openai"])
    model = OpenAIChatPolicy(chat.pop("base_url"), chat.pop("model"), **chat)
    return WebAgent(model, conversation_builder=builder, image_urls="data")


def _node_id() -> str:
    """The Ray node this actor runs on (``""`` outside Ray)."""
    ray = sys.modules.get("ray")  # inside an actor Ray is loaded; never load it here
    try:
        return str(ray.get_runtime_context().get_node_id()) if ray and ray.is_initialized() else ""
    except Exception:  # an older runtime context
        return ""
