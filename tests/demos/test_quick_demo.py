"""``replaystore demo --quick`` through the real entry point: one run feeds every check.

The run (module fixture; about 1.5 min on 2 loaded cores: marked slow) is the README's demo
command in quick form, every default part, as a child process under umask 022. Its
outputs feed the checks of each part: the summary, the transitions checkpoint, the
trajectories part (the web-agent loop in a real Chromium, from task sampling to a
LLaMA-Factory dataset), the experience store, and the files' modes. One run instead of
one per file: CI's slow step is a budget (``.ci/run``); the same run feeds the viewer's
check in a browser (``tests/view/test_demo_browser.py``). The fast checks of each part
(no browser, the configuration) stay in ``tests/cli/test_demo_command.py`` and
``tests/demos/test_trajectories_demo.py``. The full (not quick) demo is
``benchmarks/demo.py``.
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest
from PIL import Image

from cli_runner import run_cli
from file_modes import assert_files_have_mode
from quick_demo_run import STALE, quick_demo_run
from replaystore.demos import PARTS
from replaystore.demos.trajectories import DemoConfig
from replaystore.pipeline.blocklist import normalize_domain
from replaystore.trajectories.export import validate_record
from replaystore.trajectories.storage import TrajectoryStorage

BLOCKED = "botwall.localhost"


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory, chromium: str | None) -> tuple[Path, str]:
    """``replaystore demo --quick --out OUT`` under umask 022: ``(OUT, stdout)``; the
    session's one run (``tests/quick_demo_run.py``)."""
    return quick_demo_run(tmp_path_factory)


@pytest.fixture(scope="module")
def demo(demo_run: tuple[Path, str]) -> tuple[Path, list[str]]:
    """The trajectories part's directory and the lines it printed."""
    out, stdout = demo_run
    part = stdout.split("\n== trajectories ==\n", 1)[1].split("\n== ", 1)[0]
    return out / "trajectories", [line.strip() for line in part.splitlines() if line.strip()]


def assert_png(path: Path) -> None:
    with Image.open(path) as image:
        assert image.format == "PNG"
        image.load()


def success_rates(storage: TrajectoryStorage) -> list[float]:
    rows = storage.stats()["iterations"]
    return [
        r["successful_trajectories"] / (r["trajectories"] - r["dummy_trajectories"]) for r in rows
    ]


# ---------------------------------------------------------------- the whole demo


@pytest.mark.slow
def test_every_part_runs_and_the_summary_says_where_outputs_are(demo_run):
    out, stdout = demo_run
    assert PARTS[:2] == ("transitions", "trajectories")
    for part in PARTS:
        assert f"\n== {part} ==\n" in stdout
    summary = stdout.split("\n== summary ==\n", 1)[1]
    for part in PARTS:
        assert str((out / part).resolve()) in summary
    assert "total " in summary


@pytest.mark.slow
def test_transitions_outputs(demo_run):
    out, _ = demo_run
    assert_png(out / "transitions" / "learning_curve.png")
    meta = json.loads((out / "transitions" / "checkpoint" / "buffer.metadata").read_text())
    assert meta["data_size"] > 0 and meta["buffer_size"] >= meta["data_size"]
    stats = json.loads(run_cli("stats", out / "transitions" / "checkpoint", "--json").stdout)
    assert stats["kind"] == "transitions_checkpoint" and stats["data_files_complete"]


@pytest.mark.slow
def test_trajectories_outputs(demo_run):
    out, stdout = demo_run
    root = out / "trajectories"
    assert "SKIPPED" not in stdout  # CI has Chromium: the real browser loop ran
    assert stdout.count(" browser rollouts on ") == 3
    assert_png(root / "success_rate.png")
    shots = list((root / "screenshots").rglob("step_*.png"))
    assert shots
    assert_png(shots[0])
    assert TrajectoryStorage(root / "storage").iterations() == [1, 2, 3]
    dataset = root / "llamafactory"
    info = json.loads((dataset / "dataset_info.json").read_text())
    records = json.loads((dataset / info["webagent_demo"]["file_name"]).read_text())
    assert records
    for record in records:
        assert validate_record(record, "sharegpt", dataset) == []
    stats = json.loads(run_cli("stats", root / "storage", "--json").stdout)
    assert stats["kind"] == "trajectory_storage" and stats["total_iterations"] == 3


@pytest.mark.slow
def test_experience_outputs(demo_run):
    if "experience" not in PARTS:
        pytest.skip("the experience part is not registered")
    out, _ = demo_run
    store = out / "experience" / "experience.sqlite"
    conn = sqlite3.connect(f"{store.resolve().as_uri()}?mode=ro", uri=True)
    try:
        (rows,) = conn.execute("SELECT COUNT(*) FROM rows").fetchone()
    finally:
        conn.close()
    assert rows > 0
    stats = json.loads(run_cli("stats", store, "--json").stdout)
    assert stats["kind"] == "sqlite_experience_store" and stats["rows"] == rows


@pytest.mark.slow
def test_outputs_follow_umask_022(demo_run: tuple[Path, str]) -> None:
    """Every file the demo wrote (atomic writes included: mkstemp makes 0600) is 0644."""
    out, _ = demo_run
    stale = out / "trajectories" / "llamafactory" / f"{STALE}.json"
    assert not stale.exists()
    files = assert_files_have_mode(out, 0o644, at_least=20)
    names = {p.name for p in files}
    assert {"dataset_info.json", "experience.sqlite", "buffer.metadata"} <= names


# ---------------------------------------------------------------- the trajectories part


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
    quick = DemoConfig.quick()
    assert quick.tasks_per_iteration is not None
    assert len(trajectories) == quick.iterations * quick.tasks_per_iteration  # 3 x 6
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
