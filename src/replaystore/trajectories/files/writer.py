"""Writing iteration files: a trajectory's steps prepared and encoded in the chosen
format (step lines, or a frame and, for format 4, the file's table of texts), the
frames compressed, and the file written atomically with its header."""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from replaystore.atomic import atomic_open
from replaystore.errors import SchemaError, TrajectoryError
from replaystore.formats.trajectory_header import FORMAT, encode_array
from replaystore.trajectories.components import step_to_dict
from replaystore.trajectories.files.frames import CODEC_RAW, CODEC_ZSTD, compress_each
from replaystore.trajectories.files.lines import step_lines
from replaystore.trajectories.files.naming import relative_image
from replaystore.trajectories.files.v3 import frame_of
from replaystore.trajectories.files.v4 import PROMPT_ARRAYS, TextTable, prompt_index_crc
from replaystore.trajectories.index import (
    SAME_KEY,
    final_reward_value,
    is_dummy_trajectory,
    is_record_step,
    keypoint_steps,
)
from replaystore.trajectories.prompt_urls import relative_prompt
from replaystore.trajectories.screenshots import (
    ScreenshotFingerprinter,
    default_fingerprinter,
    same_as_next_flags,
)


@dataclass(slots=True)
class EncodedTrajectory:
    """One trajectory ready to write: its step lines (version 1-2) or frame (version 3)."""

    lines: list[bytes]
    final_reward: Any
    dummy: bool
    same: NDArray[np.bool_]
    has_prompt: NDArray[np.bool_] | None = None
    record: bool = False
    frame: bytes | None = None
    codec: int = CODEC_RAW
    step_crcs: NDArray[np.uint32] | None = None
    messages: int = 0
    #: ``frame`` is raw and still to be compressed (:meth:`TrajectoryStorage._write`).
    compress: bool = False
    #: Version 4: the file's texts and step references (shared by its trajectories).
    table: TextTable | None = None

    @property
    def num_steps(self) -> int:
        return int(self.same.size)


def encode_trajectory(
    t: int,
    trajectory: Sequence[Any],
    keep_page_metadata: bool,
    known: dict[str, list[str]],
    table: TextTable | None,
    *,
    format_version: int,
    fingerprinter: ScreenshotFingerprinter | None,
    roots: tuple[str, str, str],
) -> EncodedTrajectory:
    """Trajectory ``t`` ready to write in ``format_version`` (see
    :meth:`TrajectoryStorage.save_iteration`); ``roots``: the storage's root URL,
    absolute root and absolute root ending with the path separator.

    Raises:
        TrajectoryError: a step is malformed or not JSON, or the final reward breaks
            the final-reward rule.
    """
    if isinstance(trajectory, (str, bytes, Mapping)) or not isinstance(trajectory, Sequence):
        raise TrajectoryError(
            f"trajectory {t} must be a list of steps, got {type(trajectory).__name__}"
        )
    if len(trajectory) == 0:
        raise TrajectoryError(f"trajectory {t} has no steps")
    dummy = is_dummy_trajectory(trajectory)
    steps = []
    tasks: dict[int, Any] = {}  # the trajectory's Task dict, made once
    for s, step in enumerate(trajectory):
        try:
            steps.append(step_to_dict(step, tasks=tasks))
        except SchemaError as exc:
            raise TrajectoryError(f"trajectory {t} step {s} is malformed: {exc}") from None
    n = len(steps)
    reward = steps[-1]["reward"].get("reward")
    if not dummy:  # the final-reward rule (index.py), enforced before anything is written
        number = final_reward_value(reward, f"trajectory {t}", n - 1)
        if type(reward) not in (int, float, bool):
            reward = number  # NumPy scalars and other reals go in the index as floats
    _fill_same_flags(steps, fingerprinter)
    same, has_prompt, relative_urls = _prepare_steps(t, steps, keep_page_metadata, roots)
    first_meta = dict(steps[0].get("trajectory_metadata") or {})
    first_meta["keypoint_step_ids"] = keypoint_steps(steps)
    steps[0]["trajectory_metadata"] = first_meta
    record = not dummy and is_record_step(steps[-1])
    encoded = EncodedTrajectory([], reward, dummy, same, has_prompt, record)
    if format_version >= 3:
        fill_frame(encoded, t, steps, relative_urls, known, table)
    else:
        encoded.lines = step_lines(t, steps, relative_urls)
    return encoded


def _fill_same_flags(
    steps: list[dict[str, Any]], fingerprinter: ScreenshotFingerprinter | None
) -> None:
    """Fill in missing same-as-next flags from the pixels (never for the last step)."""
    n = len(steps)
    todo = [s for s in range(n - 1) if steps[s].get(SAME_KEY) is None]
    if todo:
        fp = fingerprinter if fingerprinter is not None else default_fingerprinter()
        flags = same_as_next_flags(
            [steps[s]["observation"]["image_path"] for s in todo],
            [steps[s + 1]["observation"]["image_path"] for s in todo],
            fp,
        )
        for s, flag in zip(todo, flags.tolist(), strict=True):
            steps[s][SAME_KEY] = flag


def _prepare_steps(
    t: int, steps: list[dict[str, Any]], keep_page_metadata: bool, roots: tuple[str, str, str]
) -> tuple[NDArray[np.bool_], NDArray[np.bool_], list[bool]]:
    """The step dicts made ready to store, in place (same-as-next flags as bools,
    screenshot paths and prompt URLs relative to the root, page metadata stripped);
    returns their same-as-next and has-prompt flags and which prompts' URLs are relative.

    Raises:
        TrajectoryError: a same-as-next flag is not a bool.
    """
    n = len(steps)
    same = np.zeros(n, dtype=bool)
    has_prompt = np.zeros(n, dtype=bool)
    prompts_root, root, inside = roots
    url_prefix = prompts_root + "/"
    relative_urls = [False] * n
    for s, d in enumerate(steps):
        value = d.get(SAME_KEY)
        if type(value) is bool:
            same[s] = value and s < n - 1
        elif value is not None:  # only the last step can still lack it
            if not isinstance(value, (bool, np.bool_, int)) or value not in (0, 1):
                raise TrajectoryError(
                    f"trajectory {t} step {s}: {SAME_KEY} must be a bool, got {value!r}"
                )
            d[SAME_KEY] = flag = bool(value)  # NumPy bools are not JSON
            same[s] = flag and s < n - 1
        obs = d["observation"]
        obs["image_path"] = relative_image(obs["image_path"], root, inside)
        response = d.get("response")
        prompt = (
            response.get("raw_prompt")
            if type(response) is dict or isinstance(response, Mapping)
            else None
        )
        if isinstance(prompt, str) and prompt:
            has_prompt[s] = True
            if url_prefix in prompt:
                relative = relative_prompt(prompt, prompts_root)
                if relative is not None:
                    response["raw_prompt"] = relative  # type: ignore[index]
                    relative_urls[s] = True
        pm = obs.get("page_metadata")
        if not keep_page_metadata and (type(pm) is dict or isinstance(pm, Mapping)):
            obs["page_metadata"] = {k: pm[k] for k in ("title", "url") if k in pm}
    return same, has_prompt, relative_urls


def fill_frame(
    encoded: EncodedTrajectory,
    t: int,
    steps: Sequence[dict[str, Any]],
    relative_urls: Sequence[bool],
    known: dict[str, list[str]],
    table: TextTable | None = None,
) -> None:
    """Version 3-4: the trajectory's frame (compressed by :func:`write_file`), its step
    checksums and message count; version 4 (``table`` given): its texts go to
    the file's ``table`` instead of its frame."""
    frame, crcs, messages = frame_of(t, steps, relative_urls, known, table)
    encoded.table = table
    encoded.frame = frame
    encoded.codec = CODEC_RAW
    encoded.compress = bool(frame)
    encoded.step_crcs = crcs
    encoded.messages = messages


def compress_frames(trajectories: Sequence[EncodedTrajectory], level: int) -> None:
    """Compress the frames made by :func:`fill_frame`, each kept compressed where
    that is smaller. Many frames are compressed together by zstandard's own threads
    (the same bytes as one at a time: each frame is one independent zstandard frame)."""
    todo = [e for e in trajectories if e.compress]
    if not todo:
        return
    raw = [e.frame or b"" for e in todo]
    packed = compress_each(raw, level)
    for e, frame, small in zip(todo, raw, packed, strict=True):
        if len(small) < len(frame):
            e.frame, e.codec = small, CODEC_ZSTD
        e.compress = False


def write_file(
    target: Path,
    iteration: int,
    rank: int | None,
    metadata: Mapping[str, Any],
    trajectories: Sequence[EncodedTrajectory],
    *,
    format_version: int,
    compression_level: int,
) -> None:
    """Write ``trajectories`` (encoded in one format) to ``target`` atomically, with
    their header; ``format_version``: the version of a file without trajectories.

    Raises:
        TrajectoryError: the metadata or a final reward is not JSON.
    """
    version = 2
    if trajectories and trajectories[0].frame is not None:
        version = 3 if trajectories[0].table is None else 4
    compress_frames(trajectories, compression_level)
    if not trajectories:
        version = format_version
    lengths = np.array([e.num_steps for e in trajectories], dtype=np.int64)
    same = np.concatenate([e.same for e in trajectories]) if trajectories else np.zeros(0, bool)
    index: dict[str, Any] = {
        "lengths": encode_array(lengths, "<i4"),
        "final_rewards": [e.final_reward for e in trajectories],
        "dummy": encode_array(np.array([e.dummy for e in trajectories], bool), "u1"),
        "same": encode_array(same, "u1"),
    }
    if version >= 3:
        body = _frame_index(index, trajectories, version, compression_level)
    else:
        body = _line_index(index, trajectories, int(lengths.sum()))
    if any(e.record for e in trajectories):
        index["record"] = encode_array(np.array([e.record for e in trajectories], bool), "u1")
    prompt_flags = [e.has_prompt for e in trajectories]
    if all(flags is not None for flags in prompt_flags):
        index["has_prompt"] = encode_array(
            np.concatenate(prompt_flags) if prompt_flags else np.zeros(0, bool),  # type: ignore[arg-type]
            "u1",
        )
    header = {
        "format": FORMAT,
        "version": version,
        "iteration": iteration,
        "rank": rank,
        "num_trajectories": len(trajectories),
        "num_steps": int(same.size),
        "metadata": metadata,
        "index": index,
    }
    try:
        header_line = json.dumps(header, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TrajectoryError(
            f"iteration {iteration} cannot be stored: metadata or a final reward is not "
            f"JSON ({exc})"
        ) from None
    with atomic_open(target, "wb") as handle:
        handle.write(header_line.encode("utf-8") + b"\n")
        handle.writelines(body)


def _frame_index(
    index: dict[str, Any],
    trajectories: Sequence[EncodedTrajectory],
    version: int,
    compression_level: int,
) -> list[bytes]:
    """Version 3-4: the frames' (and texts') entries added to ``index``; returns the body."""
    frames = [e.frame or b"" for e in trajectories]
    index["frame_lengths"] = encode_array(np.array([len(f) for f in frames], np.int64), "<i8")
    index["frame_crc32"] = encode_array(np.array([zlib.crc32(f) for f in frames], np.uint32), "<u4")
    index["frame_codec"] = encode_array(np.array([e.codec for e in trajectories], np.uint8), "u1")
    index["message_counts"] = encode_array(
        np.array([e.messages for e in trajectories], np.int64), "<i4"
    )
    index["line_crc32"] = encode_array(
        np.concatenate([e.step_crcs for e in trajectories if e.step_crcs is not None])
        if trajectories
        else np.zeros(0, np.uint32),
        "<u4",
    )
    body: list[bytes] = frames
    table = trajectories[0].table if trajectories else None
    if version >= 4:
        table = table if table is not None else TextTable()
        table.compress(compression_level)
        arrays = table.index()
        for name, dtype in PROMPT_ARRAYS:
            index[name] = encode_array(arrays[name], dtype)
        index["prompt_index_crc32"] = prompt_index_crc(arrays)
        body = [*frames, b"".join(table.texts)]  # one write for the texts
    return body


def _line_index(
    index: dict[str, Any], trajectories: Sequence[EncodedTrajectory], n_steps: int
) -> list[bytes]:
    """Version 2: the step lines' entries added to ``index``; returns the body."""
    line_lengths = np.fromiter(
        (len(line) for e in trajectories for line in e.lines),
        dtype=np.int64,
        count=n_steps,
    )
    crcs = np.fromiter(
        (zlib.crc32(line) for e in trajectories for line in e.lines),
        dtype=np.uint32,
        count=int(line_lengths.size),
    )
    index["line_lengths"] = encode_array(line_lengths, "<i8")
    index["line_crc32"] = encode_array(crcs, "<u4")
    body = [line for e in trajectories for line in e.lines]
    return body
