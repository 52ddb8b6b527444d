"""Merging and upgrading iteration files: a file's trajectories, every checksum
verified, re-encoded in the format being written (version 3 frames into version 3,
and same-version lines, are copied as they are)."""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from replaystore.errors import StorageError
from replaystore.formats.trajectory_header import Header
from replaystore.trajectories.files.frames import NO_CRC
from replaystore.trajectories.files.lines import RELATIVE_URLS, renumber, step_lines
from replaystore.trajectories.files.load import frames_of
from replaystore.trajectories.files.v3 import checked_head, frame_step_dict
from replaystore.trajectories.files.v4 import TextTable
from replaystore.trajectories.files.writer import EncodedTrajectory, fill_frame


@dataclass(slots=True)
class _Target:
    """The file being written: trajectories are numbered from ``first_t``, encoded as
    ``format_version``; ``known`` and ``table`` are its shared messages and texts."""

    first_t: int
    format_version: int
    known: dict[str, list[str]]
    table: TextTable | None

    def fill(
        self, encoded: EncodedTrajectory, t: int, dicts: list[Any], relative: list[bool]
    ) -> None:
        """Trajectory ``t`` of the file read (its steps as ``dicts``) encoded into ``encoded``."""
        if self.format_version >= 3:
            fill_frame(encoded, self.first_t + t, dicts, relative, self.known, self.table)
        else:
            encoded.lines = step_lines(self.first_t + t, dicts, relative)


def reencode(
    header: Header, first_t: int, format_version: int, table: TextTable | None = None
) -> list[EncodedTrajectory]:
    """The trajectories of a file, verified, as ``format_version`` trajectories
    numbered from ``first_t`` (version 3 frames into version 3, and same-version
    lines, are copied). Version 4: their texts go to ``table``, the table of the
    file being written (one is made when None: a file of its own)."""
    if format_version >= 4 and table is None:
        table = TextTable()
    target = _Target(first_t, format_version, {}, table)
    starts = (np.cumsum(header.lengths) - header.lengths).tolist()
    if header.version >= 3:
        return [
            _reencode_frame(header, t, frame, int(starts[t]), target)
            for t, frame in frames_of(header)
        ]
    raw_lines = _checked_lines(header)
    return [
        _reencode_lines(header, t, raw_lines, int(starts[t]), target)
        for t in range(int(header.lengths.size))
    ]


def _reencode_frame(
    header: Header, t: int, frame: Any, start: int, target: _Target
) -> EncodedTrajectory:
    """Trajectory ``t`` (its first step: ``start``) of a version 3-4 file, from its
    decoded ``frame``."""
    path = header.file.path
    n = int(header.lengths[t])
    encoded = index_part(header, t, start, n)
    if target.format_version == 3 and header.version == 3:
        _copy_frame(header, t, frame, start, encoded)
        return encoded
    dicts, relative = [], []
    for s in range(n):
        where = f"{path} trajectory {t} step {s}"
        head, step_raw = checked_head(frame, s, int(header.line_crc[start + s]), where)
        dicts.append(frame_step_dict(frame, head, step_raw, where))
        relative.append(bool(head.get("u")))
    target.fill(encoded, t, dicts, relative)
    return encoded


def _copy_frame(header: Header, t: int, frame: Any, start: int, encoded: EncodedTrajectory) -> None:
    """Version 3 into version 3: trajectory ``t``'s frame bytes, as stored, into
    ``encoded``, every step's checksum verified before anything is written."""
    assert header.frame_lengths is not None and header.frame_codec is not None
    path = header.file.path
    n = int(header.lengths[t])
    with open(path, "rb") as handle:
        handle.seek(int(header.frame_offsets()[t]))
        encoded.frame = handle.read(int(header.frame_lengths[t]))
    if zlib.crc32(encoded.frame) != int(header.frame_crc[t]):  # type: ignore[index]
        raise StorageError(f"{path} trajectory {t}: frame changed while read")
    encoded.codec = int(header.frame_codec[t])
    encoded.messages = int(header.message_counts[t])  # type: ignore[index]
    encoded.step_crcs = header.line_crc[start : start + n].astype(np.uint32)
    for s in range(n):
        checked_head(frame, s, int(header.line_crc[start + s]), f"{path} trajectory {t} step {s}")


def _checked_lines(header: Header) -> list[bytes]:
    """The step lines of a version 1-2 file, each checked against its CRC32."""
    path = header.file.path
    with open(path, "rb") as handle:
        handle.seek(header.body_start)
        raw_lines = handle.read().split(b"\n")
    if raw_lines and raw_lines[-1] == b"":
        raw_lines.pop()
    if len(raw_lines) != header.num_steps:
        raise StorageError(
            f"{path} holds {len(raw_lines)} steps but its header says {header.num_steps}"
        )
    for i, raw in enumerate(raw_lines):
        crc = int(header.line_crc[i])
        if crc != NO_CRC and zlib.crc32(raw + b"\n") != crc:
            raise StorageError(
                f"{path} line {i + 2}: step line fails its CRC32 check (damaged "
                "after it was written); nothing was merged"
            )
    return raw_lines


def _reencode_lines(
    header: Header, t: int, raw_lines: list[bytes], start: int, target: _Target
) -> EncodedTrajectory:
    """Trajectory ``t`` (its first step: ``start``) of a version 1-2 file, from the
    file's checked ``raw_lines``."""
    path = header.file.path
    length = int(header.lengths[t])
    encoded = index_part(header, t, start, length)
    lines = raw_lines[start : start + length]
    if target.format_version < 3:
        encoded.lines = [
            renumber(raw, target.first_t + t, f"{path} line {start + i + 2}")
            for i, raw in enumerate(lines)
        ]
        return encoded
    dicts, relative = [], []
    for i, raw in enumerate(lines):
        try:
            record = json.loads(raw)
            dicts.append(record["step"])
            relative.append(bool(record.get(RELATIVE_URLS)))
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as exc:
            raise StorageError(
                f"{path} line {start + i + 2}: malformed step line ({exc})"
            ) from None
    target.fill(encoded, t, dicts, relative)
    return encoded


def index_part(header: Header, t: int, start: int, n: int) -> EncodedTrajectory:
    """Trajectory ``t``'s index entries (steps ``start .. start + n - 1``), no data yet."""
    return EncodedTrajectory(
        [],
        header.final_rewards[t],
        bool(header.dummy[t]),
        header.same[start : start + n],
        None if header.has_prompt is None else header.has_prompt[start : start + n],
        header.record is not None and bool(header.record[t]),
    )
