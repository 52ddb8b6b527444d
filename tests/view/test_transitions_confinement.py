"""A transitions checkpoint or memmap buffer names its data files in JSON; the viewer
and ``replaystore stats`` open only plain names inside the buffer's own directory
(issue 24): a crafted file naming ``../secret`` or an absolute path is refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cli_runner import run_cli
from replaystore.errors import CheckpointError, ReplayStoreError
from replaystore.formats.transitions_checkpoint import read_checkpoint_meta

from .stores import make_transitions

pytest.importorskip("starlette")
from replaystore.view import build_app


def _secret_like_the_reward_column(path: Path, column: Path) -> Path:
    """A file outside the buffer of exactly the reward column's size: the old viewer
    mapped it and charted its values."""
    path.write_bytes(np.full(column.stat().st_size // 4, 7.0, dtype=np.float32).tobytes())
    return path


def _edit(meta_path: Path, change) -> None:
    meta = json.loads(meta_path.read_text())
    change(meta)
    meta_path.write_text(json.dumps(meta))


def _reward(fields: list[dict]) -> dict:
    return next(f for f in fields if f["name"] == "reward")


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    return make_transitions(tmp_path / "run")["checkpoint"]


def _crafted_names(checkpoint: Path, tmp_path: Path) -> list[str]:
    meta = json.loads(checkpoint.read_text())
    data_dir = checkpoint.parent / meta["data_dir"]
    reward_file = data_dir / _reward(meta["fields"])["file"]
    secret = _secret_like_the_reward_column(tmp_path / "secret", reward_file)
    relative = "../" * (len(data_dir.relative_to(tmp_path).parts)) + "secret"
    return [relative, str(secret)]


def test_a_checkpoint_naming_a_file_outside_its_directory_is_refused(
    checkpoint: Path, tmp_path: Path
) -> None:
    original = checkpoint.read_text()
    for name in _crafted_names(checkpoint, tmp_path):
        checkpoint.write_text(original)
        _edit(checkpoint, lambda meta, name=name: _reward(meta["fields"]).update(file=name))
        with pytest.raises(ReplayStoreError, match="only a plain file name"):
            build_app("transitions_checkpoint", checkpoint)
        with pytest.raises(CheckpointError, match=f"column file {name!r}"):
            read_checkpoint_meta(checkpoint)
        result = run_cli("stats", checkpoint)
        assert result.returncode == 2
        assert "only a plain file name" in result.stderr


def test_a_checkpoint_naming_another_data_directory_is_refused(
    checkpoint: Path, tmp_path: Path
) -> None:
    original = checkpoint.read_text()
    for data_dir in ("..", str(tmp_path), "../run", ""):
        checkpoint.write_text(original)
        _edit(checkpoint, lambda meta, d=data_dir: meta.update(data_dir=d))
        with pytest.raises(CheckpointError, match="data directory"):
            read_checkpoint_meta(checkpoint)
        with pytest.raises(ReplayStoreError, match="data directory"):
            build_app("transitions_checkpoint", checkpoint)


def test_a_data_file_symlinked_outside_the_checkpoint_is_refused(
    checkpoint: Path, tmp_path: Path
) -> None:
    meta = json.loads(checkpoint.read_text())
    column = checkpoint.parent / meta["data_dir"] / _reward(meta["fields"])["file"]
    secret = _secret_like_the_reward_column(tmp_path / "secret", column)
    column.unlink()
    column.symlink_to(secret)
    with pytest.raises(ReplayStoreError, match="resolves outside"):
        build_app("transitions_checkpoint", checkpoint)


def test_a_memmap_buffer_naming_a_file_outside_its_directory_is_refused(tmp_path: Path) -> None:
    memmap = make_transitions(tmp_path / "run")["memmap"]
    meta_path = memmap / "buffer.json"
    original = meta_path.read_text()
    reward_file = memmap / _reward(json.loads(original)["fields"])["file"]
    secret = tmp_path / "secret"
    secret.write_bytes(reward_file.read_bytes())
    for name in ("../../secret", str(secret)):
        meta_path.write_text(original)
        _edit(meta_path, lambda meta, name=name: _reward(meta["fields"]).update(file=name))
        with pytest.raises(ReplayStoreError, match="only a plain file name"):
            build_app("transitions_memmap", memmap)
        result = run_cli("stats", memmap)
        assert result.returncode == 2
        assert "only a plain file name" in result.stderr


def test_an_untouched_checkpoint_still_opens(checkpoint: Path) -> None:
    meta = read_checkpoint_meta(checkpoint)
    assert meta.complete()
    assert [c.name for c in meta.columns] == ["obs", "action", "reward", "done"]
    assert meta.priorities is not None
    assert all(f.path.parent == meta.data_dir for f in meta.files())
    build_app("transitions_checkpoint", checkpoint)
