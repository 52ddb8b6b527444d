"""``replaystore export``: a trajectory storage becomes a LLaMA-Factory dataset."""

from __future__ import annotations

import json
from pathlib import Path

from replaystore.trajectories.export import validate_record

from .conftest import assert_one_line_error, run_cli


def check_sharegpt_rules(record: dict, base: Path) -> None:
    """LLaMA-Factory's ShareGPT rules, checked independently of the exporter's validator."""
    turns = record["conversations"]
    assert [t["from"] for t in turns] == ["human", "gpt"] * (len(turns) // 2)
    assert turns[-1]["value"].strip()
    texts = [record["system"]] + [t["value"] for t in turns]
    assert sum(t.count("<image>") for t in texts) == len(record["images"])
    assert not any("<video>" in t or "<audio>" in t for t in texts)
    for image in record["images"]:
        assert (base / image).is_file()


def load_records(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))


def test_sharegpt_export_with_recency_bias_and_validation_split(trajectory_store, tmp_path):
    out = tmp_path / "lf"
    proc = run_cli(
        "export",
        trajectory_store,
        "--out",
        out,
        "--num-samples",
        "3",
        "--recency-bias-power",
        "2",
        "--val-ratio",
        "0.34",
        "--seed",
        "1",
        "--copy-images",
        "--dataset-name",
        "web",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # no progress bar when stderr is not a terminal
    assert "exported 2 train + 1 validation records (sharegpt) from 3 of 4" in proc.stdout
    assert str(out / "web.json") in proc.stdout
    info = json.loads((out / "dataset_info.json").read_text())
    assert set(info) == {"web", "web_val"}
    assert info["web"]["formatting"] == "sharegpt"
    assert info["web"]["columns"]["messages"] == "conversations"
    records = load_records(out / info["web"]["file_name"])
    records += load_records(out / info["web_val"]["file_name"])
    assert len(records) == 3
    for record in records:
        assert validate_record(record, "sharegpt", out) == []
        check_sharegpt_rules(record, out)
        assert all(not Path(image).is_absolute() for image in record["images"])


def test_export_is_deterministic_for_a_seed(trajectory_store, tmp_path):
    args = ["--num-samples", "2", "--recency-bias-power", "3", "--seed", "5"]
    for name in ("a", "b"):
        assert run_cli("export", trajectory_store, "--out", tmp_path / name, *args).returncode == 0
    a = (tmp_path / "a" / "replaystore.json").read_text()
    assert a == (tmp_path / "b" / "replaystore.json").read_text()


def test_default_exports_every_training_eligible_step(trajectory_store, tmp_path):
    proc = run_cli("export", trajectory_store, "--out", tmp_path / "lf")
    assert proc.returncode == 0, proc.stderr
    records = load_records(tmp_path / "lf" / "replaystore.json")
    # Successful trajectories' steps, without the one whose screenshot repeats next.
    assert len(records) == 4
    answers = sorted(r["conversations"][-1]["value"].splitlines()[-1] for r in records)
    assert answers == ["Action: answer [9-5]"] * 2 + ["Action: click [1]"] * 2


def test_all_and_keep_same_screenshot_export_failed_steps_too(trajectory_store, tmp_path):
    out = tmp_path / "lf"
    proc = run_cli(
        "export", trajectory_store, "--out", out, "--all", "--format", "openai", "--seed", "0"
    )
    assert proc.returncode == 0, proc.stderr
    records = load_records(out / "replaystore.json")
    assert len(records) == 7  # every real step; the dummy trajectory is never a sample
    for record in records:
        assert validate_record(record, "openai", out) == []
        roles = [m["role"] for m in record["messages"]]
        assert roles[0] == "system" and roles[-1] == "assistant"
    info = json.loads((out / "dataset_info.json").read_text())
    assert info["replaystore"]["columns"]["messages"] == "messages"

    kept = run_cli("export", trajectory_store, "--out", tmp_path / "k", "--keep-same-screenshot")
    assert kept.returncode == 0, kept.stderr
    assert len(load_records(tmp_path / "k" / "replaystore.json")) == 5


def test_prompts_missing_from_steps_are_built_by_the_conversation_builder(
    trajectory_store, tmp_path
):
    run_cli("export", trajectory_store, "--out", tmp_path / "lf", "--last-n-iterations", "1")
    records = load_records(tmp_path / "lf" / "replaystore.json")
    # Iteration 2 (task-3) kept no prompts: both records come from the builder.
    assert len(records) == 2
    for record in records:
        assert "Task: Find the opening hours of store 3" in record["conversations"][-2]["value"]
        # page text that spells <image> is escaped, never counted as a placeholder
        assert "&lt;image&gt; in page text" in record["conversations"][-2]["value"]


def test_export_from_something_that_is_not_a_storage_is_a_one_line_error(tmp_path):
    assert_one_line_error(
        run_cli("export", tmp_path / "nope", "--out", tmp_path / "lf"), "export", "not a directory"
    )
    assert_one_line_error(
        run_cli("export", tmp_path, "--out", tmp_path / "lf"), "export", "no trajectory iteration"
    )
    assert not (tmp_path / "lf").exists()


def test_image_root_refuses_screenshots_outside_it(trajectory_store, tmp_path, capsys):
    from replaystore.cli import main

    # The fixture's screenshots live beside the storage (root/screens), not inside it.
    status = main(
        [
            "export",
            str(trajectory_store),
            "--out",
            str(tmp_path / "no"),
            "--image-root",
            str(trajectory_store),
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1, err
    assert "outside the image root" in err[0]
    assert not (tmp_path / "no" / "dataset_info.json").exists()

    status = main(
        [
            "export",
            str(trajectory_store),
            "--out",
            str(tmp_path / "yes"),
            "--image-root",
            str(trajectory_store.parent),
        ]
    )
    assert status == 0, capsys.readouterr().err
    assert (tmp_path / "yes" / "dataset_info.json").is_file()
