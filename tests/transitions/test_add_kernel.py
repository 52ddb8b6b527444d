"""The compiled check-and-copy of add / add_batch (``replaystore._ringcopy``).

The kernel either writes an experience that needs no conversion or declines it
without writing anything; the NumPy path then converts it or raises. The first
tests specify the kernel itself (``Plan``); the others check that a buffer
stores the same bytes and raises the same errors with either path, and that a
missing extension falls back to NumPy.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replaystore.errors import ArgumentError, ConfigError, SchemaError
from replaystore.transitions import ReplayBuffer
from replaystore.transitions import writer as writer_module

from .conftest import batch, ids_of
from .test_schema import BAD_BATCH, BAD_SINGLE

ringcopy = writer_module._cringcopy
HAS_KERNEL = ringcopy is not None
needs_kernel = pytest.mark.skipif(not HAS_KERNEL, reason="replaystore._ringcopy not built")
BACKENDS = [pytest.param("c", marks=needs_kernel), "numpy"]
ARRAY_TYPES = (np.ndarray, np.generic)  # what the buffer lets the kernel copy

# Columns of every kind the kernel converts scalars into, plus an image-like one.
SPEC: dict[str, tuple[tuple[int, ...], Any]] = {
    "obs": ((3,), np.float32),
    "frame": ((2, 2), np.uint8),
    "action": ((), np.int64),
    "small": ((), np.int8),
    "reward": ((), np.float32),
    "value": ((), np.float64),
    "done": ((), np.bool_),
}


def rows(ids: Any) -> dict[str, np.ndarray]:
    """Exact-dtype batch whose values are a function of the ids."""
    a = np.asarray(ids, dtype=np.int64)
    return {
        "obs": a.astype(np.float32)[:, None] + np.array([0.0, 0.5, 0.25], np.float32),
        "frame": ((a[:, None, None] + np.arange(4).reshape(2, 2)) % 256).astype(np.uint8),
        "action": a % 5,
        "small": (a % 100 - 50).astype(np.int8),
        "reward": (a / 2).astype(np.float32),
        "value": a / 3,
        "done": a % 3 == 0,
    }


def columns(capacity: int) -> dict[str, np.ndarray]:
    """Destination columns filled with a marker byte, so any write shows."""
    return {k: np.full((capacity, *shape), 7, dtype=dtype) for k, (shape, dtype) in SPEC.items()}


def plan_for(cols: dict[str, np.ndarray]) -> Any:
    capacity = next(iter(cols.values())).shape[0]
    return ringcopy.Plan(tuple(cols), tuple(cols.values()), capacity, ARRAY_TYPES)


def snapshot(cols: dict[str, np.ndarray]) -> dict[str, bytes]:
    return {k: v.tobytes() for k, v in cols.items()}


# ------------------------------------------------------------------ the kernel


@needs_kernel
def test_kernel_copies_a_batch_from_the_pointer() -> None:
    cols = columns(8)
    assert plan_for(cols).add_batch(rows([10, 11, 12]), 2) == 3
    for k, v in rows([10, 11, 12]).items():
        np.testing.assert_array_equal(cols[k][2:5], v)
    assert (cols["action"][[0, 1, 5, 6, 7]] == 7).all()


@needs_kernel
def test_kernel_wraps_around_the_end_of_the_ring() -> None:
    cols = columns(5)
    assert plan_for(cols).add_batch(rows([1, 2, 3, 4]), 3) == 4
    # Ids 1, 2 at positions 3, 4; ids 3, 4 at positions 0, 1; position 2 untouched.
    np.testing.assert_array_equal(cols["action"], [3, 4, 7, 1, 2])
    np.testing.assert_array_equal(cols["obs"][[3, 4, 0, 1], 0], [1, 2, 3, 4])


@needs_kernel
def test_kernel_keeps_the_newest_rows_of_a_batch_larger_than_the_capacity() -> None:
    cols = columns(4)
    # Ten rows from pointer 1: rows 6..9 are kept, at positions (1 + 6) % 4 = 3, 0, 1, 2,
    # exactly where ten single adds would leave them.
    assert plan_for(cols).add_batch(rows(range(10)), 1) == 10
    np.testing.assert_array_equal(cols["obs"][:, 0], [7, 8, 9, 6])
    np.testing.assert_array_equal(cols["value"], np.array([7, 8, 9, 6]) / 3)


@needs_kernel
def test_kernel_accepts_an_empty_batch_and_writes_nothing() -> None:
    cols = columns(4)
    before = snapshot(cols)
    assert plan_for(cols).add_batch(rows([]), 0) == 0
    assert snapshot(cols) == before


def _bad_batches() -> list[Any]:
    def changed(**values: Any) -> dict[str, Any]:
        b: dict[str, Any] = rows([1, 2, 3])
        for key, value in values.items():
            if value is None:
                del b[key]
            else:
                b[key] = value
        return b

    # The offending key is the last column, so a kernel that wrote before
    # checking every column would have changed the others.
    return [
        pytest.param(changed(done=None), id="missing-key"),
        pytest.param({**rows([1, 2, 3]), "extra": np.zeros(3)}, id="extra-key"),
        pytest.param(changed(done=None, extra=np.zeros(3, bool)), id="renamed-key"),
        pytest.param(changed(done=np.zeros((3, 1), bool)), id="item-shape"),
        pytest.param(changed(done=np.zeros(2, bool)), id="rows"),
        pytest.param(changed(done=np.bool_(True)), id="scalar"),
        pytest.param(changed(done=np.zeros(3, np.uint8)), id="dtype-same-size"),
        pytest.param(changed(done=np.zeros(3, np.int64)), id="dtype"),
        pytest.param(changed(obs=np.zeros((3, 3), np.float64)), id="castable-dtype"),
        pytest.param(changed(done=np.zeros(6, bool)[::2]), id="non-contiguous"),
        pytest.param(changed(reward=np.zeros(3, ">f4")), id="byte-order"),
        pytest.param(changed(done=[True, False, True]), id="list"),
        pytest.param(changed(done=torch.zeros(3, dtype=torch.bool)), id="tensor"),
        pytest.param(changed(done=b"\x00\x01\x00"), id="bytes"),
    ]


@needs_kernel
@pytest.mark.parametrize("experience", _bad_batches())
def test_kernel_declines_a_batch_it_cannot_copy_and_writes_nothing(experience: Any) -> None:
    cols = columns(4)
    before = snapshot(cols)
    assert plan_for(cols).add_batch(experience, 3) == -1
    assert snapshot(cols) == before


@needs_kernel
def test_kernel_declines_a_mapping_that_is_not_a_plain_dict() -> None:
    from collections import OrderedDict

    cols = columns(4)
    assert plan_for(cols).add_batch(OrderedDict(rows([1])), 0) == -1
    assert plan_for(cols).add(OrderedDict({k: v[0] for k, v in rows([1]).items()}), 0) == -1


@needs_kernel
@pytest.mark.parametrize(
    "wrap",
    [bytes, bytearray, memoryview, lambda a: __import__("array").array("B", a.tobytes())],
    ids=["bytes", "bytearray", "memoryview", "array.array"],
)
def test_kernel_copies_only_its_array_types(wrap: Any) -> None:
    """A buffer exporter that is not one of the plan's array types is declined even
    when its format, shape and size match the column: the Python path decides."""
    cols = {"raw": np.full((4, 4), 7, np.uint8), "flag": np.full(4, 7, np.uint8)}
    before = snapshot(cols)
    plan = plan_for(cols)
    item = np.arange(4, dtype=np.uint8)
    assert plan.add({"raw": item, "flag": np.uint8(1)}, 0) == 1  # NumPy: copied
    assert plan.add({"raw": wrap(item), "flag": np.uint8(1)}, 1) == -1
    flags = np.array([1, 2], np.uint8)
    assert plan.add_batch({"raw": np.zeros((2, 4), np.uint8), "flag": wrap(flags)}, 1) == -1
    after = snapshot(cols)
    assert after["raw"][4:] == before["raw"][4:] and after["flag"][1:] == before["flag"][1:]


def _single(**values: Any) -> dict[str, Any]:
    one: dict[str, Any] = {k: v[0] for k, v in rows([9]).items()}
    one.update(values)
    return one


@needs_kernel
@pytest.mark.parametrize(
    "experience",
    [
        pytest.param(_single(), id="numpy-scalars"),
        pytest.param(
            _single(action=4, small=-50, reward=4.5, value=3.0, done=True), id="python-scalars"
        ),
        pytest.param(_single(action=np.array(4), done=np.array(True)), id="zero-d-arrays"),
        pytest.param(_single(action=True, small=False), id="python-bools-into-ints"),
    ],
)
def test_kernel_single_add_stores_what_numpy_assignment_stores(experience: Any) -> None:
    cols, reference = columns(3), columns(3)
    assert plan_for(cols).add(experience, 1) == 1
    for k, v in experience.items():
        reference[k][1] = v
    assert snapshot(cols) == snapshot(reference)


@needs_kernel
@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"small": 128}, id="int-above-int8"),
        pytest.param({"small": -129}, id="int-below-int8"),
        pytest.param({"action": 2**63}, id="int-above-int64"),
        pytest.param({"frame": -1}, id="int-into-array"),
        pytest.param({"action": 1.0}, id="float-into-int"),
        pytest.param({"done": 1}, id="int-into-bool"),
        pytest.param({"reward": 1e300}, id="float32-overflow"),
        pytest.param({"reward": 1}, id="int-into-float"),
        pytest.param({"value": np.float32(1.0)}, id="numpy-scalar-cast"),
        pytest.param({"obs": np.zeros(4, np.float32)}, id="item-shape"),
        pytest.param({"obs": np.zeros((1, 3), np.float32)}, id="rank"),
        pytest.param({"obs": [1.0, 2.0, 3.0]}, id="list"),
        pytest.param({"obs": torch.zeros(3)}, id="tensor"),
        pytest.param({"done": None}, id="none"),
    ],
)
def test_kernel_declines_a_single_item_it_cannot_copy_and_writes_nothing(changes: Any) -> None:
    cols = columns(3)
    before = snapshot(cols)
    assert plan_for(cols).add(_single(**changes), 2) == -1
    assert snapshot(cols) == before


@needs_kernel
def test_kernel_rejects_a_pointer_outside_the_ring() -> None:
    plan = plan_for(columns(4))
    for bad in (-1, 4):
        with pytest.raises(ValueError, match="pointer"):
            plan.add_batch(rows([1]), bad)


@needs_kernel
def test_kernel_needs_writable_columns_of_capacity_rows() -> None:
    cols = columns(4)
    cols["obs"].flags.writeable = False
    with pytest.raises((BufferError, ValueError)):
        plan_for(cols)
    with pytest.raises(ValueError, match="capacity"):
        ringcopy.Plan(("obs",), (np.zeros((3, 2), np.float32),), 4, ARRAY_TYPES)
    with pytest.raises(TypeError, match="array_types"):
        ringcopy.Plan(("obs",), (np.zeros((4, 2), np.float32),), 4, ("ndarray",))


# ------------------------------------------------------- the buffer, both paths


def _form(b: dict[str, Any], form: str) -> dict[str, Any]:
    """The same transitions in a form the kernel copies ("exact") or declines."""
    b = dict(b)
    if form == "float64":
        b["obs"] = b["obs"].astype(np.float64)
    elif form == "list" and len(b["action"]):  # an empty list has no dtype to check
        b["action"] = b["action"].tolist()
    elif form == "tensor":
        b["frame"] = torch.from_numpy(b["frame"])
    elif form == "strided":
        b["obs"] = np.repeat(b["obs"], 2, axis=0)[::2]
    return b


def _single_form(i: int, form: str) -> dict[str, Any]:
    one: dict[str, Any] = {k: v[0] for k, v in rows([i]).items()}
    if form == "python":
        one.update(
            action=int(one["action"]),
            small=int(one["small"]),
            reward=float(one["reward"]),
            value=float(one["value"]),
            done=bool(one["done"]),
        )
    elif form == "tensor":
        one["obs"] = torch.from_numpy(one["obs"])
    elif form == "int-into-float":
        one["reward"] = i
    return one


# Forms the kernel copies come up more often than those it declines.
BATCH_FORMS = ["exact", "exact", "exact", "float64", "list", "tensor", "strided"]
SINGLE_FORMS = ["exact", "python", "python", "tensor", "int-into-float"]


def _stored(buf: ReplayBuffer) -> dict[str, bytes]:
    assert buf._storage is not None
    out = {}
    for name, col in buf._storage.columns.items():
        out[name] = col[: len(buf)].numpy().tobytes()
    return out


@pytest.mark.skipif(not HAS_KERNEL, reason="replaystore._ringcopy not built")
@pytest.mark.parametrize("kind", ["memory", "memmap"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    capacity=st.integers(1, 9),
    ops=st.lists(
        st.tuples(st.integers(0, 12), st.sampled_from(BATCH_FORMS), st.sampled_from(SINGLE_FORMS)),
        min_size=1,
        max_size=8,
    ),
)
def test_both_paths_store_identical_bytes(kind: str, capacity: int, ops: list[Any]) -> None:
    bufs = [
        ReplayBuffer("cpu", "cpu", capacity, storage=kind, seed=0, add_backend=b)
        for b in ("c", "numpy")
    ]
    try:
        total = 0
        for buf in bufs:
            buf.add_batch(rows([1000]))  # the schema: exact dtypes
        c, numpy_path = bufs
        for n, batch_form, single_form in ops:
            for buf in bufs:
                buf.add_batch(_form(rows(range(total, total + n)), batch_form))
            assert (c.pointer, len(c)) == (numpy_path.pointer, len(numpy_path))
            assert _stored(c) == _stored(numpy_path)
            for buf in bufs:
                buf.add(_single_form(total + n, single_form))
            assert (c.pointer, len(c)) == (numpy_path.pointer, len(numpy_path))
            assert _stored(c) == _stored(numpy_path)
            total += n + 1
    finally:
        for buf in bufs:
            buf.close()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("experience", "match"), BAD_SINGLE)
def test_rejected_add_names_the_key_and_changes_nothing(
    backend: str, storage_kind: str, experience: Any, match: str
) -> None:
    with ReplayBuffer("cpu", "cpu", 4, storage=storage_kind, add_backend=backend) as buf:
        buf.add_batch(batch(range(4)))
        before = _stored(buf)
        with pytest.raises(SchemaError, match=match):
            buf.add(experience)
        assert len(buf) == 4 and buf.pointer == 0 and _stored(buf) == before


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("changes", "match"), BAD_BATCH)
def test_rejected_batch_names_the_key_and_changes_nothing(
    backend: str, storage_kind: str, changes: dict[str, Any], match: str
) -> None:
    with ReplayBuffer("cpu", "cpu", 4, storage=storage_kind, add_backend=backend) as buf:
        buf.add_batch(batch(range(4)))
        before = _stored(buf)
        bad: dict[str, Any] = batch([10, 11, 12])
        for key, value in changes.items():
            if value is None:
                del bad[key]
            else:
                bad[key] = value
        with pytest.raises(SchemaError, match=match):
            buf.add_batch(bad)
        assert len(buf) == 4 and buf.pointer == 0 and _stored(buf) == before


@pytest.mark.parametrize("backend", BACKENDS)
def test_float32_overflow_warns_as_numpy_does_on_both_paths(backend: str) -> None:
    with ReplayBuffer("cpu", "cpu", 2, storage="memory", add_backend=backend) as buf:
        buf.add({"x": np.float32(0.0)})
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            buf.add({"x": 1e300})
        assert any("overflow" in str(w.message) for w in caught)
        assert np.isinf(buf.sample_all()["x"][1].item())


@needs_kernel
def test_kernel_follows_the_storage_through_reset_and_load(
    storage_kind: str, tmp_path: Any
) -> None:
    with ReplayBuffer("cpu", "cpu", 4, storage=storage_kind, add_backend="c") as buf:
        buf.add_batch(batch(range(3)))
        buf.save(tmp_path / "ckpt")
        buf.add_batch(batch([50, 51]))
        buf.load(tmp_path / "ckpt")  # a new storage: the kernel must write into it
        buf.add_batch(batch([7]))
        assert ids_of(buf.sample_all()).tolist() == [0, 1, 2, 7]
        buf.reset()
        buf.add_batch({"y": np.arange(3, dtype=np.int16)})  # a new schema
        buf.add_batch({"y": np.arange(3, 6, dtype=np.int16)})
        assert buf.sample_all()["y"].tolist() == [4, 5, 2, 3]


def test_default_backend_is_the_kernel_when_built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REPLAYSTORE_RINGCOPY", raising=False)
    with ReplayBuffer("cpu", "cpu", 4) as buf:
        assert buf.add_backend == ("c" if HAS_KERNEL else "numpy")


def test_environment_variable_selects_the_add_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REPLAYSTORE_RINGCOPY", "numpy")
    with ReplayBuffer("cpu", "cpu", 4) as buf:
        assert buf.add_backend == "numpy"
    monkeypatch.setenv("REPLAYSTORE_RINGCOPY", "fortran")
    with pytest.raises(ConfigError, match="REPLAYSTORE_RINGCOPY"):
        ReplayBuffer("cpu", "cpu", 4)
    with pytest.raises(ArgumentError, match="add_backend must be"):
        ReplayBuffer("cpu", "cpu", 4, add_backend="fortran")  # type: ignore[arg-type]


def test_missing_kernel_falls_back_to_numpy(
    monkeypatch: pytest.MonkeyPatch, storage_kind: str
) -> None:
    monkeypatch.setattr(writer_module, "_cringcopy", None)
    monkeypatch.delenv("REPLAYSTORE_RINGCOPY", raising=False)
    with ReplayBuffer("cpu", "cpu", 3, storage=storage_kind) as buf:
        assert buf.add_backend == "numpy"
        buf.add_batch(batch(range(4)))
        assert ids_of(buf.sample_all(chronological=True)).tolist() == [1, 2, 3]
    with pytest.raises(ImportError, match="add_backend='numpy'"):
        ReplayBuffer("cpu", "cpu", 3, add_backend="c")


# ------------------------------------------- one rule for raw bytes, both paths

RAW = [b"\x01\x02\x03\x04", bytearray(b"\x01\x02\x03\x04"), "abcd"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("raw", RAW, ids=lambda v: type(v).__name__)
def test_raw_bytes_are_refused_naming_the_key(backend: str, storage_kind: str, raw: Any) -> None:
    """bytes, bytearray and str are not arrays: both add paths refuse them (the
    compiled one used to copy bytes into a uint8 column) and write nothing."""
    with ReplayBuffer("cpu", "cpu", 4, storage=storage_kind, add_backend=backend) as buf:
        buf.add_batch({"frame": np.zeros((4, 4), np.uint8), "small": np.zeros(4, np.uint8)})
        before = _stored(buf)
        with pytest.raises(SchemaError, match=r"'frame'.*frombuffer"):
            buf.add({"frame": raw, "small": 1})
        with pytest.raises(SchemaError, match=r"'small'.*frombuffer"):
            buf.add_batch({"frame": np.zeros((4, 4), np.uint8), "small": raw})
        assert len(buf) == 4 and buf.pointer == 0 and _stored(buf) == before


@pytest.mark.parametrize("backend", BACKENDS)
def test_raw_bytes_cannot_define_a_schema(backend: str) -> None:
    with ReplayBuffer("cpu", "cpu", 4, storage="memory", add_backend=backend) as buf:
        with pytest.raises(SchemaError, match=r"'frame'.*frombuffer"):
            buf.add({"frame": b"\x00\x01"})
        with pytest.raises(SchemaError, match=r"'frame'.*frombuffer"):
            buf.add_batch({"frame": bytearray(b"\x00\x01")})
        assert buf.fields is None


# Columns for the property test below: every kind of value is tried in each.
PROP_SPEC: dict[str, tuple[tuple[int, ...], Any]] = {
    "frame": ((4,), np.uint8),
    "small": ((), np.uint8),
    "obs": ((3,), np.float32),
    "action": ((), np.int64),
}
_TYPECODES = {np.dtype(np.uint8): "B", np.dtype(np.float32): "f", np.dtype(np.int64): "q"}
VALUE_KINDS = [
    "exact",
    "float64",
    "int32",
    "bool",
    "wrong-shape",
    "bytes",
    "bytearray",
    "str",
    "memoryview",
    "array.array",
    "numpy-scalar",
    "python-int",
    "python-big-int",
    "python-negative-int",
    "python-float",
    "python-bool",
    "list",
    "tensor",
]


def _value(kind: str, shape: tuple[int, ...], dtype: Any, lead: tuple[int, ...], x: int) -> Any:
    """A value of ``kind`` for a column of item ``shape``/``dtype`` (``lead``: batch dims)."""
    full = (*lead, *shape)
    exact = np.asarray(np.arange(int(np.prod(full))).reshape(full) + x, dtype=dtype)
    raw = exact.astype(np.uint8).tobytes()
    simple: dict[str, Any] = {
        "exact": exact,
        "float64": exact.astype(np.float64),
        "int32": exact.astype(np.int32),
        "bool": exact.astype(bool),
        "wrong-shape": np.zeros((*full, 2), dtype),
        "bytes": raw,
        "bytearray": bytearray(raw),
        "str": "x" * max(len(raw), 1),
        "memoryview": memoryview(exact),
        "list": exact.tolist(),
        "tensor": torch.from_numpy(exact.copy()),
    }
    if kind in simple:
        return simple[kind]
    if kind == "array.array":
        import array

        return array.array(_TYPECODES[np.dtype(dtype)], exact.reshape(-1).tolist())
    scalar = {
        "numpy-scalar": np.dtype(dtype).type(x % 100),
        "python-int": x % 100,
        "python-big-int": 2**40 + x,
        "python-negative-int": -1 - x,
        "python-float": x + 0.5,
        "python-bool": bool(x % 2),
    }[kind]
    return np.full(lead, scalar).tolist() if lead else scalar


def _outcome(buf: ReplayBuffer, call: str, experience: dict[str, Any]) -> tuple[Any, ...]:
    """What an add did: the error type, or the cursor and the stored bytes."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NumPy's cast warnings are the same on both paths
        try:
            getattr(buf, call)(experience)
        except SchemaError:
            return ("SchemaError", buf.pointer, len(buf), _stored(buf))
    return ("ok", buf.pointer, len(buf), _stored(buf))


def _assert_paths_agree(kinds: dict[str, str], batched: bool, n: int, x: int) -> None:
    lead = (n,) if batched else ()
    experience = {
        key: _value(kinds[key], shape, dtype, lead, x) for key, (shape, dtype) in PROP_SPEC.items()
    }
    outcomes = []
    for backend in ("c", "numpy"):
        with ReplayBuffer("cpu", "cpu", 4, storage="memory", add_backend=backend) as buf:
            first = {k: np.zeros((3, *shape), dtype) for k, (shape, dtype) in PROP_SPEC.items()}
            buf.add_batch(first)  # the schema, and rows a partial write would change
            outcomes.append(_outcome(buf, "add_batch" if batched else "add", experience))
    assert outcomes[0] == outcomes[1]


@needs_kernel
@pytest.mark.parametrize("batched", [False, True], ids=["add", "add_batch"])
@pytest.mark.parametrize("kind", VALUE_KINDS)
@pytest.mark.parametrize("key", list(PROP_SPEC))
def test_each_kind_of_value_is_accepted_or_refused_alike_by_both_paths(
    key: str, kind: str, batched: bool
) -> None:
    """Every kind of value in every kind of column, the other keys exact (so the
    compiled path would copy them): both paths refuse, or both store the same bytes."""
    _assert_paths_agree({k: kind if k == key else "exact" for k in PROP_SPEC}, batched, 3, 7)


@needs_kernel
@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    kinds=st.fixed_dictionaries(
        {k: st.one_of(st.just("exact"), st.sampled_from(VALUE_KINDS)) for k in PROP_SPEC}
    ),
    batched=st.booleans(),
    n=st.integers(0, 5),
    x=st.integers(0, 200),
)
def test_compiled_and_numpy_add_accept_refuse_and_store_alike(
    kinds: dict[str, str], batched: bool, n: int, x: int
) -> None:
    """For any mix of value kinds (arrays of every dtype, raw bytes, buffers,
    scalars, lists, tensors) the compiled and the NumPy add paths both refuse
    (SchemaError, nothing written) or both store the same bytes."""
    _assert_paths_agree(kinds, batched, n, x)
