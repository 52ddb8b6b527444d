"""Usage mistakes, in process: the wrong option or command is named, with the closest real
one and the help of the command it was given to; one line on stderr, exit status 2."""

from __future__ import annotations

from replaystore.cli import main


def usage_error(capsys, *argv: object) -> str:
    """Run ``replaystore ARGV`` expecting a usage error; its one stderr line."""
    assert main([str(a) for a in argv]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    (line,) = err.strip().splitlines()
    return line


def test_misspelt_top_level_option_is_named_with_a_suggestion(capsys):
    line = usage_error(capsys, "--verison")
    assert line == (
        "replaystore: error: unrecognized option '--verison'; did you mean --version? "
        "(see 'replaystore --help')"
    )


def test_misspelt_top_level_option_before_a_command_is_still_the_top_levels(capsys):
    line = usage_error(capsys, "--verbse", "stats", "x")
    assert line.startswith("replaystore: error: unrecognized option '--verbse'")
    assert "did you mean --verbose?" in line


def test_misspelt_command_gets_a_suggestion(capsys):
    line = usage_error(capsys, "exprt", "store")
    assert line.startswith("replaystore: error: argument COMMAND: invalid choice: 'exprt'")
    assert "did you mean export?" in line and line.endswith("(see 'replaystore --help')")


def test_unknown_subcommand_option_points_to_that_subcommands_help(capsys, tmp_path):
    line = usage_error(capsys, "export", tmp_path, "--out", tmp_path / "o", "--bogus")
    assert line.startswith("replaystore export: error: unrecognized option '--bogus'")
    assert line.endswith("(see 'replaystore export --help')")
    assert not (tmp_path / "o").exists()


def test_misspelt_subcommand_option_is_reported_before_the_option_it_meant(capsys, tmp_path):
    # argparse alone would say "--out is required": the typo is the real mistake.
    line = usage_error(capsys, "export", tmp_path, "--ot", tmp_path / "o")
    assert "unrecognized option '--ot'; did you mean --out?" in line
    assert line.startswith("replaystore export: error: ")


def test_option_with_inline_value_is_named_without_its_value(capsys, tmp_path):
    line = usage_error(capsys, "export", tmp_path, "--out", tmp_path, "--fromat=openai")
    assert "unrecognized option '--fromat'; did you mean --format?" in line
    # A unique prefix with an inline value is argparse's to accept and check.
    line = usage_error(capsys, "export", tmp_path, "--out", tmp_path, "--num-sample=3x")
    assert "argument --num-samples: expected an integer, got '3x'" in line


def test_misspelt_choice_gets_a_suggestion(capsys, tmp_path):
    line = usage_error(capsys, "export", tmp_path, "--out", tmp_path / "o", "--format", "shargpt")
    assert "invalid choice: 'shargpt'" in line and "did you mean sharegpt?" in line


def test_stray_argument_points_to_the_subcommands_help(capsys):
    line = usage_error(capsys, "stats", "a", "b")
    assert line == (
        "replaystore stats: error: unrecognized arguments: b (see 'replaystore stats --help')"
    )


def test_negative_numbers_are_values_not_options(capsys, tmp_path):
    line = usage_error(capsys, "export", tmp_path, "--out", tmp_path, "--num-samples", "-3")
    assert "argument --num-samples: must be >= 0, got -3" in line


def test_unique_option_prefixes_still_work(capsys, sqlite_store):
    assert main(["stats", str(sqlite_store), "--js"]) == 0
    assert '"kind": "sqlite_experience_store"' in capsys.readouterr().out


def test_missing_command_is_still_reported(capsys):
    line = usage_error(capsys)
    assert line == (
        "replaystore: error: the following arguments are required: COMMAND "
        "(see 'replaystore --help')"
    )


def test_demo_out_naming_an_existing_file_is_a_clear_error(capsys, tmp_path):
    existing = tmp_path / "results.txt"
    existing.write_text("keep me")
    assert main(["demo", "--quick", "--part", "experience", "--out", str(existing)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.strip().splitlines() == [
        f"replaystore demo: error: --out {existing} exists and is not a directory; "
        "give a new or an existing directory"
    ]
    assert existing.read_text() == "keep me"


def test_demo_out_below_a_file_is_a_clear_error(capsys, tmp_path):
    existing = tmp_path / "results.txt"
    existing.write_text("")
    assert main(["demo", "--part", "experience", "--out", str(existing / "run")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        f"replaystore demo: error: cannot create the --out directory {existing / 'run'}: "
        "Not a directory"
    )


def test_misspelt_demo_part_gets_a_suggestion(capsys, tmp_path):
    assert main(["demo", "--part", "transitons", "--out", str(tmp_path)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "unknown demo part 'transitons'; did you mean transitions?" in line


def test_os_errors_name_the_path_without_errno_noise(capsys, tmp_path, trajectory_store):
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    # export creates its --out directory: below a regular file it cannot.
    assert main(["export", str(trajectory_store), "--out", str(blocker / "dataset")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("replaystore export: error: ")
    assert "[Errno" not in line and str(blocker) in line
