"""WebGym's ``webgym/utils/blocklist_manager.py``: :class:`BlocklistManager` over a Blocklist.

``from webgym.utils.blocklist_manager import BlocklistManager`` becomes
``from replaystore.pipeline.blocklist_manager import BlocklistManager``. The file
is WebGym's ``<save_path>/blocklist.jsonl``, and files WebGym wrote are read as
they are; see :mod:`replaystore.pipeline.blocklist` for the locking, expiry and
domain rules (and the WebGym bugs they fix).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from replaystore.errors import StorageError
from replaystore.pipeline.blocklist import (
    DEFAULT_FILE_NAME,
    Blocklist,
    entry_time,
    iso_utc,
    normalize_domain,
)

__all__ = ["BlocklistManager"]


class BlocklistManager(Blocklist):
    """WebGym's ``BlocklistManager(save_path)``: a Blocklist in ``save_path/blocklist.jsonl``.

    Every method of WebGym's class exists with its signature. The public ones
    return what WebGym's return, or more: ``record_blocked_website`` also
    returns the entry written, ``clean_expired_entries`` the number removed,
    ``get_blocklist_stats`` has WebGym's keys (``total_entries``,
    ``currently_blocked``, ``blocked_domains`` as a list) plus
    ``expired_entries``. ``block_duration_hours`` may be set on the instance, as
    in WebGym (default 12). WebGym bugs fixed: a rewrite no longer loses entries
    appended meanwhile, queries no longer rewrite the file, and a bare domain
    (``"example.com"``) is recognised where WebGym's ``_extract_domain`` gives ``""``.

    Args:
        save_path: the directory (created if missing, as in WebGym).
        block_duration_hours: hours an entry blocks its domain (see :class:`Blocklist`).
        clock: the time source (see :class:`Blocklist`).
        fsync: whether appends are fsynced (see :class:`Blocklist`).

    Raises:
        StorageError: ``save_path`` exists and is not a directory.
        ValueError: ``block_duration_hours`` is not a positive finite number.
    """

    def __init__(
        self,
        save_path: str | os.PathLike[str],
        block_duration_hours: float = 12.0,
        clock: Callable[[], float] = time.time,
        *,
        fsync: bool = True,
    ) -> None:
        directory = Path(save_path)
        if directory.exists() and not directory.is_dir():
            raise StorageError(f"BlocklistManager save_path {directory} is a file, not a directory")
        directory.mkdir(parents=True, exist_ok=True)
        super().__init__(directory / DEFAULT_FILE_NAME, block_duration_hours, clock, fsync=fsync)
        #: The directory given (WebGym's attribute).
        self.save_path = save_path

    def __repr__(self) -> str:
        return f"BlocklistManager({str(self.path.parent)!r})"

    def record_blocked_website(  # type: ignore[override]
        self,
        url: str,
        task_id: Any = None,
        screenshot_path: str | os.PathLike[str] | None = None,
    ) -> dict[str, Any]:
        """WebGym's rule: block the *domain* of ``url``, on every scheme and port, with
        its subdomains (``www.shop.example`` blocks ``http://shop.example/``).

        The entry has no ``site``, as WebGym's entries have none, so every reader
        (a :class:`Blocklist` included) applies that host-wide rule. The native
        :meth:`Blocklist.record_blocked_website` blocks only the site
        (scheme, host and port) that walled the agent.

        Raises:
            ValueError: ``url`` has no host, or ``task_id`` holds NaN/inf.
            StorageError: the file cannot be written.
        """
        domain = normalize_domain(url)
        now = float(self.clock())
        record = {
            "domain": domain,
            "url": url,
            "timestamp": now,
            "blocked_at": iso_utc(now),
            "task_id": task_id,
            "screenshot_path": None if screenshot_path is None else os.fspath(screenshot_path),
        }
        self._append_entry(record)
        return record

    # -- WebGym's helpers, for code that calls them ---------------------------------

    def _extract_domain(self, url: str) -> str:
        """The normalised domain of ``url`` (see :func:`normalize_domain`).

        Raises:
            ValueError: ``url`` has no host.
        """
        return normalize_domain(url)

    def _get_current_timestamp(self) -> str:
        """Now (from ``clock``) as ISO 8601 UTC text: the form stored in ``blocked_at``."""
        return iso_utc(float(self.clock()))

    def _is_timestamp_expired(self, timestamp_str: str) -> bool:
        """Whether an entry recorded at ``timestamp_str`` (ISO 8601) no longer blocks.

        A naive time is local time (WebGym's form); unreadable text counts as
        expired, as in WebGym.
        """
        at = entry_time({"blocked_at": timestamp_str})
        if at is None:
            return True
        return float(self.clock()) >= at + float(self.block_duration_hours) * 3600.0

    def _read_blocklist(self) -> list[dict[str, Any]]:
        """Every readable entry in the file, expired ones included (copies, file order)."""
        return self.entries(include_expired=True)

    def _write_blocklist(self, entries: list[dict[str, Any]]) -> None:
        """Replace the file's entries by ``entries``, atomically, under the exclusive lock.

        Raises:
            ValueError: an entry is not a dict with a string ``domain``.
            StorageError: the file cannot be written.
        """
        checked = [_checked_entry(e, i) for i, e in enumerate(entries)]
        with self._locked(exclusive=True):
            self._rewrite_unlocked(checked)

    def _append_to_blocklist(self, entry: dict[str, Any]) -> None:
        """Append one entry (a dict with a string ``domain``) as one line, under the lock.

        Raises:
            ValueError: the entry is not a dict with a string ``domain``.
            StorageError: the file cannot be written.
        """
        self._append_entry(_checked_entry(entry, 0))


def _checked_entry(entry: Any, i: int) -> dict[str, Any]:
    if not isinstance(entry, dict) or not isinstance(entry.get("domain"), str):
        raise ValueError(
            f"blocklist entry {i} must be a dict with a string 'domain', got {entry!r}"
        )
    return entry
