"""Screenshot fingerprints: pixel identity, caching by (path, mtime, size), missing files."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from replaystore.trajectories.screenshots import (
    ScreenshotFingerprinter,
    fingerprint_image,
    same_as_next_flags,
)

from .conftest import TrajectoryFactory, screen_pixels


def test_same_pixels_in_different_files_and_compression_match(
    trajectory_factory: TrajectoryFactory,
) -> None:
    a = trajectory_factory.screenshot(3, compress_level=0)
    b = trajectory_factory.screenshot(3, compress_level=9)
    assert a.read_bytes() != b.read_bytes()
    assert fingerprint_image(a) == fingerprint_image(b)


def test_one_changed_pixel_differs(trajectory_factory: TrajectoryFactory) -> None:
    a = trajectory_factory.screenshot(3)
    image = screen_pixels(3)
    image.putpixel((40, 40), (1, 2, 3))
    b = trajectory_factory.root / "changed.png"
    image.save(b)
    assert fingerprint_image(a) != fingerprint_image(b)


def test_mode_and_size_are_part_of_the_fingerprint(tmp_path: Path) -> None:
    Image.new("RGB", (4, 2), (0, 0, 0)).save(tmp_path / "a.png")
    Image.new("RGB", (2, 4), (0, 0, 0)).save(tmp_path / "b.png")  # same bytes, other shape
    Image.new("RGBA", (4, 2), (0, 0, 0, 0)).save(tmp_path / "c.png")
    prints = {fingerprint_image(tmp_path / name) for name in ("a.png", "b.png", "c.png")}
    assert len(prints) == 3


def test_each_file_is_decoded_once_until_it_changes(trajectory_factory: TrajectoryFactory) -> None:
    path = trajectory_factory.screenshot(1)
    fp = ScreenshotFingerprinter()
    first = fp.fingerprint(path)
    assert fp.fingerprints([path, path, str(path)]) == [first] * 3
    assert fp.decoded == 1
    screen_pixels(2).save(path)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10_000_000))
    assert fp.fingerprint(path) not in (None, first)
    assert fp.decoded == 2


def test_missing_and_unreadable_files_are_none_counted_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    junk = tmp_path / "junk.png"
    junk.write_bytes(b"not an image")
    fp = ScreenshotFingerprinter()
    with caplog.at_level(logging.WARNING, logger="replaystore"):
        prints = fp.fingerprints([tmp_path / "gone.png", junk, "", None])
    assert prints == [None, None, None, None]
    assert fp.missing == 2  # empty paths are "no screenshot", not a missing file
    assert len(caplog.records) == 1
    assert "2 screenshot lookup(s)" in caplog.records[0].message


def test_same_as_next_flags_pairs_screenshots(trajectory_factory: TrajectoryFactory) -> None:
    shots = [trajectory_factory.screenshot(i) for i in (1, 1, 2)]
    flags = same_as_next_flags(shots[:2], shots[1:], ScreenshotFingerprinter())
    assert flags.tolist() == [True, False]
    missing = trajectory_factory.root / "none.png"
    assert same_as_next_flags([missing], [missing], ScreenshotFingerprinter()).tolist() == [False]
    with pytest.raises(ValueError, match="2 screenshots but 1 next"):
        same_as_next_flags(shots[:2], shots[:1])


def test_thread_pool_gives_the_same_fingerprints(trajectory_factory: TrajectoryFactory) -> None:
    paths = [trajectory_factory.screenshot(i % 40) for i in range(80)]
    serial = ScreenshotFingerprinter(workers=1).fingerprints(paths)
    parallel = ScreenshotFingerprinter(workers=4).fingerprints(paths)
    assert serial == parallel
    assert len(set(serial)) == 40
    assert np.all([p is not None for p in serial])


def test_cache_bound_is_respected(trajectory_factory: TrajectoryFactory) -> None:
    fp = ScreenshotFingerprinter(max_entries=3)
    paths = [trajectory_factory.screenshot(i) for i in range(5)]
    prints = fp.fingerprints(paths[:2])
    assert len(fp) == 2
    assert fp.fingerprints(paths[2:]) and len(fp) <= 3
    assert fp.fingerprints(paths[:2]) == prints
    with pytest.raises(ValueError, match="max_entries"):
        ScreenshotFingerprinter(max_entries=0)
