"""Anti-bot wall detection looks at what a wall is, not at a word (issue 23, item 2).

An ordinary 200 page that mentions "CAPTCHA", "access denied" or "too many
requests" is not a wall (one such page used to put its whole host on the
blocklist); a 403/429/503 with challenge words or markup, or a page that is
mostly a challenge, is.
"""

from __future__ import annotations

from typing import Any

import pytest

from replaystore.rollouts.browser import page_snapshot
from replaystore.rollouts.collector import looks_blocked
from replaystore.rollouts.sites import LocalSuite

from .conftest import pool, run

_FILLER = (
    "Researchers compared how long people take to solve image puzzles on phones "
    "and laptops, and how often bots got through anyway. "
) * 6

ORDINARY_PAGES = {
    "captcha article": (
        "Why CAPTCHA puzzles keep getting harder - Tech News",
        f"Why CAPTCHA puzzles keep getting harder\n{_FILLER}",
    ),
    "access denied help": (
        "Fixing 'Access denied' errors on shared folders",
        f"When Windows says access denied, check the folder's owner first. {_FILLER}",
    ),
    "rate limit docs": (
        "API rate limits",
        f"Our API answers 429 Too Many Requests when you exceed 100 calls a minute. {_FILLER}",
    ),
}


@pytest.mark.parametrize("name", sorted(ORDINARY_PAGES))
def test_an_ordinary_page_that_mentions_challenge_words_is_not_a_wall(name: str) -> None:
    title, text = ORDINARY_PAGES[name]
    assert looks_blocked(200, title, text) is None


def test_a_long_page_with_a_recaptcha_box_is_not_a_wall() -> None:
    _, text = ORDINARY_PAGES["captcha article"]
    assert looks_blocked(200, "Contact us", text, "div.g-recaptcha") is None


def test_a_plain_403_without_challenge_is_not_a_wall() -> None:
    assert looks_blocked(403, "403 Forbidden", "Forbidden\nnginx") is None


@pytest.mark.parametrize("status", [403, 429, 503])
def test_a_wall_status_with_challenge_words_is_a_wall(status: int) -> None:
    why = looks_blocked(status, "Just a moment...", "Checking your browser before accessing.")
    assert why is not None and f"HTTP {status}" in why


def test_a_page_that_is_mostly_a_challenge_is_a_wall_even_with_status_200() -> None:
    assert looks_blocked(200, "Verify", "Please verify you are human.") is not None
    assert looks_blocked(200, "example.com", "One more step", "div.cf-turnstile") is not None


def _snapshot(browser: Any, html: str | None = None, url: str | None = None) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        async with pool(browser, 1) as contexts, contexts.context() as context:
            page = await context.new_page()
            status = None
            if url is not None:
                status = (await page.goto(url)).status
            else:
                await page.set_content(html or "")
            return {"status": status, **(await page_snapshot(page))}

    return run(go())


def test_the_suite_botwall_page_is_a_wall(browser: Any, suite: LocalSuite) -> None:
    snap = _snapshot(browser, url=suite.url("botwall"))
    assert looks_blocked(snap["status"], snap["title"], snap["text"], snap["challenge"])


def test_the_snapshot_finds_challenge_markup_in_a_real_page(browser: Any) -> None:
    title, text = ORDINARY_PAGES["captcha article"]
    article = _snapshot(browser, html=f"<title>{title}</title><h1>{text}</h1>")
    assert article["challenge"] == ""
    assert looks_blocked(200, article["title"], article["text"], article["challenge"]) is None
    widget = _snapshot(
        browser, html="<title>One moment</title><p>One more step</p><div class='cf-turnstile'>"
    )
    assert widget["challenge"] == "div.cf-turnstile"
    assert looks_blocked(200, widget["title"], widget["text"], widget["challenge"])
