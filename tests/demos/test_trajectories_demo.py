"""The ``trajectories`` demo part: the web-agent loop in a real Chromium, quick mode.

One run (module fixture, ~15 s on 2 idle cores: marked slow) feeds the checks on
its files; the no-browser path and the demo's configuration are fast tests.
Browser runs need Chromium: without one they skip (fail under ``CI=true``), as
the browser tests in tests/rollouts do.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from pathlib import Path

import pytest
from PIL import Image

from replaystore.demos import PARTS
from replaystore.demos.trajectories import DemoConfig, run
from replaystore.pipeline.blocklist import normalize_domain
from replaystore.rollouts.scripted import ScriptedPolicy
from replaystore.trajectories.export import validate_record
from replaystore.trajectories.storage import TrajectoryStorage

BLOCKED = "botwall.localhost"
STALE = "stale-from-an-earlier-run"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    try:
        import playwright.async_api  # noqa: F401

        from replaystore.rollouts.browser import find_chromium

        if find_chromium() is None:
            raise RuntimeError("no Chromium found: apt-get install chromium")
    except (ImportError, RuntimeError) as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true and {exc}", pytrace=False)
        pytest.skip(str(exc))
    out = tmp_path_factory.mktemp("demo") / "trajectories"
    # Outputs of an earlier run: the demo must replace them (iteration files are immutable).
    (out / "llamafactory").mkdir(parents=True)
    (out / "llamafactory" / f"{STALE}.json").write_text("[]")
    (out / "tasks.jsonl").write_text(json.dumps({"task_id": STALE}) + "\n")
    return out, run(out, quick=True)


def success_rates(storage: TrajectoryStorage) -> list[float]:
    rows = storage.stats()["iterations"]
    return [
        r["successful_trajectories"] / (r["trajectories"] - r["dummy_trajectories"]) for r in rows
    ]


def test_part_is_registered_between_transitions_and_experience() -> None:
    assert PARTS.index("transitions") < PARTS.index("trajectories")
    if "experience" in PARTS:
        assert PARTS.index("trajectories") < PARTS.index("experience")


def test_the_scripted_policy_gets_better_with_every_iteration_of_the_demo() -> None:
    """The demo's learning curve comes from the policy's skill schedule: fewer wasted
    clicks and wrong answers every iteration, at every difficulty."""
    for cfg in (DemoConfig(), DemoConfig.quick()):
        policy = ScriptedPolicy(
            mistake_rate=cfg.mistake_rate,
            wrong_answer_rate=cfg.wrong_answer_rate,
            improvement=cfg.improvement,
        )
        for difficulty in (1, 2, 3):
            skills = [policy.skill(it, difficulty) for it in range(1, cfg.iterations + 1)]
            mistakes = [m for m, _ in skills]
            wrong = [w for _, w in skills]
            assert all(a > b for a, b in itertools.pairwise(wrong)), (cfg, wrong)
            assert all(a >= b for a, b in itertools.pairwise(mistakes))
            assert wrong[0] - wrong[-1] >= 0.4  # a clear rise, not noise
        assert policy.skill(1, 3)[1] > policy.skill(1, 1)[1]  # harder tasks fail more


def test_without_a_browser_the_part_says_how_to_get_one_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("playwright")
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.delenv("REPLAYSTORE_CHROMIUM", raising=False)
    monkeypatch.setenv("PATH", str(empty))  # no chromium on PATH
    monkeypatch.setenv("PLAYWRIGHT_BROWSERS_PATH", str(empty))  # no Playwright-managed one
    out = tmp_path / "trajectories"
    (out / "storage").mkdir(parents=True)
    lines = run(out, quick=True)
    assert lines[0].startswith("SKIPPED (no browser): no Chromium found: install one")
    assert "apt-get install chromium" in lines[0]
    assert "other parts still run" in lines[1]
    assert [p.name for p in out.iterdir()] == ["storage"]  # an earlier run's outputs are kept


@pytest.mark.slow
def test_one_merged_iteration_file_per_iteration(demo: tuple[Path, list[str]]) -> None:
    out, _ = demo
    files = TrajectoryStorage(out / "storage").files()
    assert [(f.iteration, f.rank) for f in files] == [(1, None), (2, None), (3, None)]
    for iteration in (1, 2, 3):
        (meta,) = TrajectoryStorage(out / "storage").metadata(iteration)
        assert set(meta["rank_metadata"]) == {"0", "1"}  # both ranks rolled out


@pytest.mark.slow
def test_success_rate_rises_from_the_first_to_the_last_iteration(
    demo: tuple[Path, list[str]],
) -> None:
    out, lines = demo
    rates = success_rates(TrajectoryStorage(out / "storage"))
    assert len(rates) == 3 and rates[0] < rates[-1], rates
    (curve,) = [line for line in lines if line.startswith("success rate per iteration: ")]
    assert curve.count("->") == 2


@pytest.mark.slow
def test_output_says_the_policy_is_scripted_and_no_model_is_trained(
    demo: tuple[Path, list[str]],
) -> None:
    _, lines = demo
    assert lines[0].startswith("policy: scripted (ScriptedPolicy; ")
    assert "fixed schedule" in lines[0] and "no model is trained here" in lines[0]
    (curve,) = [line for line in lines if line.startswith("success rate per iteration: ")]
    assert "the scripted schedule, not training" in curve


@pytest.mark.slow
def test_every_step_is_a_real_screenshot_of_the_page(demo: tuple[Path, list[str]]) -> None:
    out, _ = demo
    trajectories = TrajectoryStorage(out / "storage").load_all()
    assert len(trajectories) == 30
    for trajectory in trajectories:
        paths = [step["observation"].image_path for step in trajectory]
        assert len(set(paths)) == len(paths)  # one PNG per step
        for path in paths:
            assert Path(path).is_relative_to(out / "screenshots")
            with Image.open(path) as image:
                assert image.format == "PNG" and image.size == DemoConfig.quick().viewport
        assert trajectory[0]["observation"].page_metadata["url"].startswith("http://")


@pytest.mark.slow
def test_blocked_site_is_recorded_and_excluded_from_later_samples(
    demo: tuple[Path, list[str]],
) -> None:
    out, lines = demo
    entries = [json.loads(line) for line in (out / "blocklist.jsonl").read_text().splitlines()]
    assert entries and {e["domain"] for e in entries} == {BLOCKED}
    storage = TrajectoryStorage(out / "storage")
    sites: dict[int, set[str]] = {}
    for iteration, trajectory in storage.iter_trajectories():
        website = trajectory[0]["observation"].task.website
        sites.setdefault(iteration, set()).add(normalize_domain(website))
    assert BLOCKED in sites[1]
    assert all(sites[i] and BLOCKED not in sites[i] for i in (2, 3))
    assert any(line.startswith(f"blocklist: {BLOCKED} recorded in iteration 1") for line in lines)


@pytest.mark.slow
def test_stored_prompts_are_what_the_model_saw(demo: tuple[Path, list[str]]) -> None:
    _, lines = demo
    (line,) = [line for line in lines if line.startswith("prompts: ")]
    stored, identical = map(int, re.findall(r"(\d+) (?:stored|identical)", line))
    assert stored > 0 and identical == stored, line


@pytest.mark.slow
def test_wasted_clicks_are_same_screenshot_steps(demo: tuple[Path, list[str]]) -> None:
    out, _ = demo
    flags = [
        step.get("same_as_next_screenshot", False)
        for trajectory in TrajectoryStorage(out / "storage").load_all()
        for step in trajectory
    ]
    assert any(flags) and not all(flags)


@pytest.mark.slow
def test_export_is_a_valid_llamafactory_sharegpt_dataset(demo: tuple[Path, list[str]]) -> None:
    out, lines = demo
    root = out / "llamafactory"
    assert not (root / f"{STALE}.json").exists()
    info = json.loads((root / "dataset_info.json").read_text())
    assert set(info) == {"webagent_demo", "webagent_demo_val"}
    records = []
    for entry in info.values():
        assert entry["formatting"] == "sharegpt"
        records += json.loads((root / entry["file_name"]).read_text())
    assert len(records) == 24
    for record in records:
        assert validate_record(record, "sharegpt", root) == []
        assert all((root / image).is_file() for image in record["images"])
    assert any(line.startswith("re-read all 24 records: every one passes") for line in lines)


@pytest.mark.slow
def test_plot_and_task_file_are_written(demo: tuple[Path, list[str]]) -> None:
    out, _ = demo
    with Image.open(out / "success_rate.png") as image:
        assert image.format == "PNG" and image.size[0] > 100
    tasks = [json.loads(line) for line in (out / "tasks.jsonl").read_text().splitlines()]
    assert len(tasks) == 16 and STALE not in {t["task_id"] for t in tasks}
    assert {t["difficulty"] for t in tasks} == {1, 2, 3}
    assert all(re.match(r"http://\w+\.localhost:\d+/$", t["website"]) for t in tasks)
