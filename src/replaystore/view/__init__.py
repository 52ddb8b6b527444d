"""``replaystore view``: a local, read-only web app over any store replaystore writes.

Stores: a trajectory storage directory (overview charts, filtered trajectory
list, step-by-step pages with the screenshot, click point, raw response,
reward, evaluation and the exact export record), a SQLite or PostgreSQL
experience store (tasks, rows with a QueryBuilder filter form, one row's JSON),
a transitions checkpoint or memory-mapped buffer (schema, fill, histograms).

Use it from the command line (``replaystore view PATH``) or in Python::

    from replaystore.view import build_app, serve
    app = build_app("trajectory_storage", "runs/storage")   # an ASGI app
    serve("trajectory_storage", "runs/storage", port=8765)  # blocks; Ctrl-C stops

Safety: binds 127.0.0.1 unless told otherwise (and then logs a warning: the
pages show everything in the store, with no login); on a loopback address answers
only requests whose Host header is a loopback name or one given in ``allow_hosts``
(DNS rebinding, see :func:`allowed_hosts`); never writes to the store;
serves screenshots only from inside the image root. Needs the ``view`` extra
(``pip install 'replaystore[view]'``: Starlette, Jinja2, uvicorn).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import threading
import webbrowser
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from starlette.applications import Starlette

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "LOOPBACK_NAMES",
    "allowed_hosts",
    "build_app",
    "host_warning",
    "serve",
]

logger = logging.getLogger("replaystore.view")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
#: The Host names a viewer bound to a loopback address always answers to.
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


def _is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name
        return False


def allowed_hosts(bind: str, extra: Sequence[str] = ()) -> list[str] | None:
    """The Host header names a viewer bound to ``bind`` answers to; ``None``: any.

    On a loopback address: :data:`LOOPBACK_NAMES` and ``extra`` (names a reverse
    proxy sends), so a web page that rebinds its own domain to 127.0.0.1 gets 400
    instead of the store. On another interface every Host is answered unless
    ``extra`` names some. Either way ``bind`` itself is answered too (127.0.0.2, a
    LAN address), unless it is a wildcard such as 0.0.0.0.
    """
    names = [name.strip().lower() for name in extra]
    if not names and not _is_loopback(bind):
        return None
    own = [] if bind in ("0.0.0.0", "::", "") else [f"[{bind}]" if ":" in bind else bind]
    return list(dict.fromkeys([*LOOPBACK_NAMES, *names, *own]))


def host_warning(host: str) -> str | None:
    """The warning for binding ``host``, or None for a loopback address (127.0.0.0/8,
    ::1, localhost): any other interface lets others on the network read the store."""
    if _is_loopback(host):
        return None
    return (
        f"serving on {host}: anyone who can reach this address can read the whole store "
        "(there is no login); leave --host at 127.0.0.1 unless you mean it"
    )


def _require() -> None:
    missing = []
    for name in ("starlette", "jinja2", "uvicorn"):
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise ImportError(
            f"replaystore view needs {', '.join(missing)}: pip install 'replaystore[view]'"
        )


def build_app(kind: str, target: str | os.PathLike[str], **options: Any) -> Starlette:
    """The viewer's ASGI app (see :func:`replaystore.view.app.build_app` for the arguments).

    Raises:
        ImportError: the ``view`` extra is missing (the message says what to install).
    """
    _require()
    from replaystore.view.app import build_app as build

    return build(kind, target, **options)


def serve(
    kind: str,
    target: str | os.PathLike[str],
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    open_browser: bool = False,
    image_root: str | os.PathLike[str] | None = None,
    allow_hosts: Sequence[str] = (),
    on_ready: Any = None,
) -> None:
    """Serve the viewer until interrupted (blocks).

    Args:
        kind, target: the store (as for :func:`build_app`).
        host: interface to bind; a non-loopback one logs :func:`host_warning`
            (everyone who can reach it sees the whole store).
        port: TCP port (0: any free port).
        open_browser: open the start page in the default web browser.
        image_root: directory screenshots must lie in (default: the storage).
        allow_hosts: Host header names answered besides the loopback ones (for a
            reverse proxy; see :func:`allowed_hosts`).
        on_ready: called with the URL once the server listens.

    Raises:
        ImportError: the ``view`` extra is missing.
        ReplayStoreError: the store cannot be opened.
        OSError: the port cannot be bound.
    """
    options: dict[str, Any] = {"allowed_hosts": allowed_hosts(host, allow_hosts)}
    if kind == "trajectory_storage":
        options["image_root"] = image_root
    app = build_app(kind, target, **options)
    import uvicorn

    warning = host_warning(host)
    if warning is not None:
        logger.warning("%s", warning)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)
    server = uvicorn.Server(config)

    def announce() -> None:
        while not server.started:
            if server.should_exit:
                return
            threading.Event().wait(0.05)
        bound = server.servers[0].sockets[0].getsockname()[1] if server.servers else port
        shown = f"[{host}]" if ":" in host else host
        url = f"http://{shown}:{bound}/"
        if on_ready is not None:
            on_ready(url)
        if open_browser:
            webbrowser.open(url)

    threading.Thread(target=announce, daemon=True).start()
    server.run()
