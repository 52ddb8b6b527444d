"""Trajectory file formats 3 and 4 (issue 25, goal 3): the same results as format 2.

Format 3 stores each trajectory as one zstandard frame whose prompts share their
messages; format 4 keeps those messages (and the responses) once per file, outside
the frames. Everything a reader gets must be exactly what format 2 (and the files
format 2 wrote, ``data/format_v2``, written by the version-2 writer before format 3
existed) gives: steps, prompts, buffer samples and messages, trajectories, stats
and the ShareGPT export, byte for byte. Format 4's own checks: test_format_v4.py.
"""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from replaystore.errors import TrajectoryError
from replaystore.trajectories.buffer import ReplayBuffer
from replaystore.trajectories.components import Action, Observation, Response, Reward, Task
from replaystore.trajectories.context import ConversationBuilder
from replaystore.trajectories.export import export_llamafactory
from replaystore.trajectories.storage import VERSION, TrajectoryStorage

FIXTURE = Path(__file__).parent / "data" / "format_v2"


def _version(path: Path) -> int:
    return int(json.loads(path.read_bytes().split(b"\n", 1)[0])["version"])


def _samples(buffer: ReplayBuffer, files: bool = True) -> list[Any]:
    """Every sample, or the error each one raises (as text; ``files=False``: without the
    file it names, for a storage whose files were merged)."""
    out: list[Any] = []
    for i in range(len(buffer.samples)):
        try:
            out.append(buffer.samples[i])
        except TrajectoryError as exc:
            text = f"TrajectoryError: {exc}"
            out.append(text if files else re.sub(r" \(trajectory \d+ of [^)]*\)", "", text))
    return out


def _export_bytes(buffer: ReplayBuffer, out: Path) -> dict[str, bytes]:
    """The ShareGPT export of every readable sample: file name -> bytes."""
    samples = [s for s in _samples(buffer) if isinstance(s, dict)]
    export_llamafactory(samples, out, format="sharegpt", shuffle=False, on_error="skip")
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}


def _everything(root: Path, out: Path) -> dict[str, Any]:
    """What every reader gives for a storage directory."""
    storage = TrajectoryStorage(root)
    buffer = ReplayBuffer.from_storage(root)
    stats = storage.stats()
    del stats["total_size_bytes"], stats["total_size_mb"]
    for row in stats["iterations"]:
        del row["size_bytes"]
    return {
        "load_all": storage.load_all(),
        "samples": _samples(buffer),
        "view": [buffer[i] for i in range(len(buffer))],
        "trajectories": list(buffer.trajectories),
        "stats": stats,
        "export": _export_bytes(buffer, out),
    }


def _copy_fixture(root: Path) -> None:
    """The fixture, with the screenshots its prompts name under the root (for the export)."""
    shutil.copytree(FIXTURE, root)
    (root / "shots").mkdir()
    for name, n in (("bravo", 4), ("foxtrot", 5)):
        for s in range(n):
            Image.new("RGB", (4, 4), (s, 0, 0)).save(root / "shots" / f"{name}_{s}.png")


@pytest.mark.parametrize("version", [3, 4])
def test_format_2_files_of_the_old_writer_upgrade_with_identical_results(
    tmp_path: Path, version: int
) -> None:
    root = tmp_path / "store"
    _copy_fixture(root)
    assert {_version(p) for p in root.glob("*.jsonl")} == {2}
    before = _everything(root, tmp_path / "export_before")
    assert before["export"]["replaystore.json"]  # the export wrote records
    sizes = sum(p.stat().st_size for p in root.glob("*.jsonl"))

    storage = TrajectoryStorage(root, format_version=version)
    upgraded = storage.upgrade()
    assert len(upgraded) == 3 and {_version(p) for p in root.glob("*.jsonl")} == {version}
    # format 3 compresses everything; format 4 keeps the prompt texts as they are
    size = sum(p.stat().st_size for p in root.glob("*.jsonl"))
    assert size < sizes * (0.5 if version == 3 else 1)
    assert _everything(root, tmp_path / "export_after") == before
    assert storage.upgrade() == []  # nothing left to upgrade

    # format 3 rank files merge by copying frames; format 4 ones into one table of texts
    storage.merge_ranks(2)
    merged = _everything(root, tmp_path / "export_merged")
    assert merged["load_all"] == before["load_all"]
    assert merged["samples"] == before["samples"]
    assert merged["export"] == before["export"]


def test_format_2_rank_files_merge_into_a_file_of_the_current_format(tmp_path: Path) -> None:
    root = tmp_path / "store"
    shutil.copytree(FIXTURE, root)
    expected = TrajectoryStorage(root).load_all()
    merged = TrajectoryStorage(root).merge_ranks(2)
    assert _version(merged) == VERSION == 4
    assert TrajectoryStorage(root).load_all() == expected
    # and a storage asked to write format 2 writes it (readable by older releases)
    shutil.rmtree(root)
    shutil.copytree(FIXTURE, root)
    assert _version(TrajectoryStorage(root, format_version=2).merge_ranks(2)) == 2
    assert TrajectoryStorage(root).load_all() == expected


# -- the same trajectories written as format 2 and format 3 ------------------------------

_TEXTS = ["plain", "é ü ✓", 'quote " and \\ backslash', 'a, {"role": "x"} inside', "😀 \\ud83d"]


def _messages(rng: random.Random, shared: list[dict[str, Any]], step: int) -> list[dict]:
    messages = list(shared[: rng.randint(0, len(shared))])
    messages.append(
        {
            "role": "user",
            "content": [
                {"type": "text", "text": f"{rng.choice(_TEXTS)} step {step}"},
                {"type": "image_url", "image_url": {"url": f"file:///shots/{step}.png"}},
            ],
        }
    )
    return messages


def _prompt(rng: random.Random, messages: list[dict], root: Path) -> str:
    """Prompts as writers produce them, and some that are no list of messages at all."""
    kind = rng.randrange(10)
    if kind == 0:
        return json.dumps(messages, indent=1)  # stored as it is
    if kind == 1:
        return json.dumps(messages, separators=(",", ":"))
    if kind == 2:
        return json.dumps(messages, ensure_ascii=True)
    if kind == 3:
        return "[{broken"  # the buffer refuses it, with the same error either way
    if kind == 4:
        return '[{"role": "user", "content": "a"}, {"role": "user", "content": "b"}, 3]'
    if kind == 5:  # a screenshot under the storage root: stored relative
        shot = {"type": "image_url", "image_url": {"url": (root / "shots" / "a.png").as_uri()}}
        return json.dumps([*messages[:-1], {"role": "user", "content": [shot]}], ensure_ascii=False)
    if kind == 6:
        return '[{"role": "user", "content": "x"} , {"role": "user", "content": "y"}]'
    if kind == 7:  # split into messages, but one has no content: refused as before
        return '[{"role": "system", "content": "x"}, {"role": "user"}]'
    return json.dumps(messages, ensure_ascii=False)


def _random_trajectories(seed: int, root: Path) -> list[list[dict[str, Any]]]:
    rng = random.Random(seed)
    trajectories = []
    for t in range(rng.randint(1, 6)):
        task = Task(
            f"task {t} {rng.choice(_TEXTS)}", "shop", "", "https://x.example", 1, None, None
        )
        shared = [{"role": "system", "content": f"system {rng.choice(_TEXTS)}"}]
        steps = []
        n = rng.randint(1, 7)
        for s in range(n):
            messages = _messages(rng, shared, s)
            shared.extend(messages[len(shared) :][:1])
            shared.append({"role": "assistant", "content": f"reply {s} {rng.choice(_TEXTS)}"})
            prompt = _prompt(rng, messages, root) if rng.random() < 0.9 else ""
            last = s == n - 1
            steps.append(
                {
                    "observation": Observation(task, f"/shots/{t}_{s}.png", None, {"url": "u"}),
                    "action": Action({"key": "click"}, f"click {s}"),
                    "response": Response(f"reply {s} {rng.choice(_TEXTS)}", None, prompt),
                    "reward": Reward(float(rng.random() < 0.7) if last else 0.0, None, submit=last),
                    "same_as_next_screenshot": rng.random() < 0.2 and not last,
                }
            )
        trajectories.append(steps)
    return trajectories


class _Builder:
    """Rebuilds prompts the files do not keep (steps saved without one)."""

    def build(self, task: Any, history: Any, observation: Any) -> list[dict[str, Any]]:
        return [{"role": "user", "content": f"{task.task_name} after {len(history)} steps"}]


@pytest.mark.parametrize("seed", range(8))
def test_formats_3_and_4_read_exactly_what_format_2_reads(tmp_path: Path, seed: int) -> None:
    results = []
    for version in (2, 3, 4):
        root = tmp_path / f"v{version}"
        trajectories = _random_trajectories(seed, root)
        storage = TrajectoryStorage(root, format_version=version)
        storage.save_iteration(1, trajectories[:2], rank=0)
        storage.save_iteration(1, trajectories[2:], rank=1)
        storage.save_iteration(2, trajectories[::-1])
        buffer = ReplayBuffer.from_storage(root, agent=_Builder())
        # iterating reads many samples at once (format 4): the same as one by one
        assert _iterated(buffer) == _samples(buffer)
        prompts = [
            s["response"].raw_prompt.replace(str(root), "ROOT")
            for t in storage.load_all()
            for s in t
        ]
        results.append((prompts, _samples(buffer), list(buffer.trajectories)))
        unmerged = _samples(buffer, files=False)
        storage.merge_ranks(1)
        merged = ReplayBuffer.from_storage(root, agent=_Builder())
        assert _samples(merged, files=False) == unmerged
    (prompts_2, samples_2, trajs_2), *later = results
    for version, (prompts, samples, trajs) in zip((3, 4), later, strict=True):
        assert prompts == prompts_2
        assert json.dumps(samples, default=str).replace(f"v{version}", "v2") == json.dumps(
            samples_2, default=str
        )
        assert len(trajs) == len(trajs_2)


def _iterated(buffer: ReplayBuffer) -> list[Any]:
    """``_samples`` through iteration (the batch path), errors as text where they occur."""
    out: list[Any] = []
    it = iter(buffer.samples)
    while True:
        try:
            out.append(next(it))
        except StopIteration:
            return out
        except TrajectoryError as exc:
            out.append(f"TrajectoryError: {exc}")
            it = iter(buffer.samples[len(out) :])


# -- the layout --------------------------------------------------------------------------


def _conversation_trajectory(root: Path, n: int, t: int = 0) -> list[dict[str, Any]]:
    """``n`` steps whose prompts are built as the collector builds them (history window 4)."""
    builder = ConversationBuilder()
    shots = root / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    task = Task(f"Find the opening hours of store {t}", "shop", "", "https://x.example", 1,
                None, None)  # fmt: skip
    steps: list[dict[str, Any]] = []
    for s in range(n):
        image = shots / f"{t}_{s}.png"
        Image.new("RGB", (8, 8), (s, t, 0)).save(image)
        tree = "\n".join(f"[{i}] link 'item {t}-{s}-{i}'" for i in range(20))
        obs = Observation(task, str(image), tree, {"url": f"https://x.example/{s}", "title": "X"})
        prompt = json.dumps(builder.build(task, steps, obs), ensure_ascii=False)
        last = s == n - 1
        steps.append(
            {
                "observation": obs,
                "action": Action({"key": "click", "element": s}, f"click [{s}]"),
                "response": Response(f"<think>step {s}</think>\nAction: click [{s}]", None, prompt),
                "reward": Reward(1.0 if last else 0.0, None, submit=last),
                "same_as_next_screenshot": False,
            }
        )
    return steps


def test_a_conversation_is_stored_once_not_again_at_every_step(tmp_path: Path) -> None:
    import zstandard

    root = tmp_path / "store"
    trajectory = _conversation_trajectory(root, 6)
    path = TrajectoryStorage(root, format_version=3).save_iteration(1, [trajectory])
    header_line, body = path.read_bytes().split(b"\n", 1)
    header = json.loads(header_line)
    assert header["version"] == 3 and header["num_steps"] == 6
    frame = zstandard.ZstdDecompressor().decompress(body)
    system = json.dumps(json.loads(trajectory[0]["response"].raw_prompt)[0], ensure_ascii=False)
    assert frame.count(system.encode()) == 1  # six prompts, one system message
    loaded = TrajectoryStorage(root).load_all()[0]
    assert [s["response"] for s in loaded] == [s["response"] for s in trajectory]


def test_rollout_bytes_per_step_stay_flat_as_trajectories_grow(tmp_path: Path) -> None:
    per_step = {}
    for version in (2, 3, 4):
        for n in (5, 10, 20):
            root = tmp_path / f"v{version}_{n}"
            trajectories = [_conversation_trajectory(root, n, t) for t in range(3)]
            path = TrajectoryStorage(root, format_version=version).save_iteration(1, trajectories)
            per_step[version, n] = path.stat().st_size / (3 * n)
    # format 2 stores each step's whole prompt: bytes per step grow with the length
    assert per_step[2, 20] > 1.15 * per_step[2, 5]
    # format 3 stores each message once: flat (even falling) per step, and far smaller
    assert per_step[3, 20] <= per_step[3, 5]
    assert per_step[3, 20] * 5 < per_step[2, 20]
    # format 4: each added step costs the same (its new texts, a growing summary of the
    # earlier steps as a prefix link), a third of format 2's step or less
    marginal_10 = (10 * per_step[4, 10] - 5 * per_step[4, 5]) / 5
    marginal_20 = (20 * per_step[4, 20] - 10 * per_step[4, 10]) / 10
    assert marginal_20 <= 1.1 * marginal_10
    assert per_step[4, 20] * 3 < per_step[2, 20]


def test_messages_read_from_a_file_backed_buffer_are_fresh_objects(tmp_path: Path) -> None:
    root = tmp_path / "store"
    TrajectoryStorage(root).save_iteration(1, [_conversation_trajectory(root, 4)])
    buffer = ReplayBuffer.from_storage(root, filter_successful_only=False)
    first = buffer[2]["message"]
    first[0]["content"] = "changed by the caller"
    first.append({"role": "user", "content": "extra"})
    again = buffer[2]["message"]
    assert again[0]["content"] != "changed by the caller" and len(again) == len(first) - 1
    assert again == json.loads(TrajectoryStorage(root).load_all()[0][2]["response"].raw_prompt)


def test_format_version_and_compression_level_are_checked(tmp_path: Path) -> None:
    from replaystore.errors import ArgumentError

    for bad in (1, 5, True, "3"):
        with pytest.raises(ArgumentError, match="format_version"):
            TrajectoryStorage(tmp_path, format_version=bad)  # type: ignore[arg-type]
    for bad in (0, 23, 2.0, None):
        with pytest.raises(ArgumentError, match="compression_level"):
            TrajectoryStorage(tmp_path, compression_level=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("version", [2, 3, 4])
def test_a_lone_surrogate_is_refused_naming_the_step(tmp_path: Path, version: int) -> None:
    task = Task("t", "", "", "w", 1, None, None)
    step = {
        "observation": Observation(task, "a.png", None),
        "action": Action({"key": "x"}, "x"),
        "response": Response("half an emoji \ud83d", None, ""),
        "reward": Reward(1.0, None),
        "same_as_next_screenshot": False,
    }
    storage = TrajectoryStorage(tmp_path, format_version=version)
    with pytest.raises(TrajectoryError, match=r"trajectory 0 step 1 cannot be stored"):
        storage.save_iteration(1, [[dict(step, response=Response("ok", None, "")), step]])
    assert storage.files() == []


def test_frames_are_stored_raw_where_compression_does_not_pay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from replaystore.trajectories.files import frames as storage_module

    class _Inflating:  # a compressor whose output is longer than its input
        def compress(self, data: bytes) -> bytes:
            return data + b"!"

    monkeypatch.setattr(storage_module, "_zstd_compressor", lambda level: _Inflating())
    root = tmp_path / "store"
    trajectory = _conversation_trajectory(root, 3)
    path = TrajectoryStorage(root).save_iteration(1, [trajectory])
    header = json.loads(path.read_bytes().split(b"\n", 1)[0])
    assert header["index"]["frame_codec"] == "AA=="  # codec 0: the frame as it is
    monkeypatch.undo()
    loaded = TrajectoryStorage(root).load_all()[0]
    assert [s["response"] for s in loaded] == [s["response"] for s in trajectory]
    buffer = ReplayBuffer.from_storage(root, filter_successful_only=False)
    assert buffer[1]["message"] == json.loads(trajectory[1]["response"].raw_prompt)


def test_step_to_dict_with_a_task_memo_gives_the_same_dicts(tmp_path: Path) -> None:
    from replaystore.trajectories.components import step_to_dict

    trajectory = _conversation_trajectory(tmp_path, 3)
    memo: dict[int, Any] = {}
    shared = [step_to_dict(step, tasks=memo) for step in trajectory]
    assert shared == [step_to_dict(step) for step in trajectory]
    assert shared[0]["observation"]["task"] is shared[2]["observation"]["task"]
    assert len(memo) == 1


def test_split_prompts_join_back_to_the_same_text() -> None:
    from replaystore.trajectories.files.prompts import join_prompt as _join_prompt
    from replaystore.trajectories.files.prompts import split_prompt as _split_prompt

    a, b, c = (
        {"role": r, "content": f"{r} text, {{with}} braces"} for r in ("system", "user", "x")
    )
    known: dict[str, list[str]] = {}
    prompts = [
        json.dumps([a, b, c]),
        json.dumps([a, b]),  # b was parsed in the middle before: known, and now the last
        json.dumps([a]),
        json.dumps([a, b], separators=(",", ":")),
        json.dumps([b, a, c], ensure_ascii=False),
        json.dumps([a, b, c], indent=2, ensure_ascii=False),  # as WebGym writes it
        json.dumps([a, b], indent=2),
        json.dumps([c], indent=4),
    ]
    for prompt in prompts * 2:
        separator, parts = _split_prompt(prompt, known)  # type: ignore[misc]
        assert separator == (2 if "\n  {\n    " in prompt else 3 if "\n    {" in prompt
                             else 1 if '},{' in prompt else 0)  # fmt: skip
        assert _join_prompt(separator, parts) == prompt
        assert [json.loads(p) for p in parts] == json.loads(prompt)
    for prompt in ("[]", "[{}, 3]", '[{"a": 1} ]', "[{broken}]", json.dumps([a], indent=1)):
        split = _split_prompt(prompt, known)
        assert split is None or _join_prompt(*split) == prompt
