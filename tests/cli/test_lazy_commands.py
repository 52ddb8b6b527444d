"""The ``replaystore`` entry point loads only the module of the command it runs.

``replaystore --help`` imports no command module; ``replaystore COMMAND --help``
imports that command's module (its options are defined there) and nothing heavy:
no torch, NumPy, viewer app, rollout or loop runner, experience or trajectory
package. Checked in a fresh interpreter, since this test process has them loaded.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

from replaystore.cli import COMMANDS

from .conftest import run_cli

HEAVY = (
    "torch",
    "numpy",
    "tensordict",
    "aiohttp",
    "playwright",
    "starlette",
    "replaystore.experience",
    "replaystore.trajectories",
    "replaystore.transitions",
    "replaystore.rollouts",
    "replaystore.loop",
    "replaystore.loop.runner",
    "replaystore.view",
    "replaystore.view.app",
    "importlib.metadata",
)

# Each call's newly imported modules, in one fresh interpreter.
_PROBE = """
import contextlib, io, json, sys
from replaystore.cli import COMMANDS, main
found = {}
for argv in [["--help"], *([name, "--help"] for name in COMMANDS)]:
    before = set(sys.modules)
    with contextlib.redirect_stdout(io.StringIO()) as out:
        code = main(argv)
    found[" ".join(argv)] = [code, out.getvalue(), sorted(set(sys.modules) - before)]
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def help_runs() -> dict[str, list]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_command_has_its_own_module() -> None:
    assert set(COMMANDS) == {
        "demo",
        "stats",
        "export",
        "copy",
        "import-webgym",
        "rollout",
        "blocklist",
        "loop",
        "view",
        "info",
    }
    for name, (module_name, _) in COMMANDS.items():
        module = importlib.import_module(f"replaystore.cli.{module_name}")
        for attribute in ("DESCRIPTION", "add_arguments", "run"):
            assert hasattr(module, attribute), (name, attribute)


def test_top_level_help_imports_no_command_module(help_runs: dict[str, list]) -> None:
    code, out, loaded = help_runs["--help"]
    assert code == 0
    for name in COMMANDS:
        assert name in out
    assert not [m for m in loaded if m.startswith("replaystore.cli.")], loaded
    assert not [m for m in HEAVY if m in loaded], loaded


@pytest.mark.parametrize("name", list(COMMANDS))
def test_command_help_imports_only_its_module_and_nothing_heavy(
    help_runs: dict[str, list], name: str
) -> None:
    code, out, loaded = help_runs[f"{name} --help"]
    assert code == 0
    assert out.startswith(f"usage: replaystore {name}")
    commands = {m for m in loaded if m.startswith("replaystore.cli.")}
    assert f"replaystore.cli.{COMMANDS[name][0]}" in commands
    # view finds a store's kind with stats' detector; no other command loads another's module
    allowed = {f"replaystore.cli.{COMMANDS[name][0]}", "replaystore.cli.stats"}
    assert commands <= allowed, commands
    heavy = [m for m in HEAVY if m in loaded]
    assert not heavy, f"replaystore {name} --help imports {heavy}"


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("export", ["--out", "--format", "--num-samples", "--image-root", "--on-error"]),
        ("rollout", ["--tasks", "--policy", "--step-timeout", "--request-timeout", "--cdp"]),
        ("loop", ["--config", "--resume", "--make-tiny-model", "--corpus"]),
        ("view", ["--host", "--port", "--image-root", "--allow-host"]),
        ("stats", ["--json", "--success-threshold"]),
        ("copy", ["--append", "--batch-size"]),
        ("blocklist", ["--file", "--all"]),
        ("import-webgym", ["--out", "--keep-page-metadata"]),
        ("demo", ["--out", "--quick", "--part"]),
        ("info", ["--json"]),
    ],
)
def test_command_help_lists_its_options(name: str, options: list[str]) -> None:
    result = run_cli(name, "--help")
    assert result.returncode == 0
    for option in options:
        assert option in result.stdout, (name, option)


def test_an_unknown_option_of_a_command_is_still_reported_against_it() -> None:
    result = run_cli("export", "store", "--out", "x", "--fromat", "openai")
    assert result.returncode == 2
    assert "replaystore export: error: unrecognized option '--fromat'" in result.stderr
    assert "did you mean --format?" in result.stderr
