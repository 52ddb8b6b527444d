"""Schema validation: every rejected add names the key and changes nothing."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from replaystore.errors import SchemaError

from .conftest import batch, ids_of, transition


def _with(i: int, **changes: Any) -> dict[str, Any]:
    exp = transition(i)
    for key, value in changes.items():
        if value is None:
            del exp[key]
        else:
            exp[key] = value
    return exp


BAD_SINGLE = [
    pytest.param(_with(9, reward=None), "missing key.*'reward'", id="missing-key"),
    pytest.param(_with(9, extra=1.0), "unexpected key.*'extra'", id="extra-key"),
    pytest.param(_with(9, obs=np.zeros(4, np.float32)), r"'obs'.*\(3,\).*\(4,\)", id="shape"),
    pytest.param(_with(9, obs=np.zeros((1, 3), np.float32)), r"'obs'.*shape", id="rank"),
    pytest.param(_with(9, action=1.5), r"'action'.*float.*int64", id="float-into-int"),
    pytest.param(_with(9, done=np.int64(1)), r"'done'.*int64.*bool", id="int-into-bool"),
    pytest.param(
        _with(9, obs=np.zeros(3, np.complex64)), r"'obs'.*complex64", id="complex-into-float"
    ),
    pytest.param(_with(9, obs=np.array(["a", "b", "c"])), r"'obs'.*dtype", id="strings"),
    pytest.param(_with(9, obs={"x": 1}), r"'obs'.*nested", id="nested"),
]


@pytest.mark.parametrize(("experience", "match"), BAD_SINGLE)
def test_add_rejects_a_mismatching_experience(make_buffer, experience, match: str) -> None:
    buf = make_buffer(4)
    buf.add_batch(batch(range(4)))  # full ring: a partial write would clobber item 0
    with pytest.raises(SchemaError, match=match):
        buf.add(experience)
    assert len(buf) == 4 and buf.pointer == 0
    assert ids_of(buf.sample_all()).tolist() == [0, 1, 2, 3]


def test_add_accepts_compatible_dtypes(make_buffer) -> None:
    buf = make_buffer(4)
    buf.add(transition(0))
    buf.add(
        {
            "obs": np.array([1.0, 1.5, 1.25]),  # float64 into float32
            "action": np.int8(1),  # narrower int
            "reward": 1,  # int into float
            "done": np.bool_(False),
        }
    )
    buf.add(
        {
            "obs": torch.tensor([2.0, 2.5, 2.25], dtype=torch.float64),
            "action": torch.tensor(2),
            "reward": torch.tensor(1.0),
            "done": torch.tensor(True),
        }
    )
    buf.add({"obs": [3.0, 3.5, 3.25], "action": 3, "reward": 1.5, "done": True})  # list
    assert buf.sample_all()["obs"][:, 0].tolist() == [0.0, 1.0, 2.0, 3.0]


BAD_BATCH = [
    pytest.param({"reward": None}, "missing key.*'reward'", id="missing-key"),
    pytest.param({"extra": np.zeros(3)}, "unexpected key.*'extra'", id="extra-key"),
    pytest.param({"obs": np.zeros((3, 2), np.float32)}, r"'obs'.*\(3,\).*\(2,\)", id="shape"),
    pytest.param({"action": np.zeros(3, np.float32)}, r"'action'.*float32", id="dtype"),
    pytest.param({"action": np.zeros(2, np.int64)}, r"'action'.*2 rows.*3", id="rows"),
    pytest.param({"reward": np.float32(1.0)}, r"'reward'.*batch dimension", id="scalar"),
]


@pytest.mark.parametrize(("changes", "match"), BAD_BATCH)
def test_add_batch_rejects_a_mismatching_batch(make_buffer, changes, match: str) -> None:
    buf = make_buffer(4)
    buf.add_batch(batch(range(4)))
    bad = batch([10, 11, 12])
    for key, value in changes.items():
        if value is None:
            del bad[key]
        else:
            bad[key] = value
    with pytest.raises(SchemaError, match=match):
        buf.add_batch(bad)
    assert len(buf) == 4 and buf.pointer == 0
    assert ids_of(buf.sample_all()).tolist() == [0, 1, 2, 3]


def test_add_rejects_a_batched_tensordict(make_buffer) -> None:
    buf = make_buffer(4)
    with pytest.raises(SchemaError, match="add_batch"):
        buf.add(TensorDict({"x": torch.zeros(2, 3)}, [2]))


def test_add_batch_rejects_an_unbatched_tensordict(make_buffer) -> None:
    buf = make_buffer(4)
    with pytest.raises(SchemaError, match=r"batch_size \[N\]"):
        buf.add_batch(TensorDict({"x": torch.zeros(3)}, []))


def test_first_add_rejects_a_non_mapping(make_buffer) -> None:
    buf = make_buffer(4)
    with pytest.raises(SchemaError, match="mapping"):
        buf.add([1, 2, 3])
    assert buf.fields is None


def test_prioritized_buffer_reserves_index_and_weight_keys(make_buffer) -> None:
    buf = make_buffer(4, sampler="prioritized")
    with pytest.raises(SchemaError, match="'weight' is reserved"):
        buf.add({"obs": np.zeros(2), "weight": 1.0})
    assert buf.fields is None


def test_bfloat16_columns_round_trip(make_buffer) -> None:
    buf = make_buffer(4)
    buf.add({"h": torch.tensor([1.5, -2.0], dtype=torch.bfloat16)})
    buf.add_batch({"h": torch.tensor([[3.0, 4.0]], dtype=torch.bfloat16)})
    buf.add({"h": np.array([5.0, 6.0], np.float32)})  # float32 casts to bfloat16 (same kind)
    out = buf.sample_all()["h"]
    assert out.dtype == torch.bfloat16
    assert out.float().tolist() == [[1.5, -2.0], [3.0, 4.0], [5.0, 6.0]]


@pytest.mark.parametrize(
    ("column", "value"),
    [
        (np.array([1, 2], np.int8), 300),
        (np.array([1, 2], np.int8), np.int64(300)),
        (np.array([1, 2], np.uint8), -1),
        (np.array([1, 2], np.int64), 2**70),
        (np.array([1.0, 2.0], np.float32), 10**400),
    ],
    ids=["int-into-int8", "np.int64-into-int8", "negative-into-uint8", "2**70", "10**400"],
)
def test_integer_scalar_out_of_the_column_range_is_rejected(make_buffer, column, value) -> None:
    buf = make_buffer(2)
    buf.add_batch({"x": np.zeros(2), "a": column})  # full: a partial write would show
    with pytest.raises(SchemaError, match=r"'a'.*does not fit"):
        buf.add({"x": 5.0, "a": value})
    assert buf.sample_all()["a"].tolist() == column.tolist()
    assert buf.sample_all()["x"].tolist() == [0.0, 0.0]
    buf.add({"x": 5.0, "a": 1})  # in range: fine
    assert buf.sample_all()["a"].tolist()[0] == 1


def test_tensors_that_require_grad_are_stored_detached(make_buffer) -> None:
    buf = make_buffer(4)
    w = torch.nn.Parameter(torch.ones(3))
    buf.add({"w": w * 2})
    buf.add({"w": w})
    buf.add_batch({"w": torch.stack([w, w])})
    out = buf.sample_all()["w"]
    assert not out.requires_grad
    assert out.tolist() == [[2.0] * 3, [1.0] * 3, [1.0] * 3, [1.0] * 3]
