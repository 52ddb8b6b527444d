"""One loop per run directory: a second one is refused before it touches anything."""

from __future__ import annotations

import fcntl
from pathlib import Path

import pytest

from replaystore.errors import ConfigError
from replaystore.loop import LoopConfig, run_loop


def test_a_second_loop_on_a_run_directory_in_use_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    with open(run / ".loop.lock", "w") as held:
        held.write("4242")
        held.flush()
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        config = LoopConfig.from_mapping({"out": str(run), "tools_dir": str(tmp_path / "none")})
        with pytest.raises(ConfigError, match=r"in use by another replaystore loop \(pid 4242\)"):
            run_loop(config)
    assert not (run / "journal.json").exists()
