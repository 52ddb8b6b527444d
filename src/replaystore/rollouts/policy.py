"""The web agent and its policies: what turns a page observation into the model's text.

:class:`WebAgent` is WebGym's ``WebAgent`` reduced to its job: build the prompt
with our :class:`~replaystore.trajectories.context.ConversationBuilder` (the same
builder the trajectory buffer and the exporter use), ask a :class:`Policy` for the
raw text, and decompose it with our response decomposer. The prompt is stored in
``Response.raw_prompt`` with ``file://`` image URLs (small, points at the
screenshots on disk) and sent to the model with the same messages in the form
``image_urls`` asks for (base64 ``data:`` URLs by default, which any server
accepts), so the training data is exactly what the model saw, modulo the URL form.
With a text-mode builder (``ConversationBuilder(observation="text")``, for a model
that reads no images) the prompt has no image at all and the stored messages are
sent as they are.

Policies:

* :class:`OpenAIChatPolicy`: a model behind the OpenAI chat-completions protocol,
  e.g. ``vllm serve Qwen/Qwen2.5-VL-7B-Instruct`` at ``http://HOST:8000/v1``.
* ``ScriptedPolicy`` (``replaystore.rollouts.scripted``): reads the accessibility
  tree of the local website suite; for tests and the demo.
* Anything else with ``async respond(request) -> str`` and ``async aclose()``.

Model output format (what the default :class:`ThinkActionParser` reads)::

    <think>reasoning</think>
    Action: click(412, 230)
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from replaystore.errors import ConfigError
from replaystore.images import messages_to_data_urls
from replaystore.rollouts.chat_client import ChatCompletionsClient
from replaystore.trajectories.components import Observation, Response, Step, Task
from replaystore.trajectories.context import ConversationBuilder
from replaystore.trajectories.response_decomposer import (
    ModelInterface,
    ThinkActionParser,
    decompose_raw_response,
)

__all__ = ["OpenAIChatPolicy", "Policy", "PolicyRequest", "WebAgent"]

logger = logging.getLogger("replaystore.rollouts.policy")


@dataclass(slots=True)
class PolicyRequest:
    """Everything a policy may look at to choose the next action.

    Attributes:
        task: the task being attempted.
        observation: the current page: ``image_path`` (PNG on disk), ``ac_tree``
            (one line per visible interactive element, ``[i] role 'name' @(cx,cy)``),
            ``page_metadata`` (``{"url", "title"}``).
        history: the trajectory's previous steps, oldest first (step mappings with
            ``observation``/``action``/``response``/``reward``).
        messages: the chat messages to send, built by :class:`WebAgent` with images
            already in the URL form the agent was configured for.
        step: 0-based number of the step being decided.
        iteration: the rollout iteration (a scripted policy may improve with it).
    """

    task: Task
    observation: Observation
    history: list[dict[str, Any]]
    messages: list[dict[str, Any]]
    step: int
    iteration: int


@runtime_checkable
class Policy(Protocol):
    """Produces the model's raw text for a :class:`PolicyRequest`."""

    async def respond(self, request: PolicyRequest) -> str:
        """The raw model output, e.g. ``"<think>...</think>\\nAction: back()"``."""
        ...

    async def aclose(self) -> None:
        """Release connections or processes (called once, when the collector stops)."""
        ...


class WebAgent:
    """Prompt building, policy call and response decomposition for one step.

    Args:
        policy: where the text comes from (:class:`OpenAIChatPolicy`, ``ScriptedPolicy``, ...).
        parser: the model interface whose ``parse_response`` splits the text
            (default :class:`ThinkActionParser`: ``<think>...</think>`` then ``Action: ...``).
        conversation_builder: the prompt layout (default ``ConversationBuilder()``:
            system prompt, last 4 steps with screenshots, accessibility tree). A
            screenshot-mode builder must build ``file://`` image URLs
            (``image_format="file"``); the URL form sent to the model is chosen by
            ``image_urls``. A text-mode builder (``observation="text"``) builds no
            images, and its messages are sent exactly as stored.
        image_urls: ``"data"``: screenshots inlined as base64 data URLs (any server);
            ``"file"``: sent as ``file://`` URLs (a vLLM server on the same machine
            started with ``--allowed-local-media-path``; smaller requests). Unused in
            text mode.

    The trajectory buffer reads ``agent.conversation_builder`` to rebuild prompts,
    so a ``WebAgent`` can be passed as a buffer's ``agent``; :attr:`observation`
    (``"screenshot"`` or ``"text"``) is the builder's mode, which the collector
    records in each trajectory's ``trajectory_metadata``.

    Raises:
        ConfigError: ``image_urls`` is not ``"data"``/``"file"``, the builder builds
            base64 URLs, or ``policy`` has no ``respond`` method.
    """

    def __init__(
        self,
        policy: Policy,
        *,
        parser: ModelInterface | None = None,
        conversation_builder: ConversationBuilder | None = None,
        image_urls: Literal["data", "file"] = "data",
    ) -> None:
        if not callable(getattr(policy, "respond", None)):
            raise ConfigError(
                f"policy must have an async respond(request) method, got {type(policy).__name__}"
            )
        if image_urls not in ("data", "file"):
            raise ConfigError(f"image_urls must be 'data' or 'file', got {image_urls!r}")
        builder = conversation_builder or ConversationBuilder()
        observation = getattr(builder, "observation", "screenshot")
        if observation not in ("screenshot", "text"):
            raise ConfigError(
                f"the conversation builder's observation must be 'screenshot' or 'text', "
                f"got {observation!r}"
            )
        if observation == "screenshot" and getattr(builder, "image_format", "file") != "file":
            raise ConfigError(
                "WebAgent stores prompts with file:// URLs: give it a ConversationBuilder with "
                "image_format='file' and choose what is sent with image_urls='data'|'file'"
            )
        self.policy = policy
        self.parser: ModelInterface = parser if parser is not None else ThinkActionParser()
        self.conversation_builder = builder
        self.image_urls = image_urls
        #: What the model is shown of a page: ``"screenshot"`` or ``"text"`` (the builder's mode).
        self.observation: str = observation

    def build_messages(
        self,
        task: Task,
        observation: Observation,
        history: Sequence[Mapping[str, Any]],
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """``(stored, sent)``: the prompt with ``file://`` URLs and the same prompt as sent.

        In text mode both are the same list (there is no image to convert).

        Cost: reads every screenshot in the history window once when ``image_urls="data"``
        (screenshot mode).

        Raises:
            TrajectoryError, SchemaError, ImageError: see ``ConversationBuilder.build``.
        """
        stored = self.conversation_builder.build(task, history, observation)
        if self.observation == "text" or self.image_urls != "data":
            return stored, stored
        sent = messages_to_data_urls(stored)
        return stored, sent

    async def act(
        self,
        task: Task,
        observation: Observation,
        history: Sequence[Mapping[str, Any]],
        *,
        step: int,
        iteration: int,
    ) -> Response:
        """Ask the policy for the next action on ``observation``; the decomposed response.

        ``Response.raw_prompt`` is the JSON of the stored messages (``file://`` URLs).
        A reply the parser rejects does not raise: it comes back with
        ``answering_tokens == {"action": "", "parse_error": "<parser's message>"}``, which
        the collector executes as an ``invalid`` no-op step, so the trajectory records
        what the model said.

        Raises:
            ModelServerError: the policy's server failed (see :class:`OpenAIChatPolicy`).
            TrajectoryError, SchemaError, ImageError: the history or observation is
                malformed (the step is named).
        """
        # Reading and base64-encoding screenshots is file I/O: keep it off the event loop.
        stored, sent = await asyncio.to_thread(self.build_messages, task, observation, history)
        request = PolicyRequest(
            task=task,
            observation=observation,
            history=[s.to_mapping() if isinstance(s, Step) else dict(s) for s in history],
            messages=sent,
            step=step,
            iteration=iteration,
        )
        raw = await self.policy.respond(request)
        if not isinstance(raw, str):
            raise ConfigError(
                f"{type(self.policy).__name__}.respond returned {type(raw).__name__}, not str"
            )
        raw_prompt = json.dumps(stored, ensure_ascii=False)
        try:
            return decompose_raw_response(raw, self.parser, raw_prompt=raw_prompt)
        except ValueError as exc:
            logger.info("step %d of %r: unparseable model reply: %s", step, task.task_id, exc)
            return Response(
                raw_response=raw,
                answering_tokens={"action": "", "parse_error": str(exc)},
                raw_prompt=raw_prompt,
            )

    async def aclose(self) -> None:
        """Close the policy."""
        await self.policy.aclose()


class OpenAIChatPolicy:
    """A policy served over the OpenAI chat-completions protocol (vLLM, OpenAI, SGLang...).

    Sends ``request.messages`` as they are (screenshots as image parts) and returns
    ``choices[0].message.content``. Point it at ``vllm serve MODEL`` with
    ``base_url="http://HOST:8000/v1"``.

    Args:
        base_url: the server's OpenAI-compatible API root, e.g. ``http://HOST:8000/v1``.
        model: the model name the server was started with.
        **options: the rest of
            :class:`~replaystore.rollouts.chat_client.ChatCompletionsClient`'s keywords:
            ``api_key``, ``temperature``, ``max_tokens``, ``max_concurrency``,
            ``max_retries``, ``backoff_base_s``, ``backoff_max_s``, ``timeout_s``,
            ``extra_body``, ``seed``, ``transport`` (defaults: temperature 0.0,
            max_tokens 512, 8 requests in flight, 4 retries from 0.5 s doubling up to
            30 s, 30 s per request: shorter than the collector's 120 s step).
        client: an existing client to share (e.g. with a judge); then the other
            arguments must be left out.

    Use one instance per event loop (its connections and semaphore belong to the loop
    that first uses them); close it with :meth:`aclose` or ``async with``.

    Raises:
        ConfigError: see ``ChatCompletionsClient``.
        ImportError: httpx is not installed (``pip install 'replaystore[rollouts]'``).
    """

    def __init__(
        self,
        base_url: str | None = None,
        model: str | None = None,
        *,
        client: ChatCompletionsClient | None = None,
        **options: Any,
    ) -> None:
        if client is not None:
            if base_url is not None or model is not None or options:
                raise ConfigError("give OpenAIChatPolicy either client= or base_url/model/options")
            self.client = client
        else:
            if base_url is None or model is None:
                raise ConfigError("OpenAIChatPolicy needs base_url and model (or client=)")
            self.client = ChatCompletionsClient(base_url, model, **options)

    def __repr__(self) -> str:
        return f"OpenAIChatPolicy({self.client.base_url!r}, model={self.client.model!r})"

    async def respond(self, request: PolicyRequest) -> str:
        """The model's reply to ``request.messages``.

        Raises:
            ModelServerError: a 4xx other than 408/409/429 (status and the server's
                message named), retries exhausted, or a reply without text content.
        """
        return await self.client.complete(request.messages)

    async def aclose(self) -> None:
        """Close the HTTP connections."""
        await self.client.aclose()

    async def __aenter__(self) -> OpenAIChatPolicy:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
