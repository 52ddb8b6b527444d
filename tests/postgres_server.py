"""A throwaway PostgreSQL server for the tests: initdb + pg_ctl in a temporary directory.

The server listens only on a unix socket inside its own directory (no TCP port,
nothing shared with other test runs or other xdist workers) and is stopped and
deleted when the session ends. PostgreSQL refuses to run as root, so under root
the server runs as the ``postgres`` user (``nobody`` when there is none) through
``runuser``, and the directory is handed to that user.

Where the binaries are missing the tests that need the server skip with one
line saying how to install them; under ``CI=true`` they fail instead.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

INSTALL_HINT = (
    "PostgreSQL server binaries (initdb, pg_ctl) not found: install them "
    "(Debian/Ubuntu: apt-get install postgresql; macOS: brew install postgresql) "
    "or set REPLAYSTORE_PG_BIN to their directory"
)
SUPERUSER = "replaystore"


def find_bindir() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl``: $REPLAYSTORE_PG_BIN, Debian's, or PATH."""
    candidates: list[str] = []
    if os.environ.get("REPLAYSTORE_PG_BIN"):
        candidates.append(os.environ["REPLAYSTORE_PG_BIN"])
    debian = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit() else 0,
    )
    candidates.extend(reversed(debian))
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(str(Path(on_path).parent))
    for c in candidates:
        if (Path(c) / "initdb").exists() and (Path(c) / "pg_ctl").exists():
            return Path(c)
    return None


class PostgresServer:
    """A running server; :attr:`url` connects to its ``postgres`` database as superuser."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.dir = Path(tempfile.mkdtemp(prefix="replaystore-pg-"))
        self.data = self.dir / "data"
        self.user: str | None = None
        if os.geteuid() == 0:
            self.user = _unprivileged_user()
            entry = pwd.getpwnam(self.user)
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
        os.chmod(self.dir, 0o755)  # the socket lives here: connectable by the test process
        self.url = f"postgresql://{SUPERUSER}@/postgres?host={self.dir}&port=5432"

    def _run(self, *argv: str, timeout: float = 120) -> None:
        cmd = list(argv)
        if self.user is not None:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, cwd=self.dir, check=False
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
            )

    def start(self, *, durable: bool = False) -> PostgresServer:
        """initdb + pg_ctl start; ``durable=False`` (tests) turns fsync off, benchmarks keep it."""
        self._run(
            str(self.bindir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            SUPERUSER,
            "--auth=trust",
            "--encoding=UTF8",
            "--no-locale",
            "--no-sync",
        )
        options = " ".join(
            [
                f"-k {self.dir}",
                "-p 5432",
                "-c listen_addresses=''",
                "-c max_connections=300",
                "-c shared_buffers=128MB",
                "-c logging_collector=off",
            ]
        )
        if not durable:  # a throwaway server: durability is not under test here
            options += " -c fsync=off -c full_page_writes=off"
        self._run(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.dir / "server.log"),
            "-o",
            options,
            "-w",
            "-t",
            "60",
            "start",
        )
        return self

    def stop(self) -> None:
        try:
            if (self.data / "postmaster.pid").exists():
                self._run(
                    str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"
                )
        finally:
            for _ in range(5):
                try:
                    shutil.rmtree(self.dir)
                    break
                except OSError:
                    time.sleep(0.2)

    def log_tail(self, n: int = 40) -> str:
        """The last ``n`` lines of the server log (for failure messages)."""
        try:
            return "\n".join((self.dir / "server.log").read_text().splitlines()[-n:])
        except OSError:
            return ""


def _unprivileged_user() -> str:
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise RuntimeError("running as root and neither a 'postgres' nor a 'nobody' user exists")


def postgres_url_fixture() -> Iterator[str]:
    """Session fixture body: a running server's URL; skip (fail under CI=true) without binaries."""
    import pytest

    bindir = find_bindir()
    if bindir is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI=true but {INSTALL_HINT}")
        pytest.skip(INSTALL_HINT)
    pytest.importorskip("psycopg", reason="pip install 'replaystore[postgres]'")
    server = PostgresServer(bindir)
    try:
        server.start()
    except Exception as exc:
        log = server.log_tail()
        server.stop()
        pytest.fail(f"could not start PostgreSQL from {bindir}: {exc}\n{log}")
    try:
        yield server.url
    finally:
        server.stop()
