"""The viewer on a loop run's storage: the overview shows the loop's learning (the
held-out curve and the training success per iteration, each labelled by what acted and
numbered as the loop numbers iterations), the list has an acting column and filter, and
the charts' labels do not overlap (measured in Chromium, where the viewer is used)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from replaystore.view import build_app, svg
from replaystore.view.trajectories import TrajectoryIndex

from .conftest import Page, serving
from .stores import LOOP_TASKS, make_loop_run

pytest.importorskip("httpx")
from starlette.testclient import TestClient


@pytest.fixture(scope="module")
def loop_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return make_loop_run(tmp_path_factory.mktemp("view") / "run")


def test_iterations_are_numbered_as_the_loop_numbers_them_with_what_acted(
    loop_run: dict[str, Any],
) -> None:
    index = TrajectoryIndex(loop_run["storage"])
    assert index.iterations == [1, 2]  # the files' numbers
    assert index.iteration_labels() == ["0: demonstrations", "1: model checkpoints/000"]
    assert index.actings == ["demonstrations", "model checkpoints/000"]
    row = index.summary(7)
    assert row["acting"] == "model checkpoints/000" and row["loop_iteration"] == 1


def test_overview_of_a_loop_run_draws_the_held_out_curve_and_training_success(
    loop_run: dict[str, Any],
) -> None:
    client = TestClient(build_app("trajectory_storage", loop_run["storage"]))
    html = client.get("/").text
    loop = html[html.index('id="loop"') : html.index("</section>")]
    assert "held-out success per iteration (seeds 100000-100009)" in loop
    assert "success on each iteration&#x27;s training tasks" in loop or (
        "success on each iteration's training tasks" in loop
    )
    assert loop.count("<svg") == 2
    for label in ("0: demonstrations", "1: model checkpoints/000", "untrained model"):
        assert label in loop, label
    for task in LOOP_TASKS:
        assert task in loop  # one line per task, named in the legend
    # The storage's own per-iteration chart numbers iterations as the loop does too.
    rest = html[html.index('id="storage-charts"') :]
    assert "0: demonstrations" in rest and ">1<" not in rest.split("</svg>")[0]
    # Websites without the loopback port, and without the prefix they all share.
    assert "41234" not in html
    assert "success rate by website (127.0.0.1/miniwob/...)" in rest
    assert "click-button.html" in rest


def test_a_plain_storage_has_no_loop_section(tmp_path: Path, traj_store: dict[str, Any]) -> None:
    html = TestClient(build_app("trajectory_storage", traj_store["root"])).get("/").text
    assert 'id="loop"' not in html


@pytest.mark.parametrize(
    "text", ["{not json", '{"iterations": [1, 2]}', '{"iterations": "x"}', "[]"]
)
def test_a_damaged_summary_is_named_and_the_storage_pages_still_work(
    tmp_path: Path, text: str
) -> None:
    run = make_loop_run(tmp_path / "run")
    (run["out"] / "summary.json").write_text(text, encoding="utf-8")
    response = TestClient(build_app("trajectory_storage", run["storage"])).get("/")
    assert response.status_code == 200
    note = re.search(r'id="loop-note">([^<]*)<', response.text)
    assert note and "summary.json cannot be read" in note.group(1)
    assert "storage-charts" in response.text


def test_list_has_an_acting_column_and_filter(loop_run: dict[str, Any]) -> None:
    client = TestClient(build_app("trajectory_storage", loop_run["storage"]))
    html = client.get("/trajectories?acting=model+checkpoints%2F000").text
    assert "5 of 10 trajectories match" in html
    assert html.count('<td class="acting">model checkpoints/000</td>') == 5
    assert '<td class="acting">demonstrations</td>' not in html
    assert "(loop 1)" in html
    bad = client.get("/trajectories?acting=nobody")
    assert bad.status_code == 400 and "acting" in bad.text


def test_short_labels_drop_the_shared_prefix_only() -> None:
    assert svg.short_labels(["a/b/x.html", "a/b/yy.html"]) == (["x.html", "yy.html"], "a/b/")
    assert svg.short_labels(["shop.localhost/", "news.localhost/"]) == (
        ["shop.localhost/", "news.localhost/"],
        "",
    )
    assert svg.short_labels(["only/one"]) == (["only/one"], "")


@pytest.fixture()
def page(browser: Any, loop_run: dict[str, Any], tmp_path: Path) -> Iterator[Page]:
    with serving(build_app("trajectory_storage", loop_run["storage"])) as url:
        p = Page(browser, url, tmp_path)
        yield p
        p.close()


def _overlaps(boxes: list[dict[str, float]]) -> list[tuple[int, int]]:
    out = []
    for i, a in enumerate(boxes):
        for j, b in enumerate(boxes[i + 1 :], start=i + 1):
            if (
                a["x"] < b["x"] + b["width"]
                and b["x"] < a["x"] + a["width"]
                and a["y"] < b["y"] + b["height"]
                and b["y"] < a["y"] + a["height"]
            ):
                out.append((i, j))
    return out


def test_loop_overview_in_chromium_labels_do_not_overlap_and_the_filter_works(
    page: Page,
) -> None:
    page.goto("/")
    assert page.page.locator("#loop svg.chart").count() == 2
    figures = page.page.locator("svg.chart")
    for k in range(figures.count()):
        chart = figures.nth(k)
        chart_box = chart.bounding_box()
        assert chart_box is not None
        ticks = chart.locator("text.tick")
        boxes = [ticks.nth(i).bounding_box() for i in range(ticks.count())]
        assert all(b is not None for b in boxes)
        assert not _overlaps(boxes), (k, chart.locator("title").first.text_content())  # type: ignore[arg-type]
        for b in boxes:  # every label inside its chart, none cut off
            assert b is not None
            assert (
                chart_box["y"] <= b["y"]
                and b["y"] + b["height"] <= chart_box["y"] + chart_box["height"] + 1
            )
    page.shot("loop-overview")
    page.goto("/trajectories")
    page.page.select_option("select[name=acting]", "demonstrations")
    page.page.click("#apply")
    page.page.wait_for_load_state()
    assert page.page.locator("#match-count").inner_text() == "5 of 10 trajectories match"
    assert set(page.page.locator("td.acting").all_inner_texts()) == {"demonstrations"}
