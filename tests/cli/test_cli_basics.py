"""The command itself: help on every subcommand, version, usage errors as one line with exit 2."""

from __future__ import annotations

import pytest

from replaystore import __version__

from .conftest import assert_one_line_error, run_cli

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
