"""One HTTP server on a daemon thread, started and stopped by a ``with`` block.

The bundled website suite (:class:`~replaystore.rollouts.sites.LocalSuite`) and the
MiniWoB++ pages (:class:`~replaystore.rollouts.miniwob.MiniWoBServer`) are both
this: a request handler bound to loopback on a free port while rollouts run.
Subclasses name their handler and their thread; starting, the bound port,
stopping and the context manager are here, once.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

__all__ = ["BackgroundHTTPServer"]

logger = logging.getLogger("replaystore.rollouts")


class BackgroundHTTPServer(ABC):
    """A :class:`ThreadingHTTPServer` serving on a daemon thread (a context manager).

    Args:
        host: address to bind (loopback only by default).
        port: 0 picks a free port.

    Attributes:
        port: the bound port (after ``__enter__``/:meth:`start`).

    Subclasses set :attr:`name` (the thread's name and the log line's subject) and
    implement :meth:`handler`.
    """

    #: What is served, for the thread name and the log line.
    name = "http"

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self.port = int(port)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @abstractmethod
    def handler(self) -> Any:
        """The request handler class (or a factory of handlers) to serve with."""

    @property
    def started(self) -> bool:
        """Whether the server is bound and serving."""
        return self._server is not None

    def start(self) -> Self:
        """Bind and serve in a daemon thread (idempotent); returns ``self``."""
        if self._server is None:
            handler: type[BaseHTTPRequestHandler] = self.handler()
            server = ThreadingHTTPServer((self.host, self.port), handler)
            server.daemon_threads = True
            self._server = server
            self.port = int(server.server_address[1])
            self._thread = threading.Thread(
                # A short poll interval: stop() returns in ~0.05 s instead of 0.5 s.
                target=server.serve_forever,
                kwargs={"poll_interval": 0.05},
                name=f"replaystore-{self.name}",
                daemon=True,
            )
            self._thread.start()
            logger.info("%s on http://%s:%d", self.name, self.host, self.port)
        return self

    def stop(self) -> None:
        """Stop serving and close the socket (idempotent)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            if self._thread is not None:
                self._thread.join(timeout=5)
            self._server = None
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
