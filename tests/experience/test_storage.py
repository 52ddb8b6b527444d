"""The storage contract, the same for every storage (memory, SQLite, multi-process)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from replaystore.errors import ConfigError, SchemaError
from replaystore.experience import (
    DataRow,
    Experience,
    ExpMeta,
    InMemoryStorage,
    QueryBuilder,
    RandomSampler,
    RandomTaskSample,
    ReplayBuffer,
)

from .helpers import ActionModel, Observation, episode, make_row


def ids(rows):
    return [r.id for r in rows]


def test_a_stored_row_is_stored_once(make_storage):
    store = make_storage()
    row = make_row()
    store.add(row)
    assert store.size() == 1
    assert ids(store.get_all()) == [row.id]
    assert ids(store.get_by_task_id("task_1")) == [row.id]


def test_rows_come_back_in_insertion_order_with_pages(make_storage):
    store = make_storage()
    rows = [make_row(f"t{i % 3}", i) for i in range(10)]
    store.add_batch(rows)
    assert ids(store.get_all()) == ids(rows)
    assert ids(store.get_paginated(2, 4)) == ids(rows[4:8])
    assert ids(store.get_paginated(3, 4)) == ids(rows[8:])
    assert store.get_paginated(9, 4) == []
    cond = QueryBuilder().eq("exp_meta.task_id", "t1").build()
    assert ids(store.get_paginated(1, 2, cond)) == ids(rows[1:5:3])
    with pytest.raises(ConfigError):
        store.get_paginated(0, 4)


def test_get_batch_by_task_ids_and_the_seed_spelling(make_storage):
    store = make_storage()
    store.add_batch(episode("a", 2) + episode("b", 3))
    batch = store.get_batch_by_task_ids(["b", "missing", "a"])
    assert list(batch) == ["b", "missing", "a"]
    assert [len(batch[k]) for k in batch] == [3, 0, 2]
    assert {k: ids(v) for k, v in store.get_bacth_by_task_ids(["a"]).items()} == {
        "a": ids(batch["a"])
    }
    assert store.get_by_task_id("missing") == []


def test_state_and_actions_read_back_as_the_same_json_values(make_json_storage):
    @dataclasses.dataclass
    class Point:
        x: int
        tags: tuple[str, ...]

    store = make_json_storage()
    state = {"obs": Observation(content="page", info={"k": [1, 2.5, None]}), "pt": Point(1, ("a",))}
    row = DataRow(
        ExpMeta("t", "n", "ag", 0, 1.0),
        Experience(
            state=state,
            actions=[ActionModel(tool_name="click")],
            reward_t=0.5,
            messages=[{"role": "user", "content": "hi"}],
        ),
    )
    store.add(row)
    (back,) = store.get_all()
    assert back.exp_data.state == {
        "obs": {"content": "page", "info": {"k": [1, 2.5, None]}},
        "pt": {"x": 1, "tags": ["a"]},
    }
    assert back.exp_data.actions == [ActionModel(tool_name="click").model_dump(mode="json")]
    assert back.exp_data.messages == [{"role": "user", "content": "hi"}]
    assert back.exp_meta == row.exp_meta
    json.dumps(back.exp_data.state)  # plain JSON, nothing else


def test_stored_rows_do_not_follow_later_changes_to_the_callers_objects(make_json_storage):
    store = make_json_storage()
    state = {"n": 1}
    store.add(make_row(state=state))
    state["n"] = 2
    assert store.get_all()[0].exp_data.state == {"n": 1}


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (None, "None"),
        (DataRow(None, Experience(state={})), "exp_meta is required"),
        (
            DataRow(ExpMeta("t", "n", "a", 0, 0.0), Experience(state={"f": object()})),
            "exp_data.state",
        ),
        (DataRow(ExpMeta("t", "n", "a", 0, 0.0), Experience(state=float("nan"))), "exp_data.state"),
        (DataRow(ExpMeta(None, "n", "a", 0, 0.0), Experience()), "task_id"),
        (DataRow(ExpMeta("t", "n", "a", "one", 0.0), Experience()), "step"),
        ("not a row", "DataRow"),
    ],
)
def test_bad_rows_raise_schema_error_and_keep_what_was_stored(make_storage, bad, message):
    # The default in-memory store keeps payloads unchecked (AWorld's semantics);
    # with snapshot=True it refuses them as the JSON storages do.
    payload = message.startswith("exp_data")
    store = (
        make_storage(snapshot=True) if payload and make_storage.kind == "memory" else make_storage()
    )
    good = episode("t0", 3)
    store.add_batch(good)
    with pytest.raises(SchemaError, match=message):
        store.add(bad)
    with pytest.raises(SchemaError, match=message):
        store.add_batch([make_row("t9", 0), bad])  # all-or-nothing
    assert ids(store.get_all()) == ids(good)


def test_a_duplicate_row_id_is_rejected_and_the_batch_not_stored(make_storage):
    store = make_storage()
    row = make_row(row_id="same")
    store.add(row)
    with pytest.raises(SchemaError, match="same"):
        store.add_batch([make_row("t2", 0), make_row("t3", 0, row_id="same")])
    assert ids(store.get_all()) == ["same"]


def test_capacity_evicts_whole_oldest_tasks(make_storage):
    store = make_storage(max_capacity=10)
    for t in range(5):
        store.add_batch(episode(f"t{t}", 4))
        assert store.size() <= 10
    assert [r.exp_meta.task_id for r in store.get_all()] == ["t3"] * 4 + ["t4"] * 4


def test_capacity_with_single_row_adds_never_exceeds_it(make_storage):
    store = make_storage(max_capacity=7)
    for i in range(30):
        store.add(make_row(f"t{i // 5}", i % 5))
        assert store.size() <= 7
    # t5's third row made 8 > 7: the whole of t4 went, not just its oldest row.
    assert [r.exp_meta.task_id for r in store.get_all()] == ["t5"] * 5


def test_a_task_larger_than_capacity_keeps_its_newest_rows(make_storage):
    store = make_storage(max_capacity=5)
    store.add_batch(episode("old", 2))
    store.add_batch(episode("big", 12))
    assert [r.exp_meta.step for r in store.get_all()] == [7, 8, 9, 10, 11]
    store.add(make_row("next", 0))
    assert [r.exp_meta.task_id for r in store.get_all()] == ["next"]


def test_row_eviction_drops_single_oldest_rows(make_storage):
    store = make_storage(max_capacity=5, eviction="row")
    rows = [make_row(f"t{i % 2}", i) for i in range(8)]
    for r in rows:
        store.add(r)
    assert ids(store.get_all()) == ids(rows[3:])
    store.add_batch(episode("t9", 3))
    assert store.size() == 5
    assert [r.exp_meta.task_id for r in store.get_all()][-3:] == ["t9"] * 3


def test_an_evicted_task_that_receives_rows_again_is_the_newest(make_storage):
    store = make_storage(max_capacity=4)
    store.add_batch(episode("a", 2))
    store.add_batch(episode("b", 2))
    store.add_batch(episode("c", 2))  # evicts a
    store.add(make_row("a", 5))  # a again: now newest; b is oldest
    assert [r.exp_meta.task_id for r in store.get_all()] == ["c", "c", "a"]


def test_clear_empties_the_store(make_storage):
    store = make_storage()
    store.add_batch(episode("a", 3))
    store.clear()
    assert store.size() == 0 and store.get_all() == []
    store.add_batch(episode("b", 1))
    assert [r.exp_meta.task_id for r in store.get_all()] == ["b"]


def test_random_task_sample_returns_task_ids_when_the_store_has_fewer_tasks(make_storage):
    store = make_storage()
    store.add_batch(episode("a", 3) + episode("b", 2))
    picked = RandomTaskSample(seed=0).sample_task_ids(store, 10)
    assert sorted(picked) == ["a", "b"]


def test_random_task_sample_returns_at_most_batch_size_distinct_tasks(make_storage):
    store = make_storage()
    for t in range(20):
        store.add_batch(episode(f"t{t}", 3))
    picked = RandomTaskSample(seed=1).sample_task_ids(store, 5)
    assert len(picked) == 5 and len(set(picked)) == 5


def test_sampling_is_reproducible_with_a_seed(make_storage):
    store = make_storage()
    for t in range(30):
        store.add_batch(episode(f"t{t}", 3, agent_id=f"a{t % 3}"))
    cond = QueryBuilder().eq("exp_meta.agent_id", "a1").build()
    buf = ReplayBuffer(store)
    first = buf.sample_task(query_condition=cond, batch_size=4, seed=7)
    again = buf.sample_task(query_condition=cond, batch_size=4, seed=7)
    assert [ids(t) for t in first] == [ids(t) for t in again]
    rows = buf.sample(RandomSampler(), cond, batch_size=6, seed=3)
    assert ids(rows) == ids(buf.sample(RandomSampler(seed=3), cond, batch_size=6))
    assert len(set(ids(rows))) == 6
    assert all(r.exp_meta.agent_id == "a1" for r in rows)


def test_random_sampler_returns_every_matching_row_when_batch_is_large(make_storage):
    store = make_storage()
    store.add_batch([make_row("t", i, reward=float(i)) for i in range(10)])
    cond = QueryBuilder().gte("exp_data.reward_t", 7).build()
    rows = RandomSampler(seed=0).sample(store, 100, cond)
    assert sorted(r.exp_meta.step for r in rows) == [7, 8, 9]


def test_sample_task_query_selects_tasks_and_returns_their_whole_rows(make_storage):
    store = make_storage()
    store.add_batch(episode("win", 4))
    store.add_batch(episode("lose", 4))
    store.add(make_row("win", 9, reward=1.0))
    cond = QueryBuilder().gt("exp_data.reward_t", 0.5).build()
    tasks = ReplayBuffer(store).sample_task(query_condition=cond, batch_size=10, seed=0)
    assert len(tasks) == 1
    assert [r.exp_meta.step for r in tasks[0]] == [0, 1, 2, 3, 9]


def test_size_with_query(make_storage):
    store = make_storage()
    store.add_batch(episode("a", 3, agent_id="x") + episode("b", 2, agent_id="y"))
    assert store.size(QueryBuilder().eq("exp_meta.agent_id", "y").build()) == 2
    assert store.size(QueryBuilder().in_("exp_meta.task_id", ["a", "b"]).build()) == 5


def test_two_default_buffers_do_not_share_data():
    first, second = ReplayBuffer(), ReplayBuffer()
    first.store(make_row())
    assert len(first) == 1 and len(second) == 0
    assert first.storage is not second.storage


def test_in_memory_default_capacity_is_10000():
    assert InMemoryStorage().max_capacity == 10000


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_bad_capacity_is_a_config_error(bad):
    with pytest.raises(ConfigError):
        InMemoryStorage(bad)
    with pytest.raises(ConfigError):
        InMemoryStorage(10, eviction="lru")


def test_sqlite_store_persists_across_reopen(tmp_path):
    from replaystore.experience import SqliteStorage

    path = tmp_path / "keep.sqlite"
    first = SqliteStorage(path, max_capacity=10)
    first.add_batch(episode("a", 4) + episode("b", 4))
    first.close()
    again = SqliteStorage(path, max_capacity=10)
    assert [r.exp_meta.task_id for r in again.get_all()] == ["a"] * 4 + ["b"] * 4
    again.add_batch(episode("c", 4))  # the capacity bookkeeping survived too
    assert [r.exp_meta.task_id for r in again.get_all()] == ["b"] * 4 + ["c"] * 4
    assert again.integrity_check() == "ok"


def test_sqlite_file_that_is_not_a_database_is_a_storage_error(tmp_path):
    from replaystore.errors import StorageError
    from replaystore.experience import SqliteStorage

    path = tmp_path / "junk.sqlite"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StorageError, match=r"junk\.sqlite"):
        SqliteStorage(path)


def test_unfiltered_row_sampling_is_uniform_over_live_rows_with_holes(make_storage):
    store = make_storage(max_capacity=200)
    for t in range(0, 80, 2):  # interleaved tasks: evicting one leaves holes in the order
        store.add_batch([make_row(f"t{t + s % 2}", s) for s in range(10)])
    store.add_batch([make_row(f"u{i % 3}", i) for i in range(30)])
    live = {r.id for r in store.get_all()}
    counts = dict.fromkeys(live, 0)
    for seed in range(200):
        picked = store.sample_rows(10, rng=seed)
        assert len({r.id for r in picked}) == 10
        for r in picked:
            counts[r.id] += 1
    assert set(counts) == live
    # 2000 draws over 200 rows: every row drawn, none wildly over-represented.
    assert min(counts.values()) > 0 and max(counts.values()) < 35


def test_sqlite_file_of_another_application_is_a_storage_error(tmp_path):
    import sqlite3

    from replaystore.errors import StorageError
    from replaystore.experience import SqliteStorage

    path = tmp_path / "other.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE rows (a, b)")
    con.commit()
    con.close()
    with pytest.raises(StorageError, match="not a replaystore"):
        SqliteStorage(path)


def test_non_ascii_keys_and_values_are_queryable_in_every_storage(make_storage):
    store = make_storage()
    store.add(make_row(state={"größe": "straße 😀"}, agent_id="agént"))
    assert store.size(QueryBuilder().eq("exp_data.state.größe", "straße 😀").build()) == 1
    assert store.size(QueryBuilder().like("exp_data.state.größe", "😀").build()) == 1
    assert store.size(QueryBuilder().eq("exp_meta.agent_id", "agént").build()) == 1


def test_text_that_is_not_valid_unicode_is_rejected(make_storage):
    store = make_storage(snapshot=True) if make_storage.kind == "memory" else make_storage()
    with pytest.raises(SchemaError, match=r"exp_data\.state"):
        store.add(make_row(state={"k": "\ud800"}))
    with pytest.raises(SchemaError, match="task_id"):
        store.add(make_row("bad\udfff"))
    assert store.size() == 0
