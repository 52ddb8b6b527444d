"""Batch adds of large rows are copied on torch's threads (image observations).

On a 16-core GPU host a 256-row batch of Atari-like transitions (56 KiB a row)
took 1,585 us through the compiled single-threaded copy and 191 us through torch's
``copy_`` on its intra-op threads (2026-11-26). Rows over
``PARALLEL_COPY_MIN_ROW_BYTES`` now take that copy when torch has more than one
thread; the bytes stored and the errors raised are those of the other paths.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from replaystore.errors import SchemaError
from replaystore.transitions import writer as writer_module

FRAME = (4, 24, 24)  # 2,304 bytes; obs and next_obs: 4,608 bytes a row with the rest


def frames(ids: Any) -> dict[str, np.ndarray]:
    a = np.asarray(ids, dtype=np.int64)
    pixels = (a[:, None, None, None] + np.arange(np.prod(FRAME)).reshape(FRAME)) % 251
    return {
        "obs": pixels.astype(np.uint8),
        "action": a % 5,
        "reward": (a / 2).astype(np.float32),
        "next_obs": ((pixels + 1) % 251).astype(np.uint8),
        "done": a % 3 == 0,
    }


@pytest.fixture
def torch_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture
def copies(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many columns went through the threaded copy."""
    calls: list[int] = []
    real = writer_module._copy_rows_threaded

    def counting(*args: Any) -> None:
        calls.append(1)
        real(*args)

    monkeypatch.setattr(writer_module, "_copy_rows_threaded", counting)
    return calls


def _fill(make_buffer: Any, batches: list[dict[str, np.ndarray]]) -> Any:
    buf = make_buffer(300)
    for b in batches:
        buf.add_batch(b)
    return buf.sample_all(chronological=True)


def _inputs() -> list[dict[str, np.ndarray]]:
    plain = frames(range(0, 128))
    read_only = frames(range(128, 192))
    for v in read_only.values():
        v.flags.writeable = False
    reversed_rows = {k: v[::-1] for k, v in frames(range(192, 256)).items()}  # negative strides
    wrapping = frames(range(256, 400))  # past the end of a ring of 300
    return [plain, read_only, reversed_rows, wrapping]


def test_large_rows_go_through_the_threaded_copy_only_with_several_threads(
    make_buffer: Any, torch_threads: None, copies: list[int]
) -> None:
    assert (
        sum(a.dtype.itemsize * int(np.prod(a.shape[1:])) for a in frames([0]).values())
        > writer_module.PARALLEL_COPY_MIN_ROW_BYTES
    )
    torch.set_num_threads(2)
    _fill(make_buffer, [frames(range(64))])
    assert len(copies) == 5  # one call per column
    torch.set_num_threads(1)
    _fill(make_buffer, [frames(range(64))])
    assert len(copies) == 5


def test_small_rows_keep_the_usual_paths(make_buffer: Any, torch_threads: None, copies: list[int]):
    torch.set_num_threads(2)
    buf = make_buffer(100)
    buf.add_batch({"obs": np.zeros((10, 4), np.float32), "action": np.arange(10)})
    assert copies == []


def test_the_threaded_copy_stores_what_the_other_paths_store(
    make_buffer: Any, torch_threads: None, copies: list[int]
) -> None:
    torch.set_num_threads(2)
    threaded = _fill(make_buffer, _inputs())
    assert copies  # the plain batch at least
    torch.set_num_threads(1)
    single = _fill(make_buffer, _inputs())
    assert set(threaded.keys()) == set(single.keys())
    for key in list(single.keys()):  # iterating a TensorDict walks its rows
        assert torch.equal(threaded[key], single[key]), key
    ids = threaded["action"].numpy()  # the newest 300 of 400 rows, oldest first
    np.testing.assert_array_equal(ids, np.concatenate([
        np.arange(100, 128), np.arange(128, 192), np.arange(255, 191, -1), np.arange(256, 400)
    ]) % 5)  # fmt: skip


def test_a_refused_large_batch_changes_nothing(
    make_buffer: Any, torch_threads: None, copies: list[int]
) -> None:
    torch.set_num_threads(2)
    buf = make_buffer(300)
    buf.add_batch(frames(range(10)))
    bad = frames(range(10, 20))
    bad["next_obs"] = bad["next_obs"][:, :2]  # wrong shape
    with pytest.raises(SchemaError, match="next_obs"):
        buf.add_batch(bad)
    assert len(buf) == 10
    stored = buf.sample_all(chronological=True)["obs"]
    assert torch.equal(stored, torch.from_numpy(frames(range(10))["obs"]))
