"""Fixtures of the loop tests: a Chromium for the tests that roll out in a real browser.

Like ``tests/rollouts``: without Chromium those tests skip with one line saying so,
except under ``CI=true``, where a missing browser fails them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def _no_browser(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true and {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def chromium() -> str | None:
    """Path of the Chromium the loop will launch (None: Playwright's own browser)."""
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        _no_browser("Playwright is not installed: pip install 'replaystore[rollouts]'")
    from replaystore.rollouts.browser import INSTALL_HINT, BrowserUnavailableError, find_chromium

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


@pytest.fixture(scope="session")
def real_tools() -> object:
    """The real LLaMA-Factory and vLLM environments (``bash .ci/install-loop-tools``).

    Skips with the set-up command when they are missing, except under ``CI=true``
    (where ``.ci/run`` makes them), where it fails.
    """
    from replaystore.loop import ToolsMissingError, default_tools_dir, find_tools

    try:
        return find_tools(default_tools_dir())
    except ToolsMissingError as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true and {exc}", pytrace=False)
        pytest.skip(str(exc))
