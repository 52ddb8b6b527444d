"""AWorld users get their types back: identity in memory, registered decoders elsewhere."""

from __future__ import annotations

import dataclasses
import multiprocessing
import pickle
from typing import Any

import pytest
from pydantic import BaseModel

from replaystore.errors import ConfigError, SchemaError
from replaystore.experience import (
    DataRow,
    Experience,
    ExpMeta,
    FieldDecoders,
    InMemoryStorage,
    QueryBuilder,
    RandomSampler,
    RandomTaskSample,
    ReplayBuffer,
)

from .helpers import ActionModel, Observation


@dataclasses.dataclass
class Message:
    role: str
    content: str


def aworld_row(task_id: str, step: int, page: str = "home") -> DataRow:
    """A row as AWorld's examples write it: pydantic state, a list of pydantic actions."""
    return DataRow(
        ExpMeta(task_id, "browse", "agent_1", step, float(step)),
        Experience(
            state=Observation(content=page, info={"step": step}),
            actions=[ActionModel(tool_name="click", params={"x": step})],
            reward_t=0.5,
            messages=[{"role": "user", "content": f"go to {page}"}],
        ),
    )


def aworld_rows() -> list[DataRow]:
    return [aworld_row(f"t{t}", s, page=f"p{t}") for t in range(3) for s in range(2)]


def assert_aworld_types(row: DataRow, *, messages: type = dict) -> None:
    assert isinstance(row.exp_data.state, Observation)
    assert all(isinstance(a, ActionModel) for a in row.exp_data.actions)
    assert all(isinstance(m, messages) for m in row.exp_data.messages)


# ---------------------------------------------------------------- in memory: identity


def test_memory_storage_returns_the_very_rows_stored_on_every_read_path():
    rows = aworld_rows()
    buf = ReplayBuffer(InMemoryStorage(), seed=0)
    buf.store_batch(rows[:3])
    for row in rows[3:]:
        buf.store(row)
    stored = {id(r) for r in rows}
    store = buf.storage
    cond = QueryBuilder().eq("exp_data.state.content", "p1").build()
    reads = [
        store.get_all(),
        store.get_all(cond),
        store.get_paginated(2, 2),
        store.get_by_task_id("t2"),
        *store.get_batch_by_task_ids(["t0", "t1"]).values(),
        buf.sample(RandomSampler(seed=1), batch_size=4),
        buf.sample(batch_size=2),
        *buf.sample_task(batch_size=3),
    ]
    for got in reads:
        assert got and all(id(r) in stored for r in got)
    assert [r.id for r in store.get_all(cond)] == [rows[2].id, rows[3].id]
    assert store.get_all()[0] is rows[0]
    assert_aworld_types(store.get_by_task_id("t0")[0])


def test_memory_storage_queries_the_stored_objects_as_they_are_now():
    store = InMemoryStorage()  # AWorld's semantics: what you store is what you query
    row = aworld_row("t", 0, page="home")
    store.add(row)
    row.exp_data.state.content = "changed later"
    assert store.get_all()[0].exp_data.state.content == "changed later"  # the same object
    assert store.get_all(QueryBuilder().eq("exp_data.state.content", "home").build()) == []
    changed = QueryBuilder().eq("exp_data.state.content", "changed later").build()
    assert store.get_all(changed) == [row]


def test_memory_storage_with_snapshot_queries_rows_as_they_were_stored():
    store = InMemoryStorage(snapshot=True)
    row = aworld_row("t", 0, page="home")
    store.add(row)
    row.exp_data.state.content = "changed later"
    assert store.get_all()[0].exp_data.state.content == "changed later"  # the same object
    home = QueryBuilder().eq("exp_data.state.content", "home").build()
    assert store.get_all(home) == [row]  # queries run on the JSON snapshot taken at store time


def test_memory_storage_evicts_the_stored_objects_too():
    store = InMemoryStorage(max_capacity=2, eviction="row")
    rows = [aworld_row("t", s) for s in range(5)]
    store.add_batch(rows)
    got = store.get_all()
    assert got[0] is rows[3] and got[1] is rows[4]
    assert store.size() == 2
    store.clear()
    assert store.get_all() == []


def test_memory_storage_builds_rows_given_as_mappings_or_with_mapping_metadata():
    store = InMemoryStorage()
    as_dict = aworld_row("a", 0).to_dict()
    meta_dict = aworld_row("b", 0)
    meta_dict.exp_meta = meta_dict.exp_meta.to_dict()  # accepted at the boundary
    store.add_batch([as_dict, meta_dict])
    a, b = store.get_all()
    assert a.id == as_dict["id"] and a.exp_data.state == as_dict["exp_data"]["state"]
    assert isinstance(b.exp_meta, ExpMeta) and b.exp_meta.task_id == "b"
    assert b.exp_data is meta_dict.exp_data  # the caller's experience object, types intact
    assert [len(t) for t in ReplayBuffer(store).sample_task(batch_size=5, seed=0)] == [1, 1]


def test_memory_storage_takes_rows_from_any_iterable():
    store = InMemoryStorage()
    rows = aworld_rows()
    store.add_batch(r for r in rows)
    assert [r.id for r in store.get_all()] == [r.id for r in rows]


# ---------------------------------------------------------------- JSON storages: decoders


def test_without_decoders_json_storages_return_plain_json(make_json_storage):
    store = make_json_storage()
    store.add(aworld_row("t", 0))
    (row,) = store.get_all()
    assert row.exp_data.state == {"content": "home", "info": {"step": 0}}
    assert row.exp_data.actions == [{"agent_name": None, "tool_name": "click", "params": {"x": 0}}]


def test_registered_pydantic_models_come_back_on_every_read_path(make_json_storage):
    store = make_json_storage(decoders={"state": Observation, "actions": ActionModel})
    rows = aworld_rows()
    buf = ReplayBuffer(store, seed=0)
    buf.store_batch(rows)
    cond = QueryBuilder().eq("exp_data.state.content", "p1").build()
    reads = [
        store.get_all(),
        store.get_all(cond),
        store.get_paginated(1, 3),
        store.get_by_task_id("t2"),
        *store.get_batch_by_task_ids(["t0", "t1"]).values(),
        buf.sample(RandomSampler(seed=1), batch_size=4),
        buf.sample(RandomTaskSample(seed=2), batch_size=2),
        *buf.sample_task(batch_size=3),
    ]
    for got in reads:
        assert got
        for row in got:
            assert_aworld_types(row)
    by_id = {r.id: r for r in store.get_all()}
    for original in rows:
        back = by_id[original.id]
        assert back.exp_data.state == original.exp_data.state  # pydantic equality: same fields
        assert back.exp_data.actions == original.exp_data.actions
        assert back.exp_data.messages == original.exp_data.messages
        assert back.exp_meta == original.exp_meta
        assert back.exp_data.reward_t == 0.5


def test_queries_run_on_stored_json_whatever_the_decoders(make_json_storage):
    plain = make_json_storage()
    typed = make_json_storage(decoders={"state": Observation, "actions": ActionModel})
    rows = aworld_rows()
    plain.add_batch(rows)
    typed.add_batch(rows)
    cond = QueryBuilder().eq("exp_data.actions.0.params.x", 1).build()  # list index in the path
    assert [r.id for r in typed.get_all(cond)] == [r.id for r in plain.get_all(cond)]
    assert typed.size(cond) == plain.size(cond) == 3


def test_dataclass_and_callable_decoders(make_json_storage):
    def upper_state(value: dict[str, Any]) -> str:
        return value["content"].upper()

    store = make_json_storage(
        decoders=FieldDecoders(state=upper_state, actions=ActionModel, messages=Message)
    )
    store.add(aworld_row("t", 0, page="home"))
    (row,) = store.get_all()
    assert row.exp_data.state == "HOME"
    assert row.exp_data.messages == [Message("user", "go to home")]
    assert isinstance(row.exp_data.actions[0], ActionModel)


def test_single_values_and_none_are_decoded_as_they_are(make_json_storage):
    store = make_json_storage(decoders={"state": Observation, "actions": ActionModel})
    one_action = DataRow(
        ExpMeta("t", None, None, 0, 0.0),
        Experience(state=None, actions=ActionModel(tool_name="type")),
    )
    store.add(one_action)
    (row,) = store.get_all()
    assert row.exp_data.state is None  # nothing stored, nothing decoded
    assert row.exp_data.actions == ActionModel(tool_name="type")  # not a list: one value
    assert row.exp_data.messages is None


def test_each_read_decodes_afresh_and_the_store_is_untouched(make_json_storage):
    store = make_json_storage(decoders={"state": Observation})
    store.add(aworld_row("t", 0))
    first, second = store.get_all()[0], store.get_all()[0]
    assert first.exp_data.state == second.exp_data.state
    assert first.exp_data.state is not second.exp_data.state
    first.exp_data.state.content = "mutated by the caller"
    assert store.get_all()[0].exp_data.state.content == "home"


class Strict(BaseModel):
    url: str  # required: the stored Observation has no such field


def test_a_decoder_that_fails_names_the_row_field_and_decoder(make_json_storage):
    store = make_json_storage(decoders={"state": Strict})
    row = aworld_row("t", 0)
    store.add(row)
    with pytest.raises(SchemaError, match=rf"row '{row.id}': exp_data.state: decoder Strict"):
        store.get_all()
    bad_items = make_json_storage(decoders={"actions": Message})
    bad_items.add(row)
    with pytest.raises(SchemaError, match=r"exp_data.actions\[0\]: decoder Message"):
        bad_items.get_by_task_id("t")


def test_dataclass_decoder_needs_a_json_object(make_json_storage):
    store = make_json_storage(decoders={"state": Message})
    store.add(DataRow(ExpMeta("t", None, None, 0, 0.0), Experience(state=[1, 2], actions=[])))
    with pytest.raises(SchemaError, match="expected a JSON object, got list"):
        store.get_all()


def _child_reads_typed_rows(store, queue) -> None:
    try:
        rows = store.get_all()
        queue.put([type(r.exp_data.state).__name__ for r in rows])
    except BaseException as exc:  # report, do not hang the parent
        queue.put(repr(exc))


def test_decoders_travel_with_the_storage_to_forked_children(make_json_storage):
    store = make_json_storage(decoders={"state": Observation, "actions": ActionModel})
    store.add_batch(aworld_rows()[:2])
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_reads_typed_rows, args=(store, queue))
    child.start()
    got = queue.get(timeout=30)
    child.join(timeout=30)
    assert got == ["Observation", "Observation"]


def test_decoders_survive_pickling_with_the_storage(make_json_storage):
    store = make_json_storage(decoders=FieldDecoders(state=Observation, messages=Message))
    store.add(aworld_row("t", 0))
    copy = pickle.loads(pickle.dumps(store))
    assert copy.decoders == store.decoders
    (row,) = copy.get_all()
    assert isinstance(row.exp_data.state, Observation)
    assert row.exp_data.messages == [Message("user", "go to home")]


# ---------------------------------------------------------------- bad registrations


@pytest.mark.parametrize(
    ("decoders", "message"),
    [
        ({"action": ActionModel}, "did you mean 'actions'"),
        ({"message": Message}, "did you mean 'messages'"),
        ({"reward_t": float}, "cannot register a decoder for 'reward_t'"),
        ({"state": Observation()}, "instance of Observation, not a class; pass Observation"),
        ({"state": Message("u", "c")}, "instance of Message, not a class"),
        ({"actions": 42}, "decoder for 'actions' must be a pydantic model class"),
        ([Observation], "decoders must be a FieldDecoders or a mapping"),
        ("state", "decoders must be a FieldDecoders or a mapping"),
    ],
)
def test_bad_registrations_are_config_errors_at_construction(make_json_storage, decoders, message):
    with pytest.raises(ConfigError, match=message):
        make_json_storage(decoders=decoders)


def test_field_decoders_validates_its_arguments_too():
    with pytest.raises(ConfigError, match="instance of ActionModel"):
        FieldDecoders(actions=ActionModel())
    assert not FieldDecoders()  # nothing registered
    assert FieldDecoders(state=Observation)


def test_memory_storage_has_no_decoders_to_register():
    with pytest.raises(TypeError, match="decoders"):
        InMemoryStorage(decoders={"state": Observation})  # rows come back as stored
