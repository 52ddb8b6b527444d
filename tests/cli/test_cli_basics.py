"""The command itself: help on every subcommand, version, usage errors as one line with exit 2."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from replaystore import __version__

from .conftest import assert_one_line_error, run_cli, run_cli_subprocess

SUBCOMMANDS = ("demo", "stats", "export", "import-webgym", "info")


def test_top_level_help_lists_every_subcommand():
    proc = run_cli("--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: replaystore")
    for name in SUBCOMMANDS:
        assert name in proc.stdout


@pytest.mark.parametrize(
    ("command", "options"),
    [
        ("demo", ["--quick", "--out", "--part"]),
        ("stats", ["PATH", "--json", "--success-threshold"]),
        (
            "export",
            [
                "STORE",
                "--format",
                "--num-samples",
                "--recency-bias-power",
                "--val-ratio",
                "--out",
                "--seed",
                "--filter-successful-only",
                "--all",
            ],
        ),
        ("import-webgym", ["FILE", "--out"]),
        ("info", ["--json"]),
    ],
)
def test_each_subcommand_has_help_naming_its_options(command, options):
    proc = run_cli(command, "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: replaystore {command}")
    for option in options:
        assert option in proc.stdout, option


def test_version():
    proc = run_cli("--version")
    assert proc.returncode == 0
    assert proc.stdout.splitlines()[0] == f"replaystore {__version__}"


def test_missing_subcommand_is_a_one_line_usage_error():
    proc = run_cli()
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "replaystore: error: the following arguments are required: COMMAND "
        "(see 'replaystore --help')"
    ]


def test_bad_choice_is_a_one_line_usage_error(tmp_path):
    proc = run_cli("export", tmp_path, "--out", tmp_path / "o", "--format", "xml")
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("replaystore export: error: argument --format: invalid choice: 'xml'")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("option", "value", "needle"),
    [
        ("--val-ratio", "1.5", "must be in [0, 1)"),
        ("--num-samples", "-3", "must be >= 0"),
        ("--recency-bias-power", "nan", "must be finite"),
    ],
)
def test_out_of_range_numbers_are_one_line_usage_errors(tmp_path, option, value, needle):
    proc = run_cli("export", tmp_path, "--out", tmp_path / "o", option, value)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert option in line and needle in line


def test_unknown_demo_part_is_a_one_line_error(tmp_path):
    proc = run_cli("demo", "--quick", "--out", tmp_path, "--part", "nope")
    assert_one_line_error(proc, "demo", "unknown demo part 'nope'", "transitions, trajectories")


# ----------------------------------------------------------------- the real process
# Everything above runs main(argv) in process; these few run the command itself.


def _installed_script() -> str:
    script = Path(sys.executable).with_name("replaystore")
    found = str(script) if script.exists() else shutil.which("replaystore")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("the replaystore console script is not installed next to the interpreter")
        pytest.skip("the replaystore console script is not installed (pip install -e .)")
    return found


def test_installed_console_script_runs_main_with_its_exit_status(tmp_path):
    script = _installed_script()
    ok = subprocess.run([script, "--version"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.splitlines()[0] == f"replaystore {__version__}"
    bad = subprocess.run(
        [script, "stats", str(tmp_path / "nope")], capture_output=True, text=True, timeout=120
    )
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.startswith("replaystore stats: error: ") and "does not exist" in bad.stderr


def test_python_dash_m_entry_point_gives_the_same_result_as_in_process(tmp_path):
    args = ("export", tmp_path, "--out", tmp_path / "o", "--format", "xml")
    assert run_cli_subprocess(*args) == run_cli(*args)
