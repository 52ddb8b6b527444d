"""A screenshot Chromium refuses once on a busy machine is taken again, not a failed task.

Seen in a full test run: ``Page.screenshot: Protocol error (Page.captureScreenshot):
Unable to capture screenshot`` failed a rollout task whose page was fine a moment later.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from playwright.async_api import Error as PlaywrightError

from replaystore.rollouts.collector import take_screenshot

REFUSAL = "Page.screenshot: Protocol error (Page.captureScreenshot): Unable to capture screenshot"


class FlakyPage:
    def __init__(self, refusals: int, *, closed: bool = False) -> None:
        self.refusals = refusals
        self.calls = 0
        self.closed = closed

    async def screenshot(self, **kwargs: object) -> bytes:
        self.calls += 1
        if self.calls <= self.refusals:
            raise PlaywrightError(REFUSAL)
        return b"\x89PNG"

    def is_closed(self) -> bool:
        return self.closed


def test_a_refused_capture_is_taken_again_and_logged(caplog) -> None:
    page = FlakyPage(refusals=2)
    with caplog.at_level(logging.WARNING, logger="replaystore"):
        assert asyncio.run(take_screenshot(page, "shop-004")) == b"\x89PNG"
    assert page.calls == 3
    tries = [r.getMessage() for r in caplog.records if "screenshot failed" in r.getMessage()]
    assert len(tries) == 2 and "task shop-004" in tries[0] and "Unable to capture" in tries[0]


def test_after_the_last_try_the_error_is_raised() -> None:
    page = FlakyPage(refusals=5)
    with pytest.raises(PlaywrightError, match="Unable to capture screenshot"):
        asyncio.run(take_screenshot(page, "t", tries=3))
    assert page.calls == 3


def test_a_closed_page_is_not_tried_again() -> None:
    page = FlakyPage(refusals=5, closed=True)
    with pytest.raises(PlaywrightError):
        asyncio.run(take_screenshot(page, "t"))
    assert page.calls == 1
