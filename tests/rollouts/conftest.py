"""Shared fixtures of the rollout tests: a real Chromium, the local website suite.

Browser tests need Chromium (Debian: ``apt-get install chromium``; or
``REPLAYSTORE_CHROMIUM=/path``). Without one they skip with one line saying
so, except under ``CI=true``, where a missing browser fails the test.

Speed: the tests are synchronous and run their coroutines with :func:`run` on
one event loop for the whole session, so one Chromium (the ``browser``
fixture, launched once) serves every test's pools (``BrowserPool(browser=...)``);
only the tests of launching itself (``replaystore rollout``, the Ctrl-C child
process, CDP) start browsers of their own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from replaystore.rollouts.browser import (
    CHROMIUM_ARGS,
    BrowserPool,
)
from replaystore.rollouts.sites import LocalSuite

#: Small pages make fast screenshots: every browser test uses this viewport.
VIEWPORT = (640, 420)
#: Short step budgets keep every rollout test a few seconds long.
TEST_MAX_STEPS = {"easy": 5, "medium": 6, "hard": 8}


# ``chromium`` (the browser these tests launch) is a fixture of tests/conftest.py.


_RUNNER: asyncio.Runner | None = None


def run(coro: Any) -> Any:
    """Run a coroutine to completion on the session's event loop (the tests are
    synchronous; the shared browser's Playwright objects live on this loop)."""
    global _RUNNER
    if _RUNNER is None:
        _RUNNER = asyncio.Runner()
    return _RUNNER.run(coro)


@pytest.fixture(scope="session", autouse=True)
def _session_loop() -> Iterator[None]:
    """Closes the session's event loop after the last test."""
    global _RUNNER
    yield
    if _RUNNER is not None:
        _RUNNER.close()
        _RUNNER = None


@pytest.fixture(scope="session")
def browser(chromium: str | None) -> Iterator[Any]:
    """One headless Chromium for the whole session (each pool makes its own contexts)."""
    from playwright.async_api import async_playwright

    async def launch() -> tuple[Any, Any]:
        playwright = await async_playwright().start()
        launched = await playwright.chromium.launch(
            executable_path=chromium, headless=True, args=list(CHROMIUM_ARGS)
        )
        return playwright, launched

    playwright, launched = run(launch())
    yield launched

    async def stop() -> None:
        await launched.close()
        await playwright.stop()

    run(stop())


def pool(browser: Any, size: int) -> BrowserPool:
    """A pool of ``size`` contexts on the session's browser, test viewport."""
    return BrowserPool(size, browser=browser, viewport=VIEWPORT)


@pytest.fixture(scope="session")
def suite() -> Iterator[LocalSuite]:
    """The local website suite, served for the whole session."""
    with LocalSuite() as running:
        yield running


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
