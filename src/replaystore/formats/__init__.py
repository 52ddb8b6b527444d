"""Readers of replaystore's on-disk formats for tools that only look: one reader per format.

* :mod:`~replaystore.formats.sqlite_experience`: a SQLite experience store
  (what :class:`~replaystore.experience.storage.sqlite.SqliteStorage` writes),
  opened read-only, its summary, and the SQL that finds a row by its id (which
  the writer uses too);
* :mod:`~replaystore.formats.postgres_experience`: a PostgreSQL experience store
  (what :class:`~replaystore.experience.storage.postgres.PostgresStorage` writes):
  the URL's schema, the layout version and the read-only summary;
* :mod:`~replaystore.formats.experience_summary`: the counts of an experience
  store's ``rows`` table, the same queries for SQLite and PostgreSQL;
* :mod:`~replaystore.formats.transitions_checkpoint`: the metadata of a
  transitions checkpoint (what ``ReplayBuffer.save`` writes), with the data
  files it names confined to the checkpoint's directory;
* :mod:`~replaystore.formats.transitions_buffer`: the ``buffer.json`` of a
  memory-mapped transitions buffer (what
  :class:`~replaystore.transitions.storage.MemmapStorage` writes) and its summary;
* :mod:`~replaystore.formats.trajectory_header`: the header of a trajectory
  iteration file (what :class:`~replaystore.trajectories.storage.TrajectoryStorage`
  writes), parsed and checked against the file, and a storage's summary from its
  headers; it decodes steps through ``replaystore.trajectories.files`` (lines,
  frames, texts: torch-free);
* :mod:`~replaystore.formats.detect`: which of these a local path is (the one
  detection ``stats`` and ``view`` share); it lists trajectory iteration files by
  their names (``replaystore.trajectories.files.naming``, torch-free).

The writers take these modules' names (format constants, the readers they reopen
with); ``replaystore stats`` and ``replaystore view`` read these formats through
these modules. They import neither torch nor the modules that write the formats
(``replaystore.experience``, ``replaystore.transitions``,
``replaystore.trajectories.storage`` and ``.files.writer``), so a summary starts in
milliseconds.
"""

__all__: list[str] = []
