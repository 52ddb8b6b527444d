"""Every script in examples/ runs top to bottom, as a user would start it (short settings).

A new example needs an entry in RUNS: the test over the directory fails until it has one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from replaystore.trajectories.export import validate_record

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

# script -> (arguments, with {tmp} for the test's directory; a line its output must contain)
RUNS: dict[str, tuple[list[str], str]] = {
    "experience_multiprocess.py": (["{tmp}/exp.sqlite"], "stored 1000 rows"),
    "trajectories_export.py": (["--out", "{tmp}/webrl"], "LLaMA-Factory config:"),
    "transitions_dqn.py": (
        ["--total-steps", "300", "--checkpoint", "{tmp}/ckpt/buffer"],
        "saved and reloaded 300 transitions",
    ),
}
SLOW = {"transitions_dqn.py"}  # torch + gymnasium start-up and a training loop


def run_example(name: str, tmp_path: Path) -> str:
    args, _ = RUNS[name]
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *(a.format(tmp=tmp_path) for a in args)],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,  # anything written to a default relative path stays in the test's dir
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_every_example_has_a_run():
    scripts = sorted(p.name for p in EXAMPLES.glob("*.py"))
    assert scripts, EXAMPLES
    assert sorted(RUNS) == scripts, "add the new example to RUNS in this file"


def check_trajectories_export(tmp_path: Path, stdout: str) -> None:
    dataset = tmp_path / "webrl" / "llamafactory"
    info = json.loads((dataset / "dataset_info.json").read_text())
    assert set(info) == {"webagent", "webagent_val"}
    records = []
    for entry in info.values():
        records += json.loads((dataset / entry["file_name"]).read_text())
    assert len(records) == 20  # --train-samples
    for record in records:
        assert validate_record(record, "sharegpt", dataset) == []
        assert record["conversations"][-1]["value"].startswith("<think>")
    assert f"dataset_dir: {dataset}" in stdout


# Deeper checks of what a script wrote, where its output line is not enough.
CHECKS = {"trajectories_export.py": check_trajectories_export}


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in sorted(RUNS)],
)
def test_example_runs_top_to_bottom(name, tmp_path):
    stdout = run_example(name, tmp_path)
    assert RUNS[name][1] in stdout, stdout
    if name in CHECKS:
        CHECKS[name](tmp_path, stdout)
