"""Suite-wide test configuration: deterministic property tests.

Hypothesis draws its examples from a fixed seed (``derandomize=True``) and keeps
no example database, so every run, in every ``pytest-xdist`` worker, tries the
same inputs: a property test cannot pass on one run and fail on the next.
``HYPOTHESIS_PROFILE=explore`` switches to fresh random examples for a local
bug hunt (a failure prints the seed to reproduce it).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
from hypothesis import settings

# The environment may set PYTHONDONTWRITEBYTECODE=1 (this project's machines do). Then
# pytest rewrites the asserts of every test module again in every process that collects
# them (each xdist worker of each step: some 4,000 asserts, seconds of CPU each time),
# because it keeps a rewritten module only as bytecode. A test run writes bytecode as a
# plain pytest run does; the processes the tests start keep the environment's setting.
sys.dont_write_bytecode = False

settings.register_profile("replaystore", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", derandomize=False, database=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "replaystore"))


# Test files that start a Ray runtime in the pytest process (the distributed tests,
# and docs/distributed.md's Ray example run by the docs test). Ray loads its C core and
# threads into the process, and a process forked from it afterwards (a
# multiprocessing Manager or writer, without exec) may crash inside Ray's library:
# seen once under load in CI, a Manager dying mid-test. So these files run last,
# in every worker: pytest-xdist hands out tests in collection order, so a worker
# that has started one of them gets nothing but them afterwards.
_RAY_FILES = ("distributed", "test_docs.py")


def _starts_ray(item: pytest.Item) -> bool:
    parts = item.path.relative_to(item.config.rootpath).parts
    return len(parts) > 1 and parts[0] == "tests" and parts[1] in _RAY_FILES


# The test files that take longest, longest first (CI logs' --durations, 2026-11-28: the
# slow step's and step 1's). They are handed out first, so that no long file starts
# while the other worker is left with nothing to do at the end (the longest-first rule
# for two machines). pytest-xdist hands out work in collection order when it does not
# reorder it (--no-loadscope-reorder in pyproject's addopts; by default it would start
# the files with the most tests first, whatever their length, and the Ray files with
# them). A file missing here keeps its place.
_LONGEST_FIRST = (
    # the slow step's (seconds on 2 loaded cores: 202, 138, 62, 49, 37, 35, 34, 25, 19)
    "demos/test_miniwob_demo.py",
    "loop/test_lora_training.py",
    "demos/test_quick_demo.py",
    "rollouts/test_miniwob_experts.py",
    "loop/test_resume.py",
    "view/test_demo_browser.py",
    "transitions/test_checkpoint.py",
    "transitions/test_demo.py",
    "loop/test_preference_training.py",
    # step 1's (77, 66, 56, 52, 38, 30, 30)
    "loop/test_miniwob_loop.py",
    "rollouts/test_miniwob.py",
    "loop/test_baseline_tasks.py",
    "loop/test_tiny_pretrain.py",
    "rollouts/test_collector_sigint.py",
    "rollouts/test_collector.py",
    "rollouts/test_collector_cli.py",
    # Ray's, which run last anyway: the slow step's (52, 45, 42, 34, 29), then step 1's
    # (61; the docs pages, where the README's and docs/cli.md's run the quick
    # trajectories demo, 33; 27, 20, 16)
    "distributed/test_demo.py",
    "distributed/test_writers.py",
    "distributed/test_ray_rollouts_nodes.py",
    "distributed/test_ray_loop.py",
    "distributed/test_rate_limiter.py",
    "test_docs.py",
    "distributed/test_remote.py",
    "distributed/test_sharded.py",
    "distributed/test_ray_rollouts.py",
)
_RANK = {name: rank for rank, name in enumerate(_LONGEST_FIRST)}


def _order(item: pytest.Item) -> tuple[bool, int]:
    parts = item.path.relative_to(item.config.rootpath).parts
    name = "/".join(parts[1:])
    if name == "test_docs.py" and "[docs/cli.md:" in item.nodeid:
        # docs/cli.md runs README.md's quick demo command again; tests/test_docs.py runs
        # it once per session and copies its outputs. Run last, this page finds the copy
        # ready (the file's other pages run on the same worker, --dist loadfile; the
        # lock in tests/test_docs.py covers a run with other options).
        return True, len(_RANK) + 1
    return _starts_ray(item), _RANK.get(name, len(_RANK))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=_order)  # stable: the order within each file is kept


class _RunningTests:
    """Keeps a JSON file of the tests running now and when each started (``.ci/run``).

    Enabled by ``REPLAYSTORE_RUNNING_TESTS=FILE``, in the process that reports
    (pytest-xdist's controller, which hears every worker's start and finish, or plain
    pytest). When the slow step's bound stops pytest, ``.ci/running-report`` reads the
    file and names each test that was still running, its phase and how long it had run.
    The file is rewritten atomically at each start, phase and finish.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.started = time.time()
        self.total: int | None = None
        self.finished = 0
        self.running: dict[str, dict[str, object]] = {}
        self._write()

    def _write(self) -> None:
        state = {
            "started": self.started,
            "total": self.total,
            "finished": self.finished,
            "running": self.running,
        }
        temporary = f"{self.path}.tmp"
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump(state, handle)
        os.replace(temporary, self.path)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if session.items:  # plain pytest (xdist's controller collects nothing)
            self.total = len(session.items)
            self._write()

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: object, ids: list[str]) -> None:
        self.total = len(ids)
        self._write()

    def pytest_runtest_logstart(self, nodeid: str, location: object) -> None:
        self.running[nodeid] = {"started": time.time(), "phase": "setup"}
        self._write()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        entry = self.running.get(report.nodeid)
        if entry is not None and report.when in ("setup", "call"):
            entry["phase"] = "call" if report.when == "setup" else "teardown"
            entry[f"{report.when}_s"] = round(report.duration, 1)
            self._write()

    def pytest_runtest_logfinish(self, nodeid: str, location: object) -> None:
        if self.running.pop(nodeid, None) is not None:
            self.finished += 1
            self._write()


def _compile_the_package() -> None:
    """Write the library's bytecode once, before any worker or child process imports it.

    With ``PYTHONDONTWRITEBYTECODE=1`` in the environment (as on CI's machines), an
    editable install never gets ``__pycache__``: every process the tests start (CLI runs,
    the loop with its stand-in tools, Ray actors, spawned writers: several hundred) then
    compiles each module it imports from source, about 0.3 s of CPU per process that
    imports the loop or the rollouts. Python still reads bytecode that exists, so one
    ``compileall`` here (a few seconds, checked by modification time) spares all of them.
    A read-only or site-packages install is left as it is.
    """
    import compileall
    import importlib.util

    spec = importlib.util.find_spec("replaystore")
    for location in (spec.submodule_search_locations or []) if spec else []:
        if os.access(location, os.W_OK):
            compileall.compile_dir(location, quiet=2)


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: the controller did the rest
        return
    _compile_the_package()
    path = os.environ.get("REPLAYSTORE_RUNNING_TESTS")
    if path:
        config.pluginmanager.register(_RunningTests(path), "replaystore-running-tests")


def _no_browser(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true and {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def chromium() -> str | None:
    """Path of the Chromium that browser tests launch (None: Playwright's own browser).

    Without a browser (Debian: ``apt-get install chromium``, or
    ``REPLAYSTORE_CHROMIUM=/path``) the tests that use it skip with one line saying so,
    except under ``CI=true``, where a missing browser fails them.
    """
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        _no_browser("Playwright is not installed: pip install 'replaystore[rollouts]'")
    from replaystore.rollouts.browser import INSTALL_HINT, BrowserUnavailableError, find_chromium

    try:
        path = find_chromium()
    except BrowserUnavailableError as exc:
        _no_browser(str(exc))
        return None
    if path is None:
        from playwright.sync_api import sync_playwright

        with sync_playwright() as p:
            managed = Path(p.chromium.executable_path)
        if not managed.exists():
            _no_browser(INSTALL_HINT)
    return path


@pytest.fixture(scope="session")
def real_tools() -> object:
    """The real LLaMA-Factory and vLLM environments (``bash .ci/install-loop-tools``).

    Skips with the set-up command when they are missing, except under ``CI=true``
    (where ``.ci/run`` makes them), where it fails.
    """
    from replaystore.loop import ToolsMissingError, default_tools_dir, find_tools

    try:
        return find_tools(default_tools_dir())
    except ToolsMissingError as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true and {exc}", pytrace=False)
        pytest.skip(str(exc))
