"""Checkpoints: full, bit-exact, atomic under SIGKILL; memmap directories survive a crash."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from replaystore.errors import CheckpointError
from replaystore.transitions import ReplayBuffer

from .conftest import batch, ids_of, transition


def _assert_same_contents(a: ReplayBuffer, b: ReplayBuffer) -> None:
    assert (len(a), a.pointer, a.buffer_size) == (len(b), b.pointer, b.buffer_size)
    assert a.fields == b.fields
    ta, tb = a.sample_all(), b.sample_all()
    assert set(ta.keys()) == set(tb.keys())
    for key in ta.keys():  # noqa: SIM118 (TensorDict keys)
        assert ta[key].dtype == tb[key].dtype
        assert torch.equal(ta[key], tb[key]), key


def test_save_load_round_trip_after_wrap_around(make_buffer, ckpt: Path) -> None:
    src = make_buffer(7, seed=42)
    src.add_batch(batch(range(5)))
    src.add_batch(batch(range(5, 12)))  # wraps: pointer 5
    src.sample_batch(3)  # advance the RNG
    src.save(ckpt)
    dst = make_buffer(7, seed=999)
    dst.load(ckpt)
    _assert_same_contents(src, dst)
    # The RNG state travelled: the next draws are the ones the original makes.
    for _ in range(3):
        assert ids_of(dst.sample_batch(16)).tolist() == ids_of(src.sample_batch(16)).tolist()
    it_src = src.create_epoch_iterator(3, n_epochs=2)
    it_dst = dst.create_epoch_iterator(3, n_epochs=2)
    assert [ids_of(b).tolist() for b in it_src] == [ids_of(b).tolist() for b in it_dst]


def test_round_trip_is_bit_exact_for_every_dtype(make_buffer, ckpt: Path) -> None:
    src = make_buffer(5)
    rng = np.random.default_rng(0)
    src.add_batch(
        {
            "f64": rng.standard_normal((4, 2)),
            "f16": rng.standard_normal(4).astype(np.float16),
            "bf16": torch.randn(4, 3, dtype=torch.bfloat16),
            "u8": rng.integers(0, 255, (4, 2, 2), dtype=np.uint8),
            "i32": rng.integers(-9, 9, 4, dtype=np.int32),
            "b": rng.random(4) > 0.5,
            "c64": (rng.standard_normal(4) + 1j).astype(np.complex64),
            "nan": np.array([np.nan, np.inf, -0.0, 1.0], np.float32),
        }
    )
    src.save(ckpt)
    dst = make_buffer(5)
    dst.load(ckpt)
    a, b = src.sample_all(), dst.sample_all()
    for key in a.keys():  # noqa: SIM118 (TensorDict keys)
        assert a[key].dtype == b[key].dtype
        assert a[key].view(torch.uint8).tolist() == b[key].view(torch.uint8).tolist(), key


def test_prioritized_round_trip_restores_priorities_and_draws(make_buffer, ckpt: Path) -> None:
    src = make_buffer(10, sampler="prioritized", alpha=0.7, beta=0.5, seed=3)
    src.add_batch(batch(range(13)))
    src.update_priorities(range(10), np.linspace(0.0, 9.0, 10))
    src.beta = 0.8
    src.add(transition(13))  # pending max priority at save time
    src.save(ckpt)
    dst = make_buffer(10, sampler="prioritized", alpha=0.7, beta=0.5, seed=4)
    dst.load(ckpt)
    _assert_same_contents(src, dst)
    np.testing.assert_array_equal(dst.priorities(), src.priorities())
    assert dst.beta == 0.8
    for _ in range(3):
        s, d = src.sample_batch(32), dst.sample_batch(32)
        assert torch.equal(s["index"], d["index"]) and torch.equal(s["weight"], d["weight"])
    src.add(transition(14))
    dst.add(transition(14))  # max priority travelled too
    np.testing.assert_array_equal(dst.priorities(), src.priorities())


def test_metadata_keeps_the_seed_keys_and_is_json(make_buffer, ckpt: Path) -> None:
    buf = make_buffer(8)
    buf.add_batch(batch(range(11)))
    buf.save(ckpt)
    meta = json.loads(ckpt.with_name("buffer.metadata").read_text())
    assert (meta["buffer_size"], meta["data_size"], meta["pointer"]) == (8, 8, 3)
    data_dir = ckpt.parent / meta["data_dir"]
    assert sorted(p.name for p in data_dir.iterdir()) == ["0.bin", "1.bin", "2.bin", "3.bin"]
    for p in data_dir.iterdir():  # raw bytes, no pickle header
        assert not p.read_bytes().startswith(b"\x80")


def test_checkpoints_load_across_storage_kinds(tmp_path: Path, ckpt: Path) -> None:
    with ReplayBuffer("cpu", "cpu", 6, storage="memory", seed=1) as ram:
        ram.add_batch(batch(range(9)))
        ram.save(ckpt)
        with ReplayBuffer("cpu", "cpu", 6, path=tmp_path / "mm", seed=2) as mm:
            mm.load(ckpt)
            _assert_same_contents(ram, mm)


def test_load_replaces_a_different_schema(make_buffer, ckpt: Path) -> None:
    src = make_buffer(4)
    src.add_batch(batch(range(3)))
    src.save(ckpt)
    dst = make_buffer(4)
    dst.add({"other": np.zeros(5)})
    dst.load(ckpt)
    _assert_same_contents(src, dst)


def test_load_into_another_capacity_is_an_error_that_changes_nothing(
    make_buffer, ckpt: Path
) -> None:
    src = make_buffer(8)
    src.add_batch(batch(range(8)))
    src.save(ckpt)
    dst = make_buffer(5)
    dst.add_batch(batch([50, 51]))
    with pytest.raises(CheckpointError, match=r"buffer_size 8.*5.*reset\(buffer_size=8\)"):
        dst.load(ckpt)
    assert ids_of(dst.sample_all()).tolist() == [50, 51]
    dst.reset(buffer_size=8)
    dst.load(ckpt)
    _assert_same_contents(src, dst)


def test_load_rejects_mismatched_alpha(make_buffer, ckpt: Path) -> None:
    src = make_buffer(4, sampler="prioritized", alpha=0.6)
    src.add_batch(batch(range(4)))
    src.save(ckpt)
    with pytest.raises(CheckpointError, match="alpha"):
        make_buffer(4, sampler="prioritized", alpha=0.9).load(ckpt)


def test_load_of_an_objectrl_metadata_file_explains_it_holds_no_data(
    make_buffer, ckpt: Path
) -> None:
    ckpt.parent.mkdir(parents=True)
    ckpt.with_name("buffer.metadata").write_text(
        json.dumps({"buffer_size": 10, "data_size": 4, "pointer": 4})
    )
    with pytest.raises(CheckpointError, match="metadata-only"):
        make_buffer(10).load(ckpt)


def test_load_without_a_checkpoint_names_the_file(make_buffer, ckpt: Path) -> None:
    with pytest.raises(CheckpointError, match=r"buffer\.metadata"):
        make_buffer(10).load(ckpt)


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_damaged_data_is_detected_before_the_buffer_changes(
    make_buffer, ckpt: Path, damage: str
) -> None:
    src = make_buffer(6)
    src.add_batch(batch(range(6)))
    src.save(ckpt)
    meta = json.loads(ckpt.with_name("buffer.metadata").read_text())
    target = ckpt.parent / meta["data_dir"] / "0.bin"
    data = bytearray(target.read_bytes())
    if damage == "flip":
        data[5] ^= 0xFF
        target.write_bytes(bytes(data))
    elif damage == "truncate":
        target.write_bytes(bytes(data[:-4]))
    else:
        target.unlink()
    dst = make_buffer(6)
    dst.add_batch(batch([70, 71, 72]))
    with pytest.raises(CheckpointError, match=r"0\.bin"):
        dst.load(ckpt)
    assert ids_of(dst.sample_all()).tolist() == [70, 71, 72]


def test_a_new_save_replaces_the_old_and_removes_orphans(make_buffer, ckpt: Path) -> None:
    buf = make_buffer(6)
    buf.add_batch(batch(range(3)))
    buf.save(ckpt)
    orphan = ckpt.parent / ("buffer.data-" + "ab" * 16)  # a save killed before its commit
    orphan.mkdir()
    (orphan / "0.bin").write_bytes(b"junk")
    unrelated = ckpt.parent / "buffer.data-notours"
    unrelated.mkdir()
    other = make_buffer(6)
    other.load(ckpt)  # load ignores the orphan
    assert ids_of(other.sample_all()).tolist() == [0, 1, 2]
    buf.add_batch(batch([3]))
    buf.save(ckpt)
    data_dirs = sorted(p.name for p in ckpt.parent.iterdir() if p.name.startswith("buffer.data-"))
    meta = json.loads(ckpt.with_name("buffer.metadata").read_text())
    assert data_dirs == sorted([meta["data_dir"], "buffer.data-notours"])
    other.load(ckpt)
    assert ids_of(other.sample_all()).tolist() == [0, 1, 2, 3]


# --------------------------------------------------------------------- crashes

_ROWS = 2_000
_WIDTH = 64

# Imports replaystore once, then for each line "TAG STOP_AT" on stdin forks a child
# that saves the buffer with os.fsync patched to stop (and say so, with its pid) just
# before its STOP_AT-th call, so the parent can SIGKILL the save at that exact point:
# each fsync is a step after which a crash must leave a loadable checkpoint. The fork
# spares each kill point a fresh interpreter's imports (2-3 s each, ~30 kill points).
_SAVES_STOPPING_AT_FSYNC = textwrap.dedent(
    """
    import os
    import sys
    import time
    import numpy as np
    from replaystore.transitions import ReplayBuffer

    prefix, rows, width = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    print("ready", flush=True)
    for line in sys.stdin:
        tag, stop_at = float(line.split()[0]), int(line.split()[1])
        pid = os.fork()
        if pid:
            os.waitpid(pid, 0)  # killed by the parent
            print("reaped", flush=True)
            continue
        buf = ReplayBuffer("cpu", "cpu", rows, storage="memory", seed=0)
        obs = np.arange(rows * width, dtype=np.float32).reshape(rows, width) + tag
        buf.add_batch({"obs": obs, "tag": np.full(rows, tag)})
        real_fsync = os.fsync
        calls = 0

        def stopping_fsync(fd):
            global calls
            calls += 1
            if calls == stop_at:
                print("stopped", os.getpid(), flush=True)
                time.sleep(3600)  # killed here by the parent
            real_fsync(fd)

        os.fsync = stopping_fsync
        buf.save(prefix)
        print("saved", os.getpid(), flush=True)
        time.sleep(3600)
    """
)


_SIZE = (str(_ROWS), str(_WIDTH))


def _tagged_contents(tag: float) -> np.ndarray:
    return np.arange(_ROWS * _WIDTH, dtype=np.float32).reshape(_ROWS, _WIDTH) + tag


def _start(code: str, *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() in ("ready", "flushed"), f"child said {line!r}"
    return proc


def _kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.stdout is not None
    proc.stdout.close()


@pytest.mark.slow
def test_save_killed_at_any_moment_leaves_a_loadable_checkpoint(tmp_path: Path) -> None:
    """SIGKILL a save just before each of its fsyncs in turn (one forked child per
    fsync, no timing involved): the checkpoint always loads, whole, as the
    previous save or the killed one."""
    prefix = tmp_path / "ckpt" / "buffer"
    with ReplayBuffer("cpu", "cpu", _ROWS, storage="memory", seed=0) as buf:
        buf.add_batch({"obs": _tagged_contents(0.0), "tag": np.zeros(_ROWS)})
        buf.save(prefix)
    committed_tag = 0.0
    killed_mid_save = 0
    saver = subprocess.Popen(
        [sys.executable, "-c", _SAVES_STOPPING_AT_FSYNC, str(prefix), *_SIZE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert saver.stdin is not None and saver.stdout is not None
    try:
        assert saver.stdout.readline().strip() == "ready"
        for stop_at in range(1, 100):
            tag = float(stop_at)
            saver.stdin.write(f"{tag} {stop_at}\n")
            saver.stdin.flush()
            said, pid = saver.stdout.readline().split()
            assert said in ("stopped", "saved"), f"child said {said!r}"
            os.kill(int(pid), signal.SIGKILL)
            assert saver.stdout.readline().strip() == "reaped"
            committed = json.loads(prefix.with_name("buffer.metadata").read_text())["data_dir"]
            data_dirs = {p.name for p in prefix.parent.glob("buffer.data-*")}
            killed_mid_save += bool(data_dirs - {committed})  # a half-written data directory
            with ReplayBuffer("cpu", "cpu", _ROWS, storage="memory") as restored:
                restored.load(prefix)  # never a partial checkpoint
                got = restored.sample_all()
            got_tag = float(got["tag"][0])
            assert torch.all(got["tag"] == got_tag)
            np.testing.assert_array_equal(got["obs"].numpy(), _tagged_contents(got_tag))
            assert got_tag in (committed_tag, tag)  # the previous checkpoint or this one
            committed_tag = got_tag
            if said == "saved":  # stop_at is past the save's last fsync
                assert got_tag == tag
                break
        else:
            raise AssertionError("the save never completed")
    finally:
        saver.kill()
        saver.wait(timeout=30)
    assert stop_at > 3  # the save has several fsyncs, each one was a kill point
    assert killed_mid_save >= 1  # killed before the first fsync: a partial data directory


_FILL_FLUSH_KEEP_ADDING = textwrap.dedent(
    """
    import sys
    import time
    import numpy as np
    from replaystore.transitions import ReplayBuffer

    directory = sys.argv[1]
    buf = ReplayBuffer("cpu", "cpu", 1_000_000, sampler="prioritized", path=directory, seed=0)
    ids = np.arange(1000)
    buf.add_batch({"obs": np.stack([ids, 2 * ids], 1).astype(np.float32), "action": ids})
    buf.update_priorities(range(10), np.arange(10.0))
    buf.flush()
    print("flushed", flush=True)
    for i in range(1000, 11_000):  # added, never flushed; no wrap-around
        buf.add({"obs": np.array([i, 2 * i], np.float32), "action": i})
    print("added", flush=True)
    time.sleep(3600)  # killed here by the parent
    """
)


@pytest.mark.slow
def test_memmap_directory_reopened_after_sigkill_holds_everything_flushed(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "replay"
    proc = _start(_FILL_FLUSH_KEEP_ADDING, str(directory))
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "added"  # 10,000 adds since the flush
    _kill(proc)
    with ReplayBuffer("cpu", "cpu", 1_000_000, sampler="prioritized", path=directory) as buf:
        assert len(buf) == 1000 and buf.pointer == 1000
        out = buf.sample_all()
        ids = np.arange(1000)
        np.testing.assert_array_equal(out["action"].numpy(), ids)
        np.testing.assert_array_equal(out["obs"].numpy(), np.stack([ids, 2 * ids], 1))
        expected = np.ones(1000)
        expected[:10] = (np.arange(10.0) + 1e-6) ** 0.6
        np.testing.assert_allclose(buf.priorities(), expected)
        buf.add({"obs": np.array([7.0, 7.0], np.float32), "action": 7})  # usable again
        assert len(buf) == 1001


def test_memmap_directory_reopens_in_the_same_process(tmp_path: Path) -> None:
    directory = tmp_path / "replay"
    with ReplayBuffer("cpu", "cpu", 8, path=directory) as buf:
        buf.add_batch(batch(range(11)))
    # close() flushed; the files stay.
    with ReplayBuffer("cpu", "cpu", 8, path=directory) as again:
        assert ids_of(again.sample_all(chronological=True)).tolist() == list(range(3, 11))
        assert again.pointer == 3


def test_memmap_directory_without_flush_reopens_at_the_last_flush(tmp_path: Path) -> None:
    directory = tmp_path / "replay"
    buf = ReplayBuffer("cpu", "cpu", 8, path=directory)
    buf.add_batch(batch(range(3)))
    buf.flush()
    buf.add_batch(batch(range(3, 5)))  # not flushed
    with ReplayBuffer("cpu", "cpu", 8, path=directory) as again:
        assert ids_of(again.sample_all()).tolist() == [0, 1, 2]
    buf.close()


def test_memmap_directory_of_another_capacity_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "replay"
    with ReplayBuffer("cpu", "cpu", 8, path=directory) as buf:
        buf.add(transition(0))
    with pytest.raises(CheckpointError, match="capacity 8"):
        ReplayBuffer("cpu", "cpu", 16, path=directory)


def test_reset_removes_the_memmap_files(tmp_path: Path) -> None:
    directory = tmp_path / "replay"
    with ReplayBuffer("cpu", "cpu", 8, path=directory) as buf:
        buf.add_batch(batch(range(4)))
        assert any(p.suffix == ".bin" for p in directory.iterdir())
        buf.reset()
        assert not any(p.suffix == ".bin" for p in directory.iterdir())
    with ReplayBuffer("cpu", "cpu", 8, path=directory) as again:
        assert len(again) == 0


def test_torch_rng_from_another_device_type_is_kept_with_a_warning(
    make_buffer, ckpt: Path, caplog
) -> None:
    src = make_buffer(6, seed=1)
    src.add_batch(batch(range(6)))
    src.save(ckpt)
    meta_path = ckpt.with_name("buffer.metadata")
    meta = json.loads(meta_path.read_text())
    assert meta["rng"]["torch_device"] == "cpu"
    meta["rng"]["torch_device"] = "cuda"  # as a GPU buffer would have written it
    meta_path.write_text(json.dumps(meta))
    dst, twin = make_buffer(6, seed=7), make_buffer(6, seed=7)
    with caplog.at_level("WARNING", logger="replaystore.transitions.buffer"):
        dst.load(ckpt)
    assert "keeps its own" in caplog.text
    _assert_same_contents(src, dst)
    twin.add_batch(batch(range(6)))
    # dst's own torch generator (epoch shuffles; uniform draws on CPU use the NumPy
    # generator, which does transfer) was untouched by load.
    mine = next(dst.create_epoch_iterator(6, 1, shuffle=True))
    fresh = next(twin.create_epoch_iterator(6, 1, shuffle=True))
    assert ids_of(mine).tolist() == ids_of(fresh).tolist()
