"""Merging and upgrading iteration files: a file's trajectories, every checksum
verified, re-encoded in the format being written (version 3 frames into version 3,
and same-version lines, are copied as they are)."""

from __future__ import annotations

import json
import zlib

import numpy as np

from replaystore.errors import StorageError
from replaystore.trajectories.files.frames import NO_CRC
from replaystore.trajectories.files.header import Header
from replaystore.trajectories.files.lines import RELATIVE_URLS, renumber, step_lines
from replaystore.trajectories.files.load import frames_of
from replaystore.trajectories.files.v3 import checked_head, frame_step_dict
from replaystore.trajectories.files.v4 import TextTable
from replaystore.trajectories.files.writer import EncodedTrajectory, fill_frame


def reencode(
    header: Header, first_t: int, format_version: int, table: TextTable | None = None
) -> list[EncodedTrajectory]:
    """The trajectories of a file, verified, as ``format_version`` trajectories
    numbered from ``first_t`` (version 3 frames into version 3, and same-version
    lines, are copied). Version 4: their texts go to ``table``, the table of the
    file being written (one is made when None: a file of its own)."""
    known: dict[str, list[str]] = {}
    if format_version >= 4 and table is None:
        table = TextTable()
    if header.version >= 3:
        return _reencode_frames(header, first_t, format_version, known, table)
    return _reencode_lines(header, first_t, format_version, known, table)


def _reencode_frames(
    header: Header,
    first_t: int,
    format_version: int,
    known: dict[str, list[str]],
    table: TextTable | None,
) -> list[EncodedTrajectory]:
    """:func:`reencode` of a version 3-4 file."""
    path = header.file.path
    out: list[EncodedTrajectory] = []
    starts = np.cumsum(header.lengths) - header.lengths
    for t, frame in frames_of(header):
        start = int(starts[t])
        n = int(header.lengths[t])
        encoded = index_part(header, t, start, n)
        if format_version == 3 and header.version == 3:
            assert header.frame_lengths is not None and header.frame_codec is not None
            offset = int(header.frame_offsets()[t])
            with open(path, "rb") as handle:
                handle.seek(offset)
                encoded.frame = handle.read(int(header.frame_lengths[t]))
            if zlib.crc32(encoded.frame) != int(header.frame_crc[t]):  # type: ignore[index]
                raise StorageError(f"{path} trajectory {t}: frame changed while read")
            encoded.codec = int(header.frame_codec[t])
            encoded.messages = int(header.message_counts[t])  # type: ignore[index]
            encoded.step_crcs = header.line_crc[start : start + n].astype(np.uint32)
            for s in range(n):  # verified before anything is written
                checked_head(
                    frame,
                    s,
                    int(header.line_crc[start + s]),
                    f"{path} trajectory {t} step {s}",
                )
        else:
            dicts, relative = [], []
            for s in range(n):
                where = f"{path} trajectory {t} step {s}"
                head, step_raw = checked_head(frame, s, int(header.line_crc[start + s]), where)
                dicts.append(frame_step_dict(frame, head, step_raw, where))
                relative.append(bool(head.get("u")))
            if format_version >= 3:
                fill_frame(encoded, first_t + t, dicts, relative, known, table)
            else:
                encoded.lines = step_lines(first_t + t, dicts, relative)
        out.append(encoded)
    return out


def _reencode_lines(
    header: Header,
    first_t: int,
    format_version: int,
    known: dict[str, list[str]],
    table: TextTable | None,
) -> list[EncodedTrajectory]:
    """:func:`reencode` of a version 1-2 file."""
    path = header.file.path
    out: list[EncodedTrajectory] = []
    starts = np.cumsum(header.lengths) - header.lengths
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
    for t, length in enumerate(header.lengths.tolist()):
        start = int(starts[t])
        encoded = index_part(header, t, start, length)
        lines = raw_lines[start : start + length]
        if format_version >= 3:
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
            fill_frame(encoded, first_t + t, dicts, relative, known, table)
        else:
            encoded.lines = [
                renumber(raw, first_t + t, f"{path} line {start + i + 2}")
                for i, raw in enumerate(lines)
            ]
        out.append(encoded)
    return out


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
