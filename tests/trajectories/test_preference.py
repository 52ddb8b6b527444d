"""Preference data from a trajectory storage (``replaystore export --format kto|dpo``):
KTO tags every step by its trajectory's outcome; DPO pairs a success's action with a
failure's different action at the same task and prompt, with the counts of what was made."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from cli_runner import run_cli
from replaystore.errors import ArgumentError, TrajectoryError
from replaystore.trajectories.export import dataset_info_entry, validate_record
from replaystore.trajectories.preference import (
    dpo_pairs,
    kto_samples,
    preference_steps,
    storage_trajectories,
)
from replaystore.trajectories.storage import TrajectoryStorage

from .conftest import TrajectoryFactory


def _acting(trajectory: list[dict[str, Any]], *actions: str) -> list[dict[str, Any]]:
    """``trajectory`` with these raw responses, step by step."""
    for step, action in zip(trajectory, actions, strict=True):
        step["response"] = dataclasses.replace(step["response"], raw_response=action)
    return trajectory


def _attempts(factory: TrajectoryFactory) -> list[list[dict[str, Any]]]:
    """Four attempts at one task instance (the same first screen, so the same first state):

    * success over screens [1, 2]: actions A, B;
    * success over [1, 3]: actions A, C;
    * failure over [1, 4]: actions Z, D (Z at the first state: a pair with A);
    * failure over [1, 5]: actions A, E (A was also a success's action: no pair for it).

    and one failure of another task over [1]: action Q (its state is its own task's).
    """
    task = factory.task("Open the hours page")
    other = factory.task("Open the map page")
    return [
        _acting(factory.trajectory(2, screens=[1, 2], task=task), "A", "B"),
        _acting(factory.trajectory(2, screens=[1, 3], task=task), "A", "C"),
        _acting(factory.trajectory(2, screens=[1, 4], task=task, success=False), "Z", "D"),
        _acting(factory.trajectory(2, screens=[1, 5], task=task, success=False), "A", "E"),
        _acting(factory.trajectory(1, screens=[1], task=other, success=False), "Q"),
    ]


def _store(factory: TrajectoryFactory, root: Path) -> Path:
    storage = TrajectoryStorage(root)
    attempts = _attempts(factory)
    storage.save_iteration(1, attempts[:2])
    storage.save_iteration(2, [*attempts[2:], factory.dummy_trajectory()])
    return root


def test_kto_tags_each_step_by_its_trajectory_and_skips_dummies(
    trajectory_factory: TrajectoryFactory, tmp_path: Path
) -> None:
    storage = TrajectoryStorage(_store(trajectory_factory, tmp_path / "store"))
    steps = preference_steps(storage_trajectories(storage))
    assert [(s.action, s.success) for s in steps] == [
        ("A", True), ("B", True), ("A", True), ("C", True),
        ("Z", False), ("D", False), ("A", False), ("E", False), ("Q", False),
    ]  # fmt: skip
    assert steps[4].where == "iteration 2 trajectory 0 step 0"
    samples = kto_samples(steps)
    assert [s["kto_tag"] for s in samples] == [True] * 4 + [False] * 5
    assert samples[0]["message"][0]["role"] == "system"


def test_dpo_pairs_a_successful_action_with_each_different_failed_one_at_a_state(
    trajectory_factory: TrajectoryFactory,
) -> None:
    steps = preference_steps((f"t{i}", t) for i, t in enumerate(_attempts(trajectory_factory)))
    pairs, report = dpo_pairs(steps)
    # The first state of the task: successes took A (twice), failures Z and A. One pair.
    assert [(p["chosen"], p["rejected"]) for p in pairs] == [("A", "Z")]
    assert report.as_dict() == {
        "states": 6,  # the shared first state, screens 2, 3, 4, 5, the other task's
        "pairs": 1,
        "states_with_pairs": 1,
        "only_successful": 2,  # screens 2 and 3
        "only_failed": 3,  # screens 4 and 5, and the other task (the same screen 1)
        "same_actions": 0,
    }
    # The four first steps' screenshots are four files of the same pixels, so they are
    # one state (the pair above); its prompt is the task's.
    assert "Open the hours page" in json.dumps(pairs[0]["message"])


def test_the_most_frequent_success_is_chosen_and_a_shared_action_makes_no_pair(
    trajectory_factory: TrajectoryFactory,
) -> None:
    task = trajectory_factory.task("Search for kettles")
    won = [_acting(trajectory_factory.trajectory(1, screens=[9], task=task), a) for a in "XYY"]
    lost = [
        _acting(trajectory_factory.trajectory(1, screens=[9], task=task, success=False), a)
        for a in ("X", "W", "W", "V")
    ]
    pairs, report = dpo_pairs(preference_steps((str(i), t) for i, t in enumerate(won + lost)))
    assert [(p["chosen"], p["rejected"]) for p in pairs] == [("Y", "W"), ("Y", "V")]
    assert (report.states, report.pairs, report.states_with_pairs) == (1, 2, 1)
    # Failures that only repeat what a success did make nothing.
    only_shared = [won[0], lost[0]]
    pairs, report = dpo_pairs(preference_steps((str(i), t) for i, t in enumerate(only_shared)))
    assert pairs == [] and report.same_actions == 1


def test_a_step_without_its_stored_prompt_is_named(trajectory_factory: TrajectoryFactory) -> None:
    trajectory = trajectory_factory.trajectory(2, raw_prompt=False)
    with pytest.raises(TrajectoryError, match=r"run 7 step 0 has no stored prompt"):
        preference_steps([("run 7", trajectory)])
    trajectory = trajectory_factory.trajectory(1)
    trajectory[0]["reward"] = dataclasses.replace(trajectory[0]["reward"], reward=None)
    with pytest.raises(TrajectoryError, match="run 8"):
        preference_steps([("run 8", trajectory)])


def test_preference_entries_name_their_columns_and_refuse_the_openai_shape() -> None:
    kto = dataset_info_entry("k.json", kind="kto")
    assert kto["columns"]["kto_tag"] == "kto_tag" and "ranking" not in kto
    dpo = dataset_info_entry("d.json", kind="dpo")
    assert dpo["ranking"] is True
    assert (dpo["columns"]["chosen"], dpo["columns"]["rejected"]) == ("chosen", "rejected")
    with pytest.raises(ArgumentError, match="kto datasets are written in sharegpt format"):
        dataset_info_entry("k.json", "openai", "kto")
    with pytest.raises(ArgumentError, match="kind must be 'sft', 'kto' or 'dpo'"):
        dataset_info_entry("k.json", kind="ppo")  # type: ignore[arg-type]


def _records(path: Path) -> list[dict[str, Any]]:
    return json.loads(path.read_text(encoding="utf-8"))


def test_export_command_writes_kto_and_dpo_datasets(
    trajectory_factory: TrajectoryFactory, tmp_path: Path
) -> None:
    store = _store(trajectory_factory, tmp_path / "store")
    kto = run_cli("export", store, "--out", tmp_path / "kto", "--format", "kto",
                  "--dataset-name", "web_kto")  # fmt: skip
    assert kto.returncode == 0, kto.stderr
    assert "exported 9 train + 0 validation KTO records from 9 steps (4 of successful " in (
        kto.stdout
    )
    records = _records(tmp_path / "kto" / "web_kto.json")
    assert sorted(r["kto_tag"] for r in records) == [False] * 5 + [True] * 4
    for record in records:
        assert validate_record(record) == []
        assert record["conversations"][-1]["from"] == "gpt"
    info = json.loads((tmp_path / "kto" / "dataset_info.json").read_text())
    assert info["web_kto"]["columns"]["kto_tag"] == "kto_tag"

    dpo = run_cli("export", store, "--out", tmp_path / "dpo", "--format", "dpo")
    assert dpo.returncode == 0, dpo.stderr
    assert "DPO records from 1 pairs at 1 of 6 states (no pair: 2 reached only by " in dpo.stdout
    (record,) = _records(tmp_path / "dpo" / "replaystore.json")
    assert [t["from"] for t in record["conversations"]] == ["human"]  # ends on the prompt
    assert record["chosen"] == {"from": "gpt", "value": "A"}
    assert record["rejected"] == {"from": "gpt", "value": "Z"}
    assert len(record["images"]) == record["conversations"][0]["value"].count("<image>") == 1
    info = json.loads((tmp_path / "dpo" / "dataset_info.json").read_text())
    assert info["replaystore"]["ranking"] is True


def test_export_command_refuses_sft_options_and_says_why_there_are_no_pairs(
    trajectory_factory: TrajectoryFactory, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    TrajectoryStorage(store).save_iteration(1, [trajectory_factory.trajectory(2)])
    proc = run_cli("export", store, "--out", tmp_path / "o", "--format", "kto",
                   "--num-samples", "3")  # fmt: skip
    assert proc.returncode == 2 and "--num-samples is for SFT exports" in proc.stderr
    proc = run_cli("export", store, "--out", tmp_path / "o", "--format", "dpo")
    assert proc.returncode != 0 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert "no DPO pairs in" in line and "0 pairs at 0 of 2 states" in line
    assert not (tmp_path / "o").exists()


_LLAMAFACTORY_LOADS = """
import json, sys
from llamafactory.data.parser import get_dataset_list
from llamafactory.hparams import DataArguments
from llamafactory.data.converter import get_dataset_converter
out = {}
for directory, name in zip(sys.argv[1::2], sys.argv[2::2]):
    (attr,) = get_dataset_list([name], directory)
    args = DataArguments(dataset_dir=directory, media_dir=directory)
    converter = get_dataset_converter(attr.formatting, attr, args)
    rows = json.load(open(f"{directory}/{attr.dataset_name}"))
    converted = [converter(row) for row in rows]
    out[name] = {
        "kto_tag": attr.kto_tag, "ranking": attr.ranking, "rows": len(rows),
        "kept": sum(bool(c["_prompt"]) and bool(c["_response"]) for c in converted),
        "responses": [[m["content"] for m in c["_response"]] for c in converted],
        "images": [len(c["_images"] or []) for c in converted],
    }
print(json.dumps(out))
"""


def test_llamafactory_converters_load_both_exports_with_nothing_dropped(
    trajectory_factory: TrajectoryFactory, tmp_path: Path, real_tools: Any
) -> None:
    store = _store(trajectory_factory, tmp_path / "store")
    for kind in ("kto", "dpo"):
        done = run_cli("export", store, "--out", tmp_path / kind, "--format", kind,
                       "--dataset-name", f"web_{kind}")  # fmt: skip
        assert done.returncode == 0, done.stderr
    proc = subprocess.run(
        [str(real_tools.train_python), "-c", _LLAMAFACTORY_LOADS,
         str(tmp_path / "kto"), "web_kto", str(tmp_path / "dpo"), "web_dpo"],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    kto, dpo = loaded["web_kto"], loaded["web_dpo"]
    assert kto["kto_tag"] == "kto_tag" and kto["rows"] == kto["kept"] == 9
    # KTO's converter puts an empty response after a desirable one, before an undesirable.
    assert sorted(r.index("") for r in kto["responses"]) == [0] * 5 + [1] * 4
    assert dpo["ranking"] is True and dpo["rows"] == dpo["kept"] == 1
    assert dpo["responses"] == [["A", "Z"]] and dpo["images"] == [1]
