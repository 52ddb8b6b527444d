"""Websites that blocked the agent (captcha, anti-bot wall), remembered for a while.

A :class:`Blocklist` is one JSONL file: one entry per line, one line per
:meth:`Blocklist.record_blocked_website` call. An entry blocks its domain for
``block_duration_hours`` after it was recorded; the task sampler skips blocked
websites when it draws training tasks. API of WebGym's ``BlocklistManager``
(``webgym/utils/blocklist_manager.py``), with these differences:

* **Concurrency.** Many rollout processes append to one file. An append is one
  ``write()`` of one complete line on an ``O_APPEND`` descriptor, made while
  holding an exclusive ``fcntl.flock`` on a lock file next to the data file
  (``<file>.lock``), so lines are never interleaved or lost. A rewrite
  (:meth:`Blocklist.clean_expired_entries`) takes the same lock, writes a new file
  and renames it over the old one (``replaystore.atomic``), so it never loses an
  append racing with it: the appender waits, then opens the new file. Readers
  take the lock shared, and skip a torn final line (a writer killed mid-line).
  WebGym truncates the file *before* locking it when it rewrites, which can
  lose every entry.
* **Queries do not rewrite.** WebGym rewrites the file on every
  ``get_blocked_domains``/``is_website_blocked`` call; here queries only read
  (and reuse the parsed file while its size, inode and mtime are unchanged).
* **Time.** Entries store ``timestamp`` (seconds since the epoch, from the
  ``clock`` you pass, :func:`time.time` by default) and ``blocked_at`` (the same
  instant as ISO 8601 UTC, for people). Files written by WebGym (naive local
  ``blocked_at`` only) are read too.
* **Sites, not hosts.** An entry blocks one *site*: scheme, host and port
  (:func:`normalize_site`: ``http://localhost:18432``), because WebArena-style
  environments serve one site per port on one host, and a wall on one of them
  says nothing about the others. Subdomains are blocked only when the entry
  asks (``record_blocked_website(url, subdomains=True)``). WebGym blocks the
  host on every port and every subdomain. Entries with a ``domain`` and no
  ``site`` (written by WebGym, or by replaystore before sites) keep that meaning:
  they block their host on every port, and its subdomains. See
  :meth:`Blocklist.is_website_blocked`.

Entry format (one JSON object per line)::

    {"site": "https://example.com:443", "subdomains": false,
     "domain": "example.com", "url": "https://www.example.com/cart",
     "timestamp": 1767225600.0, "blocked_at": "2026-01-01T00:00:00+00:00",
     "task_id": "42", "screenshot_path": "shots/42_3.png"}

Clear entries with :meth:`Blocklist.remove` and :meth:`Blocklist.clear`, or from
the shell: ``replaystore blocklist list|remove SITE|clear --file RUN/blocklist.jsonl``.

POSIX only (``fcntl``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from replaystore.atomic import atomic_open
from replaystore.errors import StorageError

__all__ = [
    "Blocklist",
    "SiteRule",
    "blocked_domain_set",
    "blocked_site_rules",
    "blocking_rule",
    "domain_is_blocked",
    "normalize_domain",
    "normalize_site",
    "site_is_blocked",
]

logger = logging.getLogger("replaystore.pipeline.blocklist")

#: File name used when a :class:`Blocklist` is given a directory (WebGym's name).
DEFAULT_FILE_NAME = "blocklist.jsonl"


def normalize_domain(url: str) -> str:
    """The host of ``url`` in canonical form: the key the blocklist stores and compares.

    Accepts a full URL (``https://user:pw@WWW.Example.COM.:8443/path?q``) or a bare
    host (``example.com``, ``example.com:8080/x``) and removes, in order: the
    scheme, userinfo, port, path, query and fragment; upper case; a trailing dot
    (``example.com.`` is the same host); one leading ``www.`` (only when what
    remains still contains a dot, so ``www.com`` stays ``www.com``).
    Internationalised names are converted to their ASCII (punycode) form, so
    ``bücher.de`` and ``xn--bcher-kva.de`` are one domain. IPv6 literals lose
    their brackets. Subdomains other than ``www`` are kept: ``shop.example.com``
    stays ``shop.example.com`` (see :meth:`Blocklist.is_website_blocked` for how
    subdomains match).

    Examples: ``https://www.Example.com:443/a`` -> ``example.com``;
    ``http://user@shop.example.com.`` -> ``shop.example.com``.

    Raises:
        ValueError: ``url`` is not a string, or has no host (``""``, ``"https://"``,
            ``"/just/a/path"``).
    """
    if not isinstance(url, str):
        raise ValueError(f"a URL or domain must be a string, got {type(url).__name__}")
    text = url.strip()
    # Without "//" urlsplit reads "example.com:8080" as scheme "example.com".
    parsed = urlsplit(text if "://" in text else "//" + text)
    host = parsed.hostname or ""
    host = host.rstrip(".")
    if not host:
        raise ValueError(f"cannot find a host (domain) in {url!r}")
    if not host.isascii():
        with contextlib.suppress(UnicodeError):
            host = host.encode("idna").decode("ascii")
    host = host.lower()
    if host.startswith("www.") and "." in host[4:]:
        host = host[4:]
    return host


_DEFAULT_PORTS = {"http": 80, "https": 443}


def _site_parts(url: str) -> tuple[str | None, str, int | None]:
    """``(scheme or None, normalised host, port or None)`` of a URL or bare host.

    The port is the explicit one, else the scheme's default (80, 443); None when
    neither is known (a bare host such as ``example.com``).

    Raises:
        ValueError: no host, or a port that is not a number in 0-65535.
    """
    host = normalize_domain(url)
    text = url.strip()
    parsed = urlsplit(text if "://" in text else "//" + text)
    scheme = parsed.scheme.lower() or None
    try:
        port = parsed.port
    except ValueError:
        raise ValueError(f"{url!r} has a bad port") from None
    if port is None and scheme is not None:
        port = _DEFAULT_PORTS.get(scheme)
    return scheme, host, port


def normalize_site(url: str) -> str:
    """The site of ``url``: ``scheme://host:port``, the key a new blocklist entry stores.

    The host is normalised as by :func:`normalize_domain` (so ``www.`` and case do
    not matter); the port is explicit, or the scheme's default (80 for http, 443
    for https). A bare host has no scheme: ``example.com`` -> ``example.com``,
    ``example.com:8080`` -> ``example.com:8080``.

    Examples: ``http://localhost:18432/forbidden`` -> ``http://localhost:18432``;
    ``https://WWW.Example.com/a`` -> ``https://example.com:443``.

    Raises:
        ValueError: ``url`` has no host or a bad port.
    """
    scheme, host, port = _site_parts(url)
    shown = f"[{host}]" if ":" in host else host
    site = shown if port is None else f"{shown}:{port}"
    return site if scheme is None else f"{scheme}://{site}"


@dataclass(frozen=True, slots=True)
class SiteRule:
    """What one blocklist entry blocks.

    Attributes:
        host: the normalised host.
        scheme: the scheme, or None (any scheme).
        port: the port, or None (any port).
        subdomains: whether subdomains of ``host`` are blocked too.
    """

    host: str
    scheme: str | None = None
    port: int | None = None
    subdomains: bool = False

    @classmethod
    def from_entry(cls, entry: dict[str, Any]) -> SiteRule:
        """The rule of an entry: its ``site`` (and ``subdomains`` flag), or for an
        entry with only a ``domain`` (written by WebGym, or before sites) that
        host on every port, subdomains included, as such entries always meant."""
        site = entry.get("site")
        if isinstance(site, str):
            with contextlib.suppress(ValueError):
                scheme, host, port = _site_parts(site)
                return cls(host, scheme, port, bool(entry.get("subdomains", False)))
        return cls(normalize_domain(entry["domain"]), None, None, True)

    @classmethod
    def parse(cls, site: str) -> SiteRule:
        """A rule from text: a URL or ``host:port`` blocks that site; a bare host
        (no scheme, no port) blocks the host on every port and its subdomains,
        as a WebGym domain does.

        Raises:
            ValueError: no host or a bad port.
        """
        scheme, host, port = _site_parts(site)
        if scheme is None and port is None:
            return cls(host, None, None, True)
        return cls(host, scheme, port, False)

    @property
    def site(self) -> str:
        """The rule as text (``http://localhost:18432``, or a bare host for an old
        entry): what ``Blocklist.remove`` and ``replaystore blocklist remove`` take."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        site = host if self.port is None else f"{host}:{self.port}"
        return site if self.scheme is None else f"{self.scheme}://{site}"

    def matches(self, scheme: str | None, host: str, port: int | None) -> bool:
        """Whether a URL's parts (as :func:`normalize_site` reads them) fall under the rule.

        An unknown scheme or port on either side (None) matches any."""
        if host != self.host and not (self.subdomains and host.endswith("." + self.host)):
            return False
        if self.scheme is not None and scheme is not None and scheme != self.scheme:
            return False
        return self.port is None or port is None or port == self.port


def blocking_rule(url: str, rules: Iterable[SiteRule]) -> SiteRule | None:
    """The first of ``rules`` that ``url`` falls under, or None.

    Raises:
        ValueError: ``url`` has no host.
    """
    parts = _site_parts(url)
    return next((rule for rule in rules if rule.matches(*parts)), None)


def site_is_blocked(url: str, rules: Iterable[SiteRule]) -> bool:
    """Whether ``url`` falls under one of ``rules`` (see :meth:`SiteRule.matches`).

    Raises:
        ValueError: ``url`` has no host.
    """
    return blocking_rule(url, rules) is not None


def _suffixes(domain: str) -> Iterator[str]:
    """``a.b.example.com`` -> ``a.b.example.com``, ``b.example.com``, ``example.com``, ``com``."""
    yield domain
    start = domain.find(".")
    while start != -1:
        yield domain[start + 1 :]
        start = domain.find(".", start + 1)


def domain_is_blocked(domain: str, blocked: set[str] | frozenset[str]) -> bool:
    """Whether normalised ``domain`` is in ``blocked`` or is a subdomain of one in it.

    Matching is on whole labels: ``shop.example.com`` matches ``example.com``;
    ``badexample.com`` does not. Cost: O(number of labels) set look-ups.
    """
    return any(suffix in blocked for suffix in _suffixes(domain))


def iso_utc(timestamp: float) -> str:
    """``timestamp`` (seconds since the epoch) as an ISO 8601 UTC time, as entries store it."""
    return dt.datetime.fromtimestamp(timestamp, tz=dt.UTC).isoformat()


def entry_time(entry: dict[str, Any]) -> float | None:
    """Seconds since the epoch of an entry, or None when it has no readable time."""
    value = entry.get("timestamp")
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    text = entry.get("blocked_at")
    if isinstance(text, str):
        try:
            # A naive time is local time, which is what WebGym writes.
            return dt.datetime.fromisoformat(text).timestamp()
        except ValueError:
            return None
    return None


class Blocklist:
    """Blocked websites in a JSONL file shared by many processes; entries expire.

    Args:
        path: the JSONL file, or an existing directory (then ``<dir>/blocklist.jsonl``,
            WebGym's layout). Missing parent directories are created. The file is
            created on the first record; a missing file is an empty blocklist.
        block_duration_hours: how long an entry blocks its domain (WebGym: 12).
            An entry recorded at time ``t`` blocks while ``clock() < t + duration``.
        clock: returns the current time in seconds since the epoch. Tests pass a
            fake clock; processes sharing a file should share a clock source.
        fsync: flush each append to disk before returning (durable against power
            loss; costs a disk flush per record).

    Raises:
        ValueError: ``block_duration_hours`` is not a positive finite number.

    Files: ``path`` and ``path`` + ``".lock"`` (an empty file that is only ever
    locked; never delete it while processes use the blocklist).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        block_duration_hours: float = 12.0,
        clock: Callable[[], float] = time.time,
        *,
        fsync: bool = True,
    ) -> None:
        hours = float(block_duration_hours)
        if not (math.isfinite(hours) and hours > 0):
            raise ValueError(
                f"block_duration_hours must be a positive number, got {block_duration_hours!r}"
            )
        target = Path(path)
        if target.is_dir():
            target = target / DEFAULT_FILE_NAME
        target.parent.mkdir(parents=True, exist_ok=True)
        self.path = target
        self.lock_path = target.with_name(target.name + ".lock")
        self.block_duration_hours = hours
        self.clock = clock
        self.fsync = fsync
        self._cache_key: tuple[int, int, int] | None = None
        self._cache: list[dict[str, Any]] = []
        self._skipped = 0  # unreadable lines in the cached parse

    @property
    def blocklist_file(self) -> str:
        """The JSONL file as a string (WebGym's attribute name)."""
        return str(self.path)

    def __repr__(self) -> str:
        return f"Blocklist({str(self.path)!r}, block_duration_hours={self.block_duration_hours})"

    # -- locking and file access -------------------------------------------------

    @contextlib.contextmanager
    def _locked(self, exclusive: bool) -> Iterator[None]:
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _read_unlocked(self) -> list[dict[str, Any]]:
        """Parsed entries; caller holds the lock. Reuses the last parse if the file is unchanged."""
        try:
            with open(self.path, "rb") as handle:
                st = os.fstat(handle.fileno())
                key = (st.st_ino, st.st_size, st.st_mtime_ns)
                if key == self._cache_key:
                    return self._cache
                data = handle.read()
        except FileNotFoundError:
            self._cache_key, self._cache, self._skipped = None, [], 0
            return []
        except OSError as exc:
            raise StorageError(f"cannot read blocklist {self.path}: {exc}") from exc
        lines = data.split(b"\n")
        skipped = 0
        if lines[-1]:
            # No newline after the last line: a writer died mid-line. Skip it.
            logger.warning("blocklist %s: skipping incomplete last line %d", self.path, len(lines))
            skipped += 1
        entries: list[dict[str, Any]] = []
        for number, raw in enumerate(lines[:-1], start=1):
            if not raw.strip():
                continue
            try:
                entry = json.loads(raw)
            except (UnicodeDecodeError, json.JSONDecodeError):
                entry = None
            if not isinstance(entry, dict) or not isinstance(entry.get("domain"), str):
                logger.warning("blocklist %s line %d is not an entry; ignored", self.path, number)
                skipped += 1
                continue
            entries.append(entry)
        self._cache_key, self._cache, self._skipped = key, entries, skipped
        return entries

    def _is_active(self, entry: dict[str, Any], now: float, duration_s: float) -> bool:
        at = entry_time(entry)
        return at is not None and now < at + duration_s

    # -- public API ----------------------------------------------------------------

    def record_blocked_website(
        self,
        url: str,
        task_id: Any = None,
        screenshot_path: str | os.PathLike[str] | None = None,
        *,
        subdomains: bool = False,
    ) -> dict[str, Any]:
        """Append one entry blocking the site of ``url`` (scheme, host, port) from now on.

        Safe to call from many processes at once: the entry is written as one
        complete line with a single ``write()`` under an exclusive lock.

        Args:
            url: the page (or bare domain) that blocked the agent.
            task_id: the task that hit the block (any JSON value; stored as given).
            screenshot_path: screenshot of the block page (stored as a string).
            subdomains: block the subdomains of the host too (same scheme and port).

        Returns:
            The entry written (``site``, ``subdomains``, ``domain``, ``url``,
            ``timestamp``, ``blocked_at``, ``task_id``, ``screenshot_path``).

        Raises:
            ValueError: ``url`` has no host, or ``task_id`` holds NaN/inf.
            TypeError: ``task_id`` is not JSON-serialisable.
            StorageError: the file cannot be written.

        Cost: one small write, plus one disk flush when ``fsync``.
        """
        site = normalize_site(url)
        domain = normalize_domain(url)
        now = float(self.clock())
        entry = {
            "site": site,
            "subdomains": bool(subdomains),
            "domain": domain,
            "url": url,
            "timestamp": now,
            "blocked_at": iso_utc(now),
            "task_id": task_id,
            "screenshot_path": None if screenshot_path is None else os.fspath(screenshot_path),
        }
        self._append_entry(entry)
        logger.info("blocked website %s recorded (task %s)", site, task_id)
        return entry

    def _append_entry(self, entry: dict[str, Any]) -> None:
        """Append one entry as one complete line, under the exclusive lock."""
        line = (json.dumps(entry, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")
        with self._locked(exclusive=True):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
            except OSError as exc:
                raise StorageError(f"cannot open blocklist {self.path}: {exc}") from exc
            try:
                view = memoryview(line)
                while view:  # a regular file takes it in one write; loop only on a short write
                    view = view[os.write(fd, view) :]
                if self.fsync:
                    os.fsync(fd)
            except OSError as exc:
                raise StorageError(f"cannot append to blocklist {self.path}: {exc}") from exc
            finally:
                os.close(fd)

    def entries(self, include_expired: bool = False) -> list[dict[str, Any]]:
        """The entries in file order (copies), only unexpired ones unless asked otherwise.

        Cost: reads the file (O(file size)) unless it is unchanged since the last read.
        """
        with self._locked(exclusive=False):
            entries = self._read_unlocked()
        if include_expired:
            return [dict(e) for e in entries]
        now = float(self.clock())
        duration = self.block_duration_hours * 3600.0
        return [dict(e) for e in entries if self._is_active(e, now, duration)]

    def get_blocked_domains(self) -> set[str]:
        """Normalised domains with at least one unexpired entry.

        Does not rewrite the file (WebGym cleans it on every query); call
        :meth:`clean_expired_entries` for that.
        """
        return {e["domain"] for e in self.entries()}

    def get_blocked_sites(self) -> list[str]:
        """The sites of the unexpired entries, sorted (:func:`normalize_site` form;
        an entry with only a domain gives its domain)."""
        return sorted({entry_site(e) for e in self.entries()})

    def rules(self) -> list[SiteRule]:
        """What the unexpired entries block, one :class:`SiteRule` each."""
        return list(dict.fromkeys(SiteRule.from_entry(e) for e in self.entries()))

    def is_website_blocked(self, url: str) -> bool:
        """Whether ``url``'s site is currently blocked.

        An entry with a ``site`` (every entry recorded now) blocks that scheme,
        host and port only: after a wall at ``http://localhost:18432/x``,
        ``http://localhost:5000/`` and ``http://shop.localhost:18432/`` are not
        blocked. With ``subdomains`` it blocks the subdomains of its host too
        (``shop.example.com`` under ``example.com``; never upwards, never
        ``badexample.com``). An entry with only a ``domain`` (WebGym's, or older)
        blocks its host on every port and every subdomain, as before. A ``url``
        without scheme or port (``example.com``) matches entries of its host on
        any port. ``www.`` is never significant (see :func:`normalize_domain`).

        Raises:
            ValueError: ``url`` has no host.
        """
        return site_is_blocked(url, self.rules())

    def remove(self, site: str) -> int:
        """Delete the entries of ``site`` (expired ones too); returns how many.

        ``site`` is a URL or ``scheme://host:port`` (entries of that site), or a
        bare host (every entry of that host, on any port). Atomic, under the
        exclusive lock, as :meth:`clean_expired_entries`.

        Raises:
            ValueError: ``site`` has no host.
            StorageError: the file cannot be read or written.
        """
        target = SiteRule.parse(site)
        with self._locked(exclusive=True):
            self._cache_key = None
            entries = self._read_unlocked()
            keep = [e for e in entries if not _entry_is(e, target)]
            removed = len(entries) - len(keep)
            if removed:
                self._rewrite_unlocked(keep)
        logger.info("blocklist %s: removed %d entries of %s", self.path, removed, site)
        return removed

    def clear(self) -> int:
        """Delete every entry; returns how many there were (expired ones included).

        Raises:
            StorageError: the file cannot be read or written.
        """
        with self._locked(exclusive=True):
            self._cache_key = None
            entries = self._read_unlocked()
            if entries or self._skipped:
                self._rewrite_unlocked([])
        return len(entries)

    def clean_expired_entries(self) -> int:
        """Rewrite the file without its expired (and unreadable) entries, atomically.

        Holds the exclusive lock from read to rename, so entries appended by other
        processes meanwhile wait and then land in the new file: nothing unexpired is
        lost. The file keeps its permission bits, and is left untouched when no
        entry expired and every line was readable.

        Returns:
            The number of entries removed.

        Raises:
            StorageError: the file cannot be read or written.

        Cost: reads and rewrites the whole file.
        """
        with self._locked(exclusive=True):
            self._cache_key = None  # force a fresh read under the exclusive lock
            entries = self._read_unlocked()
            now = float(self.clock())
            duration = self.block_duration_hours * 3600.0
            keep = [e for e in entries if self._is_active(e, now, duration)]
            removed = len(entries) - len(keep)
            if removed == 0 and self._skipped == 0:
                return 0
            self._rewrite_unlocked(keep)
        if removed:
            logger.info(
                "blocklist %s: removed %d expired entries, kept %d", self.path, removed, len(keep)
            )
        return removed

    def _rewrite_unlocked(self, entries: Iterable[dict[str, Any]]) -> None:
        """Replace the file by ``entries`` atomically; the caller holds the exclusive lock."""
        try:
            with atomic_open(self.path, "w") as handle:  # keeps the file's mode
                handle.writelines(
                    json.dumps(e, ensure_ascii=False, allow_nan=False) + "\n" for e in entries
                )
        except OSError as exc:
            raise StorageError(f"cannot rewrite blocklist {self.path}: {exc}") from exc
        self._cache_key = None

    def stats(self) -> dict[str, Any]:
        """Counts for logging: ``total_entries`` (in the file), ``currently_blocked``
        (distinct unexpired domains), ``expired_entries``, ``blocked_domains`` and
        ``blocked_sites`` (sorted).
        """
        everything = self.entries(include_expired=True)
        now = float(self.clock())
        duration = self.block_duration_hours * 3600.0
        active = {e["domain"] for e in everything if self._is_active(e, now, duration)}
        expired = sum(1 for e in everything if not self._is_active(e, now, duration))
        return {
            "total_entries": len(everything),
            "currently_blocked": len(active),
            "expired_entries": expired,
            "blocked_domains": sorted(active),
            "blocked_sites": sorted(
                {entry_site(e) for e in everything if self._is_active(e, now, duration)}
            ),
        }

    def get_blocklist_stats(self) -> dict[str, Any]:
        """WebGym's name for :meth:`stats`."""
        return self.stats()

    def __contains__(self, url: object) -> bool:
        return isinstance(url, str) and self.is_website_blocked(url)


def entry_site(entry: dict[str, Any]) -> str:
    """The site an entry blocks: its ``site`` (a rule), else its ``domain`` (WebGym's key)."""
    site = entry.get("site")
    return site if isinstance(site, str) else str(entry["domain"])


def _entry_is(entry: dict[str, Any], target: SiteRule) -> bool:
    """Whether ``entry`` is one of the entries ``target`` names (for :meth:`Blocklist.remove`)."""
    try:
        rule = SiteRule.from_entry(entry)
    except ValueError:
        return False
    if target.port is None and target.scheme is None:  # a bare host: all its entries
        return rule.host == target.host
    return (rule.host, rule.scheme, rule.port) == (target.host, target.scheme, target.port)


def blocked_site_rules(blocked: Blocklist | Iterable[str] | None) -> tuple[SiteRule, ...]:
    """What ``blocked`` blocks: a :class:`Blocklist`'s unexpired rules, or one
    :meth:`SiteRule.parse` rule per string (a bare host blocks the host on every
    port and its subdomains; a URL or ``host:port`` blocks that site).

    Raises:
        TypeError: ``blocked`` is a single string.
        ValueError: a string has no host.
    """
    if blocked is None:
        return ()
    if isinstance(blocked, Blocklist):
        return tuple(blocked.rules())
    if isinstance(blocked, str):
        raise TypeError(
            "blocked websites must be a Blocklist or a collection of domains, not a str"
        )
    return tuple(dict.fromkeys(SiteRule.parse(d) for d in blocked))


def blocked_domain_set(blocked: Blocklist | Iterable[str] | None) -> frozenset[str]:
    """Normalised domains from a :class:`Blocklist` (its unexpired domains) or an iterable."""
    if blocked is None:
        return frozenset()
    if isinstance(blocked, Blocklist):
        return frozenset(blocked.get_blocked_domains())
    if isinstance(blocked, str):
        raise TypeError(
            "blocked websites must be a Blocklist or a collection of domains, not a str"
        )
    return frozenset(normalize_domain(d) for d in blocked)
