"""What every ``replaystore`` command shares: its parser class, usage errors, tables.

Imports only the standard library (and ``tqdm`` when a progress bar is drawn),
so that building the parser costs nothing a command does not need.
"""

from __future__ import annotations

import argparse
import difflib
import itertools
import math
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from replaystore.errors import ReplayStoreError
from replaystore.redaction import redact

__all__ = [
    "Parser",
    "UsageError",
    "check_options",
    "did_you_mean",
    "finite_float",
    "human_bytes",
    "int_at_least",
    "one_line",
    "positive_seconds",
    "progress",
    "ratio",
    "store_path",
    "table",
]


class UsageError(Exception):
    """A mistake in how the command was called: one line, exit status 2."""


# argparse's own message for a bad choice (of a command or of an option's value).
_INVALID_CHOICE = re.compile(r"invalid choice: '(?P<value>[^']*)' \(choose from (?P<choices>.*)\)")
# What argparse takes for a negative number (a value, not an option).
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """``"; did you mean X?"`` for the closest candidate, or ``""`` when none is close."""
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


class Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line on stderr (exit status 2), with a
    suggestion for a mistyped choice and a pointer to this (sub)command's help."""

    def error(self, message: str) -> NoReturn:
        found = _INVALID_CHOICE.search(message)
        if found:
            choices = [c.strip().strip("'\"") for c in found["choices"].split(",")]
            message += did_you_mean(found["value"], choices)
        message = redact(message)  # a URL given where a command or option was expected
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")

    def option_names(self) -> list[str]:
        """Every option string this parser accepts (``-h``, ``--out``, ...)."""
        return [o for action in self._actions for o in action.option_strings]

    def check_option(self, token: str) -> None:
        """Exit with a usage error when ``token`` (an ``-x`` / ``--name[=value]`` word)
        is no option of this parser, nor a unique prefix of one (argparse's abbreviations)."""
        if token == "-" or _NEGATIVE_NUMBER.match(token):
            return
        name = token.split("=", 1)[0]
        names = self.option_names()
        known = name in names or (name.startswith("--") and any(n.startswith(name) for n in names))
        if not name.startswith("--") and len(name) > 2:  # -vh: bundled short flags
            known = name[:2] in names
        if not known:
            longs = [n for n in names if n.startswith("--")]
            self.error(f"unrecognized option {name!r}{did_you_mean(name, longs)}")


def check_options(parser: Parser, commands: dict[str, Parser], argv: Sequence[str]) -> None:
    """Report the first unknown option in ``argv`` against the parser it was given to.

    argparse alone reports ``replaystore --verison`` as a missing command and an
    unknown subcommand option against the top-level help; this runs first and
    names the option, the closest real one, and the right ``--help``.
    """
    owner = parser
    for token in argv:
        if token == "--":
            return
        if token.startswith("-"):
            owner.check_option(token)
        elif owner is parser:  # the top level has no option that takes a value
            if token not in commands:
                return  # argparse reports the unknown command, with a suggestion
            owner = commands[token]


def progress(
    items: Iterable[Any] | None, total: int | None, desc: str, unit: str = "sample"
) -> Any:
    """``items`` (or, with None, a bar to ``update`` by hand) with a tqdm bar on
    stderr when it is a terminal; quiet otherwise."""
    from tqdm import tqdm

    return tqdm(items, total=total, desc=desc, unit=unit, disable=not sys.stderr.isatty())


def human_bytes(n: float) -> str:
    """``n`` bytes as ``"812 B"``, ``"4.0 KiB"``, ... ``"1.5 GiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def table(
    header: Sequence[str], rows: Sequence[Sequence[Any]], align: str, indent: str = "    "
) -> list[str]:
    """Text table lines; ``align`` has one ``l`` (left) or ``r`` (right) per column."""
    cells = [list(map(str, header))] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = []
    for row in cells:
        padded = [
            c.rjust(w) if a == "r" else c.ljust(w)
            for c, w, a in zip(row, widths, align, strict=True)
        ]
        lines.append((indent + "  ".join(padded)).rstrip())
    return lines


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (an OSError as ``path: reason``)."""
    if isinstance(exc, OSError) and exc.strerror and exc.filename is not None:
        # "[Errno 17] File exists: 'x'" -> "x: File exists"
        target = f"{exc.filename} -> {exc.filename2}" if exc.filename2 else str(exc.filename)
        return f"{target}: {exc.strerror}"
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    # A line ending in ":" introduces the next ("nothing was written: sample 3: ...").
    text = lines[0]
    for before, line in itertools.pairwise(lines):
        text += (" " if before.endswith(":") else "; ") + line
    return text


def store_path(text: str) -> Path:
    """The file a store argument names: a plain path, or the path of a ``sqlite:///`` URL.

    Raises:
        UsageError: a malformed ``sqlite:`` URL, or a URL of another scheme.
    """
    from replaystore.experience.storage.urls import sqlite_path

    try:
        path = sqlite_path(text)
    except ReplayStoreError as exc:
        raise UsageError(str(exc)) from None
    if path is None:
        raise UsageError(
            f"unsupported URL {text!r}: give a path, sqlite:///path or postgresql://..."
        )
    return Path(path)


# --------------------------------------------------------------------------- option types


def int_at_least(low: int) -> Any:
    """An argparse ``type``: an integer ``>= low``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    return parse


def positive_seconds(text: str) -> float:
    """An argparse ``type``: a finite number of seconds ``> 0``."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def finite_float(text: str) -> float:
    """An argparse ``type``: a finite number."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be finite, got {text!r}")
    return value


def ratio(text: str) -> float:
    """An argparse ``type``: a number in ``[0, 1)``."""
    value = finite_float(text)
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text!r}")
    return value
