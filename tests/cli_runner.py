"""Running the ``replaystore`` command from tests: in process (the default) or as a process.

:func:`run_cli` calls ``replaystore.cli.main(argv)`` in this process with stdout
and stderr captured: the exit status and streams the shell would see, without
starting a Python and importing torch per call. :func:`run_cli_subprocess` runs
the real ``python -m replaystore.cli`` for the few tests about the process itself.
Importable from any test (``tests/`` is on ``sys.path``): ``from cli_runner import run_cli``.
"""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class CliResult:
    """What one ``replaystore`` run left: exit status and the text of both streams."""

    returncode: int
    stdout: str
    stderr: str


def run_cli(*args: Any, cwd: Path | None = None) -> CliResult:
    """``replaystore ARGS...`` in process: ``main(argv)`` with both streams captured.

    The streams are StringIO objects (``isatty()`` is False, as for a pipe), so
    progress bars stay off as they do under ``subprocess.run(capture_output=True)``.
    An exception ``main`` does not turn into an exit status propagates, failing
    the test with its traceback (a subprocess would have exited 1).
    """
    from replaystore.cli import main

    out, err = io.StringIO(), io.StringIO()
    place = contextlib.chdir(cwd) if cwd is not None else contextlib.nullcontext()
    with place, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return CliResult(code, out.getvalue(), err.getvalue())


def run_cli_subprocess(
    *args: Any, env: dict[str, str] | None = None, timeout: float = 120, umask: int = -1
) -> CliResult:
    """``python -m replaystore.cli ARGS...`` in a new process; never raises on failure.

    ``umask``: the child's umask (-1: this process's).
    """
    proc = subprocess.run(
        [sys.executable, "-m", "replaystore.cli", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        umask=umask,
    )
    return CliResult(proc.returncode, proc.stdout, proc.stderr)
