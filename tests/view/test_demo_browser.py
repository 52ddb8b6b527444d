"""The viewer over the real demo's outputs (``replaystore demo --quick``'s rollouts in
Chromium on the local website suite), in a real browser. Slow: the demo itself takes tens
of seconds (one run for the session, shared with tests/demos/test_quick_demo.py).

``REPLAYSTORE_UPDATE_DOCS_IMG=1`` also writes the trajectory page's screenshot to
``docs/img/view-trajectory.png`` (the one the README and the docs show), from a demo run
in ``$TMPDIR/demo-output/trajectories`` (the path its header shows).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from quick_demo_run import quick_demo_run
from replaystore.view import build_app

from .conftest import Page, serving

pytestmark = pytest.mark.slow

DOCS_IMAGE = Path(__file__).resolve().parents[2] / "docs" / "img" / "view-trajectory.png"


@pytest.fixture(scope="module")
def demo_out(tmp_path_factory: pytest.TempPathFactory, browser: Any) -> Path:
    """The trajectories part of the session's ``replaystore demo --quick`` run
    (``tests/quick_demo_run.py``, shared with tests/demos/test_quick_demo.py); needs the
    browser fixture only to skip (or fail under CI) without Chromium.

    With ``REPLAYSTORE_UPDATE_DOCS_IMG=1``, a run of the demo's loop of its own (2
    iterations of 8 tasks, one rank) in the folder the docs show in the page's header."""
    if os.environ.get("REPLAYSTORE_UPDATE_DOCS_IMG") != "1":
        return quick_demo_run(tmp_path_factory)[0] / "trajectories"
    from replaystore.demos.trajectories import DemoConfig, run_loop

    out = Path(tempfile.gettempdir()) / "demo-output" / "trajectories"
    shutil.rmtree(out, ignore_errors=True)
    cfg = DemoConfig(
        iterations=2,
        tasks_per_iteration=8,
        world_size=1,
        workers=3,
        viewport=(640, 420),
        max_steps={"easy": 4, "medium": 5, "hard": 6},
        train_samples=8,
        wrong_answer_rate=0.5,
        improvement=0.3,
    )
    # The sync Playwright of the browser fixture runs an event loop on this thread.
    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, run_loop(out, cfg)).result()
    return out


@pytest.fixture(scope="module")
def demo_url(demo_out: Path) -> Iterator[str]:
    # as `replaystore view <demo>/trajectories` opens it: screenshots/ is beside storage/
    app = build_app("trajectory_storage", demo_out / "storage", image_root=demo_out)
    with serving(app) as url:
        yield url


def test_demo_outputs_in_the_browser(browser: Any, demo_url: str, tmp_path: Path) -> None:
    p = Page(browser, demo_url, tmp_path)
    p.goto("/")
    assert p.page.locator("svg.chart").count() == 3
    assert "botwall.localhost" in p.page.locator("#blocked-sites").inner_text()
    p.shot("demo-overview")
    # open the first successful trajectory and walk through every step
    p.goto("/trajectories?blocked=no&success=yes&page_size=200")
    ids = p.page.locator("#trajectory-table a.open").all_inner_texts()
    assert ids, "the demo run has no successful trajectory"
    p.page.locator("#trajectory-table a.open").first.click()
    p.page.wait_for_load_state()
    n = len(p.page.locator(".steps a.stepno").all())
    clicked = None
    for step in range(n):
        p.page.wait_for_function("document.getElementById('screenshot').complete")
        assert p.page.eval_on_selector("#screenshot", "e => e.naturalWidth") == 640
        action = p.page.locator("#action-string").inner_text()
        assert p.page.locator(".turn.gpt").last.inner_text().endswith(action)
        if action.startswith("click(") and clicked is None:
            clicked = p.page.url
            assert p.page.locator("#click-point").is_visible()
        p.shot(f"demo-step-{step}")
        if step + 1 < n:
            p.page.click("#next-step")
            p.page.wait_for_load_state()
    assert p.page.locator("#step-reward").inner_text() == "1.0"
    if os.environ.get("REPLAYSTORE_UPDATE_DOCS_IMG") == "1":
        p.page.goto(clicked or p.page.url)
        p.page.wait_for_function("document.getElementById('screenshot').complete")
        DOCS_IMAGE.parent.mkdir(parents=True, exist_ok=True)
        p.page.set_viewport_size({"width": 1280, "height": 860})
        p.page.screenshot(path=str(DOCS_IMAGE))
        assert DOCS_IMAGE.stat().st_size < 300_000
    p.close()
