"""Serve the local website suite on 127.0.0.1 (a free port) while a ``with`` block runs.

>>> with LocalSuite() as suite:              # doctest: +SKIP
...     suite.url("shop")                     # 'http://shop.localhost:41234/'
...     tasks = suite.tasks()                 # Task objects whose URLs use that port

Every site is a host under ``.localhost`` (``shop.localhost``, ``news.localhost``...):
browsers resolve those names to the loopback address without DNS, and each is
its own domain for :class:`~replaystore.pipeline.blocklist.Blocklist`. The
server binds 127.0.0.1 only. ``/slow?s=N`` on any site answers after N seconds
(at most 30), for timeout tests.

The task file ``tasks.jsonl`` next to this module names websites without a port
(``http://shop.localhost/``); :meth:`LocalSuite.tasks` and
:meth:`LocalSuite.write_tasks` put the running server's port in.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

from replaystore.atomic import atomic_write_text
from replaystore.rollouts.http_server import BackgroundHTTPServer
from replaystore.trajectories.components import Task

from .pages import SITES, render

__all__ = ["PLANS_FILE", "TASKS_FILE", "LocalSuite", "load_plans", "localize_url"]

logger = logging.getLogger("replaystore.rollouts.sites")

#: The suite's task file (seed 002 task schema, websites without a port).
TASKS_FILE = Path(__file__).with_name("tasks.jsonl")
#: How the scripted policy solves each suite task (task_id -> plan steps).
PLANS_FILE = Path(__file__).with_name("plans.json")

_MAX_SLOW_S = 30.0


class _Handler(BaseHTTPRequestHandler):
    server_version = "replaystore-suite/1"
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        host = (self.headers.get("Host") or "").split(":")[0].lower()
        site = host.removesuffix(".localhost") if host.endswith(".localhost") else ""
        parts = urlsplit(self.path)
        query = parse_qs(parts.query)
        path = parts.path or "/"
        if path == "/slow":
            try:
                delay = min(_MAX_SLOW_S, max(0.0, float((query.get("s") or ["1"])[0])))
            except ValueError:
                delay = 1.0
            time.sleep(delay)
            path = "/"
        if site in SITES:
            status, _title, body = render(site, path, query)
        else:
            links = "".join(f"<li>{name}.localhost</li>" for name in SITES)
            status, body = 404, f"<!doctype html><title>Unknown site</title><ul>{links}</ul>"
        data = body.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s %s", self.address_string(), format % args)


def localize_url(url: str, port: int) -> str:
    """``url`` with ``port`` added when its host is a ``*.localhost`` name without a port."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if host.endswith(".localhost") and parts.port is None:
        return urlunsplit(parts._replace(netloc=f"{host}:{port}"))
    return url


def load_plans(path: str | Path = PLANS_FILE) -> dict[str, list[list[str]]]:
    """The scripted solutions of the suite's tasks: ``{task_id: [step, ...]}``.

    A step is ``["click", role, name]``, ``["type", role, name, text]``,
    ``["key", name]`` or ``["answer"]`` (answer with the task's reference answer).
    """
    with open(path, encoding="utf-8") as handle:
        plans = json.load(handle)
    if not isinstance(plans, dict):
        raise ValueError(f"{path}: expected an object of task_id -> plan")
    return plans


class LocalSuite(BackgroundHTTPServer):
    """The local website suite on a background HTTP server (a context manager).

    Args:
        host: address to bind (loopback only by default).
        port: 0 picks a free port.

    Attributes:
        port: the bound port (after ``__enter__``/:meth:`start`).
    """

    name = "website suite"

    def handler(self) -> type[_Handler]:
        return _Handler

    def url(self, site: str, path: str = "/") -> str:
        """The URL of ``path`` on ``site`` (a name in :data:`~.pages.SITES`).

        Raises:
            ValueError: unknown site, or the suite is not started.
        """
        if site not in SITES:
            raise ValueError(f"unknown suite site {site!r}; sites: {sorted(SITES)}")
        if not self.started:
            raise ValueError("the suite is not started: use `with LocalSuite() as suite:`")
        return f"http://{site}.localhost:{self.port}{path}"

    def tasks(
        self, path: str | Path = TASKS_FILE, *, sites: Iterable[str] | None = None
    ) -> list[Task]:
        """The suite's tasks with this server's port in their website URLs.

        Args:
            path: task file (default: the bundled ``tasks.jsonl``).
            sites: keep only tasks on these sites (names such as ``"shop"``).
        """
        if not self.started:
            raise ValueError("the suite is not started: use `with LocalSuite() as suite:`")
        from replaystore.pipeline.task_sampler import load_tasks

        wanted = None if sites is None else set(sites)
        out = []
        for task in load_tasks(path):
            host = urlsplit(task.website).hostname or ""
            if wanted is not None and host.removesuffix(".localhost") not in wanted:
                continue
            task.website = localize_url(task.website, self.port)
            out.append(task)
        return out

    def write_tasks(self, out: str | Path, **kwargs: Any) -> Path:
        """Write :meth:`tasks` (``kwargs`` as there) to the JSONL file ``out``, atomically."""
        lines = [json.dumps(t.to_dict(), ensure_ascii=False) for t in self.tasks(**kwargs)]
        target = Path(out)
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(target, "\n".join(lines) + "\n")
        return target
