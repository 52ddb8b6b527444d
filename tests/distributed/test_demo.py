"""The opt-in demo part ``distributed`` (quick mode) runs end to end."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.slow]


def test_quick_distributed_demo_prints_throughput_and_fill(tmp_path: Path) -> None:
    pytest.importorskip("gymnasium", reason="the demo extra brings gymnasium")
    from replaystore.demos import OPT_IN_PARTS, PARTS
    from replaystore.demos.distributed import run

    assert "distributed" in OPT_IN_PARTS and "distributed" not in PARTS
    lines = run(tmp_path / "distributed", quick=True)
    text = "\n".join(lines)
    assert "transitions in:" in text and "samples out" in text
    # The rate limiter kept one update of 64 per new transition after learning_starts.
    limiter = next(line for line in lines if line.startswith("rate limiter:"))
    assert "samples per insert after the first 400 (target 64" in limiter
    achieved = float(limiter.split(" samples: ")[1].split()[0])
    assert 32 <= achieved <= 96
    fill = next(line for line in lines if line.startswith("per-shard fill"))
    assert "shard 0" in fill and "shard 1" in fill
    assert (tmp_path / "distributed" / "learning_curve.png").stat().st_size > 0
