"""Readers of replaystore's on-disk formats for tools that only look: one reader per format.

* :mod:`~replaystore.formats.sqlite_experience`: a SQLite experience store
  (what :class:`~replaystore.experience.storage.sqlite.SqliteStorage` writes),
  opened read-only, its summary, and the SQL that finds a row by its id (which
  the writer uses too);
* :mod:`~replaystore.formats.experience_summary`: the counts of an experience
  store's ``rows`` table, the same queries for SQLite and PostgreSQL;
* :mod:`~replaystore.formats.transitions_checkpoint`: the metadata of a
  transitions checkpoint (what ``ReplayBuffer.save`` writes), with the data
  files it names confined to the checkpoint's directory;
* :mod:`~replaystore.formats.detect`: which of these a local path is (the one
  detection ``stats`` and ``view`` share); it lists trajectory iteration files by
  their names (``replaystore.trajectories.files.naming``, torch-free).

``replaystore stats`` and ``replaystore view`` read these formats through these
modules only. They import neither torch nor the packages that write the formats
(``replaystore.experience``, ``replaystore.transitions``), so a summary starts
in milliseconds.
"""

__all__: list[str] = []
