"""Fixtures of the viewer tests: one store of each kind per session, and a live server.

Browser tests need Chromium and Playwright; without them they skip with one
line saying how to install them, except under ``CI=true``, where they fail.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from .stores import make_experience_store, make_trajectory_storage, make_transitions

pytest.importorskip("starlette", reason="the viewer needs the view extra: pip install '.[view]'")


@pytest.fixture(scope="session")
def traj_store(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return make_trajectory_storage(tmp_path_factory.mktemp("view") / "storage")


@pytest.fixture(scope="session")
def exp_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_experience_store(tmp_path_factory.mktemp("view") / "experience.sqlite")


@pytest.fixture(scope="session")
def transitions(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_transitions(tmp_path_factory.mktemp("view"))


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """Serve ``app`` with uvicorn on a free 127.0.0.1 port in a thread; yields its URL."""
    import uvicorn

    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", access_log=False)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the viewer's test server did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def _no_browser(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true and {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Chromium (Playwright's sync API), launched once per module.

    Not per session: sync Playwright keeps an event loop running on this thread
    while it is open, and other tests run ``asyncio.run`` here.
    """
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _no_browser("Playwright is not installed: pip install 'replaystore[rollouts]'")
    from replaystore.rollouts.browser import (
        CHROMIUM_ARGS,
        INSTALL_HINT,
        BrowserUnavailableError,
        find_chromium,
    )

    try:
        executable = find_chromium()
    except BrowserUnavailableError as exc:
        _no_browser(str(exc))
    with sync_playwright() as p:
        if executable is None and not Path(p.chromium.executable_path).exists():
            _no_browser(INSTALL_HINT)
        launched = p.chromium.launch(
            executable_path=executable, headless=True, args=list(CHROMIUM_ARGS)
        )
        yield launched
        launched.close()


class Page:
    """A browser page that records console errors and failed requests."""

    def __init__(self, browser: Any, base: str, shots: Path) -> None:
        self.context = browser.new_context(viewport={"width": 1280, "height": 900})
        self.page = self.context.new_page()
        self.base = base
        self.shots = shots
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on(
            "response",
            lambda r: self.errors.append(f"{r.status} {r.url}") if r.status >= 400 else None,
        )

    def goto(self, path: str) -> Any:
        response = self.page.goto(self.base + path)
        assert response is not None and response.status == 200, (path, response and response.status)
        return response

    def shot(self, name: str) -> Path:
        path = self.shots / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        assert path.stat().st_size > 1000
        return path

    def close(self) -> None:
        assert self.errors == [], self.errors
        self.context.close()
