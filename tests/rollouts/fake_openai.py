"""A small real HTTP server speaking the OpenAI chat-completions protocol (a vLLM stand-in).

``POST /v1/chat/completions`` answers ``{"choices": [{"message": {"role": "assistant",
"content": ...}, "finish_reason": "stop"}], ...}`` as vLLM does. The server runs in
a thread on 127.0.0.1 (a free port) and records every request body, so tests can
assert what a client sent; it can be told to fail or stall:

    with FakeOpenAIServer(reply="<think>ok</think>\\nAction: back()") as server:
        server.fail_next(429, 500)        # the next two requests fail, then it answers
        server.delay_s = 0.2              # every answer waits 0.2 s (in-flight overlap)
        ... ChatCompletionsClient(server.base_url, "m") ...
        server.requests[0]["model"], server.max_in_flight

``reply`` may also be a callable ``body -> str`` (e.g. to answer a judge).

``server.text_only = True`` makes it a text-only model as vLLM serves one: a request
with an image part gets HTTP 400 ``"<model> is not a multimodal model"`` (vLLM's
error body, ``{"object": "error", "message": ..., "code": 400}``).
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Reply = str | Callable[[dict[str, Any]], str]


class FakeOpenAIServer:
    """The chat-completions endpoint on ``http://127.0.0.1:<port>/v1`` (see module docstring).

    Attributes:
        requests: JSON bodies of the requests that reached the endpoint, in arrival order.
        headers: their headers (lower-cased names), same order.
        arrival_times: ``time.monotonic()`` at each arrival, same order.
        max_in_flight: the most requests being handled at the same moment.
        delay_s: seconds every request waits before it is answered.
        text_only: refuse requests with image parts as vLLM does for a text-only model.
    """

    def __init__(self, reply: Reply = "<think>done</think>\nAction: back()") -> None:
        self.reply = reply
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.arrival_times: list[float] = []
        self.max_in_flight = 0
        self.delay_s = 0.0
        self.text_only = False
        self._in_flight = 0
        self._lock = threading.Lock()
        self._failures: deque[tuple[int, str, dict[str, str]]] = deque()
        self._stalls: deque[float] = deque()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                raw = self.rfile.read(length)
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                try:
                    body = json.loads(raw)
                except ValueError:
                    self._send(400, {"error": {"message": "body is not JSON"}})
                    return
                server._handle(self, body)

            def _send(self, status: int, payload: Any, headers: dict[str, str] | None = None):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    def fail_next(self, *statuses: int, message: str = "injected failure", **headers: str) -> None:
        """The next ``len(statuses)`` requests get these HTTP statuses (with an OpenAI error body).

        ``headers`` are added to those answers (``retry_after="0"`` -> ``Retry-After: 0``).
        """
        extra = {name.replace("_", "-").title(): value for name, value in headers.items()}
        with self._lock:
            self._failures.extend((status, message, extra) for status in statuses)

    def stall_next(self, *seconds: float) -> None:
        """The next requests wait this long before answering (longer than a client timeout)."""
        with self._lock:
            self._stalls.extend(seconds)

    def _handle(self, handler: Any, body: dict[str, Any]) -> None:
        with self._lock:
            self.requests.append(body)
            self.headers.append({k.lower(): v for k, v in handler.headers.items()})
            self.arrival_times.append(time.monotonic())
            self._in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self._in_flight)
            failure = self._failures.popleft() if self._failures else None
            stall = self._stalls.popleft() if self._stalls else 0.0
        try:
            if stall or self.delay_s:
                time.sleep(stall or self.delay_s)
            if failure is not None:
                status, message, headers = failure
                handler._send(status, {"error": {"message": message, "code": status}}, headers)
                return
            if self.text_only and _has_image(body):
                message = f"{body.get('model')} is not a multimodal model"
                error = {"object": "error", "message": message, "type": "BadRequestError"}
                handler._send(400, {**error, "param": None, "code": 400})
                return
            content = self.reply(body) if callable(self.reply) else self.reply
            handler._send(
                200,
                {
                    "id": f"chatcmpl-{len(self.requests)}",
                    "object": "chat.completion",
                    "model": body.get("model"),
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": content},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                },
            )
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (its timeout)
            pass
        finally:
            with self._lock:
                self._in_flight -= 1

    def start(self) -> FakeOpenAIServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _has_image(body: dict[str, Any]) -> bool:
    """Whether a chat-completions request has an image part in any message."""
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and any(
            isinstance(p, dict) and p.get("type") == "image_url" for p in content
        ):
            return True
    return False
