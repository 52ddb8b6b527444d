"""The demo (through the real ``replaystore`` command) and the example script run end to end.

The quick transitions part runs here under umask 077 (its files' modes are checked too).
The full demo, which trains until CartPole is solved (minutes), is
``benchmarks/demo.py``, with its figures in ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from file_modes import assert_files_have_mode
from replaystore.transitions import ReplayBuffer

ROOT = Path(__file__).resolve().parents[2]


def _replaystore_command() -> list[str]:
    script = Path(sys.executable).with_name("replaystore")
    if script.exists():
        return [str(script)]
    found = shutil.which("replaystore")
    return [found] if found else [sys.executable, "-m", "replaystore.cli"]


@pytest.mark.slow
def test_quick_demo_runs_through_the_cli_and_writes_its_outputs(tmp_path: Path) -> None:
    command = [*_replaystore_command(), "demo", "--part", "transitions", "--quick"]
    proc = subprocess.run(
        [*command, "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        umask=0o077,
    )
    assert proc.returncode == 0, proc.stderr
    assert "== transitions ==" in proc.stdout
    assert "reloaded bit-exact, next draws identical" in proc.stdout
    out = tmp_path / "transitions"
    # Under umask 077 every file the part wrote (the plot, the checkpoint, the memory map)
    # is private: nothing is made more open than the umask allows.
    assert_files_have_mode(out, 0o600, at_least=5)
    with Image.open(out / "learning_curve.png") as png:
        png.verify()
    meta = json.loads((out / "checkpoint" / "buffer.metadata").read_text())
    # The checkpoint is the 1-step run's buffer: half of the quick mode's 3,000 steps.
    assert meta["data_size"] == 1500 and meta["sampler"]["kind"] == "prioritized"
    with ReplayBuffer("cpu", "cpu", meta["buffer_size"], sampler="prioritized") as buf:
        buf.load(out / "checkpoint" / "buffer")
        assert len(buf) == 1500
        assert set(buf.sample_batch(8).keys()) >= {"obs", "action", "reward", "next_obs", "done"}
    assert "3-step run (n_step=3): " in proc.stdout
    assert "learning curves (both runs): " in proc.stdout
    # The memory-mapped buffer directory reopens with everything the demo flushed.
    with ReplayBuffer("cpu", "cpu", meta["buffer_size"], path=out / "replay-memmap") as buf:
        assert len(buf) == 1500


@pytest.mark.slow
def test_dqn_example_runs_top_to_bottom(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt" / "buffer"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "transitions_dqn.py"),
            "--total-steps",
            "1500",
            "--checkpoint",
            str(ckpt),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"saved and reloaded 1500 transitions from {ckpt}.metadata" in proc.stdout
    assert ckpt.with_name("buffer.metadata").is_file()
