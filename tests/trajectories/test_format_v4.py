"""Trajectory file format 4 (issue 25, goal 3): prompt texts once per file, read alone.

Format 4 keeps every distinct prompt message and every split prompt's response once
per file, after the frames, indexed per step in the header. A file-backed buffer
reads a sample from those texts alone (test_format_v3.py checks that every reader
gets what format 2 gives). Here: the checks that guard them (CRC-32C per text, the
header's prompt index under its own CRC32, sizes at open), how texts are stored
(as they are, compressed, or as a prefix link to a previous step's text), upgrades
and merges between formats 3 and 4, the JSON parser the reads use, and copies of a
buffer sent to other processes.
"""

from __future__ import annotations

import base64
import json
import math
import pickle
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from replaystore.errors import StorageError
from replaystore.trajectories.buffer import ReplayBuffer
from replaystore.trajectories.components import Action, Observation, Response, Reward, Task
from replaystore.trajectories.files import jsonfast as jsonfast_module
from replaystore.trajectories.files import reader as reader_module
from replaystore.trajectories.files import v4 as v4_module
from replaystore.trajectories.storage import TrajectoryStorage

from .test_format_v3 import _conversation_trajectory, _everything


def _header(path: Path) -> tuple[dict[str, Any], bytes]:
    line, body = path.read_bytes().split(b"\n", 1)
    return json.loads(line), body


def _array(header: dict[str, Any], name: str, dtype: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(header["index"][name]), dtype=dtype)


def _chat_trajectory(
    t: int, n: int, words: list[str], rng: random.Random, **dumps: Any
) -> list[dict]:
    """WebGym-like steps: a shared system prompt, then a new user message per step; the
    prompt written by ``json.dumps(messages, ensure_ascii=False, **dumps)``."""
    task = Task(f"task {t}", "shop", "", "https://x.example", 1, None, None)
    system = {"role": "system", "content": "You are a web agent. " * 20}
    steps = []
    for s in range(n):
        text = " ".join(rng.choice(words) for _ in range(200))
        user = {
            "role": "user",
            "content": [
                {"type": "text", "text": f"step {s}: {text}"},
                {"type": "image_url", "image_url": {"url": f"file:///shots/{t}_{s}.png"}},
            ],
        }
        last = s == n - 1
        steps.append(
            {
                "observation": Observation(task, f"/shots/{t}_{s}.png", None, {"url": "u"}),
                "action": Action({"key": "click"}, f"click [{s}]"),
                "response": Response(f"<think>{s}</think> click [{s}]", None,
                                     json.dumps([system, user], ensure_ascii=False, **dumps)),
                "reward": Reward(1.0 if last else 0.0, None, submit=last),
                "same_as_next_screenshot": False,
            }
        )  # fmt: skip
    return steps


@pytest.fixture
def chat_store(tmp_path: Path) -> tuple[Path, list[list[dict]]]:
    rng = random.Random(5)
    letters = "abcdefghij"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(400)]
    trajectories = [_chat_trajectory(t, 6, words, rng) for t in range(8)]
    root = tmp_path / "store"
    TrajectoryStorage(root).save_iteration(1, trajectories)
    return root, trajectories


def _expected_messages(trajectories: list[list[dict]]) -> list[Any]:
    return [json.loads(step["response"].raw_prompt) for t in trajectories for step in t]


def test_samples_come_from_the_texts_alone(chat_store, monkeypatch) -> None:
    root, trajectories = chat_store
    (path,) = root.glob("*.jsonl")
    header, _ = _header(path)
    assert header["version"] == 4
    # the system prompt is stored once for the whole file, each step's message once
    counts = _array(header, "prompt_counts", "<i4")
    refs = _array(header, "prompt_refs", "<i4")
    assert counts.tolist() == [2] * 48 and len(set(refs[::2].tolist())) == 1
    # a sample never decodes a frame
    monkeypatch.setattr(reader_module, "read_frame", _no_frames)
    buffer = ReplayBuffer.from_storage(root, filter_successful_only=False)
    expected = _expected_messages(trajectories)
    assert [s["message"] for s in buffer] == expected  # iterating: many at once
    assert [buffer[i]["message"] for i in range(len(buffer))] == expected  # one by one
    assert buffer[3]["action"] == trajectories[0][3]["response"].raw_response


def test_a_data_loader_with_batches_reads_each_batch_at_once(chat_store, monkeypatch) -> None:
    """``DataLoader(buffer, batch_size=...)`` calls ``__getitems__`` once per batch: the
    samples ``buffer[i]`` gives, read many at once (never one by one)."""
    from torch.utils.data import DataLoader

    root, _ = chat_store
    buffer = ReplayBuffer.from_storage(root, filter_successful_only=False)
    order = [7, 0, -1, 31, 7, 12, 5, 47, 2]
    one_by_one = [buffer[i] for i in order]
    many_calls: list[list[int]] = []
    read_many = buffer._sample_parts_many
    assert read_many is not None

    def counted(positions: list[int]) -> Any:
        many_calls.append(list(positions))
        return read_many(positions)

    monkeypatch.setattr(buffer, "_sample_parts_many", counted)
    monkeypatch.setattr(buffer, "_sample", _no_frames)  # the one-by-one path
    loader = DataLoader(buffer, batch_size=4, sampler=order, collate_fn=list)
    batches = list(loader)
    assert [len(b) for b in batches] == [4, 4, 1]
    assert [s for b in batches for s in b] == one_by_one
    assert len(many_calls) == 3 and many_calls[0][2] == int(buffer._view[-1])  # -1: the last
    assert buffer.__getitems__([]) == []
    with pytest.raises(IndexError, match="sample index 48 out of range for a buffer of 48"):
        buffer.__getitems__([0, 48])
    with pytest.raises(IndexError, match="sample index -49 out of range"):
        buffer.__getitems__([-49])
    with pytest.raises(TypeError, match="buffer indices must be integers, got float"):
        buffer.__getitems__([1, 2.0])
    with pytest.raises(TypeError, match="got bool"):
        buffer.__getitems__([True])
    with pytest.raises(TypeError, match="takes a sequence of indices, got int"):
        buffer.__getitems__(3)  # type: ignore[arg-type]


def _no_frames(*args: Any) -> bytes:
    raise AssertionError("a sample decoded a frame")


@pytest.mark.parametrize("indent", [2, 4])
def test_prompts_as_webgym_writes_them_take_the_same_path(tmp_path, monkeypatch, indent) -> None:
    """WebGym writes every step's raw_prompt with ``json.dumps(messages, indent=2,
    ensure_ascii=False)`` (``convert_messages_to_path_format``): such prompts are split into
    their messages as compact ones are (read from the texts alone, no frame decoded, no
    whole-prompt parse), and ``raw_prompt`` comes back byte for byte."""
    rng = random.Random(7)
    words = ["Grüße", "café", "日本語", "naïve", "ok", "x"] * 20
    trajectories = [_chat_trajectory(t, 4, words, rng, indent=indent) for t in range(5)]
    root = tmp_path / "store"
    TrajectoryStorage(root).save_iteration(1, trajectories)
    (path,) = root.glob("*.jsonl")
    header, _ = _header(path)
    counts = _array(header, "prompt_counts", "<i4")
    assert counts.tolist() == [2] * 20  # split: system prompt and user message
    monkeypatch.setattr(reader_module, "read_frame", _no_frames)
    buffer = ReplayBuffer.from_storage(root, filter_successful_only=False)
    expected = _expected_messages(trajectories)
    assert [buffer[i]["message"] for i in range(len(buffer))] == expected
    assert [s["message"] for s in buffer.get_training_samples(20, 1.0)] != []
    monkeypatch.undo()
    stored = TrajectoryStorage(root).load_all()
    for got, wrote in zip(stored, trajectories, strict=True):
        for a, b in zip(got, wrote, strict=True):
            assert a["response"].raw_prompt == b["response"].raw_prompt  # byte for byte
            assert a["response"].raw_prompt.startswith("[\n  ")


def test_every_sample_is_a_new_object(chat_store) -> None:
    root, trajectories = chat_store
    buffer = ReplayBuffer.from_storage(root, filter_successful_only=False)
    first = list(buffer)
    first[0]["message"][0]["content"] = "changed"
    first[1]["message"][1]["content"][0]["text"] = "changed too"
    again = list(buffer)
    assert [s["message"] for s in again] == _expected_messages(trajectories)
    assert again[0]["message"][0] is not again[1]["message"][0]


def _flip_in_texts(path: Path, needle: bytes) -> None:
    data = bytearray(path.read_bytes())
    at = data.index(needle, data.index(b"\n"))
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_changed_byte_in_a_text_is_refused_naming_the_step(chat_store) -> None:
    root, trajectories = chat_store
    (path,) = root.glob("*.jsonl")
    text = trajectories[2][4]["response"].raw_prompt
    needle = json.loads(text)[1]["content"][0]["text"][:40].encode()
    _flip_in_texts(path, needle)
    buffer = ReplayBuffer.from_storage(root, filter_successful_only=False)
    with pytest.raises(StorageError, match=r"trajectory 2 step 4 .*CRC-32C"):
        buffer[2 * 6 + 4]
    samples = iter(ReplayBuffer.from_storage(root, filter_successful_only=False))
    got = []
    with pytest.raises(StorageError, match=r"trajectory 2 step 4 .*CRC-32C"):
        for sample in samples:  # the batch read gives way to the step that names it
            got.append(sample)
    assert len(got) == 2 * 6 + 4
    with pytest.raises(StorageError, match="CRC-32C"):
        TrajectoryStorage(root).load_all()


def test_a_changed_prompt_index_is_refused_at_open(chat_store) -> None:
    root, _ = chat_store
    (path,) = root.glob("*.jsonl")
    header, body = _header(path)
    refs = _array(header, "prompt_refs", "<i4").copy()
    refs[5] = refs[3]
    header["index"]["prompt_refs"] = base64.b64encode(refs.tobytes()).decode()
    path.write_bytes(json.dumps(header).encode() + b"\n" + body)
    with pytest.raises(StorageError, match="prompt index fails its CRC32"):
        ReplayBuffer.from_storage(root)


def test_a_cut_file_is_refused_at_open(chat_store) -> None:
    root, _ = chat_store
    (path,) = root.glob("*.jsonl")
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(StorageError, match="truncated"):
        ReplayBuffer.from_storage(root)


def test_growing_summaries_are_prefix_links_and_repetitive_texts_compressed(
    tmp_path: Path,
) -> None:
    root = tmp_path / "store"
    trajectory = _conversation_trajectory(root, 20)
    path = TrajectoryStorage(root).save_iteration(1, [trajectory])
    header, _ = _header(path)
    codecs = _array(header, "text_codec", "u1")
    assert {0, 1, 2} <= set(codecs.tolist())  # as they are, zstandard, prefix links
    loaded = TrajectoryStorage(root).load_all()[0]
    assert [s["response"] for s in loaded] == [s["response"] for s in trajectory]
    buffer = ReplayBuffer.from_storage(root, filter_successful_only=False)
    expected = [json.loads(s["response"].raw_prompt) for s in trajectory]
    assert [s["message"] for s in buffer] == expected
    assert [buffer[i]["message"] for i in range(20)] == expected


def test_a_prefix_chain_is_bounded() -> None:
    table = v4_module.TextTable()
    text = "x" * 300
    numbers = []
    for k in range(30):
        longer = text + "".join(f" line {i}" for i in range(k + 1))
        numbers.append(table.add(longer, [text] if k else ()))
        text = longer
    depths = [table.depths[n] for n in numbers]
    assert max(depths) == v4_module._PREFIX_CHAIN
    assert depths[v4_module._PREFIX_CHAIN + 1] == 0  # a whole text starts a new chain


def test_format_3_files_upgrade_to_format_4_and_format_4_ranks_merge(tmp_path: Path) -> None:
    root = tmp_path / "store"
    old = TrajectoryStorage(root, format_version=3)
    for rank in range(2):
        trajectories = [_conversation_trajectory(root, 5, 2 * rank + t) for t in range(2)]
        old.save_iteration(1, trajectories, rank=rank)
    old.save_iteration(2, [_conversation_trajectory(root, 3, 9)])
    before = _everything(root, tmp_path / "export_before")
    assert len(TrajectoryStorage(root).upgrade()) == 3
    assert {_header(p)[0]["version"] for p in root.glob("*.jsonl")} == {4}
    assert _everything(root, tmp_path / "export_after") == before
    merged = TrajectoryStorage(root).merge_ranks(1)
    assert _header(merged)[0]["version"] == 4
    after = _everything(root, tmp_path / "export_merged")
    assert after["load_all"] == before["load_all"] and after["export"] == before["export"]
    # and a storage asked for format 3 merges format 4 rank files into format 3
    for rank in range(2):
        TrajectoryStorage(root).save_iteration(3, [_conversation_trajectory(root, 4, rank)],
                                               rank=rank)  # fmt: skip
    expected = TrajectoryStorage(root).load_all()
    assert _header(TrajectoryStorage(root, format_version=3).merge_ranks(3))[0]["version"] == 3
    assert TrajectoryStorage(root).load_all() == expected


def test_a_buffer_pickles_after_reading_and_its_copy_reads_alike(chat_store) -> None:
    root, trajectories = chat_store
    buffer = ReplayBuffer.from_storage(root, filter_successful_only=False)
    first = [s["message"] for s in buffer]  # memory maps and parsed texts held now
    copy = pickle.loads(pickle.dumps(buffer))  # what a spawned DataLoader worker gets
    assert [s["message"] for s in copy] == first == _expected_messages(trajectories)


_JSON_TEXTS = [
    '{"a": 1e400, "b": -0.0, "c": 123456789012345678901234567890, "d": 0.1}',
    '{"a": NaN, "b": Infinity, "c": -Infinity}',
    '{"a": "\\ud83d\\ude00 \\u00e9 \\\\ \\" \\n \\t \\u0000"}',
    '{"lone": "\\ud800"}',  # pydantic-core refuses it: json.loads decides
    '{"a": 1, "a": 2}',
    '  [1, 2.5, "x", null, true, false, {}]  ',
    '"just a string"',
]


@pytest.mark.parametrize("text", _JSON_TEXTS)
def test_the_text_parser_gives_what_json_loads_gives(text: str) -> None:
    for data in (text, text.encode("utf-8")):
        got, expected = jsonfast_module.loads_text(data), json.loads(data)
        assert repr(got) == repr(expected) and type(got) is type(expected)


def test_the_text_parser_on_random_values() -> None:
    rng = random.Random(3)

    def value(depth: int) -> Any:
        kind = rng.randrange(7 if depth < 3 else 4)
        if kind == 0:
            return rng.choice([0, -1, 2**70, rng.randint(-(10**9), 10**9)])
        if kind == 1:
            return rng.choice([rng.random(), rng.uniform(-1e300, 1e300), 5e-324, 1.5])
        if kind == 2:  # printable ASCII and any code point but the surrogates
            ranges = [(32, 126), (160, 0xD7FF), (0xE000, 0x10FFFF)]
            count = rng.randint(0, 20)
            return "".join(chr(rng.randint(*rng.choice(ranges))) for _ in range(count))
        if kind == 3:
            return rng.choice([None, True, False])
        if kind == 4:
            return [value(depth + 1) for _ in range(rng.randint(0, 4))]
        return {f"k{i}": value(depth + 1) for i in range(rng.randint(0, 4))}

    for _ in range(300):
        v = value(0)
        for ascii_only in (True, False):
            text = json.dumps(v, ensure_ascii=ascii_only)
            got = jsonfast_module.loads_text(text.encode("utf-8"))
            expected = json.loads(text)
            assert got == expected or (isinstance(got, float) and math.isnan(got))
            assert json.dumps(got) == json.dumps(expected)


_texts = pytest.importorskip("replaystore._texts", reason="replaystore._texts is not built")


def test_the_texts_kernel_computes_crc32c_as_google_crc32c_does() -> None:
    import google_crc32c

    rng = np.random.default_rng(9)
    for n in (0, 1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 1500, 4097):
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert _texts.crc32c(data) == google_crc32c.value(data), n
        assert _texts.crc32c(memoryview(data)) == google_crc32c.value(data)


def test_reads_with_and_without_the_texts_kernel_agree(chat_store, monkeypatch) -> None:
    root, trajectories = chat_store
    (path,) = root.glob("*.jsonl")
    _flip_in_texts(
        path,
        json.loads(trajectories[5][2]["response"].raw_prompt)[1]["content"][0]["text"][
            :30
        ].encode(),
    )
    results = []
    for kernel in (_texts, None):
        monkeypatch.setattr(jsonfast_module, "_TEXTS_KERNEL", [kernel])
        buffer = ReplayBuffer.from_storage(root, filter_successful_only=False)
        got: list[Any] = []
        with pytest.raises(StorageError, match=r"trajectory 5 step 2 .*CRC-32C"):
            for sample in buffer:
                got.append(sample)
        results.append(got)
    assert results[0] == results[1] and len(results[0]) == 5 * 6 + 2


def test_a_probe_decides_whether_a_files_texts_are_worth_compressing() -> None:
    rng = np.random.default_rng(4)

    def table_of(texts: list[str]) -> Any:
        table = v4_module.TextTable()
        for text in texts:
            table.add(text)
        table.compress(2)
        return table

    noise = [rng.integers(0, 2**62, 40).tobytes().hex() for _ in range(200)]  # 640 hex chars
    assert set(table_of(noise).codecs) == {v4_module.CODEC_RAW}
    trees = [f"{i}: " + " ".join(f"[{k}] link 'item {k}'" for k in range(40)) for i in range(200)]
    table = table_of(trees)
    assert set(table.codecs) == {v4_module.CODEC_ZSTD}  # every one, not only the probe
    assert all(len(t) <= 0.5 * len(text) for t, text in zip(table.texts, trees, strict=True))


def test_the_texts_kernel_reads_samples_as_the_python_path_does(tmp_path, monkeypatch) -> None:
    """``_texts.samples`` (the batch and one-by-one reads of format 4 steps) gives what
    the NumPy path gives for every step of a store of mixed prompts (shared texts,
    relative image URLs, prompts not split, zstd-compressed texts), and None where that
    path reads the step another way."""
    from .test_format_v3 import _copy_fixture

    root = tmp_path / "store"
    _copy_fixture(root)
    TrajectoryStorage(root, format_version=4).upgrade()
    rng = random.Random(3)
    trees = [f"link 'item {k}'" for k in range(60)]  # texts worth compressing
    chats = [_chat_trajectory(t, 3, trees, rng, indent=2) for t in range(4)]
    TrajectoryStorage(root).save_iteration(9, chats)

    def parts_of(kernel: Any) -> tuple[list[Any], list[Any]]:
        monkeypatch.setattr(jsonfast_module, "_TEXTS_KERNEL", [kernel])
        buffer = ReplayBuffer.from_storage(root, filter_successful_only=False)
        source = buffer._source
        positions = buffer._view.tolist()
        many = source.sample_parts_many(positions)
        fresh = ReplayBuffer.from_storage(root, filter_successful_only=False)._source
        one = [fresh.sample_parts(p, int(buffer._traj[p]), int(buffer._step[p])) for p in positions]
        return many, one

    (many_c, one_c), (many_py, one_py) = parts_of(_texts), parts_of(None)
    assert many_c == many_py and one_c == one_py
    assert sum(p is not None for p in many_c) >= 12 and None in many_c  # both kinds met
    codecs = set(ReplayBuffer.from_storage(root)._source._prompts.arrays["text_codec"].tolist())
    assert codecs >= {v4_module.CODEC_RAW, v4_module.CODEC_ZSTD}


def test_the_texts_kernel_samples_refuses_what_it_cannot_read(chat_store) -> None:
    root, trajectories = chat_store
    buffer = ReplayBuffer.from_storage(root, filter_successful_only=False)
    source = buffer._source
    prompts = source._prompts

    def samples(positions: list[int], other: Any = source._kernel_text) -> list[Any]:
        return _texts.samples(
            positions, prompts.kernel_arrays, source._maps, source._map_of, other,
            json.loads, source._parsed, source._copy,
        )  # fmt: skip

    expected = _expected_messages(trajectories)
    got = samples([0, 47, 0])
    assert [g[0] for g in got] == [expected[0], expected[47], expected[0]]
    assert got[0][0] is not got[2][0] and got[0][0][0] is not got[2][0][0]  # new values
    assert samples([np.int64(47)]) == [got[1]]  # NumPy's integers too
    with pytest.raises(IndexError, match="position 48 is outside the 48 steps"):
        samples([1, 48])
    with pytest.raises(TypeError, match="'str' object cannot be interpreted as an integer"):
        samples([1, "2"])
    with pytest.raises(TypeError, match="a list of positions"):
        _texts.samples((1,), prompts.kernel_arrays, source._maps, source._map_of,
                       source._kernel_text, json.loads, source._parsed, source._copy)  # fmt: skip

    def refuses(number: int) -> Any:
        raise ValueError("not JSON")

    source._parsed.clear()  # the shared system prompt now comes from ``other``
    assert samples([3, 4], refuses) == [None, None]  # an Exception: read another way

    def interrupted(number: int) -> Any:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        samples([3], interrupted)
