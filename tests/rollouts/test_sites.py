"""The local website suite: its task file, its plans, and what the server answers."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections import Counter

import pytest

from replaystore.pipeline.task_sampler import load_tasks
from replaystore.rollouts.sites import SITES, TASKS_FILE, LocalSuite, load_plans, localize_url


def _get(suite: LocalSuite, site: str, path: str = "/") -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{suite.port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _get_host(suite: LocalSuite, site: str, path: str = "/") -> tuple[int, str]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{suite.port}{path}", headers={"Host": f"{site}.localhost"}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_task_file_has_checkable_tasks_on_every_site_and_difficulty() -> None:
    tasks = load_tasks(TASKS_FILE)
    sites = Counter(t.website.split("//")[1].split(".")[0] for t in tasks)
    assert set(sites) == set(SITES) and len(SITES) >= 6
    assert {t.difficulty for t in tasks} == {1, 2, 3}
    assert all(t.reference_answer and t.evaluator_reference for t in tasks)
    plans = load_plans()
    assert set(plans) == {t.task_id for t in tasks}
    assert all(plan[-1] == ["answer"] for plan in plans.values())


@pytest.mark.parametrize(
    ("site", "path", "text"),
    [
        ("shop", "/search?q=lamp&max_price=30", "Desk Lamp"),
        ("travel", "/flights?to=Lisbon", "$129"),
        ("recipes", "/r/r1", "45 minutes"),
        ("library", "/book/b1/availability", "Riverside"),
        ("news", "/s/transport", "Night trams"),
    ],
)
def test_sites_serve_the_answers_their_tasks_need(site: str, path: str, text: str) -> None:
    with LocalSuite() as suite:
        status, body = _get_host(suite, site, path)
    assert status == 200 and text in body


def test_anti_bot_site_answers_403_with_a_captcha() -> None:
    with LocalSuite() as suite:
        status, body = _get_host(suite, "botwall")
    assert status == 403 and "CAPTCHA" in body


def test_unknown_hosts_get_404_and_urls_get_the_port() -> None:
    with LocalSuite() as suite:
        assert _get(suite, "")[0] == 404
        assert suite.url("shop").endswith(f".localhost:{suite.port}/")
        assert all(f":{suite.port}/" in t.website for t in suite.tasks())
    assert localize_url("http://shop.localhost/x", 81) == "http://shop.localhost:81/x"
    assert localize_url("https://example.org/", 81) == "https://example.org/"
    with pytest.raises(ValueError, match="unknown suite site"):
        LocalSuite().url("nope")
