"""Shared fixtures of the rollout tests: a real Chromium, the local website suite.

Browser tests need Chromium (Debian: ``apt-get install chromium``; or
``REPLAYSTORE_CHROMIUM=/path``). Without one they skip with one line saying
so, except under ``CI=true``, where a missing browser fails the test.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from replaystore.rollouts.browser import INSTALL_HINT, BrowserUnavailableError, find_chromium
from replaystore.rollouts.sites import LocalSuite

#: Small pages make fast screenshots: every browser test uses this viewport.
VIEWPORT = (640, 420)
#: Short step budgets keep every rollout test a few seconds long.
TEST_MAX_STEPS = {"easy": 5, "medium": 6, "hard": 8}


def _no_browser(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true and {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def chromium() -> str | None:
    """Path of the Chromium the tests launch (None: Playwright's own browser)."""
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        _no_browser("Playwright is not installed: pip install 'replaystore[rollouts]'")
    try:
        path = find_chromium()
    except BrowserUnavailableError as exc:
        _no_browser(str(exc))
        return None
    if path is None:
        from playwright.sync_api import sync_playwright

        with sync_playwright() as p:
            managed = Path(p.chromium.executable_path)
        if not managed.exists():
            _no_browser(INSTALL_HINT)
    return path


@pytest.fixture(scope="module")
def suite() -> Iterator[LocalSuite]:
    """The local website suite, served for the whole test module."""
    with LocalSuite() as running:
        yield running


def run(coro: Any) -> Any:
    """Run a coroutine to completion in a fresh event loop (the tests are synchronous)."""
    return asyncio.run(coro)


class ReplayPolicy:
    """Answers each task with a fixed list of model replies (the last one repeats).

    ``delay_s`` sleeps before every reply (for timeout tests).
    """

    def __init__(self, replies: dict[str, Sequence[str]], delay_s: float = 0.0) -> None:
        self.replies = {k: list(v) for k, v in replies.items()}
        self.delay_s = delay_s

    async def respond(self, request: Any) -> str:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        replies = self.replies[str(request.task.task_id)]
        return replies[min(request.step, len(replies) - 1)]

    async def aclose(self) -> None:
        pass


def reply(action: str, thought: str = "next step") -> str:
    """A model reply in the suite's format."""
    return f"<think>{thought}</think>\nAction: {action}"
