"""Decoded format 3 frames (issue 25, goal 3): lines found once, read on demand.

A frame is kept as its decoded bytes plus the positions of its newlines; a line is
copied out, a message decoded and a step's checksum verified only when read. What
is read must be exactly what splitting the frame into lines gives, and a frame whose
line count disagrees with its header is refused as before.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from replaystore.errors import StorageError
from replaystore.trajectories.files.v3 import _head_prompt
from replaystore.trajectories.files.v3 import checked_head as _checked_head
from replaystore.trajectories.files.v3 import frame_of as _frame_of
from replaystore.trajectories.files.v3 import split_frame as _split_frame


def _steps(n: int) -> list[dict[str, Any]]:
    """Step dicts whose prompts grow a conversation (messages shared between steps)."""
    messages = [{"role": "system", "content": "You browse.\nBe brief."}]
    steps = []
    for s in range(n):
        messages = [*messages, {"role": "user", "content": f"page {s}: caf\u00e9 \u2603 {'x' * s}"}]
        steps.append(
            {
                "observation": {"image_path": f"shots/{s}.png", "task": {"task_name": "t"}},
                "response": {"raw_prompt": json.dumps(messages), "raw_response": f"click [{s}]"},
                "reward": {"reward": 0.0},
            }
        )
    steps.append({"observation": {"image_path": ""}, "response": {"raw_prompt": "not json"}})
    return steps


def _frame(n: int = 4) -> tuple[bytes, list[int], int, list[dict[str, Any]]]:
    steps = _steps(n)
    prompts = [d["response"]["raw_prompt"] for d in steps]
    data, crcs, messages = _frame_of(0, steps, [False] * len(steps), {})
    for d, prompt in zip(steps, prompts, strict=True):
        d["prompt"] = prompt
    return data, crcs.tolist(), messages, steps


def test_lines_messages_and_heads_are_exactly_the_split_frame() -> None:
    data, crcs, n_messages, steps = _frame()
    frame = _split_frame(data, n_messages, len(steps), "here")
    lines = data.split(b"\n")[:-1]
    assert [frame.line(k) for k in range(len(lines))] == lines
    assert frame.messages == [line.decode("utf-8") for line in lines[:n_messages]]
    assert frame.lines == lines[n_messages:]
    for s, d in enumerate(steps):
        head, step_raw = _checked_head(frame, s, crcs[s], f"step {s}")
        assert step_raw == lines[n_messages + 2 * s + 1]
        assert head == json.loads(lines[n_messages + 2 * s])
        if "p" in head:
            assert _head_prompt(frame, head) == d["prompt"]
        else:
            assert json.loads(step_raw)["response"]["raw_prompt"] == d["prompt"]
    # messages are decoded when asked, not when the frame is split
    fresh = _split_frame(data, n_messages, len(steps), "here")
    assert fresh.texts == [None] * n_messages
    fresh.message(1)
    assert fresh.texts[0] is None and fresh.texts[1] == lines[1].decode("utf-8")


def test_a_frame_whose_lines_disagree_with_its_header_is_refused() -> None:
    data, _, n_messages, steps = _frame()
    n = len(steps)
    for bad, counts in (
        (data[:-1], (n_messages, n)),  # last newline missing
        (data + b"x", (n_messages, n)),  # text after the last line
        (data + b"x\n", (n_messages, n)),  # one line too many
        (data, (n_messages + 1, n)),
        (data, (n_messages, n + 1)),
        (b"", (0, 1)),
    ):
        with pytest.raises(StorageError, match=r"here: its frame holds .* lines, its header says"):
            _split_frame(bad, *counts, "here")
    assert _split_frame(b"", 0, 0, "here").lines == []


def test_only_what_is_read_is_checked() -> None:
    data, crcs, n_messages, steps = _frame()
    lines = data.split(b"\n")
    # a message no step asks for, made invalid UTF-8, and a damaged last step: the
    # other steps still read; the damaged step and a read of that message fail clearly
    lines[n_messages - 1] = b"\xff" + lines[n_messages - 1][1:]
    last = n_messages + 2 * (len(steps) - 1) + 1
    lines[last] = lines[last].replace(b"not json", b"NOT json")
    frame = _split_frame(b"\n".join(lines), n_messages, len(steps), "here")
    head, _ = _checked_head(frame, 0, crcs[0], "step 0")
    assert json.loads(_head_prompt(frame, head)) == json.loads(steps[0]["prompt"])
    with pytest.raises(StorageError, match="here: malformed prompt message"):
        frame.message(n_messages - 1)
    with pytest.raises(StorageError, match="step 4: step fails its CRC32 check"):
        _checked_head(frame, len(steps) - 1, crcs[-1], "step 4")
    with pytest.raises(IndexError):
        frame.message(-1)


def test_step_checksums_cover_the_head_and_step_lines() -> None:
    data, crcs, n_messages, steps = _frame()
    lines = data.split(b"\n")
    for s in range(len(steps)):
        k = n_messages + 2 * s
        expected = zlib.crc32(lines[k + 1] + b"\n", zlib.crc32(lines[k] + b"\n"))
        assert crcs[s] == expected
    assert np.asarray(crcs).dtype.kind in "iu"


def _webgym_like(n_traj: int, steps: int = 6) -> list[list[dict[str, Any]]]:
    from replaystore.trajectories.components import Action, Observation, Response, Reward, Task

    rng = np.random.default_rng(5)
    words = ["alpha", "bravo", "page", "click", "result", "search", "cart", "item"]
    out = []
    for t in range(n_traj):
        task = Task(f"task {t}", "Shopping", "Shopping", f"https://s{t}.example", 2, None, None)
        traj = []
        for s in range(steps):
            text = " ".join(rng.choice(words, 400).tolist())
            prompt = json.dumps(
                [{"role": "system", "content": "Act."}, {"role": "user", "content": text}]
            )
            traj.append(
                {
                    "observation": Observation(task, f"/shots/{t}_{s}.png", None, {"url": "u"}),
                    "action": Action({"key": "click"}, "click [1]"),
                    "response": Response(f"click [{s}]", {"action": "click"}, prompt),
                    "reward": Reward(1.0 if s == steps - 1 else 0.0, None, submit=s == steps - 1),
                    "same_as_next_screenshot": False,
                }
            )
        out.append(traj)
    return out


def test_frames_compressed_together_are_the_bytes_compressed_one_by_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from replaystore.trajectories.buffer import ReplayBuffer
    from replaystore.trajectories.files import frames as module
    from replaystore.trajectories.storage import TrajectoryStorage

    trajectories = _webgym_like(40)
    meta = {"timestamp": "fixed"}
    files = {}
    for name, threshold in (("together", 0), ("one_by_one", 1 << 62)):
        monkeypatch.setattr(module, "_PARALLEL_BYTES", threshold)
        storage = TrajectoryStorage(tmp_path / name)
        files[name] = storage.save_iteration(1, trajectories, metadata=meta).read_bytes()
    assert files["together"] == files["one_by_one"]
    header = json.loads(files["together"].split(b"\n", 1)[0])
    codecs = np.frombuffer(__import__("base64").b64decode(header["index"]["frame_codec"]), "u1")
    assert codecs.tolist() == [1] * 40  # every frame compressed (it pays here)
    samples = ReplayBuffer.from_storage(tmp_path / "together").get_training_samples(30, seed=1)
    for sample in samples:
        assert sample["message"][0] == {"role": "system", "content": "Act."}


def test_a_zstandard_backend_without_batch_compression_compresses_one_by_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from replaystore.trajectories.files import frames as module
    from replaystore.trajectories.storage import TrajectoryStorage

    class OneByOne:
        def __init__(self, inner: Any) -> None:
            self.compress = inner.compress

        def multi_compress_to_buffer(self, data: Any, threads: int = 0) -> Any:
            raise NotImplementedError("not in this backend")

    real = module._zstd_compressor
    trajectories = _webgym_like(8)
    meta = {"timestamp": "fixed"}
    monkeypatch.setattr(module, "_PARALLEL_BYTES", 0)
    expected = TrajectoryStorage(tmp_path / "a").save_iteration(1, trajectories, metadata=meta)
    monkeypatch.setattr(module, "_zstd_compressor", lambda level: OneByOne(real(level)))
    got = TrajectoryStorage(tmp_path / "b").save_iteration(1, trajectories, metadata=meta)
    assert got.read_bytes() == expected.read_bytes()


def test_component_to_dict_is_the_field_by_field_conversion() -> None:
    import dataclasses

    from replaystore.trajectories.components import (
        Action,
        Observation,
        Response,
        Reward,
        Task,
        _Component,
    )

    def reference(component: Any, shared: dict[str, Any] | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(component):
            if shared is not None and f.name in shared:
                out[f.name] = shared[f.name]
                continue
            value = getattr(component, f.name)
            out[f.name] = reference(value) if isinstance(value, _Component) else value

        return out

    class Label(str):
        pass

    task = Task("t", "d", "s", "w", 1, {"ref": [1, 2]}, None, task_id="7")
    inner = Action({"key": "k"}, "k")
    components = [
        task,
        Observation(task, "a.png", None, {"title": "x"}),
        Observation(task, None, "tree"),
        Action(inner, Label("s")),  # a component where a plain value is expected: converted
        Response("r", (1, 2), "[]"),
        Reward(1.0, task, submit=True),
        Reward(None, None),
    ]
    for component in components:
        got = component.to_dict()
        assert got == reference(component) and list(got) == list(reference(component))
        assert json.dumps(got, default=list) == json.dumps(reference(component), default=list)
    shared = {"task": {"shared": True}, "not_a_field": 1}
    observation = components[1]
    assert observation.to_dict(shared=shared) == reference(observation, shared)
    assert observation.to_dict(shared=shared)["task"] is shared["task"]
    assert components[3].to_dict()["action"] == {"action": {"key": "k"}, "action_string": "k"}


@pytest.mark.parametrize(
    "text",
    ['{"a": [1, 2.5, null]}', ' {"a":1}', '{"a":1} ', '{"a":1}x', "1", "NaN", '"\\ud800"', "",
     "{", '{"a":1}{"b":2}', '{"a":1e400}', '{"a":1,"a":2}', "\ufeff{}"],
)  # fmt: skip
def test_loads_is_json_loads(text: str) -> None:
    from replaystore.trajectories.files.jsonfast import loads as _loads

    try:
        expected: Any = ("value", json.loads(text))
    except ValueError as exc:
        expected = ("error", type(exc), str(exc))
    try:
        got: Any = ("value", _loads(text))
    except ValueError as exc:
        got = ("error", type(exc), str(exc))
    assert repr(got) == repr(expected)


def test_the_reply_text_is_encoded_as_the_step_encoder_encodes_it() -> None:
    from replaystore.trajectories.files.jsonfast import STEP_ENCODER as _STEP_ENCODER
    from replaystore.trajectories.files.jsonfast import encode_text as _encode_text

    for text in ("a", 'caf\u00e9 \u2603\n"\\\x00\x1f\x7f', "\ud800", "", "x" * 999, "\U0001f600"):
        assert _encode_text(text) == _STEP_ENCODER.encode(text)
