"""The ``trajectories`` demo part, run directly in quick mode; its claims checked on its files."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest
from PIL import Image

from replaystore.demos import PARTS
from replaystore.demos.trajectories import run
from replaystore.pipeline.blocklist import normalize_domain
from replaystore.trajectories.export import validate_record
from replaystore.trajectories.storage import TrajectoryStorage

BLOCKED = "botwall-market.test"


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> tuple[Path, list[str]]:
    out = tmp_path_factory.mktemp("demo") / "trajectories"
    return out, run(out, quick=True)


def same_up_to_path_and_size(lines: list[str], out: Path) -> list[str]:
    return [
        re.sub(r"\d+ KiB", "N KiB", line.replace(str(out), "OUT"))
        for line in lines
        if not line.startswith("time: ")
    ]


def success_rates(storage: TrajectoryStorage) -> list[float]:
    rows = storage.stats()["iterations"]
    return [
        r["successful_trajectories"] / (r["trajectories"] - r["dummy_trajectories"]) for r in rows
    ]


def test_part_is_registered_between_transitions_and_experience():
    assert PARTS.index("transitions") < PARTS.index("trajectories")
    if "experience" in PARTS:
        assert PARTS.index("trajectories") < PARTS.index("experience")


def test_one_merged_iteration_file_per_iteration(demo):
    out, _ = demo
    files = TrajectoryStorage(out / "storage").files()
    assert [(f.iteration, f.rank) for f in files] == [(1, None), (2, None), (3, None)]


def test_success_rate_rises_every_iteration(demo):
    out, lines = demo
    rates = success_rates(TrajectoryStorage(out / "storage"))
    assert all(a < b for a, b in itertools.pairwise(rates)), rates
    assert any(line.startswith("success rate per iteration: ") for line in lines)


def test_blocked_site_is_recorded_and_excluded_from_later_samples(demo):
    out, lines = demo
    entries = [json.loads(line) for line in (out / "blocklist.jsonl").read_text().splitlines()]
    assert entries and {e["domain"] for e in entries} == {BLOCKED}
    storage = TrajectoryStorage(out / "storage")
    sites: dict[int, set[str]] = {}
    for iteration, trajectory in storage.iter_trajectories():
        website = trajectory[0]["observation"].task.website
        sites.setdefault(iteration, set()).add(normalize_domain(website))
    assert BLOCKED in sites[1]
    assert all(BLOCKED not in sites[i] for i in (2, 3))
    assert len(sites[2]) == len(sites[1]) - 1  # every other website is still sampled
    (meta,) = storage.metadata(2)
    assert BLOCKED in meta["rank_metadata"]["0"]["blocked_domains_at_sampling"]
    assert any(line.startswith(f"blocklist: {BLOCKED}") for line in lines)


def test_some_steps_keep_their_prompt_and_some_leave_it_to_the_buffer(demo):
    out, _ = demo
    prompts = [
        bool(step["response"].raw_prompt)
        for trajectory in TrajectoryStorage(out / "storage").load_all()
        for step in trajectory
        if step["observation"].image_path
    ]
    assert 0 < sum(prompts) < len(prompts)


def test_repeated_screenshots_and_dummy_trajectories_are_present(demo):
    out, _ = demo
    stats = TrajectoryStorage(out / "storage").stats()
    assert stats["dummy_trajectories"] > 0
    flags = [
        step.get("same_as_next_screenshot", False)
        for trajectory in TrajectoryStorage(out / "storage").load_all()
        for step in trajectory
    ]
    assert any(flags) and not all(flags)


def test_export_is_a_valid_llamafactory_sharegpt_dataset(demo):
    out, lines = demo
    root = out / "llamafactory"
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


def test_plot_and_task_file_are_written(demo):
    out, _ = demo
    with Image.open(out / "success_rate.png") as image:
        assert image.format == "PNG" and image.size[0] > 100
    tasks = [json.loads(line) for line in (out / "tasks.jsonl").read_text().splitlines()]
    assert len(tasks) == 48
    assert {t["difficulty"] for t in tasks} == {1, 2, 3}


def test_same_seed_same_outputs_and_a_rerun_replaces_the_old_ones(demo, tmp_path):
    out, lines = demo
    again = tmp_path / "trajectories"
    first = run(again, quick=True)
    second = run(again, quick=True)  # iteration files are immutable: the rerun starts fresh
    assert same_up_to_path_and_size(first, again) == same_up_to_path_and_size(second, again)
    # Sizes differ with the length of the output path (prompts hold file:// URLs).
    assert same_up_to_path_and_size(first, again) == same_up_to_path_and_size(lines, out)
    name = "llamafactory/webagent_demo.json"
    assert (again / name).read_bytes() == (out / name).read_bytes()
