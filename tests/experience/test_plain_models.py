"""Pydantic models whose JSON is their fields' values are written without pydantic's
serialiser (``replaystore.experience.plain_models``), and what is stored is what
pydantic writes: the same JSON values, for every value, on every path."""

from __future__ import annotations

import datetime
import enum
import json
import math
from typing import Annotated, Any, Literal, Optional

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    RootModel,
    computed_field,
    field_serializer,
    field_validator,
    model_serializer,
)

import replaystore.experience.rows as rows_module
from replaystore.experience import DataRow, Experience, ExpMeta, SqliteStorage
from replaystore.experience.plain_models import plain_fields, typed_models
from replaystore.experience.rows import encode_flat, encode_records, encode_row

# derandomized by the suite's profile (tests/conftest.py)
SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# AWorld's shapes (aworld/core/common.py: ActionResult, Observation, ActionModel)
class Result(BaseModel):
    is_done: bool = False
    content: Any = None
    error: str = None  # type: ignore[assignment]  # AWorld's own annotation
    metadata: Optional[dict[str, Any]] = {}  # noqa: UP045


class Observation(BaseModel):
    observer: Optional[str] = None  # noqa: UP045
    content: Optional[Any] = None  # noqa: UP045
    dom_tree: Optional[str | Any] = None  # noqa: UP045
    action_result: Optional[list[Result]] = []  # noqa: UP045
    images: Optional[list[str]] = []  # noqa: UP045
    info: Optional[dict[str, Any]] = {}  # noqa: UP045
    mode: Literal["text", "image"] = "text"
    score: float = 0.0
    step: int = 0


class Action(BaseModel):
    tool_name: Optional[str] = None  # noqa: UP045
    params: Optional[dict[str, Any]] = {}  # noqa: UP045
    policy_info: Optional[Any] = None  # noqa: UP045


class Tree(BaseModel):
    name: str
    children: list[Tree] = []


class Checked(BaseModel):
    """A validator does not change what is written."""

    n: int

    @field_validator("n")
    @classmethod
    def _positive(cls, v: int) -> int:
        if v < 0:
            raise ValueError("n < 0")
        return v


class Color(enum.Enum):
    RED = "red"


class Aliased(BaseModel):
    model_config = ConfigDict(populate_by_name=True)
    name: str = Field(serialization_alias="Name")


class Excluded(BaseModel):
    name: str = "x"
    secret: str = Field("s", exclude=True)


class FieldSerialised(BaseModel):
    n: int = 1

    @field_serializer("n")
    def _twice(self, v: int) -> int:
        return 2 * v


class ModelSerialised(BaseModel):
    n: int = 1

    @model_serializer
    def _dump(self) -> dict[str, Any]:
        return {"N": self.n}


class Computed(BaseModel):
    n: int = 1

    @computed_field  # type: ignore[prop-decorator]
    @property
    def twice(self) -> int:
        return 2 * self.n


class Extra(BaseModel):
    model_config = ConfigDict(extra="allow")
    n: int = 1


class Dated(BaseModel):
    when: datetime.datetime = datetime.datetime(2024, 1, 1)


class Colored(BaseModel):
    color: Color = Color.RED


class Pair(BaseModel):
    pair: tuple[int, int] = (1, 2)


class Annotated_(BaseModel):
    n: Annotated[int, PlainSerializer(lambda v: str(v))] = 1


class Root(RootModel[list[int]]):
    pass


class HoldsDated(BaseModel):
    d: Dated = Dated()


def test_plain_models_are_recognised_and_the_rest_are_not():
    assert plain_fields(Observation) == tuple(Observation.model_fields)
    assert typed_models(Observation) == {Result}
    assert plain_fields(Result) == tuple(Result.model_fields)
    assert plain_fields(Action) == ("tool_name", "params", "policy_info")
    assert typed_models(Action) == frozenset()
    assert plain_fields(Checked) == ("n",)
    assert plain_fields(Tree) == ("name", "children") and typed_models(Tree) == {Tree}
    for cls in (
        Aliased,
        Excluded,
        FieldSerialised,
        ModelSerialised,
        Computed,
        Extra,
        Dated,
        Colored,
        Pair,
        Annotated_,
        Root,
        HoldsDated,
    ):
        assert plain_fields(cls) is None, cls.__name__
        assert typed_models(cls) == frozenset()


def _row(state: Any, actions: Any = None, i: int = 0) -> DataRow:
    meta = ExpMeta(f"t{i // 3}", "web", f"a{i % 2}", i, float(i))
    return DataRow(meta, Experience(state=state, actions=actions, reward_t=0.5), f"r{i}")


def _kernel() -> Any:
    """The compiled ``dumps`` (None: not built, or ``REPLAYSTORE_JSONCOPY=numpy``)."""
    rows_module._resolve_jsoncopy()
    return rows_module.COPY_KERNELS[1]


@pytest.fixture
def kernel() -> Any:
    if _kernel() is None:
        pytest.skip("replaystore._jsoncopy is not built (or REPLAYSTORE_JSONCOPY=numpy)")
    return _kernel()


def _pydantic_json(value: Any) -> Any:
    return json.loads(value.model_dump_json())


def _stored(row: DataRow) -> Any:
    (record,) = encode_records([row])
    return json.loads(record[-1])


LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(alphabet='ab_é😀"\\\n', max_size=4),
)
JSONISH = st.recursive(
    LEAF,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.text(alphabet="abé", max_size=2), inner, max_size=3),
    ),
    max_leaves=6,
)
RESULT = st.builds(
    Result,
    is_done=st.booleans(),
    content=JSONISH,
    error=st.text(max_size=3),
    metadata=st.one_of(st.none(), st.dictionaries(st.text(max_size=2), JSONISH, max_size=2)),
)
OBSERVATION = st.builds(
    Observation,
    observer=st.one_of(st.none(), st.text(max_size=3)),
    content=st.one_of(JSONISH, st.builds(Action, params=st.just({"x": 1}))),
    dom_tree=st.one_of(st.none(), st.text(max_size=5)),
    action_result=st.one_of(st.none(), st.lists(RESULT, max_size=2)),
    images=st.lists(st.text(max_size=3), max_size=2),
    info=st.dictionaries(st.text(max_size=2), JSONISH, max_size=2),
    mode=st.sampled_from(["text", "image"]),
    score=st.floats(allow_nan=False, allow_infinity=False),
    step=st.integers(-(2**70), 2**70),
)
ACTION = st.builds(
    Action,
    tool_name=st.one_of(st.none(), st.sampled_from(["browser", "é"])),
    params=st.dictionaries(st.sampled_from(["x", "y"]), JSONISH, max_size=2),
    policy_info=JSONISH,
)


@SETTINGS
@given(state=OBSERVATION, actions=st.lists(ACTION, max_size=2))
def test_a_plain_model_is_stored_as_pydantic_writes_it_whoever_writes_it(state, actions):
    expected = {"state": _pydantic_json(state), "actions": [_pydantic_json(a) for a in actions]}
    stored = _stored(_row(state, actions))
    assert {"state": stored["state"], "actions": stored["actions"]} == expected
    if _kernel() is None:
        return  # without the compiled kernels the generic path writes every payload
    # The compiled walk and the Python one write the same text.
    payload = {"state": state, "actions": actions}
    python = rows_module._value_text(payload, rows_module.COPY_KERNELS[1])
    compiled = rows_module.ENCODE_KERNELS[0](payload, rows_module._ENCODERS)
    assert python is not None and json.loads(python) == expected
    if compiled is not NotImplemented:
        assert compiled == python


def test_the_fields_are_written_without_the_serialiser_unless_a_value_needs_it(monkeypatch, kernel):
    calls: list[Any] = []
    serializer = Observation.__pydantic_serializer__

    class Spy:
        def to_json(self, value: Any) -> bytes:
            calls.append(value)
            return serializer.to_json(value)

    encode_records([_row(Observation())])  # the class seen once
    names, _, heads = rows_module._ENCODERS[Observation]
    monkeypatch.setitem(rows_module._ENCODERS, Observation, [names, Spy(), heads])
    plain = Observation(content={"a": [1, 2.5, "é"]}, action_result=[Result(content=3)])
    records = encode_flat([_row(plain, i=0), _row(plain, i=1)])
    assert calls == []
    assert json.loads(records[-1])["state"] == _pydantic_json(plain)
    # A value the walk does not write: the serialiser writes this one, as pydantic does.
    dated = Observation(info={"when": datetime.datetime(2024, 1, 2), "nan": math.nan})
    text = encode_row(_row(dated), decode=False).payload_json
    assert calls == [dated]
    assert json.loads(text)["state"]["info"] == {"when": "2024-01-02T00:00:00", "nan": None}


def test_a_subclass_in_a_typed_field_is_written_as_pydantic_writes_it(kernel):
    class Part(BaseModel):  # this test's own classes: a subclass stays for the session
        content: Any = None

    class Owner(BaseModel):
        result: Part | None = None

    encode_records([_row(Owner(result=Part()))])
    assert type(rows_module._ENCODERS[Owner]) is list  # written from its fields

    class Detailed(Part):  # pydantic writes it as a Part where a Part is typed
        detail: str = "kept out"

    owner = Owner(result=Detailed(content=1))
    expected = _pydantic_json(owner)
    assert "detail" not in expected["result"]
    assert _stored(_row(owner))["state"] == expected
    assert type(rows_module._ENCODERS[Owner]) is not list  # handed back to its serialiser
    # Any field: pydantic writes the instance's own fields, and so does the walk.
    holder = Action(policy_info=Detailed(content=2))
    assert _stored(_row(holder))["state"] == _pydantic_json(holder)
    assert _stored(_row(holder))["state"]["policy_info"]["detail"] == "kept out"


def test_a_nested_class_seen_first_inside_a_plain_model_is_learnt(monkeypatch, kernel):
    class Leaf(BaseModel):
        n: int = 0

    monkeypatch.setattr(rows_module, "_ENCODERS", {})
    monkeypatch.setattr(rows_module, "_PLAIN", {})
    monkeypatch.setattr(rows_module, "_TYPED", ())
    state = Action(policy_info=Leaf(n=4))  # Leaf in an Any field: known only at run time
    assert _stored(_row(state))["state"]["policy_info"] == {"n": 4}
    assert type(rows_module._ENCODERS[Leaf]) is list
    compiled = rows_module.ENCODE_KERNELS[0]({"s": state}, rows_module._ENCODERS)
    if compiled is not NotImplemented:
        assert json.loads(compiled) == {"s": _pydantic_json(state)}


def test_recursive_plain_models_round_trip_through_sqlite(tmp_path):
    tree = Tree(name="root", children=[Tree(name="a"), Tree(name="b", children=[Tree(name="c")])])
    observation = Observation(action_result=[Result(content={"k": [1, None]})], step=3)
    store = SqliteStorage(tmp_path / "rows.sqlite")
    try:
        store.add_batch([_row(tree, [Action(tool_name="t")], i=0), _row(observation, i=1)])
        back = {r.id: r.exp_data for r in store.get_all()}
    finally:
        store.close()
    assert back["r0"].state == _pydantic_json(tree)
    assert back["r0"].actions == [_pydantic_json(Action(tool_name="t"))]
    assert back["r1"].state == _pydantic_json(observation)
