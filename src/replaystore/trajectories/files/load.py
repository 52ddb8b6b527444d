"""Whole-file and per-trajectory reads of iteration files (every checksum verified):
each trajectory's decoded frame, the first and last step records of each trajectory,
a range of one trajectory's steps, and every trajectory of a file, for any format."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from replaystore.errors import StorageError
from replaystore.formats.trajectory_header import Header
from replaystore.trajectories.files.frames import decode_frame, read_frame
from replaystore.trajectories.files.lines import decode_line
from replaystore.trajectories.files.v3 import (
    Frame,
    checked_head,
    decode_frame_step,
    split_frame,
)
from replaystore.trajectories.files.v4 import Texts


def frames_of(header: Header) -> Iterator[tuple[int, Frame]]:
    """``(trajectory, decoded frame)`` of every trajectory of a version 3-4 file."""
    assert header.frame_lengths is not None and header.frame_crc is not None
    assert header.frame_codec is not None and header.message_counts is not None
    path = header.file.path
    texts = None if header.texts is None else Texts.mapped(header.texts)
    with open(path, "rb") as handle:
        handle.seek(header.body_start)
        for t in range(int(header.lengths.size)):
            where = f"{path} trajectory {t}"
            length = int(header.frame_lengths[t])
            data = decode_frame(
                handle.read(length),
                length,
                int(header.frame_crc[t]),
                int(header.frame_codec[t]),
                where,
            )
            n_messages = int(header.message_counts[t])
            yield t, split_frame(data, n_messages, int(header.lengths[t]), where, texts)


def edge_records(header: Header) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """Per trajectory of a file: its first and last step records, ``{"step": the
    step's dict as stored}`` (screenshot paths as stored; version 3: without the
    prompt and response texts), for indexes such as the viewer's. Version 3 frames
    are checked (CRC32); version 1-2 lines are read as they are.

    Raises:
        StorageError: a frame or line is damaged or not JSON.
    """
    path = header.file.path
    if header.version >= 3:
        for t, frame in frames_of(header):
            records = []
            for s in (0, int(header.lengths[t]) - 1):
                try:
                    records.append({"step": json.loads(frame.step_line(s))})
                except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                    raise StorageError(f"{path} trajectory {t} step {s}: {exc}") from None
            yield records[0], records[1]
        return
    offsets = header.body_start + np.cumsum(header.line_lengths) - header.line_lengths
    starts = np.cumsum(header.lengths) - header.lengths
    with open(path, "rb") as handle:
        for t in range(int(header.lengths.size)):
            edges = []
            for i in (int(starts[t]), int(starts[t] + header.lengths[t] - 1)):
                handle.seek(int(offsets[i]))
                raw = handle.read(int(header.line_lengths[i]))
                try:
                    record = json.loads(raw)
                except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                    raise StorageError(
                        f"{path}: malformed step line at byte {int(offsets[i])} ({exc})"
                    ) from None
                if not isinstance(record, dict):
                    raise StorageError(
                        f"{path}: step line at byte {int(offsets[i])} is not an object"
                    )
                edges.append(record)
            yield edges[0], edges[1]


def trajectory_steps(
    header: Header, t: int, first: int, count: int, where: str, root: Path
) -> list[dict[str, Any]]:
    """Steps ``first .. first+count-1`` of trajectory ``t`` of a version 3 file,
    decoded as :meth:`load_all` decodes them (checksums verified);
    ``root``: the storage root.

    Raises:
        FileNotFoundError: the file is gone.
        StorageError: the frame or a step is damaged.
    """
    assert header.frame_lengths is not None and header.frame_crc is not None
    assert header.frame_codec is not None and header.message_counts is not None
    data = read_frame(
        header.file.path,
        int(header.frame_offsets()[t]),
        int(header.frame_lengths[t]),
        int(header.frame_crc[t]),
        int(header.frame_codec[t]),
        f"{where}",
    )
    texts = None if header.texts is None else Texts.mapped(header.texts)
    frame = split_frame(data, int(header.message_counts[t]), int(header.lengths[t]), where, texts)
    start = int((np.cumsum(header.lengths) - header.lengths)[t])
    out = []
    for s in range(first, first + count):
        at = f"{where} step {s}"
        head, step_raw = checked_head(frame, s, int(header.line_crc[start + s]), at)
        out.append(decode_frame_step(frame, head, step_raw, at, root))
    return out


def read_trajectories(header: Header, root: Path) -> list[list[dict[str, Any]]]:
    """Every trajectory of the file ``header`` was read from, decoded as
    :meth:`TrajectoryStorage.load_all` decodes them; ``root``: the storage root.

    Raises:
        FileNotFoundError: the file is gone.
        StorageError: the file is inconsistent or a step is damaged.
    """
    if header.version >= 3:
        return _frame_trajectories(header, root)
    return _line_trajectories(header, root)


def _frame_trajectories(header: Header, root: Path) -> list[list[dict[str, Any]]]:
    """:func:`read_trajectories` of a version 3-4 file."""
    file = header.file
    out: list[list[dict[str, Any]]] = []
    first = 0
    for t, frame in frames_of(header):
        steps = []
        for s in range(int(header.lengths[t])):
            where = f"{file.path} trajectory {t} step {s}"
            head, step_raw = checked_head(frame, s, int(header.line_crc[first + s]), where)
            steps.append(decode_frame_step(frame, head, step_raw, where, root))
        first += len(steps)
        out.append(steps)
    return out


def _line_trajectories(header: Header, root: Path) -> list[list[dict[str, Any]]]:
    """:func:`read_trajectories` of a version 1-2 file."""
    file = header.file
    trajectories: list[list[dict[str, Any]]] = [[] for _ in range(header.lengths.size)]
    count = 0
    with open(file.path, "rb") as handle:
        handle.seek(header.body_start)
        for line in handle:
            if count >= header.num_steps:
                raise StorageError(
                    f"{file.path} holds more steps than its header says ({header.num_steps})"
                )
            t, _, step = decode_line(
                line, f"{file.path} line {count + 2}", int(header.line_crc[count]), root
            )
            if not 0 <= t < len(trajectories):
                raise StorageError(f"{file.path} line {count + 2}: trajectory {t} unknown")
            trajectories[t].append(step)
            count += 1
    if count != header.num_steps:
        raise StorageError(
            f"{file.path} holds {count} steps but its header says {header.num_steps}"
        )
    return trajectories
