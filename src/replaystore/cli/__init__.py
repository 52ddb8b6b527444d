"""The ``replaystore`` command.

Subcommands:

* ``demo``: run the end-to-end demo of every part of the library;
* ``stats PATH``: summarise a trajectory storage directory, a SQLite experience
  store, a transitions checkpoint or a memory-mapped transitions buffer;
* ``export STORE --out DIR``: sample a trajectory storage and write a
  LLaMA-Factory dataset (ShareGPT or OpenAI messages);
* ``copy SRC DST``: copy an experience store (SQLite file or ``sqlite:///`` URL,
  ``postgresql://`` URL) into another, verifying the row count;
* ``import-webgym FILE... --out DIR``: import WebGym ``.pt`` iteration files
  safely (no pickle code runs) into a trajectory storage;
* ``rollout``, ``blocklist``: one web-agent rollout iteration in a real browser,
  and the sites its blocklist leaves out;
* ``loop``: WebGym's loop (roll out, train, serve, repeat), resumable;
* ``view PATH``: a local, read-only web page over any of those stores;
* ``info``: versions, the active compiled kernels and the optional packages
  present (``--version`` prints the short form).

Each command is one module of this package (``replaystore.cli.stats``, ...)
with ``DESCRIPTION``, ``add_arguments(parser)`` and ``run(args)``. This entry
point knows only the commands' names and one-line help: it imports the module
of the command given (to define its options and run it) and no other, so
``replaystore --help`` and ``replaystore stats`` load nothing the command
does not need. A command module imports only the standard library and
:mod:`replaystore.cli._common` at module level; its heavy imports (torch, the
viewer, the rollout and loop runners) are inside ``run``.

User errors (a missing file, a bad option, a file that is not what it should
be, an unsafe pickle) are printed as one line on stderr with exit status 2; an
unknown option or command gets a "did you mean" suggestion and a pointer to the
help of the command it was given to. Anything else is a bug and keeps its
traceback. Long work shows a progress bar on stderr when stderr is a terminal,
and nothing otherwise.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any, NoReturn

from replaystore.cli._common import Parser, UsageError, check_options, one_line
from replaystore.errors import ReplayStoreError
from replaystore.redaction import RedactingFormatter, redact, url_passwords

__all__ = ["COMMANDS", "main"]

#: Each command: its module under ``replaystore.cli`` and its line in ``replaystore --help``.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("demo", "run the end-to-end demo of every part of the library"),
    "stats": (
        "stats",
        "summarise a trajectory storage, SQLite experience store or transitions buffer",
    ),
    "export": ("export", "write a LLaMA-Factory dataset from a trajectory storage"),
    "copy": ("copy", "copy an experience store between SQLite and PostgreSQL"),
    "import-webgym": (
        "import_webgym",
        "import WebGym .pt iteration files safely into a trajectory storage",
    ),
    "rollout": ("rollout", "run one web-agent rollout iteration in a real browser"),
    "blocklist": ("blocklist", "list or clear the sites a rollout's blocklist leaves out"),
    "loop": (
        "loop",
        "close WebGym's loop: roll out, train with LLaMA-Factory, serve with vLLM, repeat",
    ),
    "view": ("view", "browse a store in a local, read-only web page"),
    "info": (
        "info",
        "show versions, the active compiled kernels and the optional packages present",
    ),
}


class _VersionAction(argparse.Action):
    """``--version``: versions and active kernels, computed only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> NoReturn:
        from replaystore.cli.info import version_text

        print(version_text())
        parser.exit(0)


def _parser() -> tuple[Parser, dict[str, Parser]]:
    """The top-level parser and one empty subparser per command (options come later)."""
    parser = Parser(
        prog="replaystore",
        description="Store and sample reinforcement-learning experience.",
        epilog="Run 'replaystore COMMAND --help' for the options of a command.",
    )
    parser.add_argument(
        "--version",
        action=_VersionAction,
        help="show versions and the active compiled kernels, and exit",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands = {name: sub.add_parser(name, help=line) for name, (_, line) in COMMANDS.items()}
    return parser, commands


def _command_word(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names: its first word that is no option (the top level
    has no option that takes a value), or None."""
    for token in argv:
        if token == "--":
            return None
        if not token.startswith("-"):
            return token
    return None


def command_module(name: str, parser: Parser) -> ModuleType:
    """Import the module of command ``name`` and define its options on ``parser``."""
    module = importlib.import_module(f"replaystore.cli.{COMMANDS[name][0]}")
    parser.description = module.DESCRIPTION
    module.add_arguments(parser)
    return module


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``replaystore`` command; returns the exit status.

    Never raises SystemExit: ``--help`` and ``--version`` return 0, usage errors 2
    (after printing), so in-process callers get the status the shell would.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, commands = _parser()
    name = _command_word(argv)
    module = command_module(name, commands[name]) if name in commands else None
    try:
        check_options(parser, commands, argv)
        args, extras = parser.parse_known_args(argv)
        if extras:  # stray positional words: report them against the command they followed
            commands[args.command].error(f"unrecognized arguments: {' '.join(extras)}")
    except SystemExit as exc:  # argparse's way out of --help, --version and usage errors
        return exc.code if isinstance(exc.code, int) else 2
    assert module is not None  # parse_known_args exits unless a known command was given
    handler = logging.StreamHandler()  # a store URL in a log record: no password
    handler.setFormatter(RedactingFormatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, handlers=[handler])
    try:
        return int(module.run(args))
    except (UsageError, ReplayStoreError, OSError) as exc:
        line = redact(one_line(exc), url_passwords(argv))
        print(f"replaystore {args.command}: error: {line}", file=sys.stderr)
        return 2
