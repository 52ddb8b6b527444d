"""Child processes of the loop (vLLM, the trainer, browsers) that never outlive it.

Every child is started in its own process group, with its output streamed to a
log file in the run directory, and carries a marker in its environment
(:data:`MARKER_VAR` = ``<run token>:<loop pid>``) that its own children (vLLM's
engine process, Playwright's browser) inherit. Three ways they end:

* the loop stops them (normal end, an error, Ctrl-C, SIGTERM): SIGTERM to the
  group, then SIGKILL after a grace period;
* the loop dies with SIGKILL: the direct child gets SIGKILL from the kernel
  (``PR_SET_PDEATHSIG`` on Linux) and its group's other members notice their
  parent is gone; whatever is left is found by its marker and killed by
  :func:`kill_strays` when the run is resumed;
* :func:`kill_strays` at the start of every run and ``--resume`` kills every
  process whose marker names this run but another (dead) loop process.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

__all__ = ["MARKER_VAR", "ChildProcess", "describe_exit", "kill_strays", "run_marker", "tail"]

logger = logging.getLogger("replaystore.loop.processes")

#: Environment variable that marks the processes of a loop run.
MARKER_VAR = "REPLAYSTORE_LOOP_RUN"

_PR_SET_PDEATHSIG = 1


def run_marker(token: str) -> str:
    """The marker value of this loop process for run ``token``."""
    return f"{token}:{os.getpid()}"


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class ChildProcess:
    """One child command in its own process group, output appended to ``log_path``.

    Args:
        name: what it is, for messages (``"vLLM server"``, ``"trainer"``).
        argv: the command.
        log_path: its stdout and stderr go here (appended; the directory is made).
        env: variables added to the loop's environment.
        marker: the run marker (:func:`run_marker`) put in its environment.
        cwd: working directory.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        marker: str | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = [str(a) for a in argv]
        self.log_path = Path(log_path)
        self.env = {str(k): str(v) for k, v in (env or {}).items()}
        self.marker = marker
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> ChildProcess:
        """Start the command.

        Raises:
            FileNotFoundError: the executable does not exist (named).
        """
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(self.env)
        if self.marker is not None:
            env[MARKER_VAR] = self.marker
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        header = f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(self.argv)}\n"
        self._log.write(header.encode("utf-8"))
        self._log.flush()
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=self.cwd,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        except BaseException:
            self._log.close()
            self._log = None
            raise
        logger.info("%s started (pid %d), log %s", self.name, self.proc.pid, self.log_path)
        return self

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def poll(self) -> int | None:
        """The exit status, or None while it runs."""
        return None if self.proc is None else self.proc.poll()

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit status (``subprocess.TimeoutExpired`` after ``timeout``)."""
        if self.proc is None:
            raise RuntimeError(f"{self.name} was never started")
        return self.proc.wait(timeout)

    def stop(self, grace_s: float = 15.0) -> int | None:
        """SIGTERM the whole group, SIGKILL what is left after ``grace_s``; idempotent."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                logger.warning("%s did not stop in %g s: killing it", self.name, grace_s)
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait()
        if proc is not None:
            # The leader is gone; members it left behind in its group are not.
            _signal_group(proc.pid, signal.SIGKILL)
        if self._log is not None:
            self._log.close()
            self._log = None
        return None if proc is None else proc.returncode

    def __enter__(self) -> ChildProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _environ(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return handle.read()
    except OSError:
        return b""


def kill_strays(token: str, *, own_marker: str | None = None) -> list[int]:
    """SIGKILL every process marked for run ``token`` by a loop other than this one.

    Linux only (reads ``/proc``); elsewhere it finds nothing. Returns the pids killed.
    """
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    prefix = f"{MARKER_VAR}={token}:".encode()
    own = None if own_marker is None else f"{MARKER_VAR}={own_marker}".encode()
    me = os.getpid()
    killed = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        for var in _environ(int(entry.name)).split(b"\0"):
            if var.startswith(prefix) and var != own:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(entry.name), signal.SIGKILL)
                    killed.append(int(entry.name))
                break
    if killed:
        logger.warning("killed %d process(es) left by an earlier loop of this run", len(killed))
    return killed


def tail(path: Path, lines: int = 5) -> str:
    """The last ``lines`` non-empty lines of a log file (for error messages)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 8192))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
    kept = [line.rstrip() for line in text.splitlines() if line.strip()]
    return "\n".join(kept[-lines:])


def describe_exit(code: int | None) -> str:
    """``"exited with status 1"`` or ``"was killed by SIGKILL"``."""
    if code is None:
        return "is still running"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
    return f"exited with status {code}"
