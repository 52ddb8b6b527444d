"""An async client for the OpenAI chat-completions HTTP protocol, as vLLM serves it.

``POST {base_url}/chat/completions`` with ``{"model", "messages", "temperature",
"max_tokens", ...}`` and the answer's ``choices[0].message.content``. This is what
``vllm serve MODEL`` exposes at ``http://HOST:8000/v1`` (and what OpenAI, SGLang,
TGI and llama.cpp's server expose too), so one client serves the policy
(:class:`~replaystore.rollouts.policy.OpenAIChatPolicy`) and the judge
(:class:`~replaystore.rollouts.evaluator.OpenAIJudge`).

Failure handling, per request:

* HTTP 408, 409, 429 and 5xx, timeouts and connection errors are retried up to
  ``max_retries`` times, after ``min(backoff_max_s, backoff_base_s * 2**k)``
  seconds scaled by a random factor in [0.5, 1] ("equal jitter", so that many
  workers hit by the same overload do not come back in lock-step). A
  ``Retry-After`` header (seconds) raises the wait to what the server asked, up
  to ``backoff_max_s``.
* Any other 4xx fails at once with :class:`~replaystore.errors.ModelServerError`
  naming the status and the server's own message (vLLM and OpenAI put it in
  ``{"error": {"message": ...}}``); a 404 also asks whether ``base_url`` ends in ``/v1``.
* At most ``max_concurrency`` requests are in flight at once (an
  :class:`asyncio.Semaphore`); a request waiting out its backoff does not hold a slot.

``httpx`` is imported when the first client is made; without it the error says
``pip install 'replaystore[rollouts]'``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import time
from collections.abc import Mapping, Sequence
from typing import Any

from replaystore.errors import ConfigError, ModelServerError

__all__ = ["DEFAULT_REQUEST_TIMEOUT_S", "RETRY_STATUSES", "ChatCompletionsClient"]

logger = logging.getLogger("replaystore.rollouts.chat_client")

#: Seconds one HTTP request may take: a quarter of the collector's step timeout (120 s),
#: so a request that times out can be retried inside its step.
DEFAULT_REQUEST_TIMEOUT_S = 30.0

#: HTTP statuses retried with backoff (everything else >= 400 fails at once).
RETRY_STATUSES: frozenset[int] = frozenset({408, 409, 429, 500, 502, 503, 504})


def _import_httpx() -> Any:
    try:
        import httpx
    except ImportError:
        raise ImportError(
            "the OpenAI-protocol client needs httpx, which is not installed: "
            "pip install 'replaystore[rollouts]'"
        ) from None
    return httpx


def _server_message(response: Any) -> str:
    """The error text a server sent: ``error.message`` of a JSON body, else the body (cut)."""
    text = response.text
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if isinstance(body, Mapping):
        error = body.get("error", body.get("detail", body.get("message")))
        if isinstance(error, Mapping) and isinstance(error.get("message"), str):
            return error["message"]
        if isinstance(error, str):
            return error
    text = " ".join(text.split())
    return text if len(text) <= 300 else text[:300] + "..."


class ChatCompletionsClient:
    """Sends chat messages to an OpenAI-protocol server and returns the reply text.

    Args:
        base_url: the API root, e.g. ``http://localhost:8000/v1`` for ``vllm serve``
            (``/chat/completions`` is appended).
        model: the model name the server serves (vLLM: the name given to ``vllm serve``,
            or its ``--served-model-name``).
        api_key: sent as ``Authorization: Bearer ...``. ``None``: the ``OPENAI_API_KEY``
            environment variable if set, else no header (vLLM without ``--api-key``).
        temperature: sampling temperature (>= 0).
        max_tokens: cap on generated tokens per reply (>= 1).
        max_concurrency: requests in flight at once from this client (>= 1).
        max_retries: retries after the first attempt for retryable failures (>= 0).
        backoff_base_s: first backoff in seconds; doubles each retry.
        backoff_max_s: cap on one backoff (and on an honoured ``Retry-After``).
        timeout_s: seconds allowed for one HTTP request (connect, send, wait, read);
            default 30, shorter than the rollout's step timeout (120 s) so that a
            request that times out is retried within its step.
        extra_body: more top-level fields for every request (``top_p``, ``stop``,
            vLLM's ``repetition_penalty``...); they override the defaults above.
        seed: seeds the backoff jitter (deterministic waits in tests).
        transport: an ``httpx`` async transport (tests, proxies); default: the network.

    Raises:
        ConfigError: a bad ``base_url`` (not http(s)) or an out-of-range number.
        ImportError: httpx is not installed.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        temperature: float = 0.0,
        max_tokens: int = 512,
        max_concurrency: int = 8,
        max_retries: int = 4,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 30.0,
        timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        extra_body: Mapping[str, Any] | None = None,
        seed: int | None = None,
        transport: Any = None,
    ) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ConfigError(
                "base_url must be an http(s) URL such as http://localhost:8000/v1, "
                f"got {base_url!r}"
            )
        if not isinstance(model, str) or not model.strip():
            raise ConfigError(f"model must be a non-empty model name, got {model!r}")
        _check_number("temperature", temperature, minimum=0.0)
        _check_number("backoff_base_s", backoff_base_s, minimum=0.0)
        _check_number("backoff_max_s", backoff_max_s, minimum=0.0)
        _check_number("timeout_s", timeout_s, minimum=0.0, strict=True)
        for name, value, minimum in (
            ("max_tokens", max_tokens, 1),
            ("max_concurrency", max_concurrency, 1),
            ("max_retries", max_retries, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ConfigError(f"{name} must be an int >= {minimum}, got {value!r}")
        httpx = _import_httpx()
        self.base_url = base_url.rstrip("/")
        self.url = f"{self.base_url}/chat/completions"
        self.model = model
        self.temperature = float(temperature)
        self.max_tokens = max_tokens
        self.max_concurrency = max_concurrency
        self.max_retries = max_retries
        self.backoff_base_s = float(backoff_base_s)
        self.backoff_max_s = float(backoff_max_s)
        self.timeout_s = float(timeout_s)
        self.extra_body = dict(extra_body or {})
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._rng = random.Random(seed)
        self._semaphore = asyncio.Semaphore(max_concurrency)
        self._client = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(self.timeout_s, connect=min(self.timeout_s, 30.0)),
            limits=httpx.Limits(
                max_connections=max_concurrency, max_keepalive_connections=max_concurrency
            ),
            transport=transport,
        )
        self._httpx = httpx
        #: Waits (seconds) slept before retries, most recent last; for logs and tests.
        self.backoff_history: list[float] = []
        #: Replies the server cut at ``max_tokens`` (finish_reason ``length``).
        self.replies_cut = 0

    def __repr__(self) -> str:
        return f"ChatCompletionsClient({self.base_url!r}, model={self.model!r})"

    def backoff_s(self, retry: int, retry_after: float | None = None) -> float:
        """The wait before retry number ``retry`` (0-based), jittered; see the module docstring."""
        delay = min(self.backoff_max_s, self.backoff_base_s * (2.0**retry))
        delay *= 0.5 + 0.5 * self._rng.random()
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.backoff_max_s))
        return delay

    def request_body(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        temperature: float | None = None,
        max_tokens: int | None = None,
    ) -> dict[str, Any]:
        """The JSON body :meth:`complete` posts for ``messages`` (no I/O)."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": list(messages),
            "temperature": self.temperature if temperature is None else float(temperature),
            "max_tokens": self.max_tokens if max_tokens is None else int(max_tokens),
        }
        body.update(self.extra_body)
        return body

    async def complete(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        temperature: float | None = None,
        max_tokens: int | None = None,
    ) -> str:
        """The assistant's reply text for ``messages`` (OpenAI chat messages, images inline).

        Cost: one HTTP round trip, plus up to ``max_retries`` more with backoff.

        Raises:
            ModelServerError: a non-retryable 4xx (status and server message named),
                retries exhausted (last status or error named), or a reply without
                ``choices[0].message.content``.
        """
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
            raise ConfigError(f"messages must be a list of dicts, got {type(messages).__name__}")
        body = self.request_body(messages, temperature=temperature, max_tokens=max_tokens)
        payload = json.dumps(body, ensure_ascii=False).encode("utf-8")
        last_problem = ""
        last_status: int | None = None
        for attempt in range(self.max_retries + 1):
            retry_after: float | None = None
            started = time.perf_counter()
            try:
                async with self._semaphore:
                    response = await self._client.post(self.url, content=payload)
            except self._httpx.TimeoutException:
                last_status = None
                last_problem = f"timed out after {self.timeout_s:g} s"
            except self._httpx.TransportError as exc:
                last_status = None
                last_problem = f"connection failed: {type(exc).__name__}: {exc}"
            else:
                status = response.status_code
                if status < 400:
                    return self._reply_text(response)
                last_status = status
                last_problem = f"HTTP {status}: {_server_message(response)}"
                if status not in RETRY_STATUSES:
                    hint = ""
                    if status == 404 and not self.base_url.endswith("/v1"):
                        hint = " (does base_url end in /v1? vLLM serves http://HOST:8000/v1)"
                    raise ModelServerError(
                        f"model server {self.url} refused the request with {last_problem}{hint}",
                        status=status,
                    )
                retry_after = _retry_after(response)
            if attempt == self.max_retries:
                break
            delay = self.backoff_s(attempt, retry_after)
            self.backoff_history.append(delay)
            logger.warning(
                "model server %s: %s after %.2f s; retry %d/%d in %.2f s",
                self.url,
                last_problem,
                time.perf_counter() - started,
                attempt + 1,
                self.max_retries,
                delay,
            )
            await asyncio.sleep(delay)
        raise ModelServerError(
            f"model server {self.url} failed {self.max_retries + 1} attempts; last: {last_problem}",
            status=last_status,
        )

    def _reply_text(self, response: Any) -> str:
        try:
            body = response.json()
        except ValueError:
            raise ModelServerError(
                f"model server {self.url} answered HTTP {response.status_code} with a body "
                f"that is not JSON: {response.text[:120]!r}",
                status=response.status_code,
            ) from None
        choices = body.get("choices") if isinstance(body, Mapping) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
            raise ModelServerError(
                f"model server {self.url} answered without choices[0]: {str(body)[:200]}",
                status=response.status_code,
            )
        message = choices[0].get("message")
        content = message.get("content") if isinstance(message, Mapping) else None
        if not isinstance(content, str):
            raise ModelServerError(
                f"model server {self.url} answered without a text choices[0].message.content: "
                f"{str(choices[0])[:200]}",
                status=response.status_code,
            )
        if choices[0].get("finish_reason") == "length":
            # Once per client at WARNING (an untrained model hits it on every step), then DEBUG.
            self.replies_cut += 1
            logger.log(
                logging.WARNING if self.replies_cut == 1 else logging.DEBUG,
                "model reply cut at max_tokens=%d (finish_reason 'length'); raise max_tokens "
                "if actions go missing (further cut replies are logged at DEBUG)",
                self.max_tokens,
            )
        return content

    async def aclose(self) -> None:
        """Close the HTTP connections (idempotent)."""
        await self._client.aclose()

    async def __aenter__(self) -> ChatCompletionsClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _retry_after(response: Any) -> float | None:
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:  # an HTTP date: not worth parsing for a backoff hint
        return None
    return seconds if seconds >= 0 else None


def _check_number(name: str, value: Any, *, minimum: float, strict: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
    if ok:
        ok = value > minimum if strict else value >= minimum
    if not ok:
        relation = ">" if strict else ">="
        raise ConfigError(f"{name} must be a number {relation} {minimum:g}, got {value!r}")
