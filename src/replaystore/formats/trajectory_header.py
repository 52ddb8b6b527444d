"""The header of a trajectory iteration file: the format constants, the base64 index
arrays, the parsed first line (:class:`Header`) and :func:`read_header`, which checks
the header's index and the file's size and last frame, line and text against it.

:class:`~replaystore.trajectories.storage.TrajectoryStorage` writes iteration files
(:mod:`replaystore.trajectories.files.writer`, which takes :data:`FORMAT` and
:func:`encode_array` from here); every reader (the storage, ``replaystore stats``, the
viewer) parses their headers with :func:`read_header`. :func:`read_summary` is what
``replaystore stats`` prints of a storage (``TrajectoryStorage.stats``: headers only).
Steps are decoded through :mod:`replaystore.trajectories.files` (lines, frames, format
4's texts), never through the storage; nothing here imports torch or writes.
"""

from __future__ import annotations

import base64
import binascii
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from replaystore.errors import StorageError
from replaystore.trajectories.files.frames import CODEC_ZSTD, NO_CRC
from replaystore.trajectories.files.jsonfast import crc32c, loads_text
from replaystore.trajectories.files.lines import check_body, first_line
from replaystore.trajectories.files.naming import (
    IterationFile,
    list_files,
    readable_files,
    with_listing,
)
from replaystore.trajectories.files.v4 import PROMPT_ARRAYS, TextIndex, check_prompt_index
from replaystore.trajectories.index import count_successes, final_reward_values

__all__ = [
    "FORMAT",
    "READABLE_VERSIONS",
    "VERSION",
    "WRITABLE_VERSIONS",
    "Header",
    "check_frames",
    "decode_array",
    "encode_array",
    "read_header",
    "read_summary",
    "stats_of",
]

FORMAT = "replaystore.trajectories"
#: Written format version: 2 added ``index.line_crc32`` (CRC32 of each step line); 3
#: stores each trajectory as one (zstandard-compressed) frame whose prompts share
#: their messages; 4 keeps the prompts' messages and responses once per file,
#: uncompressed, indexed per step in the header (see the module doc).
VERSION = 4
#: Versions read: 1 (no checksums), 2, 3 and 4.
READABLE_VERSIONS = (1, 2, 3, 4)
#: Versions :class:`TrajectoryStorage` can write (``format_version=``).
WRITABLE_VERSIONS = (2, 3, 4)


def encode_array(array: NDArray[Any], dtype: str) -> str:
    return base64.b64encode(np.ascontiguousarray(array, dtype=dtype).tobytes()).decode("ascii")


def decode_array(text: str, dtype: str, count: int | None, where: str) -> NDArray[Any]:
    """A base64 index array; ``count``: the number of entries it must have (None: any)."""
    try:
        # what base64.b64decode(validate=True) does, without its two copies of the text
        raw = binascii.a2b_base64(text, strict_mode=True)
        array = np.frombuffer(raw, dtype=dtype)
    except (ValueError, TypeError) as exc:
        raise StorageError(f"{where}: corrupt index array ({exc})") from None
    if count is not None and array.size != count:
        raise StorageError(f"{where}: index array has {array.size} entries, expected {count}")
    return array


@dataclass(slots=True)
class Header:
    """The parsed first line of an iteration file."""

    file: IterationFile
    body_start: int
    metadata: dict[str, Any]
    lengths: NDArray[np.int32]
    final_rewards: list[Any]
    dummy: NDArray[np.bool_]
    same: NDArray[np.bool_]
    line_lengths: NDArray[np.int64]
    #: CRC32 of each step line (int64), or ``NO_CRC`` for a version 1 file.
    line_crc: NDArray[np.int64]
    #: Whether each step stores a non-empty raw_prompt; None for files written before
    #: the header kept it (the "has_prompt" index entry is optional).
    has_prompt: NDArray[np.bool_] | None = None
    #: Whether each trajectory's last step is a record step (not a training sample,
    #: :func:`~replaystore.trajectories.index.is_record_step`); None for older files.
    record: NDArray[np.bool_] | None = None
    version: int = 2
    #: Version 3, per trajectory: byte length, CRC32 and codec of its frame, and how
    #: many shared prompt messages the frame holds before its steps. None before.
    frame_lengths: NDArray[np.int64] | None = None
    frame_crc: NDArray[np.int64] | None = None
    frame_codec: NDArray[np.uint8] | None = None
    message_counts: NDArray[np.int32] | None = None
    #: Version 4: the file's texts (:class:`TextIndex`), None before.
    texts: TextIndex | None = None
    #: Version 4, per step: how many texts its prompt joins (0: not split), where they
    #: start in ``prompt_refs``, its separator, its response's text (-1: none), and
    #: whether its prompt's image URLs are relative to the storage root.
    prompt_counts: NDArray[np.int32] | None = None
    prompt_starts: NDArray[np.int64] | None = None
    prompt_refs: NDArray[np.int32] | None = None
    prompt_separators: NDArray[np.uint8] | None = None
    prompt_responses: NDArray[np.int32] | None = None
    prompt_relative: NDArray[np.bool_] | None = None

    @property
    def num_steps(self) -> int:
        return int(self.same.size)

    def frame_offsets(self) -> NDArray[np.int64]:
        """Version 3: the byte offset of each trajectory's frame in the file."""
        assert self.frame_lengths is not None
        return self.body_start + np.cumsum(self.frame_lengths) - self.frame_lengths


def read_header(file: IterationFile) -> Header:
    """The parsed header of ``file``, checked against itself and the file (size, last
    frame or line, and last text: one ``stat`` and a read or two, no hash of the data).

    Raises:
        FileNotFoundError: the file is gone.
        StorageError: not an iteration file of ours (or of a version not read), or its
            header or body is inconsistent or damaged.
        TrajectoryError: a non-dummy trajectory's final reward breaks the final-reward
            rule (:func:`~replaystore.trajectories.index.final_reward_value`).
    """
    first = first_line(file.path)
    where = str(file.path)
    header = _header_object(first, where)
    version = header["version"]
    try:
        parsed, prompts, prompt_crc = _parse_index(file, len(first), header, version, where)
    except (KeyError, TypeError, ValueError) as exc:
        raise StorageError(f"{where}: malformed header ({exc!r})") from None
    _check_counts(parsed, where)
    # The final-reward rule (index.py) for files written before save_iteration
    # enforced it: every reader (stats, load_all, from_storage, export) refuses alike.
    lengths, rewards = parsed.lengths, parsed.final_rewards
    kept = np.flatnonzero(~parsed.dummy)
    final_reward_values(
        [rewards[t] for t in kept.tolist()],
        lengths[kept] - 1,
        lambda k: f"trajectory {kept[k]} of {where}",
    )
    frame_lengths = parsed.frame_lengths
    if prompts is not None:
        assert frame_lengths is not None
        texts_start = len(first) + int(frame_lengths.sum())
        parsed.texts = check_prompt_index(
            prompts, prompt_crc, parsed.num_steps, file.path, texts_start
        )
    if frame_lengths is not None:
        check_frames(file, len(first), frame_lengths, parsed.frame_crc, parsed.texts)  # type: ignore[arg-type]
    else:
        check_body(file, len(first), lengths, parsed.line_lengths, parsed.line_crc)
    if prompts is not None:
        _set_prompts(parsed, prompts)
    parsed.metadata = dict(header.get("metadata") or {})
    return parsed


def _header_object(first: bytes, where: str) -> dict[str, Any]:
    """The first line as a JSON object of our format, of a version read.

    Raises:
        StorageError: it is not.
    """
    try:
        header = loads_text(first)
    except ValueError:
        raise StorageError(f"{where} is not a replaystore iteration file") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise StorageError(f"{where} is not a replaystore iteration file")
    version = header.get("version")
    if version not in READABLE_VERSIONS:
        raise StorageError(
            f"{where} has format version {version!r}; this replaystore "
            f"reads versions {', '.join(map(str, READABLE_VERSIONS))}"
        )
    return header


def _parse_index(
    file: IterationFile, body_start: int, header: dict[str, Any], version: int, where: str
) -> tuple[Header, dict[str, NDArray[Any]] | None, int | None]:
    """The header's index decoded (not checked against each other yet; metadata and
    version 4 texts not set), with the version 4 prompt arrays and their CRC32.

    Raises:
        StorageError: an array has the wrong size or is not base64.
        KeyError, TypeError, ValueError: an entry is missing or of the wrong type.
    """
    index = header["index"]
    n_traj = int(header["num_trajectories"])
    n_steps = int(header["num_steps"])
    lengths = decode_array(index["lengths"], "<i4", n_traj, where)
    rewards = list(index["final_rewards"])
    dummy = decode_array(index["dummy"], "u1", n_traj, where).astype(bool)
    same = decode_array(index["same"], "u1", n_steps, where).astype(bool)
    frame_lengths = frame_crc = frame_codec = message_counts = None
    if version >= 3:
        line_lengths = np.zeros(0, dtype=np.int64)
        frame_lengths = decode_array(index["frame_lengths"], "<i8", n_traj, where)
        frame_crc = decode_array(index["frame_crc32"], "<u4", n_traj, where).astype(np.int64)
        frame_codec = decode_array(index["frame_codec"], "u1", n_traj, where)
        message_counts = decode_array(index["message_counts"], "<i4", n_traj, where)
    else:
        line_lengths = decode_array(index["line_lengths"], "<i8", n_steps, where)
    has_prompt = (
        decode_array(index["has_prompt"], "u1", n_steps, where).astype(bool)
        if "has_prompt" in index
        else None
    )
    record = (
        decode_array(index["record"], "u1", n_traj, where).astype(bool)
        if "record" in index
        else None
    )
    if version >= 2:
        line_crc = decode_array(index["line_crc32"], "<u4", n_steps, where).astype(np.int64)
    else:
        line_crc = np.full(n_steps, NO_CRC, dtype=np.int64)
    prompts = (
        {name: decode_array(index[name], dtype, None, where) for name, dtype in PROMPT_ARRAYS}
        if version >= 4
        else None
    )
    prompt_crc = int(index["prompt_index_crc32"]) if version >= 4 else None
    parsed = Header(
        file=file,
        body_start=body_start,
        metadata={},
        lengths=lengths,
        final_rewards=rewards,
        dummy=dummy,
        same=same,
        line_lengths=line_lengths,
        line_crc=line_crc,
        has_prompt=has_prompt,
        record=record,
        version=int(version),
        frame_lengths=frame_lengths,
        frame_crc=frame_crc,
        frame_codec=frame_codec,
        message_counts=message_counts,
    )
    return parsed, prompts, prompt_crc


def _check_counts(h: Header, where: str) -> None:
    """The header's counts against its index.

    Raises:
        StorageError: they do not match.
    """
    n_traj, n_steps = int(h.lengths.size), h.num_steps
    lengths, line_lengths = h.lengths, h.line_lengths
    frame_lengths, message_counts, frame_codec = h.frame_lengths, h.message_counts, h.frame_codec
    version = h.version
    if (
        len(h.final_rewards) != n_traj
        or int(lengths.sum()) != n_steps
        or (n_traj and int(lengths.min()) < 1)
        or (version < 3 and n_steps and int(line_lengths.min()) < 1)
        or (
            frame_lengths is not None
            and n_traj
            and (
                int(frame_lengths.min()) < 1
                or int(message_counts.min()) < 0  # type: ignore[union-attr]
                or int(frame_codec.max()) > CODEC_ZSTD  # type: ignore[union-attr]
            )
        )
    ):
        raise StorageError(f"{where}: header counts do not match its index")


def _set_prompts(h: Header, prompts: dict[str, NDArray[Any]]) -> None:
    """A version 4 header's per-step prompt arrays, in the types readers use."""
    counts = prompts["prompt_counts"].astype(np.int32)
    h.prompt_counts = counts
    h.prompt_starts = np.cumsum(counts, dtype=np.int64) - counts
    h.prompt_refs = prompts["prompt_refs"].astype(np.int32)
    h.prompt_separators = prompts["prompt_separators"].astype(np.uint8)
    h.prompt_responses = prompts["prompt_responses"].astype(np.int32)
    h.prompt_relative = prompts["prompt_relative"].astype(bool)


def check_frames(
    file: IterationFile,
    body_start: int,
    frame_lengths: NDArray[np.int64],
    frame_crc: NDArray[np.int64],
    texts: TextIndex | None = None,
) -> None:
    """Version 3-4 at open: the file's size, its last frame's CRC32 and (version 4) its
    last text's against its header."""
    where = str(file.path)
    frames_end = body_start + int(frame_lengths.sum())
    expected = frames_end if texts is None else texts.end
    with open(file.path, "rb") as handle:
        actual = os.fstat(handle.fileno()).st_size
        if actual != expected:
            state = "truncated" if actual < expected else "longer than its header says"
            texts_said = "" if texts is None else f" and {texts.lengths.size} texts"
            raise StorageError(
                f"{where} is {state}: its header announces {frame_lengths.size} trajectory "
                f"frames{texts_said} in {expected} bytes, the file has {actual} bytes "
                "(damaged or cut short; restore it from a copy or remove it)"
            )
        if texts is not None and texts.lengths.size:
            handle.seek(int(texts.offsets[-1]))
            if crc32c(handle.read(int(texts.lengths[-1]))) != int(texts.crc[-1]):
                raise StorageError(
                    f"{where}: its last text ({texts.lengths.size - 1}) fails its CRC-32C check"
                )
        if frame_lengths.size == 0:
            return
        handle.seek(frames_end - int(frame_lengths[-1]))
        last = handle.read(int(frame_lengths[-1]))
    if zlib.crc32(last) != int(frame_crc[-1]):
        raise StorageError(
            f"{where}: the frame of its last trajectory ({frame_lengths.size - 1}) fails its "
            "CRC32 check"
        )


def read_summary(root: Path, success_threshold: float = 1.0) -> dict[str, Any]:
    """:func:`stats_of` the files a storage's reads read under ``root`` (per iteration its
    merged file, else its rank files), listed again when one vanished meanwhile (a merge
    or a cleanup). Reads only: unlike opening a ``TrajectoryStorage``, it never removes
    a writer's temporary files.

    Raises:
        StorageError, TrajectoryError: as :func:`stats_of`.
    """
    return with_listing(
        lambda: readable_files(list_files(root), None),
        lambda files: stats_of(files, root, success_threshold),
    )


def stats_of(files: list[IterationFile], root: Path, success_threshold: float) -> dict[str, Any]:
    """:meth:`~replaystore.trajectories.storage.TrajectoryStorage.stats` of ``files``
    (the readable files under ``root``), from their headers alone (no step is parsed).

    Raises:
        FileNotFoundError: a file vanished (the caller lists again).
        StorageError, TrajectoryError: see :meth:`TrajectoryStorage.stats`.
    """
    per: dict[int, dict[str, Any]] = {}
    for f in files:
        header = read_header(f)
        size = f.path.stat().st_size
        successful, _ = count_successes(header.final_rewards, header.dummy, success_threshold)
        entry = per.setdefault(
            f.iteration,
            {
                "iteration": f.iteration,
                "files": 0,
                "trajectories": 0,
                "steps": 0,
                "successful_trajectories": 0,
                "dummy_trajectories": 0,
                "size_bytes": 0,
            },
        )
        entry["files"] += 1
        entry["trajectories"] += int(header.lengths.size)
        entry["steps"] += header.num_steps
        entry["successful_trajectories"] += successful
        entry["dummy_trajectories"] += int(header.dummy.sum())
        entry["size_bytes"] += size
    rows = [per[it] for it in sorted(per)]
    total_size = sum(r["size_bytes"] for r in rows)
    return {
        "root": str(root),
        "total_iterations": len(rows),
        "total_files": sum(r["files"] for r in rows),
        "total_trajectories": sum(r["trajectories"] for r in rows),
        "total_steps": sum(r["steps"] for r in rows),
        "successful_trajectories": sum(r["successful_trajectories"] for r in rows),
        "dummy_trajectories": sum(r["dummy_trajectories"] for r in rows),
        "total_size_bytes": total_size,
        "total_size_mb": total_size / 2**20,
        "iterations": rows,
    }
