"""BrowserPool on a real Chromium: reuse, isolation, bounded size, CDP; the action grammar."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from replaystore.rollouts.actions import execute_action, format_action, parse_action
from replaystore.rollouts.browser import (
    CHROMIUM_ARGS,
    BrowserPool,
    BrowserUnavailableError,
    accessibility_tree,
    find_chromium,
)
from replaystore.rollouts.scripted import find_element, parse_ac_tree
from replaystore.rollouts.sites import LocalSuite

from .conftest import VIEWPORT, pool, run


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("click(12, 30.5)", {"key": "click", "x": 12.0, "y": 30.5}),
        ('type(1, 2, "lentil soup")', {"key": "type", "x": 1.0, "y": 2.0, "text": "lentil soup"}),
        ("key('Enter')", {"key": "key", "name": "Enter"}),
        ("scroll(down)", {"key": "scroll", "direction": "down"}),
        ("scroll('up');", {"key": "scroll", "direction": "up"}),
        ("back()", {"key": "back"}),
        ('goto("https://example.org/a")', {"key": "goto", "url": "https://example.org/a"}),
        ('answer("$39.99")', {"key": "answer", "text": "$39.99"}),
    ],
)
def test_parse_action_reads_the_grammar(text: str, expected: dict) -> None:
    action = parse_action(text)
    assert action.action == expected and action.action_string == text
    assert parse_action(format_action(expected)).action == expected


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("click here", "not an action call"),
        ("click(1)", "takes 2 arguments"),
        ("click(-1, 2)", ">= 0"),
        ("click(nan, 2)", "cannot read"),
        ("type(1, 2, 3)", "quoted string"),
        ('goto("file:///etc/passwd")', "http(s) URL"),
        ("scroll(left)", "down or up"),
        ("hover(1, 2)", "takes 1 argument"),
        ("swipe(1, 2)", "unknown action"),
        ("click(__import__('os').system('x'), 1)", "cannot read"),
    ],
)
def test_unparseable_actions_are_invalid_not_errors(text: str, reason: str) -> None:
    action = parse_action(text)
    assert action.action["key"] == "invalid"
    assert reason in action.action["reason"]


def test_find_chromium_rejects_a_bad_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REPLAYSTORE_CHROMIUM", "/nonexistent/chromium")
    with pytest.raises(BrowserUnavailableError, match="REPLAYSTORE_CHROMIUM"):
        find_chromium()


def test_find_chromium_takes_the_headless_shell_for_headless_launches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("chromium", "chromium-headless-shell"):
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(0o755)
    monkeypatch.delenv("REPLAYSTORE_CHROMIUM", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_chromium() == str(tmp_path / "chromium-headless-shell")
    assert find_chromium(headless=False) == str(tmp_path / "chromium")  # a window to watch
    (tmp_path / "chromium-headless-shell").unlink()
    assert find_chromium() == str(tmp_path / "chromium")


def test_pool_reuses_contexts_and_clears_cookies_and_storage(
    browser: Any, suite: LocalSuite
) -> None:
    async def go() -> None:
        async with pool(browser, 2) as contexts:
            url = suite.url("shop")
            async with contexts.context() as first:
                page = await first.new_page()
                await page.goto(url)
                await page.evaluate("localStorage.setItem('k', 'v'); document.cookie = 'c=1'")
                assert await page.evaluate("document.cookie") == "c=1"
            async with contexts.context() as second:
                assert second is first  # the same context, reused
                page = await second.new_page()
                await page.goto(url)
                assert await page.evaluate("localStorage.getItem('k')") is None
                assert await page.evaluate("document.cookie") == ""
            assert (contexts.created, contexts.reused) == (1, 1)
        # The pool closed its contexts and left the shared browser open.
        assert browser.is_connected() and not browser.contexts

    run(go())


def test_a_pool_on_a_given_browser_needs_a_browser_and_not_cdp_too(browser: Any) -> None:
    with pytest.raises(ValueError, match="not both"):
        BrowserPool(1, browser=browser, cdp_urls=["http://127.0.0.1:9"])
    with pytest.raises(ValueError, match="Playwright Browser"):
        BrowserPool(1, browser="chromium")


def test_pool_bounds_the_number_of_live_contexts(browser: Any) -> None:
    async def go() -> None:
        async with pool(browser, 2) as contexts:
            live = peak = 0

            async def task() -> None:
                nonlocal live, peak
                async with contexts.context():
                    live += 1
                    peak = max(peak, live)
                    await asyncio.sleep(0.05)
                    live -= 1

            await asyncio.gather(*(task() for _ in range(6)))
            assert peak == 2 and contexts.created == 2

    run(go())


def test_actions_execute_and_the_ac_tree_locates_elements(browser: Any, suite: LocalSuite) -> None:
    async def go() -> None:
        contexts = pool(browser, 1)
        async with contexts, contexts.context() as context:
            page = await context.new_page()
            await page.goto(suite.url("shop"))
            tree = parse_ac_tree(await accessibility_tree(page))
            box = find_element(tree, "textbox", "Search products")
            assert box is not None and 0 <= box.x < VIEWPORT[0] and 0 <= box.y < VIEWPORT[1]
            await execute_action(page, parse_action(f'type({box.x}, {box.y}, "kettle")'))
            # A generous settle window: the test asserts that the navigation is seen.
            outcome = await execute_action(page, parse_action('key("Enter")'), settle_s=1.0)
            assert outcome.navigated and outcome.error is None
            assert page.url.endswith("/search?q=kettle")
            link = find_element(parse_ac_tree(await accessibility_tree(page)), "link", "Red Kettle")
            assert link is not None
            await execute_action(page, parse_action(f"click({link.x}, {link.y})"), settle_s=1.0)
            assert await page.title() == "Red Kettle"
            await execute_action(page, parse_action("back()"))
            assert page.url.endswith("/search?q=kettle")
            bad = await execute_action(page, parse_action('key("NoSuchKey")'))
            assert bad.error is not None and "key" in bad.error
            done = await execute_action(page, parse_action('answer("$39.99")'))
            assert done.done and done.answer == "$39.99"

    run(go())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_pool_connects_to_a_remote_browser_over_cdp(
    chromium: str | None, suite: LocalSuite, tmp_path: Path
) -> None:
    if chromium is None:
        pytest.skip("the CDP test starts a system Chromium by path")
    port = _free_port()
    proc = subprocess.Popen(
        [chromium, "--headless", *CHROMIUM_ARGS, f"--remote-debugging-port={port}",
         f"--user-data-dir={tmp_path / 'profile'}", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        endpoint = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(endpoint + "/json/version", timeout=1).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

        async def go() -> None:
            async with BrowserPool(1, cdp_urls=[endpoint], viewport=VIEWPORT) as pool:
                assert pool.browser_version
                async with pool.context() as context:
                    page = await context.new_page()
                    await page.goto(suite.url("news"))
                    assert await page.title() == "Metro News"

        run(go())
        assert proc.poll() is None  # disconnecting leaves the remote browser running
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_unreachable_cdp_endpoint_is_a_clear_error(chromium: str | None) -> None:
    async def go() -> None:
        pool = BrowserPool(1, cdp_urls=[f"http://127.0.0.1:{_free_port()}"], launch_timeout_s=3)
        with pytest.raises(BrowserUnavailableError, match="over CDP"):
            await pool.start()

    run(go())
