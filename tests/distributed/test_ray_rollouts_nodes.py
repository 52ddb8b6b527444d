"""A Ray rollout over two nodes (two raylets on this machine) survives losing one: the
second node's processes are killed mid-run, its tasks go to the first node's actor, and every
task is stored exactly once with the rewards of an in-process run of the same seeds.

The cluster is started with ``ray start`` (temp dirs, free ports, a resource per node)
and every process it started is killed by id at the end: each node's processes carry an
environment marker, read back from ``/proc`` (Linux), so no other Ray on the machine is
touched (``ray stop`` would stop them all)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from replaystore.rollouts.miniwob import miniwob_tasks
from replaystore.rollouts.ray_rollout import RayOptions, ray_rollout
from replaystore.rollouts.ray_worker import worker_spec
from replaystore.trajectories.storage import TrajectoryStorage

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
]

TASKS = "miniwob:click-button,enter-text"
SEEDS = "1-4"
RAY = str(Path(sys.executable).with_name("ray"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalCluster:
    """A head node and a second node on this machine, each with resource ``slot`` (one
    rollout actor per node) and the second also ``node2``."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.mark = uuid.uuid4().hex
        self.address = f"127.0.0.1:{_free_port()}"

    def _env(self, node: str) -> dict[str, str]:
        scratch = self.tmp / "scratch"  # the actors' own temp folders (a killed one's stays)
        scratch.mkdir(parents=True, exist_ok=True)
        return {
            **os.environ,
            "TMPDIR": str(scratch),
            "REPLAYSTORE_TEST_CLUSTER": f"{self.mark}-{node}",
            # A dead node is noticed in about 2 s, not Ray's default 15 s or more.
            "RAY_health_check_period_ms": "500",
            "RAY_health_check_timeout_ms": "500",
            "RAY_health_check_failure_threshold": "3",
            "RAY_AUTH_MODE": "disabled",
            "RAY_USAGE_STATS_ENABLED": "0",
        }

    def _start(self, node: str, first: list[str], resources: str) -> None:
        ports = [
            f"--{name}={_free_port()}"
            for name in (
                "node-manager-port",
                "object-manager-port",
                "dashboard-agent-grpc-port",
                "dashboard-agent-listen-port",
                "metrics-export-port",
                "runtime-env-agent-port",
            )
        ]
        command = [
            RAY,
            "start",
            *first,
            f"--temp-dir={self.tmp / node}",
            "--node-ip-address=127.0.0.1",
            "--num-cpus=2",
            f"--resources={resources}",
            f"--object-store-memory={80 * 1024 * 1024}",
            "--disable-usage-stats",
            *ports,
        ]
        done = subprocess.run(command, env=self._env(node), capture_output=True, text=True)
        assert done.returncode == 0, f"ray start ({node}) failed: {done.stderr[-2000:]}"

    def start(self) -> None:
        port = self.address.rsplit(":", 1)[1]
        head = ["--head", f"--port={port}", "--include-dashboard=false"]
        head.append(f"--ray-client-server-port={_free_port()}")
        self._start("head", head, '{"slot": 1}')
        self._start("node2", [f"--address={self.address}"], '{"slot": 1, "node2": 1}')

    def pids(self, node: str | None = None) -> list[int]:
        """The processes of ``node`` (None: of both), by their environment marker."""
        wanted = [f"REPLAYSTORE_TEST_CLUSTER={self.mark}-{n}".encode() for n in ("head", "node2")]
        if node is not None:
            wanted = [f"REPLAYSTORE_TEST_CLUSTER={self.mark}-{node}".encode()]
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    env = (entry / "environ").read_bytes().split(b"\0")
                except OSError:
                    continue
                if any(w in env for w in wanted):
                    found.append(int(entry.name))
        return found

    def kill_node(self, node: str) -> None:
        """SIGKILL every process of ``node``, as when its machine goes away.

        Killing only the raylet is not enough: its actor's worker process can go on
        serving calls, which do not pass through the raylet, until it notices (seen on
        one machine of this kind: it finished every task it held and no actor was lost).
        """
        for _ in range(3):  # a browser may start while its parent dies
            for pid in self.pids(node):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)

    def stop(self) -> None:
        for _ in range(4):  # workers and browsers may start while their parents die
            for pid in self.pids():
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.25)


def _auth_mode(mode: str | None) -> None:
    """Set ``RAY_AUTH_MODE`` for this process and make Ray read it again.

    A local ``ray.init()`` earlier in the process (another test file's runtime, on the
    same xdist worker) turns token authentication on and Ray keeps that in its cached
    config whatever the variable says afterwards: the driver then talks to this test's
    cluster (started with authentication off) in token mode and every actor dies at
    start ("The actor died unexpectedly"), as seen in CI.
    """
    from ray._private.authentication_test_utils import reset_auth_token_state

    if mode is None:
        os.environ.pop("RAY_AUTH_MODE", None)
    else:
        os.environ["RAY_AUTH_MODE"] = mode
    reset_auth_token_state()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    pytest.importorskip("miniwob")
    before = os.environ.get("RAY_AUTH_MODE")
    _auth_mode("disabled")
    # Short: Ray's socket paths under it must fit in 107 bytes.
    root = Path(tempfile.mkdtemp(prefix="rsray-", dir="/tmp"))
    running = LocalCluster(root)
    try:
        yield running
    finally:
        import ray

        ray.shutdown()
        running.stop()
        shutil.rmtree(root, ignore_errors=True)
        _auth_mode(before)
        assert running.pids() == [], "a process of the test cluster is still running"


def _in_process_rewards(out: Path, box: dict[str, object]) -> None:
    from replaystore.rollouts.runner import rollout

    result = asyncio.run(
        rollout(
            TASKS, out, seeds=SEEDS, workers=2, observation="text", progress=False, settle_s=0.05
        )
    )
    box["rewards"] = {o.task.task_id: o.reward for o in result.outcomes}


def test_a_lost_node_loses_no_task(
    cluster: LocalCluster, tmp_path: Path, chromium: str | None
) -> None:
    box: dict[str, object] = {}
    local = threading.Thread(target=_in_process_rewards, args=(tmp_path / "local", box))
    local.start()  # the same seeds in this process, while the cluster starts
    try:
        cluster.start()
    finally:
        local.join(timeout=300)
    storage = TrajectoryStorage(tmp_path / "ray" / "storage")
    shots = storage.root / "screenshots" / "iteration_000001" / "rank000"

    def kill_node2_after_a_result() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if shots.is_dir() and any(shots.iterdir()):  # both actors busy, tasks queued
                cluster.kill_node("node2")
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_node2_after_a_result, daemon=True)
    killer.start()
    tasks = miniwob_tasks(TASKS, SEEDS, "http://127.0.0.1:1")  # actors serve the pages
    spec = worker_spec(
        policy="miniwob_expert",
        serve="miniwob",
        browsers=2,
        observation="text",
        viewport=(640, 420),
        collector={"settle_s": 0.05},
    )
    result = ray_rollout(
        tasks,
        storage,
        1,
        spec=spec,
        options=RayOptions(
            address=cluster.address, actors=2, browsers_per_actor=2, resources={"slot": 1}
        ),
    )
    killer.join(timeout=1)
    stored: dict[str, float] = {}
    for trajectory in storage.load_all():
        task_id = trajectory[-1]["observation"].task.task_id
        assert task_id not in stored, f"{task_id} stored twice"
        stored[task_id] = float(trajectory[-1]["reward"].reward)
    assert sorted(stored) == sorted(t.task_id for t in tasks)
    assert stored == box["rewards"]
    assert result.ray["nodes"] == 2  # one actor on each node
    assert len(result.ray["lost_actors"]) == 1
    assert result.ray["reassigned"] >= 1
    for trajectory in storage.load_all():
        for step in trajectory:
            assert Path(step["observation"].image_path).is_file()
