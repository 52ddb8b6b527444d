"""SQLite storage: :class:`SqliteStorage`, the embedded default many processes can share.

One file holds the rows: metadata in indexed columns, the experience as JSON
text. Each process (and each fork) opens its own connection; writers take the
write lock for one short transaction per batch (``BEGIN IMMEDIATE``), readers
never block writers (WAL). Query conditions are compiled to SQL with bound
parameters (values are never written into SQL text) and payload paths are
read with ``json_extract``. Random selection is done on the filtered set of
sequence numbers with a seeded NumPy generator, so the same seed gives the same
sample on the same store.

A process killed at any instant leaves the file consistent: a batch is in it
whole or not at all (SQLite's journal), and ``PRAGMA integrity_check`` passes.

Durability is a choice (``synchronous=``): with ``"NORMAL"`` (the default, in WAL
mode) committed batches survive a crash of the process, but after a power loss
or an OS crash the last few commits may be missing (the file is never corrupt);
a commit costs no fsync, which is what makes one-row ``store`` calls cheap
(tens of microseconds). ``"FULL"`` fsyncs the log on every commit, so every
commit survives a power loss too, at about 4x the cost of a one-row commit on
an SSD (batches amortise it).

Indexes: besides ``(task_id, seq)`` and the row ids (below), the table ``task_keys``
records, per task, the distinct ``agent_id`` and ``task_name`` values of its
rows (with the task's first sequence number). A condition with ``eq``/``in_``
on those fields (or on ``task_id``) first narrows the search to the tasks that
can match, through that table, then reads only their rows; sampling tasks by
such a condition reads only the table. It costs a write only when a task
meets a new agent or task name, unlike an index over every row.

Row ids: a row's id is unique in the store and found through two tables keyed
by the id's 64-bit hash (FNV-1a, :func:`~replaystore.experience.rows.id_hash`)
and the row's seq. A batch's ids go into ``row_ids_new``, which holds the ids of
the rows stored since the last merge; every 16,384 seqs it is
moved, in hash order, into ``row_ids``, which holds the rest. A unique index on
the id text itself put random ids (AWorld's ``DataRow`` gives each row
``str(uuid.uuid4())``) on random pages of an index of every row, and a commit
of 1,000 such rows rewrote most of its pages (a 100k-row pydantic fill ran at
55-60k rows/s against 130-140k with sequential ids); the small table's pages are
few, and the large one is rewritten once per merge. The cost: each id is
looked up in ``row_ids`` (one B-tree search) and inserted into ``row_ids_new``.
Hashes can collide: a hash found in either table sends the batch down a careful
path that compares the ids themselves; the first of two distinct ids sharing a
hash keeps ``row_ids_new``'s one slot for it, the other goes to ``row_ids``,
which holds a hash any number of times. Deleting rows deletes their keys
(through the SQL function ``replaystore_id_hash``, registered on every
connection the store opens; nothing in the schema needs it, so any SQLite can
read and check the file). A condition with ``eq``/``in_`` on ``id`` reads the
rows of those hashes' seqs, then compares the ids.

What a commit writes (file format 3,
:data:`~replaystore.experience.storage.sqlite.schema.FORMAT`): a row's table
page, its ``rows_task`` page and its ``row_ids_new`` page, plus the ``tasks`` and
``task_keys`` pages when the row starts a task or brings a new agent or task
name to one. No counter is
rewritten per commit: ``seq`` is not AUTOINCREMENT (a new row gets the largest
seq handed out so far plus one, read from ``max(seq)`` and ``stats.high_water``),
and ``size()`` is the number of seqs handed out minus ``stats.dead``, the two
stats rows written only when rows are deleted (eviction, :meth:`SqliteStorage.clear`).
Seqs are never reused. Files of formats 1 and 2 are upgraded on open (one
transaction, a copy of the table: see
:func:`~replaystore.experience.storage.sqlite.migrate.upgrade`); a file of a
newer format is refused with a :class:`~replaystore.errors.StorageError`.

The package, one module per part:

* :mod:`~replaystore.experience.storage.sqlite.schema`: the tables, indexes and
  format version, and the statements that write rows;
* :mod:`~replaystore.experience.storage.sqlite.filters`: query conditions as SQL,
  narrowed through ``tasks``, ``task_keys`` and the id tables;
* :mod:`~replaystore.experience.storage.sqlite.migrate`: upgrades of older files
  on open;
* :mod:`~replaystore.experience.storage.sqlite.checkpointer`: the background WAL
  checkpoint thread and its fork hooks;
* :mod:`~replaystore.experience.storage.sqlite.storage`: :class:`SqliteStorage`.

The read side of the format (opening a store read-only, its summary, the SQL that
finds a row by id) is :mod:`replaystore.formats.sqlite_experience`, which the
viewer and ``replaystore stats`` use without importing this package.
"""

# FORMAT and id_seqs_sql: importable from here as before the split (not in __all__).
from replaystore.experience.storage.sqlite.schema import FORMAT as FORMAT
from replaystore.experience.storage.sqlite.storage import SqliteStorage
from replaystore.formats.sqlite_experience import id_seqs_sql as id_seqs_sql

__all__ = ["SqliteStorage"]
