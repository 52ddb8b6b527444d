"""``replaystore view PATH``: a local, read-only web page over any store."""

from __future__ import annotations

import argparse
from pathlib import Path

from replaystore.cli._common import Parser, UsageError, int_at_least, store_path
from replaystore.formats.detect import NotAStoreError, detect_with_storage
from replaystore.redaction import redact

__all__ = ["DESCRIPTION", "add_arguments", "run", "view_target"]

DESCRIPTION = (
    "Serve a read-only web app over PATH: a trajectory storage directory (or a "
    "directory with one in storage/, like the demo's and rollout's outputs), a SQLite "
    "experience store, a postgresql:// URL, a transitions checkpoint or a memory-mapped "
    "transitions buffer. Binds 127.0.0.1 unless --host says otherwise. Nothing in PATH is "
    "ever written. Needs the view extra."
)


def add_arguments(parser: Parser) -> None:
    """The options of ``replaystore view``."""
    parser.add_argument("path", metavar="PATH", help="the store (as for 'replaystore stats')")
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="interface to bind (default: %(default)s; another one is reachable by others "
        "and gets a warning)",
    )
    parser.add_argument(
        "--port", type=int_at_least(0), default=8765, help="TCP port (default: %(default)s)"
    )
    parser.add_argument("--open", action="store_true", help="open the page in a web browser")
    parser.add_argument(
        "--image-root",
        metavar="DIR",
        default=None,
        help="serve screenshots only from inside DIR (default: the storage directory, or "
        "the directory given as PATH)",
    )
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer requests for Host NAME, e.g. behind a reverse proxy (repeatable; "
        "on a loopback address only localhost, 127.0.0.1 and [::1] are answered otherwise)",
    )


def view_target(text: str) -> tuple[str, str, Path | None]:
    """``(kind, target, default image root)`` of ``replaystore view``'s PATH argument.

    Kinds are detected as ``stats`` detects them; a directory holding a trajectory
    storage in ``storage/`` (a demo or rollout output directory) opens that storage
    with screenshots allowed from the whole directory.
    """
    from replaystore.experience.storage.urls import is_postgres_url

    if is_postgres_url(text):
        return "postgres_experience_store", text, None
    path = store_path(text)
    try:
        kind, target, image_root = detect_with_storage(path)
    except NotAStoreError as exc:
        raise UsageError(str(exc)) from None
    return kind, str(target), image_root


def run(args: argparse.Namespace) -> int:
    """Serve the viewer over PATH until Ctrl-C; returns the exit status."""
    from replaystore.view import serve

    kind, target, image_root = view_target(args.path)
    if args.image_root is not None:
        if kind != "trajectory_storage":
            raise UsageError("--image-root applies to a trajectory storage only")
        image_root = Path(args.image_root)
        if not image_root.is_dir():
            raise UsageError(f"--image-root {image_root} is not a directory")
    if args.port > 65535:
        raise UsageError(f"--port must be <= 65535, got {args.port}")
    options = {"image_root": image_root} if kind == "trajectory_storage" else {}

    def ready(url: str) -> None:
        print(f"replaystore view: {kind.replace('_', ' ')} {redact(target)}", flush=True)
        print(f"  serving on {url} (read-only; Ctrl-C stops)", flush=True)

    try:
        serve(
            kind,
            target,
            host=args.host,
            port=args.port,
            open_browser=args.open,
            allow_hosts=args.allow_host,
            on_ready=ready,
            **options,
        )
    except ImportError as exc:
        raise UsageError(str(exc)) from None
    except KeyboardInterrupt:
        pass
    except SystemExit as exc:  # uvicorn's way out when it cannot bind (it logged why)
        if exc.code:
            raise UsageError(
                f"cannot serve on {args.host}:{args.port} (in use, or not an address of "
                "this machine?)"
            ) from None
    return 0
