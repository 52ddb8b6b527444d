"""The SQLite store's background WAL checkpointer, and the fork hooks that keep it safe.

:class:`Checkpointer` copies a store's log (``-wal``) into the database file on a
thread of the writing process, so that writers never wait for a checkpoint's
copy and fsyncs; :class:`~replaystore.experience.storage.sqlite.storage.SqliteStorage`
starts one with its first commit in a process and pokes it after each commit.

At a fork (``os.register_at_fork``) every live checkpointer's thread is kept out
of SQLite until the fork is done, and in the child each checkpointer is
orphaned: its thread is not there, and its connection, like every connection a
child inherits (:func:`keep_inherited`), is kept open and never used.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
import weakref
from pathlib import Path

__all__ = ["Checkpointer", "keep_inherited"]

log = logging.getLogger("replaystore.experience.sqlite")

# The log (``-wal``) is checkpointed by a thread of each writing process (see
# Checkpointer), which restarts it once it holds this many pages (32 MiB; SQLite's
# default auto-checkpoint is at 1000, 4 MiB: a checkpoint fsyncs the log and the
# file, and each writes a page that many commits touched once). The log file stays
# at its largest size afterwards (it is reused, not regrown).
_WAL_RESTART = 8192
# The background checkpointer waits at least this long between checkpoints, and
# this long at most for the write lock and for readers to leave the log before a
# restart (then it tries again after a later commit).
_CHECKPOINT_INTERVAL = 0.05
_CHECKPOINT_WAIT = 0.2

# Connections inherited through fork(). They must never be used or closed in the
# child: closing one could checkpoint and delete the WAL under the parent's feet.
# Keeping a reference stops the garbage collector from closing them.
_INHERITED: list[sqlite3.Connection] = []


def keep_inherited(conn: sqlite3.Connection) -> None:
    """In a forked child: keep ``conn`` (the parent's) open and unused for good.

    Never closed here: closing it could checkpoint and delete the parent's log.
    """
    _INHERITED.append(conn)


class Checkpointer:
    """Checkpoints one store's log on a thread of its own, so that writers do not wait.

    A checkpoint copies the pages committed to the log (``-wal``) into the database
    file and fsyncs both. SQLite's auto-checkpoint runs it in the committing writer,
    which waits for the copy and both fsyncs (an eighth of the time of a 100k-row
    ``add_batch`` fill with pydantic rows); here it runs beside the writers, as
    SQLite's WAL documentation suggests. After each commit the thread runs a
    PASSIVE checkpoint (it never blocks readers or writers), at most one per
    :data:`_CHECKPOINT_INTERVAL`; once the log holds :data:`_WAL_RESTART` pages, a
    RESTART checkpoint, so that the next commit writes the log from its start
    again: it copies what is left, waiting at most :data:`_CHECKPOINT_WAIT` for the
    write lock and for readers to leave the log. The store's calls in this process
    (writes and reads) wait for the restart on the store's thread lock
    (``writers``), which the thread holds through it. A checkpoint that cannot run now
    (busy, disk full) is logged at DEBUG and tried after a later commit; should the
    thread fall behind (or not start), the writers' own auto-checkpoint (SQLite's
    ``wal_autocheckpoint``, which the store sets to 16384 pages) bounds the log.

    A daemon thread with its own connection; :meth:`close` stops and joins it, and
    a process exiting mid-checkpoint leaves the file consistent (a checkpoint is
    crash-safe). A fork waits until the thread is out of SQLite (inside it, the
    thread may hold one of SQLite's process-wide locks, which the child would
    inherit held by no thread); the child does without the parent's thread and
    starts its own with its first commit.
    """

    def __init__(self, path: Path, writers: threading.RLock) -> None:
        self.path = path
        self._writers = writers
        self._wake = threading.Event()
        self._busy = threading.Lock()  # held by the thread while it is in SQLite
        self._closed = False
        self._conn: sqlite3.Connection | None = None
        self._thread = threading.Thread(
            target=self._run, name=f"replaystore-checkpoint:{path.name}", daemon=True
        )
        _CHECKPOINTERS.add(self)
        self._thread.start()

    def poke(self) -> None:
        """A commit was made: checkpoint soon."""
        if not self._wake.is_set():  # set already: the thread has not woken since
            self._wake.set()

    def stop(self) -> None:
        """Ask the thread to stop (it then closes its connection), without waiting."""
        self._closed = True
        self._wake.set()

    def close(self) -> None:
        """Stop the thread (after the checkpoint under way, if any) and wait for it."""
        self.stop()
        self._thread.join()

    def orphan(self) -> None:
        """In a forked child: the thread is not there, and its connection must never be
        closed here (closing it could checkpoint and delete the parent's log)."""
        self._closed = True
        if self._conn is not None:
            keep_inherited(self._conn)

    def _hold_writers(self) -> bool:
        """Take the store's thread lock, which this process's writers take for each
        write; False (not taken) once the checkpointer is closed.

        Polled, so that :meth:`close`, called under that lock, never waits for a
        thread that waits for it.
        """
        while not self._closed:
            if self._writers.acquire(timeout=_CHECKPOINT_INTERVAL):
                return True
        return False

    def _checkpoint(self, conn: sqlite3.Connection, mode: str) -> int:
        """Run a ``mode`` checkpoint; the pages in the log (0 if it could not run now)."""
        with self._busy:  # held in SQLite: a fork waits (see _quiesce_checkpointers)
            if self._closed:
                return 0
            try:
                return int(conn.execute(f"PRAGMA wal_checkpoint({mode})").fetchone()[1])
            except sqlite3.Error as exc:
                log.debug("%s: background checkpoint not done (%s)", self.path, exc)
                return 0

    def _run(self) -> None:
        conn = None
        try:
            while True:
                with self._busy:
                    if self._closed:
                        return
                    if conn is None:
                        conn = self._conn = sqlite3.connect(
                            self.path,
                            timeout=_CHECKPOINT_WAIT,
                            isolation_level=None,
                            check_same_thread=False,
                        )
                if self._checkpoint(conn, "PASSIVE") >= _WAL_RESTART and self._hold_writers():
                    # This process's writers wait on the lock while the restart copies
                    # what the passive checkpoint left and fsyncs (tens of ms), woken as
                    # it ends; waiting in SQLite's busy handler, they would sleep its
                    # steps (1, 2, 5, 10, 15 ms, ...) past it.
                    try:
                        self._checkpoint(conn, "RESTART")
                    finally:
                        self._writers.release()
                if self._closed:
                    return
                time.sleep(_CHECKPOINT_INTERVAL)
                self._wake.wait()
                self._wake.clear()
        except sqlite3.Error as exc:
            log.debug("%s: no background checkpoints (%s)", self.path, exc)
        finally:
            with self._busy:
                self._conn = None
                if conn is not None:
                    conn.close()


# Every live checkpointer of this process. At a fork each one's thread is kept out
# of SQLite (a thread inside it could hold one of SQLite's process-wide locks, which
# the child would inherit held by no one), and in the child each one is orphaned.
_CHECKPOINTERS: weakref.WeakSet[Checkpointer] = weakref.WeakSet()
_QUIESCED: list[Checkpointer] = []


def _quiesce_checkpointers() -> None:
    _QUIESCED[:] = list(_CHECKPOINTERS)
    for checkpointer in _QUIESCED:
        checkpointer._busy.acquire()


def _resume_checkpointers() -> None:
    for checkpointer in _QUIESCED:
        checkpointer._busy.release()
    _QUIESCED.clear()


def _orphan_checkpointers() -> None:
    for checkpointer in list(_CHECKPOINTERS):
        checkpointer.orphan()
    _CHECKPOINTERS.clear()
    _resume_checkpointers()


if hasattr(os, "register_at_fork"):  # POSIX; elsewhere there is no fork
    os.register_at_fork(
        before=_quiesce_checkpointers,
        after_in_parent=_resume_checkpointers,
        after_in_child=_orphan_checkpointers,
    )
