"""The viewer refuses requests whose Host header it does not know (DNS rebinding).

A web page can rebind its own domain to 127.0.0.1 and read a local server through
the visitor's browser; the browser then sends that domain as Host. So a viewer
bound to a loopback address answers only loopback names and ``--allow-host`` ones.
"""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

starlette = pytest.importorskip("starlette")
from starlette.testclient import TestClient  # noqa: E402

from replaystore.view import allowed_hosts, build_app  # noqa: E402

FOREIGN = "evil.example.com"


# Every kind of route of a trajectory viewer: pages, a screenshot, a static file.
ROUTES = ("/", "/trajectories", "/trajectory/0", "/screenshot/0/0", "/static/view.css")


def _get(port: int, path: str, host: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers={"Host": host})
        response = conn.getresponse()
        return response.status, response.read().decode("utf-8", "replace")
    finally:
        conn.close()


@contextmanager
def _viewer(*args: str) -> Iterator[int]:
    """``replaystore view ARGS --port 0`` as a process; yields its port."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "replaystore.cli", "view", *args, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        url = proc.stdout.readline().split("serving on ", 1)[1].split()[0]
        yield int(url.rstrip("/").rsplit(":", 1)[1])
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=20)


def test_loopback_viewer_refuses_a_foreign_host_on_every_route(
    traj_store: dict[str, Any],
) -> None:
    with _viewer(str(traj_store["root"])) as port:
        for path in ROUTES:
            status, body = _get(port, path, FOREIGN)
            assert status == 400, path
            assert FOREIGN in body and "--allow-host" in body, path
            assert len(body.strip().splitlines()) == 1, path
            for host in ("localhost", f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"):
                assert _get(port, path, host)[0] == 200, (path, host)


def test_allow_host_names_a_reverse_proxy(traj_store: dict[str, Any]) -> None:
    root = str(traj_store["root"])
    with _viewer(root, "--allow-host", "viewer.lab", "--allow-host", "Proxy.Example") as port:
        assert _get(port, "/", "viewer.lab")[0] == 200
        assert _get(port, "/static/view.css", "proxy.example:443")[0] == 200
        assert _get(port, "/", FOREIGN)[0] == 400


def test_every_store_kind_refuses_a_foreign_host(
    traj_store: dict[str, Any], exp_store: Path, transitions: dict[str, Path]
) -> None:
    hosts = allowed_hosts("127.0.0.1")
    apps = [
        (build_app("trajectory_storage", traj_store["root"], allowed_hosts=hosts), "/trajectories"),
        (build_app("sqlite_experience_store", exp_store, allowed_hosts=hosts), "/rows"),
        (build_app("transitions_memmap", transitions["memmap"], allowed_hosts=hosts), "/"),
    ]
    for app, page in apps:
        client = TestClient(app, raise_server_exceptions=False)
        for path in (page, "/static/view.js", "/no/such/page"):
            refused = client.get(path, headers={"Host": FOREIGN})
            assert refused.status_code == 400 and "--allow-host" in refused.text
            assert client.get(path, headers={"Host": "localhost:8765"}).status_code != 400


def test_which_hosts_each_bind_accepts() -> None:
    loopback = ["localhost", "127.0.0.1", "[::1]"]
    assert allowed_hosts("127.0.0.1") == loopback
    assert allowed_hosts("::1", ["Proxy.Lab"]) == [*loopback, "proxy.lab"]
    assert allowed_hosts("127.0.0.2") == [*loopback, "127.0.0.2"]  # the bound address too
    # another interface: today's warning, and a Host check only when names are given
    assert allowed_hosts("0.0.0.0") is None
    assert allowed_hosts("0.0.0.0", ["viewer.lab"]) == [*loopback, "viewer.lab"]
    assert allowed_hosts("192.168.1.5", ["viewer.lab"]) == [*loopback, "viewer.lab", "192.168.1.5"]
