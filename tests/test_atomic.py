"""Atomic writes: the target is either the old file or the complete new one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replaystore.atomic import atomic_open, atomic_write_json


def test_atomic_write_json_round_trips(tmp_path: Path) -> None:
    target = tmp_path / "meta.json"
    atomic_write_json(target, {"a": 1, "b": [1, 2]})
    assert json.loads(target.read_text()) == {"a": 1, "b": [1, 2]}


def test_failed_write_leaves_previous_file_and_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "data.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_open(target, "wb") as handle:
        handle.write(b"new but incomplete")
        raise RuntimeError("killed half-way")
    assert target.read_bytes() == b"old"
    assert list(tmp_path.iterdir()) == [target]


def test_nan_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    target = tmp_path / "x.json"
    with pytest.raises(ValueError):
        atomic_write_json(target, {"x": float("nan")})
    assert not target.exists()
