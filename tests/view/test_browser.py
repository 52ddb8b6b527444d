"""The viewer in a real headless Chromium (Playwright): every page loads without a
console error, filters and paging work from the form, a trajectory can be stepped
through with its screenshot loaded and its click point drawn.

Screenshots of each page are saved under the test's temporary directory.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from replaystore.view import build_app

from .conftest import Page, serving


@pytest.fixture(scope="module")
def traj_url(traj_store: dict[str, Any]) -> Iterator[str]:
    with serving(build_app("trajectory_storage", traj_store["root"])) as url:
        yield url


@pytest.fixture()
def page(browser: Any, traj_url: str, tmp_path: Path) -> Iterator[Page]:
    p = Page(browser, traj_url, tmp_path)
    yield p
    p.close()


def test_overview_page_shows_counts_and_three_charts(page: Page) -> None:
    page.goto("/")
    assert page.page.locator("svg.chart").count() == 3
    assert page.page.locator("#blocked-count").inner_text() == "8"
    assert "botwall.localhost" in page.page.locator("#blocked-sites").inner_text()
    page.shot("overview")
    page.page.click("#to-list")
    page.page.wait_for_url("**/trajectories")
    assert page.page.locator("#match-count").inner_text() == "24 of 24 trajectories match"


def test_list_filters_and_pages_from_the_form(page: Page) -> None:
    page.goto("/trajectories")
    page.page.select_option("select[name=website]", "http://shop.localhost")
    page.page.select_option("select[name=success]", "yes")
    page.page.select_option("select[name=page_size]", "10")
    page.page.click("#apply")
    page.page.wait_for_load_state()
    # shop is t % 3 == 0, success t % 2 == 0: t in {0, 6, 12, 18}
    assert page.page.locator("#match-count").inner_text() == "4 of 24 trajectories match"
    ids = page.page.locator("#trajectory-table a.open").all_inner_texts()
    assert ids == ["0", "6", "12", "18"]
    page.shot("list-filtered")
    page.page.fill("input[name=q]", "item 1")
    page.page.click("#apply")
    page.page.wait_for_load_state()
    assert page.page.locator("#trajectory-table a.open").all_inner_texts() == ["12", "18"]

    page.goto("/trajectories?page_size=10")
    assert page.page.locator("#page-info").first.inner_text() == "page 1 of 3"
    page.page.locator("#next-page").first.click()
    page.page.wait_for_load_state()
    assert page.page.locator("#page-info").first.inner_text() == "page 2 of 3"
    assert page.page.locator("#trajectory-table a.open").first.inner_text() == "10"
    page.shot("list-page-2")


def test_trajectory_steps_show_screenshot_click_point_action_and_reward(page: Page) -> None:
    page.goto("/trajectories?q=task+3:")
    page.page.locator("#trajectory-table a.open").first.click()
    page.page.wait_for_url("**/trajectory/3")
    # t=3: shop, 5 steps, not successful; clicks at (40 + 20 s, 30 + 10 s), then an answer
    for step in range(5):
        img = page.page.locator("#screenshot")
        img.wait_for()
        page.page.wait_for_function("document.getElementById('screenshot').complete")
        assert page.page.eval_on_selector("#screenshot", "e => e.naturalWidth") == 320
        assert page.page.locator("#step-number").inner_text() == str(step)
        action = page.page.locator("#action-string").inner_text()
        if step < 4:
            assert action == f"click({40 + 20 * step}, {30 + 10 * step})"
            point = page.page.locator("#click-point")
            assert point.is_visible()
            box, pic = point.bounding_box(), img.bounding_box()
            assert box is not None and pic is not None
            centre_x = (box["x"] + box["width"] / 2 - pic["x"]) * 320 / pic["width"]
            assert abs(centre_x - (40 + 20 * step)) < 3
            assert page.page.locator("#step-reward").inner_text() == "0.0"
        else:
            assert action == 'answer("answer 3")'
            assert page.page.locator("#click-point").is_hidden()
            assert '"match": false' in page.page.locator("#evaluation").inner_text()
        same = page.page.locator("#same-flag").inner_text()
        assert same == ("yes" if step == 0 else "no")
        assert f"step {step} of task 3" in page.page.locator("#raw-response").inner_text()
        assert page.page.locator(".turn.gpt").last.inner_text().endswith(action)
        page.shot(f"trajectory-3-step-{step}")
        if step < 4:
            page.page.click("#next-step")
            page.page.wait_for_url(f"**/trajectory/3?step={step + 1}")
    assert page.page.locator("#next-step").count() == 0
    assert page.page.locator("#final-reward").inner_text() == "0"


def test_screenshot_zoom_enlarges_the_image(page: Page) -> None:
    page.goto("/trajectory/0")
    page.page.wait_for_function("document.getElementById('screenshot').naturalWidth > 0")
    before = page.page.locator("#screenshot").bounding_box()
    page.page.click("[data-zoom=in]")
    after = page.page.locator("#screenshot").bounding_box()
    assert before is not None and after is not None
    assert after["width"] == pytest.approx(1.5 * before["width"], rel=0.02)
    assert page.page.locator("#zoom-level").inner_text() == "150%"
    page.page.click("[data-zoom=fit]")
    assert page.page.locator("#zoom-level").inner_text() == "100%"


def test_experience_pages_filter_and_show_a_row(
    browser: Any, exp_store: Path, tmp_path: Path
) -> None:
    with serving(build_app("sqlite_experience_store", exp_store)) as url:
        p = Page(browser, url, tmp_path)
        p.goto("/")
        assert p.page.locator("#store-counts").inner_text() == "36 rows in 12 tasks"
        p.shot("experience-tasks")
        p.page.locator("#task-table a.open").nth(3).click()
        p.page.wait_for_load_state()
        assert p.page.locator("#match-count").inner_text() == "3 rows match"
        fields = p.page.locator("input[name=field]")
        fields.nth(1).fill("exp_data.reward_t")
        p.page.locator("select[name=op]").nth(1).select_option("gt")
        p.page.locator("input[name=value]").nth(1).fill("0.5")
        p.page.click("#apply")
        p.page.wait_for_load_state()
        assert p.page.locator("#match-count").inner_text() == "1 rows match"
        assert '"op": "gt"' in p.page.locator("#condition").inner_text()
        p.shot("experience-rows")
        p.page.locator("#row-table a.open").first.click()
        p.page.wait_for_load_state()
        text = p.page.locator("#row-json").inner_text()
        assert '"task_id": "task-03"' in text and '"reward_t": 1.0' in text
        p.shot("experience-row")
        p.close()


@pytest.mark.parametrize("key", ["memmap", "checkpoint"])
def test_transitions_page_draws_histograms(
    browser: Any, transitions: dict[str, Path], tmp_path: Path, key: str
) -> None:
    kind = "transitions_memmap" if key == "memmap" else "transitions_checkpoint"
    with serving(build_app(kind, transitions[key])) as url:
        p = Page(browser, url, tmp_path)
        p.goto("/")
        assert p.page.locator("svg.chart").count() == 3
        assert re.match(r"40 \(62\.5% full\)", p.page.locator("#fill").inner_text())
        assert p.page.locator("#schema tbody tr").count() == 4
        p.shot(f"transitions-{key}")
        p.close()
