"""Export to LLaMA-Factory: ShareGPT / OpenAI records, dataset_info.json, splits, checks."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from replaystore.errors import ExportError
from replaystore.pipeline.images import image_to_data_url
from replaystore.trajectories.buffer import ReplayBuffer
from replaystore.trajectories.context import ConversationBuilder
from replaystore.trajectories.export import (
    PLACEHOLDERS,
    escape_placeholders,
    export_buffer,
    export_llamafactory,
    sample_to_record,
    validate_record,
)


def llamafactory_problems(record: dict, dataset_dir: Path, fmt: str = "sharegpt") -> list[str]:
    """LLaMA-Factory's documented rules (data/README.md, mm_plugin), written independently.

    ShareGPT: human in odd positions, gpt in even positions, ending on gpt; OpenAI: an
    optional leading system message, then user/assistant alternating. Every value is a
    string; the number of "<image>" substrings over all messages equals len(images) and
    "<video>"/"<audio>" occur zero times (no videos/audios); relative image paths are
    resolved against dataset_dir (the default media_dir).
    """
    problems = []
    if fmt == "sharegpt":
        turns = record["conversations"]
        roles = [t["from"] for t in turns]
        values = [t["value"] for t in turns] + [record.get("system", "")]
        user, assistant = "human", "gpt"
    else:
        turns = record["messages"]
        if turns and turns[0]["role"] == "system":
            values = [turns[0]["content"]]
            turns = turns[1:]
        else:
            values = []
        roles = [t["role"] for t in turns]
        values += [t["content"] for t in turns]
        user, assistant = "user", "assistant"
    if roles != [user, assistant] * (len(roles) // 2) or not roles or len(roles) % 2:
        problems.append(f"bad roles {roles}")
    if not all(isinstance(v, str) for v in values):
        return [*problems, "non-string value"]
    text = "".join(values)
    if text.count("<image>") != len(record["images"]):
        problems.append(f"{text.count('<image>')} placeholders, {len(record['images'])} images")
    if "<video>" in text or "<audio>" in text:
        problems.append("video/audio placeholder without media")
    for image in record["images"]:
        if not (dataset_dir / image).is_file():  # absolute paths replace dataset_dir
            problems.append(f"missing {image}")
    return problems


def read_records(path: Path) -> list[dict]:
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines()]
    return json.loads(path.read_text())


def sample_from_step(step: dict, reward: float = 1.0) -> dict:
    return {
        "message": json.loads(step["response"].raw_prompt),
        "action": step["response"].raw_response,
        "trajectory_reward": reward,
        "same_as_next_screenshot": False,
    }


@pytest.fixture
def samples(trajectory_factory) -> list[dict]:
    """Ten samples: the prompts WebGym stores (system + user with one screenshot)."""
    steps = [s for _ in range(5) for s in trajectory_factory.trajectory(2)]
    return [sample_from_step(s) for s in steps]


@pytest.fixture
def multiturn_sample(trajectory_factory) -> dict:
    """A prompt built with history: three screenshots in three user turns."""
    steps = trajectory_factory.trajectory(3)
    current = steps[2]["observation"]
    messages = ConversationBuilder(history_window=4).build(current.task, steps[:2], current)
    return {"message": messages, "action": steps[2]["response"].raw_response}


def test_sharegpt_records_follow_llamafactory_rules(tmp_path, samples):
    report = export_llamafactory(samples, tmp_path / "ds")
    records = read_records(report.train_file)
    assert len(records) == report.num_train == 10
    for record in records:
        assert llamafactory_problems(record, tmp_path / "ds") == []
        assert set(record) == {"conversations", "system", "images"}
        assert record["system"] == "You are a web agent. Answer with one action."
        assert [t["from"] for t in record["conversations"]] == ["human", "gpt"]
    shots = sorted(s["message"][1]["content"][1]["image_url"]["url"] for s in samples)
    assert sorted(Path(r["images"][0]).as_uri() for r in records) == shots
    assert report.num_image_refs == 10 and report.images_written == 0


def test_one_placeholder_per_image_in_order(tmp_path, multiturn_sample):
    report = export_llamafactory([multiturn_sample], tmp_path)
    (record,) = read_records(report.train_file)
    assert llamafactory_problems(record, tmp_path) == []
    turns = record["conversations"]
    assert [t["from"] for t in turns] == ["human", "gpt"] * 3
    assert [t["value"].count("<image>") for t in turns] == [1, 0, 1, 0, 1, 0]
    urls = [
        part["image_url"]["url"]
        for m in multiturn_sample["message"]
        if isinstance(m["content"], list)
        for part in m["content"]
        if part["type"] == "image_url"
    ]
    assert [Path(p).as_uri() for p in record["images"]] == urls
    assert turns[0]["value"].startswith("Step 1 observation\nURL:")
    assert turns[0]["value"].endswith("\n<image>")
    assert turns[-1]["value"] == multiturn_sample["action"]


def test_literal_placeholders_in_text_are_escaped(tmp_path, samples):
    sample = samples[0]
    sample["message"][1]["content"][0]["text"] += "\npage says <image> and <video>"
    sample["action"] = "<think>an <audio> tag, <image></think>Action: click [2]"
    report = export_llamafactory([sample], tmp_path)
    (record,) = read_records(report.train_file)
    assert llamafactory_problems(record, tmp_path) == []
    human, gpt = (t["value"] for t in record["conversations"])
    assert human.count("<image>") == 1
    assert "page says &lt;image&gt; and &lt;video&gt;" in human
    assert gpt == "<think>an &lt;audio&gt; tag, &lt;image&gt;</think>Action: click [2]"


def test_escape_never_leaves_a_placeholder():
    tricky = "<<image>> <ima<image>ge> <video><audio> <image"
    escaped = escape_placeholders(tricky)
    assert not any(token in escaped for token in PLACEHOLDERS)
    assert escape_placeholders("no tokens") == "no tokens"


def test_validation_split_sizes_are_disjoint_and_cover_everything(tmp_path, samples):
    report = export_llamafactory(samples, tmp_path, val_ratio=0.3, seed=1)
    train, val = read_records(report.train_file), read_records(report.val_file)
    assert (report.num_train, report.num_val) == (len(train), len(val)) == (7, 3)
    all_actions = sorted(s["action"] for s in samples)
    assert sorted(r["conversations"][-1]["value"] for r in train + val) == all_actions


@pytest.mark.parametrize(("n", "ratio", "n_val"), [(1, 0.5, 0), (2, 0.01, 1), (4, 0.99, 3)])
def test_small_splits_keep_at_least_one_training_record(tmp_path, samples, n, ratio, n_val):
    report = export_llamafactory(samples[:n], tmp_path, val_ratio=ratio)
    assert (report.num_train, report.num_val) == (n - n_val, n_val)
    assert (report.val_file is not None) == (n_val > 0)


def test_same_seed_same_files_other_seed_other_order(tmp_path, samples):
    a = export_llamafactory(samples, tmp_path / "a", seed=7, val_ratio=0.2)
    b = export_llamafactory(samples, tmp_path / "b", seed=7, val_ratio=0.2)
    c = export_llamafactory(samples, tmp_path / "c", seed=8, val_ratio=0.2)
    assert a.train_file.read_bytes() == b.train_file.read_bytes()
    assert a.val_file.read_bytes() == b.val_file.read_bytes()
    assert read_records(a.train_file) + read_records(a.val_file) != read_records(
        c.train_file
    ) + read_records(c.val_file)


def test_no_shuffle_keeps_input_order(tmp_path, samples):
    report = export_llamafactory(samples, tmp_path, shuffle=False)
    actions = [r["conversations"][-1]["value"] for r in read_records(report.train_file)]
    assert actions == [s["action"] for s in samples]


def test_dataset_info_json_registers_train_and_val(tmp_path, samples):
    report = export_llamafactory(samples, tmp_path, dataset_name="web", val_ratio=0.2)
    info = json.loads((tmp_path / "dataset_info.json").read_text())
    sharegpt_entry = {
        "formatting": "sharegpt",
        "columns": {"messages": "conversations", "system": "system", "images": "images"},
        "tags": {
            "role_tag": "from",
            "content_tag": "value",
            "user_tag": "human",
            "assistant_tag": "gpt",
        },
    }
    assert info == {
        "web": {"file_name": "web.json", **sharegpt_entry},
        "web_val": {"file_name": "web_val.json", **sharegpt_entry},
    }
    assert report.dataset_info_file == tmp_path / "dataset_info.json"


def test_dataset_info_keeps_other_entries_and_drops_a_stale_val_entry(tmp_path, samples):
    (tmp_path / "dataset_info.json").write_text(json.dumps({"alpaca": {"file_name": "a.json"}}))
    export_llamafactory(samples, tmp_path, dataset_name="web", val_ratio=0.2)
    export_llamafactory(samples, tmp_path, dataset_name="web")
    info = json.loads((tmp_path / "dataset_info.json").read_text())
    assert sorted(info) == ["alpaca", "web"]
    assert info["alpaca"] == {"file_name": "a.json"}


def test_openai_format_records_and_dataset_info(tmp_path, multiturn_sample):
    report = export_llamafactory([multiturn_sample], tmp_path, format="openai", file_format="jsonl")
    assert report.train_file.name == "replaystore.jsonl"
    (record,) = read_records(report.train_file)
    assert set(record) == {"messages", "images"}
    assert llamafactory_problems(record, tmp_path, "openai") == []
    assert [m["role"] for m in record["messages"]] == ["system"] + ["user", "assistant"] * 3
    assert record["messages"][0]["content"] == multiturn_sample["message"][0]["content"]
    assert all(isinstance(m["content"], str) for m in record["messages"])
    info = json.loads((tmp_path / "dataset_info.json").read_text())
    assert info["replaystore"] == {
        "file_name": "replaystore.jsonl",
        "formatting": "sharegpt",
        "columns": {"messages": "messages", "images": "images"},
        "tags": {
            "role_tag": "role",
            "content_tag": "content",
            "user_tag": "user",
            "assistant_tag": "assistant",
            "system_tag": "system",
        },
    }


def test_data_url_images_are_decoded_next_to_the_dataset(tmp_path, samples):
    for sample in samples[:3]:
        part = sample["message"][1]["content"][1]
        path = Path(part["image_url"]["url"].removeprefix("file://"))
        part["image_url"]["url"] = image_to_data_url(path)
    report = export_llamafactory(samples[:3], tmp_path / "ds", shuffle=False)
    records = read_records(report.train_file)
    assert report.images_written == 3
    for record, sample in zip(records, samples[:3], strict=True):
        assert llamafactory_problems(record, tmp_path / "ds") == []
        (image,) = record["images"]
        assert Path(image).parent == tmp_path / "ds" / "images"
        assert image_to_data_url(image) == sample["message"][1]["content"][1]["image_url"]["url"]


def test_copy_images_makes_a_movable_dataset(tmp_path, samples):
    export_llamafactory(samples, tmp_path / "ds", copy_images=True)
    for screenshot in (tmp_path / "screenshots").iterdir():
        screenshot.unlink()
    shutil.move(tmp_path / "ds", tmp_path / "moved")
    records = read_records(tmp_path / "moved" / "replaystore.json")
    for record in records:
        assert record["images"][0].startswith("images/")
        assert llamafactory_problems(record, tmp_path / "moved") == []


def test_bad_samples_are_listed_and_nothing_is_written(tmp_path, samples, multiturn_sample):
    Path(
        samples[2]["message"][1]["content"][1]["image_url"]["url"].removeprefix("file://")
    ).unlink()
    del samples[4]["action"]
    samples[5]["message"].append({"role": "assistant", "content": "dangling"})
    samples[6]["message"][1]["role"] = "tool"
    samples[7]["action"] = "   "
    part = samples[0]["message"][1]["content"][1]["image_url"]  # decoded before the failures
    part["url"] = image_to_data_url(Path(part["url"].removeprefix("file://")))
    with pytest.raises(ExportError) as caught:
        export_llamafactory(samples, tmp_path / "ds")
    message = str(caught.value)
    assert "5 of 10 samples" in message
    assert "sample 2: message[1].content[1]: image" in message and "not found" in message
    assert "sample 4: sample has no 'action'" in message
    assert "sample 5: turn 2 should be 'human'" in message
    assert "sample 6: message[1] has unsupported role 'tool'" in message
    assert "sample 7: the final assistant turn is empty" in message
    assert not (tmp_path / "ds").exists()


def test_skip_mode_reports_rejected_samples(tmp_path, samples, caplog):
    del samples[3]["message"]
    report = export_llamafactory(samples, tmp_path, on_error="skip")
    assert report.num_train == 9
    assert [(r.index, r.reason) for r in report.rejected] == [(3, "sample has no 'message'")]
    assert "sample 3 left out" in caplog.text


def test_no_exportable_sample_is_an_error(tmp_path):
    with pytest.raises(ExportError, match="no exportable samples"):
        export_llamafactory([], tmp_path)


def test_unreadable_dataset_info_is_an_error_before_writing(tmp_path, samples):
    (tmp_path / "dataset_info.json").write_text("{not json")
    with pytest.raises(ExportError, match=r"dataset_info\.json"):
        export_llamafactory(samples, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dataset_info.json", "screenshots"]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"format": "alpaca"},
        {"file_format": "csv"},
        {"val_ratio": 1.0},
        {"val_ratio": -0.1},
        {"on_error": "ignore"},
        {"dataset_name": "a/b"},
    ],
)
def test_invalid_arguments_are_refused(tmp_path, samples, kwargs):
    with pytest.raises(ValueError):
        export_llamafactory(samples, tmp_path, **kwargs)


def test_image_in_system_or_assistant_message_is_refused(samples):
    image_part = samples[0]["message"][1]["content"][1]
    samples[0]["message"][0]["content"] = [image_part]
    with pytest.raises(ExportError, match=r"message\[0\]\.content\[0\] is an image outside"):
        sample_to_record(samples[0])


def test_validate_record_finds_llamafactory_problems(tmp_path):
    good = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "ok"}]}
    assert validate_record({**good, "images": []}, base_dir=tmp_path) == []
    assert validate_record({**good, "images": ["x.png"]}, base_dir=tmp_path) == [
        "0 <image> placeholders for 1 images",
        f"image file not found: {tmp_path / 'x.png'}",
    ]
    swapped = {"conversations": good["conversations"][::-1], "images": []}
    assert validate_record(swapped)[0] == "turn 0 should be 'human', got 'gpt'"
    video = {
        "messages": [{"role": "user", "content": "<video>"}, {"role": "assistant", "content": "a"}]
    }
    assert validate_record(video, "openai") == ["unescaped <video> with no videos/audios"]


def test_export_buffer_exports_training_samples(tmp_path, trajectory_factory):
    trajectories = [trajectory_factory.trajectory(3, success=s) for s in (True, False, True)]
    buffer = ReplayBuffer(trajectories, seed=0)
    report = export_buffer(buffer, tmp_path / "ds", num_samples=4, recency_bias_power=2.0, seed=3)
    again = export_buffer(buffer, tmp_path / "again", num_samples=4, recency_bias_power=2.0, seed=3)
    records = read_records(report.train_file)
    assert len(records) == 4
    assert report.train_file.read_bytes() == again.train_file.read_bytes()
    successful = {s["response"].raw_response for t in trajectories[::2] for s in t}
    for record in records:
        assert llamafactory_problems(record, tmp_path / "ds") == []
        assert record["conversations"][-1]["value"] in successful


def test_no_temporary_files_are_left_behind(tmp_path, samples):
    export_llamafactory(samples, tmp_path / "ds", val_ratio=0.5)
    assert not [name for name in os.listdir(tmp_path / "ds") if name.endswith(".tmp")]


# --------------------------------------------------------------------------- text observations


class _TextAgent:
    """What the buffer reads of a WebAgent in text mode: its conversation builder."""

    conversation_builder = ConversationBuilder(observation="text", history_window=2)


@pytest.mark.parametrize("fmt", ["sharegpt", "openai"])
def test_text_prompts_rebuilt_by_the_buffer_export_without_images(
    tmp_path, trajectory_factory, fmt
):
    trajectories = [trajectory_factory.trajectory(4, raw_prompt=False) for _ in range(2)]
    buffer = ReplayBuffer(trajectories, agent=_TextAgent(), filter_same_screenshot=False)
    report = export_buffer(buffer, tmp_path / "out", format=fmt, seed=1)
    records = read_records(report.train_file)
    assert len(records) == report.num_train == 8 and report.num_image_refs == 0
    for record in records:
        assert record["images"] == []
        assert "<image>" not in json.dumps(record)
        assert validate_record(record, fmt, base_dir=tmp_path / "out") == []
        assert llamafactory_problems(record, tmp_path / "out", fmt) == []
    turns = records[0]["conversations"] if fmt == "sharegpt" else records[0]["messages"]
    text = json.dumps(turns)
    assert "Accessibility tree:" in text and "URL: https://example.com/page/" in text


def test_stored_text_prompt_exports_as_its_strings(tmp_path, trajectory_factory):
    steps = trajectory_factory.trajectory(3)
    current = steps[2]["observation"]
    messages = ConversationBuilder(observation="text").build(current.task, steps[:2], current)
    record = sample_to_record({"message": messages, "action": "Action: back()"}, out_dir=tmp_path)
    assert record["images"] == []
    assert record["system"] == messages[0]["content"]
    assert [t["value"] for t in record["conversations"]] == [
        *(m["content"] for m in messages[1:]),
        "Action: back()",
    ]
    assert validate_record(record, "sharegpt") == []
