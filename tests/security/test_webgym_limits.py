"""Issue 16, items 1-2: what one hostile WebGym ``.pt`` file may make the importer allocate."""

from __future__ import annotations

import pickle
import time
import zipfile
from pathlib import Path

import pytest
import torch

from replaystore.errors import UnsafeFileError
from replaystore.trajectories.storage import TrajectoryStorage
from replaystore.trajectories.webgym_import import (
    ImportLimits,
    import_webgym,
    load_webgym_file_with_metadata,
    load_webgym_payload,
)


def recompress(src: Path, dst: Path) -> Path:
    """The same torch zip with every member deflated (torch itself stores them)."""
    with zipfile.ZipFile(src) as old, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as new:
        for info in old.infolist():
            new.writestr(info.filename, old.read(info), compress_type=zipfile.ZIP_DEFLATED)
    return dst


def torch_zip_with_pickle(path: Path, data_pkl: bytes) -> Path:
    """A torch-style zip archive whose ``data.pkl`` is exactly ``data_pkl``."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", data_pkl)
        archive.writestr("archive/byteorder", "little")
        archive.writestr("archive/version", "3\n")
    return path


class _BigBytearray:
    def __init__(self, n: int) -> None:
        self.n = n

    def __reduce__(self):
        return (bytearray, (self.n,))


def test_stride_0_expanded_tensor_of_1e8_elements_is_refused_quickly(tmp_path):
    # The 1.7 KB file that kept import-webgym busy for minutes (and ~3 GB of lists).
    path = tmp_path / "a.pt.iteration1"
    torch.save({"trajectories": [], "metadata": {"x": torch.zeros(1).expand(10**8)}}, path)
    assert path.stat().st_size < 4096
    started = time.perf_counter()
    with pytest.raises(UnsafeFileError, match=r"a\.pt\.iteration1.*max_elements"):
        load_webgym_payload(path)
    assert time.perf_counter() - started < 2.0
    with pytest.raises(UnsafeFileError, match="max_elements"):
        import_webgym(path, tmp_path / "store")
    assert TrajectoryStorage(tmp_path / "store").files() == []


def test_element_count_is_summed_over_the_file_and_configurable(tmp_path):
    path = tmp_path / "b.pt"
    tensors = [torch.arange(60) for _ in range(3)]  # 180 elements in three views
    torch.save({"trajectories": [], "metadata": {"t": tensors}}, path)
    _, meta = load_webgym_file_with_metadata(path)
    assert meta["t"][2] == list(range(60))
    with pytest.raises(UnsafeFileError, match=r"max_elements=100\b"):
        load_webgym_file_with_metadata(path, limits=ImportLimits(max_elements=100))
    _, meta = load_webgym_file_with_metadata(path, limits=ImportLimits(max_elements=180))
    assert len(meta["t"]) == 3


def test_one_element_view_of_a_huge_compressed_storage_is_refused(tmp_path):
    # A 16 MiB storage deflates to ~16 KB: the importer must not unpack it.
    stored = tmp_path / "stored.pt"
    torch.save({"trajectories": [], "metadata": {"x": torch.zeros(4 << 20)[:1]}}, stored)
    bomb = recompress(stored, tmp_path / "bomb.pt")
    assert bomb.stat().st_size < 200_000
    with pytest.raises(UnsafeFileError, match=r"bomb\.pt.*max_expansion"):
        load_webgym_payload(bomb)
    # The same data stored as torch stores it (uncompressed) is an honest 16 MiB file.
    assert load_webgym_payload(stored)["metadata"]["x"] == [0.0]


def test_storage_bytes_cap_is_configurable_and_checked_before_reading(tmp_path):
    path = tmp_path / "c.pt"
    torch.save({"trajectories": [], "metadata": {"x": torch.zeros(1 << 19)[:2]}}, path)  # 2 MiB
    with pytest.raises(UnsafeFileError, match=r"max_bytes=1,048,576"):
        load_webgym_payload(path, limits=ImportLimits(max_bytes=1 << 20))
    assert load_webgym_payload(path, limits=ImportLimits(max_bytes=4 << 20))["metadata"]["x"] == [
        0.0,
        0.0,
    ]


def test_shared_storage_is_read_and_counted_once(tmp_path):
    path = tmp_path / "d.pt"
    base = torch.zeros(1 << 18)  # 1 MiB, referenced by 50 one-element views
    torch.save({"trajectories": [], "metadata": {"v": [base[i : i + 1] for i in range(50)]}}, path)
    meta = load_webgym_payload(path, limits=ImportLimits(max_bytes=2 << 20))["metadata"]
    assert meta["v"] == [[0.0]] * 50


def test_bytearray_size_is_checked_before_allocating(tmp_path):
    huge = torch_zip_with_pickle(
        tmp_path / "e.pt", pickle.dumps({"trajectories": [], "m": _BigBytearray(10**12)}, 2)
    )
    with pytest.raises(UnsafeFileError, match=r"bytearray\(1,000,000,000,000\).*max_bytes"):
        load_webgym_payload(huge)
    small = torch_zip_with_pickle(
        tmp_path / "f.pt", pickle.dumps({"trajectories": [], "m": _BigBytearray(3 << 20)}, 2)
    )
    with pytest.raises(UnsafeFileError, match="max_bytes=1,048,576"):
        load_webgym_payload(small, limits=ImportLimits(max_bytes=1 << 20))
    assert load_webgym_payload(small)["m"] == bytearray(3 << 20)
    text = torch_zip_with_pickle(
        tmp_path / "g.pt", pickle.dumps({"trajectories": [], "m": bytearray(b"abc")}, 2)
    )
    assert load_webgym_payload(text)["m"] == bytearray(b"abc")


@pytest.mark.parametrize(
    "kwargs",
    [{"max_bytes": 0}, {"max_elements": -1}, {"max_expansion": 0.5}, {"max_bytes": 1.5}],
)
def test_limits_themselves_are_validated(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        ImportLimits(**kwargs)
