"""PostgreSQL storage beyond the shared contract: URLs, schema versions, sampling at scale,
what PostgreSQL cannot store, and the ``replaystore`` commands on PostgreSQL stores.

The contract itself (test_storage.py) and the query property test run against
PostgreSQL through the ``make_storage`` fixture; these tests need the same
throwaway server (``postgres_url``).
"""

from __future__ import annotations

import json
import multiprocessing
import pickle
import uuid

import psycopg
import pytest

from cli_runner import CliResult, run_cli
from replaystore.errors import ConfigError, SchemaError, StorageError
from replaystore.experience import (
    DataRow,
    Experience,
    ExperienceBuffer,
    ExpMeta,
    PostgresStorage,
    QueryBuilder,
    SqliteStorage,
    open_storage,
)
from replaystore.experience.storage import postgres as pg_module

from .helpers import episode, make_row


def schema_url(url: str, schema: str | None = None) -> str:
    return f"{url}&schema={schema or 's_' + uuid.uuid4().hex[:12]}"


# ----------------------------------------------------------------------------- URLs


def test_open_storage_opens_postgresql_urls_for_the_buffer(postgres_url):
    url = schema_url(postgres_url)
    buf = ExperienceBuffer(storage=open_storage(url, max_capacity=10))
    assert isinstance(buf.storage, PostgresStorage)
    buf.store_batch(episode("a", 6) + episode("b", 6))
    assert [r.exp_meta.task_id for r in buf.storage.get_all()] == ["b"] * 6
    again = open_storage(url)  # a second handle, as another machine would open it
    assert again.size() == 6
    buf.storage.close()
    again.close()


def test_open_storage_sqlite_url_forms_and_plain_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    relative = open_storage("sqlite:///rel/a.sqlite")
    absolute = open_storage(f"sqlite:///{tmp_path}/b.sqlite")  # sqlite:////abs/path
    plain = open_storage(tmp_path / "c.sqlite")
    for store in (relative, absolute, plain):
        assert isinstance(store, SqliteStorage)
    assert (tmp_path / "rel" / "a.sqlite").is_file()
    assert absolute.path == tmp_path / "b.sqlite"
    assert plain.path == tmp_path / "c.sqlite"


@pytest.mark.parametrize(
    ("target", "message"),
    [("mysql://x/y", "unsupported store URL scheme 'mysql'"), ("sqlite://", "bad SQLite URL")],
)
def test_open_storage_refuses_what_it_cannot_open(target, message):
    with pytest.raises(ConfigError, match=message):
        open_storage(target)


def test_an_unreachable_server_is_a_storage_error_without_the_password(tmp_path):
    url = f"postgresql://me:secret@/db?host={tmp_path}&port=1&connect_timeout=2"
    with pytest.raises(StorageError, match="cannot connect") as info:
        PostgresStorage(url, timeout=2)
    assert "secret" not in str(info.value)


def test_a_bad_schema_name_is_a_config_error(postgres_url):
    with pytest.raises(ConfigError, match="schema"):
        PostgresStorage(postgres_url, schema="x; DROP TABLE rows")


# ----------------------------------------------------------------------------- schema


def test_a_store_of_a_newer_layout_version_is_refused(postgres_url, make_postgres):
    store = make_postgres()
    store.add(make_row())
    with psycopg.connect(postgres_url) as conn:
        conn.execute(f'UPDATE "{store.schema}".replaystore_version SET version = 99')
    with pytest.raises(StorageError, match="version 99, newer than this replaystore"):
        PostgresStorage(postgres_url, schema=store.schema)
    with psycopg.connect(postgres_url) as conn:
        conn.execute(f'UPDATE "{store.schema}".replaystore_version SET version = 0')
    with pytest.raises(StorageError, match="unknown layout version 0"):
        PostgresStorage(postgres_url, schema=store.schema)


def test_tables_of_another_application_are_refused(postgres_url):
    schema = f"other_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_url) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"CREATE TABLE {schema}.rows (a int)")
    with pytest.raises(StorageError, match="not a replaystore experience store"):
        PostgresStorage(postgres_url, schema=schema)


def open_and_store(url: str, schema: str, n: int, barrier) -> None:
    barrier.wait()
    store = PostgresStorage(url, schema=schema)
    store.add_batch(episode(f"{n}", 3, agent_id=f"p{n}"))
    store.close()


def test_concurrent_first_opens_create_the_tables_once(postgres_url):
    schema = f"race_{uuid.uuid4().hex[:8]}"
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(6)  # all open at the same instant
    procs = [
        ctx.Process(target=open_and_store, args=(postgres_url, schema, n, barrier))
        for n in range(6)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    store = PostgresStorage(postgres_url, schema=schema)
    assert store.size() == 18 and len(store.task_ids()) == 6
    with psycopg.connect(postgres_url) as conn:
        versions = conn.execute(f"SELECT * FROM {schema}.replaystore_version").fetchall()
    assert versions == [("experience", pg_module.SCHEMA_VERSION)]
    store.close()


# ----------------------------------------------------------------------------- values


def test_payload_text_comes_back_exactly_as_written(make_postgres):
    store = make_postgres()
    state = {"zeta": 1, "alpha": 2.0, "big": 1e16, "nested": {"b": [1, 2.5], "a": None}}
    store.add(make_row(state=state))
    back = store.get_all()[0].exp_data.state
    assert back == state
    assert list(back) == ["zeta", "alpha", "big", "nested"]  # JSONB would sort the keys
    assert type(back["alpha"]) is float and type(back["big"]) is float  # and drop ".0"


def test_nul_characters_are_a_schema_error_naming_the_field(make_postgres):
    store = make_postgres()
    with pytest.raises(SchemaError, match=r"exp_data contains a NUL"):
        store.add(make_row(state={"k": "a\x00b"}))
    with pytest.raises(SchemaError, match=r"exp_meta\.agent_id contains a NUL"):
        store.add_batch([make_row("ok"), make_row(agent_id="x\x00")])
    store.add(make_row(state={"k": "a\\u0000b"}))  # a backslash and "u0000": plain text
    assert store.size() == 1
    assert store.size(QueryBuilder().eq("exp_data.state.k", "a\x00b").build()) == 0


def test_a_pickled_storage_reconnects_in_another_process(make_postgres):
    store = make_postgres()
    store.add_batch(episode("a", 2))
    clone = pickle.loads(pickle.dumps(store))
    assert clone.size() == 2 and clone.schema == store.schema
    clone.close()


def store_from_child(buf: ExperienceBuffer, n: int) -> None:
    buf.store_batch(episode(f"child{n}", 50))


def test_a_buffer_created_in_the_parent_works_in_forked_children(make_postgres):
    buf = ExperienceBuffer(make_postgres())
    buf.store_batch(episode("parent", 10))  # the parent's pool is open when forking
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=store_from_child, args=(buf, n)) for n in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert len(buf) == 160
    assert buf.storage.get_by_task_id("parent")[0].exp_meta.step == 0  # parent still works


# ----------------------------------------------------------------------------- sampling


@pytest.fixture
def big_store(make_postgres, monkeypatch):
    """A store sampled by random draws (the path large stores take): 120 tasks of 5 rows."""
    monkeypatch.setattr(pg_module, "EXACT_SAMPLING_UP_TO", 10)
    store = make_postgres(max_capacity=500)
    for t in range(120):  # capacity evicts the first 20 tasks: holes before the live range
        store.add_batch(episode(f"t{t:03d}", 5, agent_id=f"a{t % 4}"))
    return store


def test_drawn_task_samples_are_distinct_matching_and_cover_every_task(big_store):
    cond = QueryBuilder().eq("exp_meta.agent_id", "a1").build()
    live = set(big_store.task_ids(cond))
    assert len(live) == 25
    seen: dict[str, int] = {}
    for seed in range(100):
        picked = big_store.sample_task_ids(8, cond, rng=seed)
        assert len(picked) == 8 and len(set(picked)) == 8 and set(picked) <= live
        for tid in picked:
            seen[tid] = seen.get(tid, 0) + 1
    assert set(seen) == live  # 800 draws of 25 tasks: each about 32 times
    assert min(seen.values()) > 10 and max(seen.values()) < 60
    assert big_store.sample_task_ids(8, cond, rng=3) == big_store.sample_task_ids(8, cond, rng=3)


def test_drawn_samples_fall_back_to_listing_for_a_rare_condition(big_store):
    rare = QueryBuilder().eq("exp_meta.task_id", "t077").and_().eq("exp_meta.step", 4).build()
    assert big_store.sample_task_ids(5, rare, rng=0) == ["t077"]
    rows = big_store.sample_rows(5, rare, rng=0)
    assert [(r.exp_meta.task_id, r.exp_meta.step) for r in rows] == [("t077", 4)]
    tasks = big_store.sample_tasks(3, QueryBuilder().eq("exp_meta.agent_id", "a2").build(), 1)
    assert len(tasks) == 3 and all(len(rows) == 5 for rows in tasks.values())


def test_drawn_row_samples_are_distinct_and_matching(big_store):
    cond = QueryBuilder().gte("exp_meta.step", 3).build()
    rows = big_store.sample_rows(40, cond, rng=2)
    assert len({r.id for r in rows}) == 40 and all(r.exp_meta.step >= 3 for r in rows)
    assert len(big_store.sample_rows(1000, None, rng=0)) == 500


# ----------------------------------------------------------------------------- CLI


def cli(*args: str) -> CliResult:
    """``replaystore ARGS`` in process (``replaystore.cli.main``), both streams captured."""
    return run_cli(*args)


def test_copy_sqlite_to_postgresql_and_back_verifies_the_row_count(postgres_url, tmp_path):
    src = SqliteStorage(tmp_path / "src.sqlite")
    rows = [r for t in range(30) for r in episode(f"t{t}", 7, agent_id=f"a{t % 3}")]
    src.add_batch(rows)
    src.close()
    url = schema_url(postgres_url)
    proc = cli("copy", str(tmp_path / "src.sqlite"), url, "--batch-size", "50")
    assert proc.returncode == 0, proc.stderr
    assert (
        "copied 210 rows" in proc.stdout and "verified: destination holds 210 rows" in proc.stdout
    )
    back = tmp_path / "back.sqlite"
    proc = cli("copy", url, f"sqlite:///{back}")
    assert proc.returncode == 0, proc.stderr
    copied = SqliteStorage(back).get_all()
    assert [r.id for r in copied] == [r.id for r in rows]
    assert [r.exp_data.state for r in copied] == [r.exp_data.state for r in rows]
    proc = cli("copy", str(tmp_path / "src.sqlite"), url)  # DST not empty: refused
    assert proc.returncode == 2 and "already holds 210 rows: pass --append" in proc.stderr


def test_copy_of_a_missing_source_is_a_one_line_error(tmp_path):
    proc = cli("copy", str(tmp_path / "nope.sqlite"), str(tmp_path / "dst.sqlite"))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"replaystore copy: error: source store {tmp_path / 'nope.sqlite'} does not exist"
    ]


def test_stats_reads_a_postgresql_url(postgres_url, make_postgres):
    store = make_postgres()
    store.add_batch(episode("a", 3, agent_id="x") + episode("b", 2, agent_id="y"))
    url = schema_url(postgres_url, store.schema)
    proc = cli("stats", url, "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["kind"] == "postgres_experience_store"
    assert (summary["rows"], summary["tasks"], summary["version"]) == (5, 2, 1)
    assert [(a["agent_id"], a["rows"]) for a in summary["per_agent"]] == [("x", 3), ("y", 2)]
    text = cli("stats", url)
    assert text.returncode == 0 and "PostgreSQL experience store" in text.stdout
    missing = cli("stats", schema_url(postgres_url, "no_such_store"))
    assert missing.returncode == 2 and "no replaystore experience store" in missing.stderr


def test_stats_reads_a_sqlite_url(tmp_path):
    store = SqliteStorage(tmp_path / "x.sqlite")
    store.add_batch(episode("a", 4))
    store.close()
    proc = cli("stats", f"sqlite:///{tmp_path / 'x.sqlite'}", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["rows"] == 4


def test_export_of_an_experience_store_url_says_what_to_do(postgres_url, tmp_path):
    proc = cli("export", postgres_url, "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and "replaystore copy" in proc.stderr


def test_storage_error_rows_are_never_half_stored_on_a_duplicate(make_postgres):
    store = make_postgres()
    store.add(DataRow(ExpMeta("t", "n", "a", 0, 0.0), Experience(state={}), "dup"))
    with pytest.raises(SchemaError, match="'dup' is already stored"):
        store.add_batch([make_row("u", i) for i in range(100)] + [make_row(row_id="dup")])
    assert store.size() == 1 and store.task_ids() == ["t"]


@pytest.mark.parametrize(("singles", "tail"), [(300, 0), (300, 12), (255, 12)])
def test_one_batch_evicting_hundreds_of_tasks_matches_the_in_memory_store(
    make_postgres, singles, tail
):
    from replaystore.experience import InMemoryStorage

    # Eviction reads the oldest tasks 256 at a time; 255 + 1 tasks is the edge where
    # the newest task is in the first read and must keep its newest rows.
    batch = [make_row(f"t{i:03d}", 0) for i in range(singles)] + episode("last", tail)
    memory, store = InMemoryStorage(5), make_postgres(5)
    memory.add_batch(batch)
    store.add_batch(batch)
    assert [r.id for r in store.get_all()] == [r.id for r in memory.get_all()]
    assert store.size() == 5 and store.task_ids() == memory.task_ids()
