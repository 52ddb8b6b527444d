"""Formats 1 and 2: one JSON line per step, ``{"t", "s", "step"[,
"relative_image_urls"]}`` (format 2: each line's CRC32 in the header). Encoding,
decoding, renumbering for a merge, and the open-time check of a file's size and
last line."""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from replaystore.errors import StorageError, TrajectoryError
from replaystore.trajectories.components import step_from_dict
from replaystore.trajectories.files.frames import NO_CRC
from replaystore.trajectories.files.naming import IterationFile, resolve_image
from replaystore.trajectories.prompt_urls import resolve_prompt, root_url

# Step-line key: the step's prompt holds image URLs relative to the storage root.
RELATIVE_URLS = "relative_image_urls"


def first_line(path: str | os.PathLike[str]) -> bytes:
    """The first line of ``path``, newline included (the whole file when it has none):
    what ``readline()`` gives, read in growing unbuffered chunks (a header line of
    several hundred kB costs a few reads and one join, a fifth of ``readline``'s time).

    Raises:
        OSError: as :func:`open` (FileNotFoundError: the file is gone).
    """
    chunks: list[bytes] = []
    size = 1 << 16
    with open(path, "rb", buffering=0) as handle:
        while True:
            chunk = handle.read(size)
            end = chunk.find(b"\n")
            if end >= 0:
                chunks.append(chunk[: end + 1])
                break
            if not chunk:
                break
            chunks.append(chunk)
            size = min(2 * size, 1 << 24)
    return b"".join(chunks)


def _dumps(value: Any, t: int, s: int) -> bytes:
    """One step's JSON line text as UTF-8 (no newline).

    Raises:
        TrajectoryError: not JSON-serialisable, or a string holds a lone surrogate
            (no UTF-8 for it); names the trajectory and step.
    """
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        return text.encode("utf-8")
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError: a lone surrogate
        raise TrajectoryError(f"trajectory {t} step {s} cannot be stored as JSON: {exc}") from None


def step_lines(
    t: int, steps: Sequence[dict[str, Any]], relative_urls: Sequence[bool]
) -> list[bytes]:
    """Version 2 step lines: ``{"t", "s", "step"[, "relative_image_urls"]}``."""
    lines = []
    for s, d in enumerate(steps):
        line: dict[str, Any] = {"t": t, "s": s, "step": d}
        if relative_urls[s]:
            line[RELATIVE_URLS] = True
        lines.append(_dumps(line, t, s) + b"\n")
    return lines


def renumber(raw: bytes, t: int, where: str) -> bytes:
    try:
        record = json.loads(raw)
        record["t"] = t
    except (json.JSONDecodeError, UnicodeDecodeError, TypeError) as exc:
        raise StorageError(f"{where}: malformed step line ({exc})") from None
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"


def decode_line(line: bytes, where: str, crc: int, root: Path) -> tuple[int, int, dict[str, Any]]:
    """A version 1-2 step line as ``(trajectory, step, step mapping)``, checked against
    ``crc`` (``NO_CRC``: not checked); ``root``: the storage root (relative screenshot
    paths and prompt URLs are resolved against it).

    Raises:
        StorageError: the line fails its CRC32 check or is malformed.
    """
    if crc != NO_CRC and zlib.crc32(line) != crc:
        raise StorageError(
            f"{where}: step line fails its CRC32 check (the file was changed or damaged "
            "after it was written)"
        )
    try:
        record = json.loads(line)
        t, s, data = int(record["t"]), int(record["s"]), record["step"]
        if record.get(RELATIVE_URLS):
            data["response"]["raw_prompt"] = resolve_prompt(
                data["response"]["raw_prompt"], root_url(root)
            )
        step = step_from_dict(data)
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError) as exc:
        raise StorageError(f"{where}: malformed step line ({exc})") from None
    observation = step["observation"]
    observation.image_path = resolve_image(root, observation.image_path)
    return t, s, step


def check_body(
    file: IterationFile,
    body_start: int,
    lengths: NDArray[np.int32],
    line_lengths: NDArray[np.int64],
    line_crc: NDArray[np.int64],
) -> None:
    """Size and last line of the file against its header (one stat, one line read)."""
    where = str(file.path)
    expected = body_start + int(line_lengths.sum())
    with open(file.path, "rb") as handle:
        actual = os.fstat(handle.fileno()).st_size
        if actual != expected:
            state = "truncated" if actual < expected else "longer than its header says"
            raise StorageError(
                f"{where} is {state}: its header announces {line_lengths.size} steps in "
                f"{expected} bytes, the file has {actual} bytes (damaged or cut short; "
                "restore it from a copy or remove it)"
            )
        if line_lengths.size == 0:
            return
        handle.seek(expected - int(line_lengths[-1]))
        last = handle.read(int(line_lengths[-1]))
    n = int(line_lengths.size)
    if line_crc[-1] != NO_CRC and zlib.crc32(last) != int(line_crc[-1]):
        raise StorageError(f"{where}: last step line (line {n + 1}) fails its CRC32 check")
    try:
        record = json.loads(last)
        t, s = int(record["t"]), int(record["s"])
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError):
        raise StorageError(
            f"{where}: last step line (line {n + 1}) is not a complete step"
        ) from None
    if not last.endswith(b"\n") or (t, s) != (int(lengths.size) - 1, int(lengths[-1]) - 1):
        raise StorageError(
            f"{where}: last step line (line {n + 1}) is trajectory {t} step {s}, but the "
            f"header ends with trajectory {int(lengths.size) - 1} step {int(lengths[-1]) - 1}"
        )
