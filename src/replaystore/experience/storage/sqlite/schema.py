"""The SQLite experience store's file layout: tables, indexes, format version, and the
statements that write rows into them.

* :data:`FORMAT` and :data:`SCHEMA`: the format this version writes and its
  tables and indexes (``rows``, ``tasks``, ``task_keys``, the id tables
  :data:`ID_TABLES`, ``stats``); :data:`STATS` writes a new file's ``stats`` rows;
* :data:`COLUMNS`, :data:`ROW_PARAMS` and :data:`SLOT`: a row's columns, in the
  order of :func:`~replaystore.experience.rows.encode_flat`'s records;
* the insert statements of a batch (:data:`INSERT_ROWS`, :data:`INSERT_IDS`,
  :data:`TASK_INSERTS`, :data:`KEY_INSERTS`), and the per-connection temporary
  views and triggers through which a one-row store inserts in one statement
  (:data:`ROW_VIEW`, :data:`ROW_TRIGGER`, :data:`BOOKED_VIEW`,
  :data:`BOOKED_TRIGGER`; :data:`INSERT_ONE`, :data:`INSERT_BOOKED`).

Constants only: :class:`~replaystore.experience.storage.sqlite.storage.SqliteStorage`
runs them; :mod:`~replaystore.experience.storage.sqlite.migrate` brings older
files to :data:`FORMAT`. What the format holds and why: the package docstring
(:mod:`replaystore.experience.storage.sqlite`).
"""

from __future__ import annotations

from replaystore.experience.rows import META_FIELDS, RECORD_SLOTS
from replaystore.formats.sqlite_experience import ID_TABLES

__all__ = [
    "ASSIGNED",
    "ASSIGNED_MERGED",
    "BOOKED_TRIGGER",
    "BOOKED_VIEW",
    "CHUNK_ROWS",
    "COLUMNS",
    "FORMAT",
    "ID_HASH_SQL",
    "ID_TABLES",
    "INSERT_BOOKED",
    "INSERT_IDS",
    "INSERT_ONE",
    "INSERT_ROWS",
    "KEYED",
    "KEY_INSERTS",
    "ROW_PARAMS",
    "ROW_TRIGGER",
    "ROW_VIEW",
    "SCHEMA",
    "SEQS_USED",
    "SLOT",
    "STATS",
    "TASK_INSERTS",
]

FORMAT = 3
"""The file format this version writes (``stats.format``); older files are migrated on open.

1: ``rows.seq`` AUTOINCREMENT, ``tasks.n_rows`` and ``stats.n_rows`` counters, all
updated by every commit. 2: none of them; ``stats`` holds ``high_water`` and
``dead``, changed only when rows are deleted (see :class:`SqliteStorage`). 3: no
unique index on ``rows.id``; the ids are found through ``row_ids_new`` and
``row_ids`` by a hash of the id (see "Row ids" in the package docstring), and
``stats.merged`` records the last merge of the one into the other.
"""

SCHEMA = """
CREATE TABLE IF NOT EXISTS rows (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    task_name TEXT,
    agent_id TEXT,
    step INTEGER NOT NULL,
    execute_time REAL NOT NULL,
    pre_agent TEXT,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS rows_task ON rows (task_id, seq);
CREATE TABLE IF NOT EXISTS tasks (
    task_id TEXT PRIMARY KEY,
    first_seq INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS tasks_first ON tasks (first_seq);
CREATE TABLE IF NOT EXISTS task_keys (
    field TEXT NOT NULL,
    value TEXT NOT NULL,
    first_seq INTEGER NOT NULL,
    task_id TEXT NOT NULL,
    PRIMARY KEY (field, value, first_seq, task_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS task_keys_task ON task_keys (task_id);
CREATE TABLE IF NOT EXISTS row_ids_new (
    h INTEGER PRIMARY KEY,
    seq INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS row_ids (
    h INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    PRIMARY KEY (h, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS stats (
    key TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID
"""
STATS = (
    "INSERT OR IGNORE INTO stats (key, value) "
    "VALUES ('format', ?), ('high_water', ?), ('dead', ?), ('merged', ?)"
)
# The SQL function giving a row id's key in the id tables (rows.id_hash), registered
# on every connection the store opens; used where SQL must key rows it reads
# (deletes, the upgrade), never in the schema, so any SQLite reads the file.
ID_HASH_SQL = "replaystore_id_hash"
# Metadata fields recorded per task in ``task_keys`` (see the package docstring).
KEYED = ("agent_id", "task_name")
# Sequence numbers handed out so far: every seq up to this one has been used (by a
# row stored now or deleted since), so the next row gets this plus one.
SEQS_USED = (
    "max(coalesce((SELECT max(seq) FROM rows), 0), "
    "(SELECT value FROM stats WHERE key = 'high_water'))"
)
ASSIGNED = "SELECT " + SEQS_USED
ASSIGNED_MERGED = ASSIGNED + ", (SELECT value FROM stats WHERE key = 'merged')"

COLUMNS = "seq, id, " + ", ".join(META_FIELDS) + ", data"
ROW_PARAMS = len(COLUMNS.split(", "))
assert ROW_PARAMS == RECORD_SLOTS  # a row's parameters are its slots in encode_flat's list
# Each column's slot in a row's parameters (the seq's is encode_flat's free slot).
SLOT = {name: i for i, name in enumerate(COLUMNS.split(", "))}
_ROW_VALUES = "(" + ", ".join(["?"] * ROW_PARAMS) + ")"
# A batch's rows go in through multi-row INSERT statements of up to this many rows
# (4,608 parameters; SQLite allows 32,766 since 3.32, builds before that 999, and
# a build may set its own: fewer rows a statement where the connection's limit is
# lower): each binds its rows and inserts them in one step, about 1 us a row less
# than executemany's reset-bind-step per row. A batch is cut into chunks whose
# sizes are powers of two, so a connection prepares (and caches) at most ten such
# statements whatever the batch sizes.
CHUNK_ROWS = 512
INSERT_ROWS = {
    1 << k: f"INSERT INTO rows ({COLUMNS}) VALUES " + ", ".join([_ROW_VALUES] * (1 << k))
    for k in range(CHUNK_ROWS.bit_length())
}
# A batch's (id hash, seq) pairs go into row_ids_new the same way, each unless its
# hash is in row_ids (one search of its primary key), sorted by hash first (by
# SQLite: inserting in key order keeps the B-tree's cursor near). Fewer rows
# inserted than given means a hash was found: see SqliteStorage._insert_ids. OR
# IGNORE (a hash of row_ids_new is skipped, not an error): a statement that cannot
# fail midway needs no statement journal, which otherwise holds a copy of each
# row_ids_new page the statement changes (0.6-0.7 us a row with uuid4 ids).
INSERT_IDS = {
    1 << k: "INSERT OR IGNORE INTO row_ids_new (h, seq) SELECT column1, column2 FROM (VALUES "
    + ", ".join(["(?, ?)"] * (1 << k))
    + ") AS v WHERE NOT EXISTS (SELECT 1 FROM row_ids WHERE row_ids.h = v.column1) ORDER BY 1"
    for k in range(CHUNK_ROWS.bit_length())
}
# A batch's tasks (task id, its first row's seq) and its keys (field, value, task id)
# go in the same way, each task unless it is there already, each key with its task's
# first seq (the task looked up by its primary key: CROSS JOIN keeps the VALUES rows
# the outer loop). About 1 us a row less than an executemany of one-row statements.
TASK_INSERTS = {
    1 << k: "INSERT OR IGNORE INTO tasks (task_id, first_seq) VALUES "
    + ", ".join(["(?, ?)"] * (1 << k))
    for k in range(CHUNK_ROWS.bit_length())
}
KEY_INSERTS = {
    1 << k: "INSERT OR IGNORE INTO task_keys (field, value, first_seq, task_id) "
    "SELECT v.column1, v.column2, t.first_seq, t.task_id FROM (VALUES "
    + ", ".join(["(?, ?, ?)"] * (1 << k))
    + ") AS v CROSS JOIN tasks AS t ON t.task_id = v.column3"
    for k in range(CHUNK_ROWS.bit_length())
}
# The next row's seq, as a value in an INSERT ... VALUES (the VALUES form runs
# about 2 us faster than INSERT ... SELECT).
_NEXT_SEQ = SEQS_USED + " + 1"
# One-row stores insert into this per-connection view; its trigger stores the row
# (seq worked out in SQL), its task and its keys, and its id's key. One statement,
# so an unbounded store commits it on its own: no BEGIN and COMMIT round trips, no
# Python between the inserts. Temporary objects: they live in this connection, not
# the file. The view's last column is the id's hash (rows.id_hash). A hash found
# in row_ids (the RAISE) or in row_ids_new (its primary key) fails the statement,
# storing nothing: SqliteStorage.add then takes the batch path, which tells a
# stored id from another id of the same hash.
_META_NEW = ", ".join("NEW." + f for f in META_FIELDS)
ROW_VIEW = (
    "CREATE TEMP VIEW IF NOT EXISTS rows_in AS SELECT id, "
    + ", ".join(META_FIELDS)
    + ", data, 0 AS h FROM main.rows"
)
_HASH_SEEN = "SELECT RAISE(ABORT, 'row id hash in row_ids') FROM row_ids WHERE h = NEW.h LIMIT 1"
ROW_TRIGGER = f"""
CREATE TEMP TRIGGER IF NOT EXISTS rows_in_insert INSTEAD OF INSERT ON rows_in BEGIN
    {_HASH_SEEN};
    INSERT INTO rows (seq, id, {", ".join(META_FIELDS)}, data)
        VALUES ({_NEXT_SEQ}, NEW.id, {_META_NEW}, NEW.data);
    INSERT OR IGNORE INTO tasks (task_id, first_seq) VALUES (NEW.task_id, last_insert_rowid());
    INSERT OR IGNORE INTO task_keys (field, value, first_seq, task_id)
        SELECT 'agent_id', NEW.agent_id, first_seq, task_id FROM tasks
        WHERE task_id = NEW.task_id AND NEW.agent_id IS NOT NULL
        UNION ALL
        SELECT 'task_name', NEW.task_name, first_seq, task_id FROM tasks
        WHERE task_id = NEW.task_id AND NEW.task_name IS NOT NULL;
    INSERT INTO row_ids_new (h, seq) VALUES (NEW.h, last_insert_rowid());
END
"""
INSERT_ONE = "INSERT INTO rows_in VALUES (" + ", ".join(["?"] * (ROW_PARAMS)) + ")"
# A one-row store whose task, agent and task name this connection has booked
# already (see SqliteStorage.add) inserts the row and its id's key alone, about
# 3 us less than the full trigger. Guarded in the statement itself: the view's
# first column is the data_version at which the booking was seen, and should
# another connection have committed since (a delete could have taken the task's
# bookkeeping), the id becomes NULL, the NOT NULL constraint refuses the row, and
# the store takes the full trigger's path.
BOOKED_VIEW = (
    "CREATE TEMP VIEW IF NOT EXISTS rows_booked AS SELECT 0 AS version, id, "
    + ", ".join(META_FIELDS)
    + ", data, 0 AS h FROM main.rows"
)
BOOKED_TRIGGER = f"""
CREATE TEMP TRIGGER IF NOT EXISTS rows_booked_insert INSTEAD OF INSERT ON rows_booked BEGIN
    {_HASH_SEEN};
    INSERT INTO rows (seq, id, {", ".join(META_FIELDS)}, data) VALUES ({_NEXT_SEQ},
        CASE WHEN (SELECT data_version FROM pragma_data_version) = NEW.version THEN NEW.id END,
        {_META_NEW}, NEW.data);
    INSERT INTO row_ids_new (h, seq) VALUES (NEW.h, last_insert_rowid());
END
"""
INSERT_BOOKED = "INSERT INTO rows_booked VALUES (" + ", ".join(["?"] * (ROW_PARAMS + 1)) + ")"
