"""Incremental trajectory storage: one immutable file per rollout iteration and rank.

WebGym pickles each iteration with ``torch.save`` (loading runs arbitrary code,
and a reader racing the writer hit ``EOFError``). Here every iteration file is a
JSON header line followed by JSON data, written atomically (temporary file,
fsync, rename), so a reader sees either no file or the complete file, and loading
never executes anything. Screenshots stay image files; their paths, and the
``file://`` URLs of the prompts (``response.raw_prompt``), are stored relative to
the storage root when they lie under it and resolved when read (move the whole
directory freely; :mod:`~replaystore.trajectories.prompt_urls`).

Layout of ``root``::

    iteration_000001.rank000.jsonl   # written by rank 0 during iteration 1
    iteration_000001.rank001.jsonl   # rank 1
    iteration_000002.jsonl           # iteration 2 after merge_ranks(2)

File format (docs/file-formats.md has every field): the first line is a header
(JSON object) with the iteration, rank, user metadata and an index: trajectory
lengths, final rewards, dummy flags, same-as-next-screenshot flags and per-step
CRC32s (fixed-width little-endian integers, base64). The index lets
:meth:`ReplayBuffer.from_storage` open a million steps by reading headers only.

* Version 4 (written by default): version 3's frames, without the texts a sample
  needs. Each distinct prompt message and each split prompt's ``raw_response``
  (its JSON text) is stored once per *file*, after the frames: as it is, as one
  zstandard frame where that halves it, or as a prefix link to a text of the
  previous step that it extends (``text_codec``). These are the file's texts
  (``index.text_lengths``, ``text_crc32c``: CRC-32C, which the compiled
  ``replaystore._texts`` computes with the CPU's crc32 instruction, or the
  ``google-crc32c`` package, several times faster than zlib's CRC32, so a cold
  read's checks cost little). The header lists, per
  step, the texts of its prompt (``prompt_counts``, ``prompt_refs``,
  ``prompt_separators``, ``prompt_responses``, ``prompt_relative``; their CRC32
  in ``prompt_index_crc32``), so a buffer reads a sample's messages and action
  from the texts alone (one slice of a memory map per text, its CRC-32C checked on
  first read), without decompressing a frame. The step's head line keeps the same
  references (``"m"``, and ``"x"`` for the response) for whole-step reads. Compared
  with version 3 the file is larger (most texts are stored as they are) and a cold
  random read of samples is several times faster (``benchmarks/RESULTS.md``).
* Version 3: one frame per trajectory (``index.frame_lengths``,
  ``frame_crc32``, ``frame_codec``: stored as it is, or one zstandard frame where
  that is smaller). A frame decodes to UTF-8 lines: the trajectory's distinct prompt
  messages, each the exact JSON text it had in its prompt (a conversation is stored
  once, not again at every step), then per step a head line (step number, the
  message numbers of its prompt and their layout, ``raw_response``) and the
  step's dict. Reading joins the messages back: the same prompt text, character for
  character (:func:`_split_prompt`; compact lists, and WebGym's ``json.dumps(messages,
  indent=2, ensure_ascii=False)``). A file-backed buffer keeps decoded frames (up
  to 64 MiB) and parses each distinct message once (:meth:`_FileSource.sample_parts`).
* Versions 1 and 2: one JSON line per step, ``{"t": trajectory number in the file,
  "s": step number, "step": step_to_dict(step)}``, plus ``"relative_image_urls":
  true`` when the step's prompt names its screenshots relative to the storage root;
  ``index.line_lengths`` gives each line's byte length, so a step is one seek away.
  ``TrajectoryStorage(root, format_version=2)`` still writes it;
  :meth:`TrajectoryStorage.upgrade` rewrites older files as the storage's version.

Integrity: every read is checked (version 3: the frame's CRC32, then the step's;
version 2: the step line's CRC32), so a changed byte raises :class:`StorageError`
naming the file, trajectory and, where it can tell, the step instead of loading
altered data. At open (every header read, so :meth:`ReplayBuffer.from_storage`
too) each file's size must equal its header's byte count and its last frame (or
line) must match its checksum (version 1: be the last step the header announces):
a truncated or extended file is refused at open, for the cost of one ``stat`` and
one read per file, not a hash of the data. Version 1 files (no checksums) still
load, their lines are not checksummed.

Leftovers: a writer killed between creating its temporary file and renaming it
leaves ``.iteration_<N>[.rank<R>].jsonl.<random>.tmp``. Opening a storage
removes such files of ours (only that exact pattern) once they are older than
``stale_temp_age_s`` (default one hour): a live writer keeps its temporary file
fresh while it writes and renames it within moments of finishing, so an old one
belongs to no one. Nothing else in the directory is touched.

On save: page metadata is stripped to ``title`` and ``url`` (unless
``keep_page_metadata``); each trajectory's first step gets
``trajectory_metadata["keypoint_step_ids"]`` (the steps whose reward has
``submit``); a missing ``same_as_next_screenshot`` is computed from the
screenshots' pixels and stored (last steps: never same-as-next).
"""

from __future__ import annotations

import base64
import datetime as _dt
import json
import logging
import mmap
import operator
import os
import re
import struct
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

import numpy as np
import zstandard
from google_crc32c import value as _google_crc32c
from numpy.typing import NDArray

from replaystore.atomic import atomic_open, fsync_dir
from replaystore.errors import ArgumentError, SchemaError, StorageError, TrajectoryError
from replaystore.trajectories.components import step_from_dict, step_to_dict
from replaystore.trajectories.index import (
    SAME_KEY,
    StepIndex,
    final_reward_value,
    is_dummy_trajectory,
    is_record_step,
    is_successful,
    keypoint_steps,
)
from replaystore.trajectories.prompt_urls import relative_prompt, resolve_prompt, root_url
from replaystore.trajectories.screenshots import (
    ScreenshotFingerprinter,
    default_fingerprinter,
    same_as_next_flags,
)

__all__ = ["IterationFile", "TrajectoryStorage"]

logger = logging.getLogger("replaystore.trajectories.storage")

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
# Version 4: prompt_separators value of a step whose prompt is not split (255).
_NOT_SPLIT = 255
#: Default zstandard level of version 3-4 frames (and version 4 texts).
COMPRESSION_LEVEL = 2
#: Version 4: a text is stored zstandard-compressed only where that makes it at most
#: this fraction of its size. Reading a compressed text costs a decompression (about
#: 2-3 µs for 1.5 kB), a sample's cold read most of all; repetitive texts (page trees,
#: growing summaries of earlier steps) shrink well below it, prose-like ones do not.
TEXT_COMPRESSION_RATIO = 0.5
_TEXT_COMPRESS_MIN = 128
_TEXT_PROBE = 32
# Version 4 prefix links: a text of at least _PREFIX_MIN bytes whose first
# _PREFIX_SHARE of bytes (or more) are a previous step's text's is stored as a link
# (_PREFIX_HEAD: that text's number and the shared length, then the rest); at most
# _PREFIX_CHAIN links lead to a text stored whole (the cost of a cold read).
_CODEC_PREFIX = 2
_PREFIX_MIN = 256
_PREFIX_SHARE = 0.5
_PREFIX_CHAIN = 8
_PREFIX_HEAD = struct.Struct("<II")
#: Default age (seconds) after which our own temporary files count as abandoned.
STALE_TEMP_AGE_S = 3600.0
_FILE_RE = re.compile(r"^iteration_(\d{6,})(?:\.rank(\d{3,}))?\.jsonl$")
# atomic_open's temporary names for our iteration files: .<name>.<mkstemp random>.tmp
_TEMP_RE = re.compile(r"^\.iteration_\d{6,}(?:\.rank\d{3,})?\.jsonl\.[A-Za-z0-9_]+\.tmp$")
_NO_CRC = -1
# Version 3 frame codecs (index.frame_codec): stored as they are, or one zstandard frame.
_CODEC_RAW = 0
_CODEC_ZSTD = 1
# The layouts of a split prompt (index = "p" in its head line, ``prompt_separators`` in a
# version 4 header): ``(opening, separator, closing)`` with ``prompt == opening +
# separator.join(messages) + closing``. 0 and 1: json.dumps's compact lists (", " is its
# default separator); 2 and 3: json.dumps(messages, indent=2 or 4), as WebGym writes
# every step's raw_prompt (indent=2, ensure_ascii=False: the texts are kept as they are).
_PROMPT_LAYOUTS = (
    ("[", ", ", "]"),
    ("[", ",", "]"),
    ("[\n  ", ",\n  ", "\n]"),
    ("[\n    ", ",\n    ", "\n]"),
)
# Encoders made once (json.dumps with options builds one per call).
_STEP_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
_SCAN = json.JSONDecoder().raw_decode
# _STEP_ENCODER.encode of a str (ensure_ascii=False): the JSON string literal
_encode_text = json.encoder.encode_basestring
_SCAN_ONCE = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
# How many characters of a message's start index the messages already seen, and how
# many texts are kept per start (the most recent).
_KNOWN_KEY = 64
_KNOWN_PER_KEY = 4
_LISTING_RETRIES = 5
# Frames of one file are compressed by up to this many zstandard threads, when they
# hold at least _PARALLEL_BYTES (below that, starting threads costs more than it saves).
_COMPRESS_THREADS = 2
_PARALLEL_BYTES = 1 << 20
# Step-line key: the step's prompt holds image URLs relative to the storage root.
_RELATIVE_URLS = "relative_image_urls"


def _encode(array: NDArray[Any], dtype: str) -> str:
    return base64.b64encode(np.ascontiguousarray(array, dtype=dtype).tobytes()).decode("ascii")


def _decode(text: str, dtype: str, count: int | None, where: str) -> NDArray[Any]:
    """A base64 index array; ``count``: the number of entries it must have (None: any)."""
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
        array = np.frombuffer(raw, dtype=dtype)
    except (ValueError, TypeError) as exc:
        raise StorageError(f"{where}: corrupt index array ({exc})") from None
    if count is not None and array.size != count:
        raise StorageError(f"{where}: index array has {array.size} entries, expected {count}")
    return array


@dataclass(frozen=True, slots=True)
class IterationFile:
    """One iteration file on disk: ``rank`` is None for a merged file."""

    path: Path
    iteration: int
    rank: int | None


@dataclass(slots=True)
class _Header:
    """The parsed first line of an iteration file."""

    file: IterationFile
    body_start: int
    metadata: dict[str, Any]
    lengths: NDArray[np.int32]
    final_rewards: list[Any]
    dummy: NDArray[np.bool_]
    same: NDArray[np.bool_]
    line_lengths: NDArray[np.int64]
    #: CRC32 of each step line (int64), or ``_NO_CRC`` for a version 1 file.
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
    #: Version 4: the file's texts (:class:`_TextIndex`), None before.
    texts: _TextIndex | None = None
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


class TrajectoryStorage:
    """Iteration files of web-agent trajectories under one directory.

    Args:
        root: the directory (created on first save).
        keep_page_metadata: keep every page-metadata field (default: only
            ``title`` and ``url``, as WebGym does, which saves ~10 KB per step).
        fingerprinter: screenshot fingerprint cache for computing missing
            same-as-next flags (default: process-wide).
        stale_temp_age_s: on construction, our own abandoned temporary files
            (``.iteration_*.jsonl.*.tmp``, left by a killed writer) older than
            this many seconds are removed (``None``: leave them). See the module doc.
        format_version: the file format version written (:data:`WRITABLE_VERSIONS`;
            default :data:`VERSION`). 2 writes files that replaystore releases
            before format 3 read; every version in :data:`READABLE_VERSIONS` is read.
        compression_level: zstandard level of version 3 frames (1-22; default 2).

    Raises:
        ValueError: a negative ``stale_temp_age_s``.
        ArgumentError: ``format_version`` is not writable, or ``compression_level``
            is not an integer from 1 to 22.

    Thread/process safety: any number of readers may run while writers write;
    each file appears complete or not at all. Saving an (iteration, rank) that
    exists raises :class:`StorageError`; two processes racing to save the *same*
    (iteration, rank) at the same instant are not detected (give each rank its own).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        keep_page_metadata: bool = False,
        fingerprinter: ScreenshotFingerprinter | None = None,
        stale_temp_age_s: float | None = STALE_TEMP_AGE_S,
        format_version: int = VERSION,
        compression_level: int = COMPRESSION_LEVEL,
    ) -> None:
        if format_version not in WRITABLE_VERSIONS or isinstance(format_version, bool):
            raise ArgumentError(
                f"format_version must be one of {WRITABLE_VERSIONS}, got {format_version!r}"
            )
        if (
            not isinstance(compression_level, int)
            or isinstance(compression_level, bool)
            or not 1 <= compression_level <= 22
        ):
            raise ArgumentError(
                f"compression_level must be an integer from 1 to 22, got {compression_level!r}"
            )
        self.root = Path(root)
        self.keep_page_metadata = bool(keep_page_metadata)
        self.format_version = int(format_version)
        self.compression_level = compression_level
        self._fingerprinter = fingerprinter
        if stale_temp_age_s is not None:
            if not isinstance(stale_temp_age_s, int | float) or not stale_temp_age_s >= 0:
                raise ValueError(
                    f"stale_temp_age_s must be None or a number >= 0, got {stale_temp_age_s!r}"
                )
            self.remove_stale_temporaries(stale_temp_age_s)

    def remove_stale_temporaries(self, older_than_s: float = STALE_TEMP_AGE_S) -> list[Path]:
        """Remove our abandoned temporary files older than ``older_than_s`` seconds.

        Only names of the exact form ``.iteration_<N>[.rank<R>].jsonl.<random>.tmp``
        (what a killed :meth:`save_iteration` or :meth:`merge_ranks` leaves) are
        considered; age is the time since the file was last written. A writer
        still running in another process keeps its file younger than that.

        Returns:
            The removed paths.

        Cost: one directory scan and one ``stat`` per matching name.
        """
        removed: list[Path] = []
        if not self.root.is_dir():
            return removed
        cutoff = time.time() - float(older_than_s)
        for entry in os.scandir(self.root):
            if not _TEMP_RE.match(entry.name):
                continue
            try:
                if not entry.is_file(follow_symlinks=False) or entry.stat().st_mtime > cutoff:
                    continue
                os.unlink(entry.path)
            except FileNotFoundError:  # its writer finished (renamed it) or another opener won
                continue
            removed.append(Path(entry.path))
        if removed:
            logger.warning(
                "removed %d abandoned temporary files (killed writers) under %s: %s",
                len(removed),
                self.root,
                ", ".join(p.name for p in removed[:5]),
            )
        return removed

    def __repr__(self) -> str:
        return f"TrajectoryStorage({str(self.root)!r})"

    # ------------------------------------------------------------------ listing

    def files(self) -> list[IterationFile]:
        """Every iteration file, sorted by (iteration, rank); merged files first."""
        if not self.root.is_dir():
            return []
        out = []
        for entry in os.scandir(self.root):
            match = _FILE_RE.match(entry.name)
            if match and entry.is_file():
                rank = None if match.group(2) is None else int(match.group(2))
                out.append(IterationFile(Path(entry.path), int(match.group(1)), rank))
        out.sort(key=lambda f: (f.iteration, -1 if f.rank is None else f.rank))
        return out

    def iterations(self) -> list[int]:
        """Iteration numbers present, ascending."""
        return sorted({f.iteration for f in self.files()})

    def next_iteration(self) -> int:
        """One more than the highest iteration present (1 for an empty storage)."""
        its = self.iterations()
        return its[-1] + 1 if its else 1

    def _readable_files(self, last_n_iterations: int | None) -> list[IterationFile]:
        """Per iteration: its merged file if present, else its rank files."""
        if last_n_iterations is not None and (
            int(last_n_iterations) != last_n_iterations or last_n_iterations < 1
        ):
            raise ValueError(
                f"last_n_iterations must be None or an integer >= 1, got {last_n_iterations!r}"
            )
        by_iteration: dict[int, list[IterationFile]] = {}
        for f in self.files():
            by_iteration.setdefault(f.iteration, []).append(f)
        chosen = sorted(by_iteration)
        if last_n_iterations is not None:
            chosen = chosen[-int(last_n_iterations) :]
        out: list[IterationFile] = []
        for it in chosen:
            group = by_iteration[it]
            merged = [f for f in group if f.rank is None]
            out.extend(merged or group)
        return out

    def _with_listing(self, last_n_iterations: int | None, read: Any) -> Any:
        # A merge or a cleanup may remove a listed file before we open it; the
        # data then lives in the merged file (or was deleted on purpose): list again.
        for attempt in range(_LISTING_RETRIES):
            files = self._readable_files(last_n_iterations)
            try:
                return read(files)
            except FileNotFoundError:
                if attempt == _LISTING_RETRIES - 1:
                    raise
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------ writing

    def save_iteration(
        self,
        iteration: int | None,
        trajectories: Sequence[Sequence[Any]],
        rank: int | None = 0,
        *,
        metadata: Mapping[str, Any] | None = None,
        keep_page_metadata: bool | None = None,
    ) -> Path:
        """Write one immutable iteration file for ``rank``; returns its path.

        Args:
            iteration: iteration number >= 1 (None: :meth:`next_iteration`).
            trajectories: lists of steps (mappings with components or their
                dicts, or :class:`Step`). Not modified.
            rank: the writing process's rank (one file per rank); ``None`` writes
                the iteration's merged file directly (one writer for the whole
                iteration, as a single-node run), refused when rank files exist.
            metadata: JSON-compatible facts to keep in the header (model, config...).
            keep_page_metadata: override the storage's setting for this file.

        Raises:
            StorageError: the file (or the iteration's merged file) already exists;
                for ``rank=None``, also when the iteration has rank files.
            TrajectoryError: a step is malformed or not JSON-serialisable, or a
                non-dummy trajectory's final reward is None, not a number or not
                finite (:func:`~replaystore.trajectories.index.final_reward_value`;
                names the trajectory and step); nothing is written.

        Cost: one JSON encoding per step, plus one image decode per screenshot
        whose same-as-next flag must be computed; one fsync.
        """
        if iteration is None:
            iteration = self.next_iteration()
        if int(iteration) != iteration or iteration < 1:
            raise ArgumentError(f"iteration must be an integer >= 1, got {iteration!r}")
        if rank is not None and (int(rank) != rank or rank < 0):
            raise ArgumentError(f"rank must be None or an integer >= 0, got {rank!r}")
        iteration = int(iteration)
        rank = None if rank is None else int(rank)
        self.root.mkdir(parents=True, exist_ok=True)
        merged = self.root / f"iteration_{iteration:06d}.jsonl"
        if rank is None:
            target = merged
            ranked = [
                f.path for f in self.files() if f.iteration == iteration and f.rank is not None
            ]
            if ranked:
                raise StorageError(
                    f"iteration {iteration} has rank files ({ranked[0].name}, ...): write its "
                    "merged file with merge_ranks, or save under another iteration"
                )
        else:
            target = self.root / f"iteration_{iteration:06d}.rank{rank:03d}.jsonl"
        for existing in (target, merged):
            if existing.exists():
                raise StorageError(
                    f"{existing} already exists: iteration files are immutable "
                    "(pick another iteration or rank)"
                )
        header_meta = dict(metadata or {})
        header_meta.setdefault("timestamp", _dt.datetime.now(_dt.UTC).isoformat())
        keep = self.keep_page_metadata if keep_page_metadata is None else bool(keep_page_metadata)
        known: dict[str, list[str]] = {}  # prompt messages seen in this iteration
        table = _TextTable() if self.format_version >= 4 else None
        self._root_strings(refresh=True)
        encoded = [
            self._encode_trajectory(t, traj, keep, known, table)
            for t, traj in enumerate(trajectories)
        ]
        self._write(target, iteration, rank, header_meta, encoded)
        logger.info(
            "saved iteration %d rank %s: %d trajectories to %s",
            iteration,
            "merged" if rank is None else rank,
            len(encoded),
            target,
        )
        return target

    def _encode_trajectory(
        self,
        t: int,
        trajectory: Sequence[Any],
        keep_page_metadata: bool,
        known: dict[str, list[str]],
        table: _TextTable | None = None,
    ) -> _EncodedTrajectory:
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
        # Fill in missing same-as-next flags from the pixels (never for the last step).
        todo = [s for s in range(n - 1) if steps[s].get(SAME_KEY) is None]
        if todo:
            fp = self._fingerprinter if self._fingerprinter is not None else default_fingerprinter()
            flags = same_as_next_flags(
                [steps[s]["observation"]["image_path"] for s in todo],
                [steps[s + 1]["observation"]["image_path"] for s in todo],
                fp,
            )
            for s, flag in zip(todo, flags.tolist(), strict=True):
                steps[s][SAME_KEY] = flag
        same = np.zeros(n, dtype=bool)
        has_prompt = np.zeros(n, dtype=bool)
        prompts_root, root, inside = self._root_strings()
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
            obs["image_path"] = _relative(obs["image_path"], root, inside)
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
        first_meta = dict(steps[0].get("trajectory_metadata") or {})
        first_meta["keypoint_step_ids"] = keypoint_steps(steps)
        steps[0]["trajectory_metadata"] = first_meta
        record = not dummy and is_record_step(steps[-1])
        encoded = _EncodedTrajectory([], reward, dummy, same, has_prompt, record)
        if self.format_version >= 3:
            self._fill_frame(encoded, t, steps, relative_urls, known, table)
        else:
            encoded.lines = _step_lines(t, steps, relative_urls)
        return encoded

    def _root_strings(self, refresh: bool = False) -> tuple[str, str, str]:
        """``(root_url, absolute root, absolute root + separator)``; ``refresh`` makes
        them again (once per save: a relative root depends on the current directory)."""
        cached = getattr(self, "_roots", None)
        if cached is None or refresh or cached[0] is not self.root:
            root = os.path.abspath(self.root)
            cached = (self.root, root_url(self.root), root, root.rstrip(os.sep) + os.sep)
            self._roots = cached
        return cached[1], cached[2], cached[3]

    def _fill_frame(
        self,
        encoded: _EncodedTrajectory,
        t: int,
        steps: Sequence[dict[str, Any]],
        relative_urls: Sequence[bool],
        known: dict[str, list[str]],
        table: _TextTable | None = None,
    ) -> None:
        """Version 3-4: the trajectory's frame (compressed by :meth:`_write`), its step
        checksums and message count; version 4 (``table`` given): its texts go to
        the file's ``table`` instead of its frame."""
        frame, crcs, messages = _frame_of(t, steps, relative_urls, known, table)
        encoded.table = table
        encoded.frame = frame
        encoded.codec = _CODEC_RAW
        encoded.compress = bool(frame)
        encoded.step_crcs = crcs
        encoded.messages = messages

    def _compress_frames(self, trajectories: Sequence[_EncodedTrajectory]) -> None:
        """Compress the frames made by :meth:`_fill_frame`, each kept compressed where
        that is smaller. Many frames are compressed together by zstandard's own threads
        (the same bytes as one at a time: each frame is one independent zstandard frame)."""
        todo = [e for e in trajectories if e.compress]
        if not todo:
            return
        raw = [e.frame or b"" for e in todo]
        packed = _compress_each(raw, self.compression_level)
        for e, frame, small in zip(todo, raw, packed, strict=True):
            if len(small) < len(frame):
                e.frame, e.codec = small, _CODEC_ZSTD
            e.compress = False

    def _resolve(self, image_path: Any) -> Any:
        if not isinstance(image_path, str) or image_path == "" or os.path.isabs(image_path):
            return image_path
        return str(self.root / image_path)

    def _write(
        self,
        target: Path,
        iteration: int,
        rank: int | None,
        metadata: Mapping[str, Any],
        trajectories: Sequence[_EncodedTrajectory],
    ) -> None:
        version = 2
        if trajectories and trajectories[0].frame is not None:
            version = 3 if trajectories[0].table is None else 4
        self._compress_frames(trajectories)
        if not trajectories:
            version = self.format_version
        lengths = np.array([e.num_steps for e in trajectories], dtype=np.int64)
        same = np.concatenate([e.same for e in trajectories]) if trajectories else np.zeros(0, bool)
        index: dict[str, Any] = {
            "lengths": _encode(lengths, "<i4"),
            "final_rewards": [e.final_reward for e in trajectories],
            "dummy": _encode(np.array([e.dummy for e in trajectories], bool), "u1"),
            "same": _encode(same, "u1"),
        }
        if version >= 3:
            frames = [e.frame or b"" for e in trajectories]
            index["frame_lengths"] = _encode(np.array([len(f) for f in frames], np.int64), "<i8")
            index["frame_crc32"] = _encode(
                np.array([zlib.crc32(f) for f in frames], np.uint32), "<u4"
            )
            index["frame_codec"] = _encode(
                np.array([e.codec for e in trajectories], np.uint8), "u1"
            )
            index["message_counts"] = _encode(
                np.array([e.messages for e in trajectories], np.int64), "<i4"
            )
            index["line_crc32"] = _encode(
                np.concatenate([e.step_crcs for e in trajectories if e.step_crcs is not None])
                if trajectories
                else np.zeros(0, np.uint32),
                "<u4",
            )
            body: list[bytes] = frames
            table = trajectories[0].table if trajectories else None
            if version >= 4:
                table = table if table is not None else _TextTable()
                table.compress(self.compression_level)
                arrays = table.index()
                for name, dtype in _PROMPT_ARRAYS:
                    index[name] = _encode(arrays[name], dtype)
                index["prompt_index_crc32"] = _prompt_index_crc(arrays)
                body = [*frames, b"".join(table.texts)]  # one write for the texts
        else:
            line_lengths = np.fromiter(
                (len(line) for e in trajectories for line in e.lines),
                dtype=np.int64,
                count=int(lengths.sum()),
            )
            crcs = np.fromiter(
                (zlib.crc32(line) for e in trajectories for line in e.lines),
                dtype=np.uint32,
                count=int(line_lengths.size),
            )
            index["line_lengths"] = _encode(line_lengths, "<i8")
            index["line_crc32"] = _encode(crcs, "<u4")
            body = [line for e in trajectories for line in e.lines]
        if any(e.record for e in trajectories):
            index["record"] = _encode(np.array([e.record for e in trajectories], bool), "u1")
        prompt_flags = [e.has_prompt for e in trajectories]
        if all(flags is not None for flags in prompt_flags):
            index["has_prompt"] = _encode(
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

    # ------------------------------------------------------------------ reading

    def _read_header(self, file: IterationFile) -> _Header:
        with open(file.path, "rb") as handle:
            first = handle.readline()
        where = str(file.path)
        try:
            header = json.loads(first)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise StorageError(f"{where} is not a replaystore iteration file") from None
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise StorageError(f"{where} is not a replaystore iteration file")
        version = header.get("version")
        if version not in READABLE_VERSIONS:
            raise StorageError(
                f"{where} has format version {version!r}; this replaystore "
                f"reads versions {', '.join(map(str, READABLE_VERSIONS))}"
            )
        try:
            index = header["index"]
            n_traj = int(header["num_trajectories"])
            n_steps = int(header["num_steps"])
            lengths = _decode(index["lengths"], "<i4", n_traj, where)
            rewards = list(index["final_rewards"])
            dummy = _decode(index["dummy"], "u1", n_traj, where).astype(bool)
            same = _decode(index["same"], "u1", n_steps, where).astype(bool)
            frame_lengths = frame_crc = frame_codec = message_counts = None
            if version >= 3:
                line_lengths = np.zeros(0, dtype=np.int64)
                frame_lengths = _decode(index["frame_lengths"], "<i8", n_traj, where)
                frame_crc = _decode(index["frame_crc32"], "<u4", n_traj, where).astype(np.int64)
                frame_codec = _decode(index["frame_codec"], "u1", n_traj, where)
                message_counts = _decode(index["message_counts"], "<i4", n_traj, where)
            else:
                line_lengths = _decode(index["line_lengths"], "<i8", n_steps, where)
            has_prompt = (
                _decode(index["has_prompt"], "u1", n_steps, where).astype(bool)
                if "has_prompt" in index
                else None
            )
            record = (
                _decode(index["record"], "u1", n_traj, where).astype(bool)
                if "record" in index
                else None
            )
            if version >= 2:
                line_crc = _decode(index["line_crc32"], "<u4", n_steps, where).astype(np.int64)
            else:
                line_crc = np.full(n_steps, _NO_CRC, dtype=np.int64)
            prompts = (
                {name: _decode(index[name], dtype, None, where) for name, dtype in _PROMPT_ARRAYS}
                if version >= 4
                else None
            )
            prompt_crc = int(index["prompt_index_crc32"]) if version >= 4 else None
        except (KeyError, TypeError, ValueError) as exc:
            raise StorageError(f"{where}: malformed header ({exc!r})") from None
        if (
            len(rewards) != n_traj
            or int(lengths.sum()) != n_steps
            or (n_traj and int(lengths.min()) < 1)
            or (version < 3 and n_steps and int(line_lengths.min()) < 1)
            or (
                frame_lengths is not None
                and n_traj
                and (
                    int(frame_lengths.min()) < 1
                    or int(message_counts.min()) < 0  # type: ignore[union-attr]
                    or int(frame_codec.max()) > _CODEC_ZSTD  # type: ignore[union-attr]
                )
            )
        ):
            raise StorageError(f"{where}: header counts do not match its index")
        # The final-reward rule (index.py) for files written before save_iteration
        # enforced it: every reader (stats, load_all, from_storage, export) refuses alike.
        for t in np.flatnonzero(~dummy).tolist():
            final_reward_value(rewards[t], f"trajectory {t} of {where}", int(lengths[t]) - 1)
        texts = None
        if prompts is not None:
            assert frame_lengths is not None
            texts = _check_prompt_index(
                prompts, prompt_crc, n_steps, file.path, len(first) + int(frame_lengths.sum())
            )
        if frame_lengths is not None:
            _check_frames(file, len(first), frame_lengths, frame_crc, texts)  # type: ignore[arg-type]
        else:
            self._check_body(file, len(first), lengths, line_lengths, line_crc)
        header_v4: dict[str, Any] = {}
        if prompts is not None:
            counts = prompts["prompt_counts"].astype(np.int32)
            header_v4 = {
                "texts": texts,
                "prompt_counts": counts,
                "prompt_starts": np.cumsum(counts, dtype=np.int64) - counts,
                "prompt_refs": prompts["prompt_refs"].astype(np.int32),
                "prompt_separators": prompts["prompt_separators"].astype(np.uint8),
                "prompt_responses": prompts["prompt_responses"].astype(np.int32),
                "prompt_relative": prompts["prompt_relative"].astype(bool),
            }
        return _Header(
            file=file,
            body_start=len(first),
            metadata=dict(header.get("metadata") or {}),
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
            **header_v4,
        )

    @staticmethod
    def _check_body(
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
        if line_crc[-1] != _NO_CRC and zlib.crc32(last) != int(line_crc[-1]):
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

    def _decode_line(
        self, line: bytes, where: str, crc: int = _NO_CRC
    ) -> tuple[int, int, dict[str, Any]]:
        if crc != _NO_CRC and zlib.crc32(line) != crc:
            raise StorageError(
                f"{where}: step line fails its CRC32 check (the file was changed or damaged "
                "after it was written)"
            )
        try:
            record = json.loads(line)
            t, s, data = int(record["t"]), int(record["s"]), record["step"]
            if record.get(_RELATIVE_URLS):
                data["response"]["raw_prompt"] = resolve_prompt(
                    data["response"]["raw_prompt"], root_url(self.root)
                )
            step = step_from_dict(data)
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError) as exc:
            raise StorageError(f"{where}: malformed step line ({exc})") from None
        observation = step["observation"]
        observation.image_path = self._resolve(observation.image_path)
        return t, s, step

    def _decode_frame_step(
        self, frame: _Frame, head: Mapping[str, Any], step_raw: bytes, where: str
    ) -> dict[str, Any]:
        """A version 3 step (checked by :func:`_frame_head`) as a step mapping."""
        data = _frame_step_dict(frame, head, step_raw, where)
        try:
            if head.get("u"):
                data["response"]["raw_prompt"] = resolve_prompt(
                    data["response"]["raw_prompt"], root_url(self.root)
                )
            step = step_from_dict(data)
        except _STEP_ERRORS as exc:
            raise StorageError(f"{where}: malformed step ({exc})") from None
        observation = step["observation"]
        observation.image_path = self._resolve(observation.image_path)
        return step

    def _frames_of(self, header: _Header) -> Iterator[tuple[int, _Frame]]:
        """``(trajectory, decoded frame)`` of every trajectory of a version 3-4 file."""
        assert header.frame_lengths is not None and header.frame_crc is not None
        assert header.frame_codec is not None and header.message_counts is not None
        path = header.file.path
        texts = None if header.texts is None else _Texts.mapped(header.texts)
        with open(path, "rb") as handle:
            handle.seek(header.body_start)
            for t in range(int(header.lengths.size)):
                where = f"{path} trajectory {t}"
                length = int(header.frame_lengths[t])
                data = _decode_frame(
                    handle.read(length),
                    length,
                    int(header.frame_crc[t]),
                    int(header.frame_codec[t]),
                    where,
                )
                n_messages = int(header.message_counts[t])
                yield t, _split_frame(data, n_messages, int(header.lengths[t]), where, texts)

    def _edge_records(self, header: _Header) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
        """Per trajectory of a file: its first and last step records, ``{"step": the
        step's dict as stored}`` (screenshot paths as stored; version 3: without the
        prompt and response texts), for indexes such as the viewer's. Version 3 frames
        are checked (CRC32); version 1-2 lines are read as they are.

        Raises:
            StorageError: a frame or line is damaged or not JSON.
        """
        path = header.file.path
        if header.version >= 3:
            for t, frame in self._frames_of(header):
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

    def _trajectory_steps(
        self, header: _Header, t: int, first: int, count: int, where: str
    ) -> list[dict[str, Any]]:
        """Steps ``first .. first+count-1`` of trajectory ``t`` of a version 3 file,
        decoded as :meth:`load_all` decodes them (checksums verified).

        Raises:
            FileNotFoundError: the file is gone.
            StorageError: the frame or a step is damaged.
        """
        assert header.frame_lengths is not None and header.frame_crc is not None
        assert header.frame_codec is not None and header.message_counts is not None
        data = _read_frame(
            header.file.path,
            int(header.frame_offsets()[t]),
            int(header.frame_lengths[t]),
            int(header.frame_crc[t]),
            int(header.frame_codec[t]),
            f"{where}",
        )
        texts = None if header.texts is None else _Texts.mapped(header.texts)
        frame = _split_frame(
            data, int(header.message_counts[t]), int(header.lengths[t]), where, texts
        )
        start = int((np.cumsum(header.lengths) - header.lengths)[t])
        out = []
        for s in range(first, first + count):
            at = f"{where} step {s}"
            head, step_raw = _checked_head(frame, s, int(header.line_crc[start + s]), at)
            out.append(self._decode_frame_step(frame, head, step_raw, at))
        return out

    def _read_file(self, file: IterationFile) -> tuple[_Header, list[list[dict[str, Any]]]]:
        header = self._read_header(file)
        if header.version >= 3:
            out: list[list[dict[str, Any]]] = []
            first = 0
            for t, frame in self._frames_of(header):
                steps = []
                for s in range(int(header.lengths[t])):
                    where = f"{file.path} trajectory {t} step {s}"
                    head, step_raw = _checked_head(frame, s, int(header.line_crc[first + s]), where)
                    steps.append(self._decode_frame_step(frame, head, step_raw, where))
                first += len(steps)
                out.append(steps)
            return header, out
        trajectories: list[list[dict[str, Any]]] = [[] for _ in range(header.lengths.size)]
        count = 0
        with open(file.path, "rb") as handle:
            handle.seek(header.body_start)
            for line in handle:
                if count >= header.num_steps:
                    raise StorageError(
                        f"{file.path} holds more steps than its header says ({header.num_steps})"
                    )
                t, _, step = self._decode_line(
                    line, f"{file.path} line {count + 2}", int(header.line_crc[count])
                )
                if not 0 <= t < len(trajectories):
                    raise StorageError(f"{file.path} line {count + 2}: trajectory {t} unknown")
                trajectories[t].append(step)
                count += 1
        if count != header.num_steps:
            raise StorageError(
                f"{file.path} holds {count} steps but its header says {header.num_steps}"
            )
        return header, trajectories

    def readable_files(self, last_n_iterations: int | None = None) -> list[IterationFile]:
        """The files :meth:`load_all` reads: per iteration its merged file, else its rank files.

        Raises:
            ValueError: ``last_n_iterations`` is not None or an integer >= 1.
        """
        return self._readable_files(last_n_iterations)

    def describe_file(self, file: IterationFile) -> dict[str, Any]:
        """Counts of one iteration file from its header (no step is parsed).

        Returns:
            ``{"path", "iteration", "rank", "num_trajectories", "num_steps",
            "dummy_trajectories", "size_bytes", "metadata"}`` (rank None: merged file).

        Raises:
            StorageError: the file is not ours.
        """
        header = self._read_header(file)
        return {
            "path": str(file.path),
            "iteration": file.iteration,
            "rank": file.rank,
            "num_trajectories": int(header.lengths.size),
            "num_steps": header.num_steps,
            "dummy_trajectories": int(header.dummy.sum()),
            "size_bytes": file.path.stat().st_size,
            "metadata": header.metadata,
        }

    def read_file(self, file: IterationFile | str | os.PathLike[str]) -> list[list[dict[str, Any]]]:
        """The trajectories of one iteration file (as :meth:`load_all` returns them).

        Raises:
            StorageError: the file is not ours or is inconsistent.
            FileNotFoundError: the file is gone (e.g. merged or cleaned up meanwhile).
        """
        if not isinstance(file, IterationFile):
            path = Path(file)
            match = _FILE_RE.match(path.name)
            if match is None:
                raise StorageError(f"{path} is not named like an iteration file")
            rank = None if match.group(2) is None else int(match.group(2))
            file = IterationFile(path, int(match.group(1)), rank)
        return self._read_file(file)[1]

    def load_all(self, last_n_iterations: int | None = None) -> list[list[dict[str, Any]]]:
        """Every stored trajectory (oldest iteration first; ranks in order).

        Steps come back as WebGym mappings with component objects; screenshot
        paths are absolute again.

        Args:
            last_n_iterations: only the most recent N iterations (None: all).

        Raises:
            StorageError: a file is not ours or is inconsistent.
            TrajectoryError: a stored final reward breaks the final-reward rule
                (see :meth:`stats`).
        """

        def read(files: list[IterationFile]) -> list[list[dict[str, Any]]]:
            out: list[list[dict[str, Any]]] = []
            for f in files:
                out.extend(self._read_file(f)[1])
            return out

        return self._with_listing(last_n_iterations, read)

    def load_last(self) -> list[list[dict[str, Any]]]:
        """The trajectories of the most recent iteration ([] when there is none)."""
        return self.load_all(last_n_iterations=1) if self.iterations() else []

    def iter_trajectories(
        self, last_n_iterations: int | None = None
    ) -> Iterator[tuple[int, list[dict[str, Any]]]]:
        """``(iteration, trajectory)`` pairs, one file in memory at a time."""
        for f in self._readable_files(last_n_iterations):
            for trajectory in self._read_file(f)[1]:
                yield f.iteration, trajectory

    def metadata(self, iteration: int) -> list[dict[str, Any]]:
        """The header metadata of each readable file of ``iteration``."""
        files = [f for f in self._readable_files(None) if f.iteration == iteration]
        return [self._read_header(f).metadata for f in files]

    # ------------------------------------------------------------------ maintenance

    def merge_ranks(self, iteration: int) -> Path:
        """Combine the rank files of ``iteration`` into one file; removes the rank files.

        Trajectories keep rank order. Readers never miss data: the merged file
        appears (atomically) before the rank files are removed, and readers
        prefer it. Idempotent: an already merged iteration returns its path.
        The merged file is written in this storage's ``format_version``: version 3
        frames into version 3 are copied as they are, anything else is converted
        (version 4 files share one table of texts, so their steps are re-encoded).

        Raises:
            StorageError: the iteration has no files, or a rank file fails a
                checksum (nothing is merged then).
        """
        group = [f for f in self.files() if f.iteration == iteration]
        merged_path = self.root / f"iteration_{int(iteration):06d}.jsonl"
        ranks = [f for f in group if f.rank is not None]
        if not group:
            raise StorageError(f"iteration {iteration} has no files under {self.root}")
        if any(f.rank is None for f in group) and not ranks:
            return merged_path
        if merged_path.exists():
            raise StorageError(
                f"iteration {iteration} has both a merged file and rank files; remove one"
            )
        encoded: list[_EncodedTrajectory] = []
        rank_meta: dict[str, Any] = {}
        table = _TextTable() if self.format_version >= 4 else None  # one for the merged file
        for f in ranks:
            header = self._read_header(f)
            rank_meta[str(f.rank)] = header.metadata
            encoded.extend(self._reencode(header, first_t=len(encoded), table=table))
        metadata = {"merged_ranks": [f.rank for f in ranks], "rank_metadata": rank_meta}
        self._write(merged_path, int(iteration), None, metadata, encoded)
        for f in ranks:
            f.path.unlink(missing_ok=True)
        fsync_dir(self.root)
        logger.info(
            "merged %d rank files of iteration %d into %s", len(ranks), iteration, merged_path
        )
        return merged_path

    def upgrade(self) -> list[Path]:
        """Rewrite every iteration file older than this storage's ``format_version``.

        Each file is read whole (every checksum verified) and replaced atomically
        by the same trajectories in the new format (same name, header metadata,
        iteration and rank): a process killed at any instant leaves either the
        old file or the new one. Buffers opened before must be reopened.

        Returns:
            The rewritten paths (newest format files are left alone).

        Raises:
            StorageError: a file is not ours, is inconsistent or fails a checksum
                (that file and the ones after it are left as they were).
        """
        rewritten = []
        for f in self.files():
            header = self._read_header(f)
            if header.version >= self.format_version:
                continue
            encoded = self._reencode(header, first_t=0)
            self._write(f.path, f.iteration, f.rank, header.metadata, encoded)
            rewritten.append(f.path)
        if rewritten:
            logger.info(
                "upgraded %d iteration files under %s to format version %d",
                len(rewritten),
                self.root,
                self.format_version,
            )
        return rewritten

    def _reencode(
        self, header: _Header, first_t: int, table: _TextTable | None = None
    ) -> list[_EncodedTrajectory]:
        """The trajectories of a file, verified, as ``format_version`` trajectories
        numbered from ``first_t`` (version 3 frames into version 3, and same-version
        lines, are copied). Version 4: their texts go to ``table``, the table of the
        file being written (one is made when None: a file of its own)."""
        path = header.file.path
        out: list[_EncodedTrajectory] = []
        known: dict[str, list[str]] = {}
        if self.format_version >= 4 and table is None:
            table = _TextTable()
        starts = np.cumsum(header.lengths) - header.lengths
        if header.version >= 3:
            for t, frame in self._frames_of(header):
                start = int(starts[t])
                n = int(header.lengths[t])
                encoded = self._index_part(header, t, start, n)
                if self.format_version == 3 and header.version == 3:
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
                        _checked_head(
                            frame,
                            s,
                            int(header.line_crc[start + s]),
                            f"{path} trajectory {t} step {s}",
                        )
                else:
                    dicts, relative = [], []
                    for s in range(n):
                        where = f"{path} trajectory {t} step {s}"
                        head, step_raw = _checked_head(
                            frame, s, int(header.line_crc[start + s]), where
                        )
                        dicts.append(_frame_step_dict(frame, head, step_raw, where))
                        relative.append(bool(head.get("u")))
                    if self.format_version >= 3:
                        self._fill_frame(encoded, first_t + t, dicts, relative, known, table)
                    else:
                        encoded.lines = _step_lines(first_t + t, dicts, relative)
                out.append(encoded)
            return out
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
            if crc != _NO_CRC and zlib.crc32(raw + b"\n") != crc:
                raise StorageError(
                    f"{path} line {i + 2}: step line fails its CRC32 check (damaged "
                    "after it was written); nothing was merged"
                )
        for t, length in enumerate(header.lengths.tolist()):
            start = int(starts[t])
            encoded = self._index_part(header, t, start, length)
            lines = raw_lines[start : start + length]
            if self.format_version >= 3:
                dicts, relative = [], []
                for i, raw in enumerate(lines):
                    try:
                        record = json.loads(raw)
                        dicts.append(record["step"])
                        relative.append(bool(record.get(_RELATIVE_URLS)))
                    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as exc:
                        raise StorageError(
                            f"{path} line {start + i + 2}: malformed step line ({exc})"
                        ) from None
                self._fill_frame(encoded, first_t + t, dicts, relative, known, table)
            else:
                encoded.lines = [
                    _renumber(raw, first_t + t, f"{path} line {start + i + 2}")
                    for i, raw in enumerate(lines)
                ]
            out.append(encoded)
        return out

    @staticmethod
    def _index_part(header: _Header, t: int, start: int, n: int) -> _EncodedTrajectory:
        """Trajectory ``t``'s index entries (steps ``start .. start + n - 1``), no data yet."""
        return _EncodedTrajectory(
            [],
            header.final_rewards[t],
            bool(header.dummy[t]),
            header.same[start : start + n],
            None if header.has_prompt is None else header.has_prompt[start : start + n],
            header.record is not None and bool(header.record[t]),
        )

    def cleanup_old_iterations(self, keep_last_n: int = 5) -> list[Path]:
        """Delete the files of all but the ``keep_last_n`` most recent iterations.

        Returns:
            The removed paths.

        Raises:
            ValueError: ``keep_last_n`` is not an integer >= 0.
        """
        if int(keep_last_n) != keep_last_n or keep_last_n < 0:
            raise ArgumentError(f"keep_last_n must be an integer >= 0, got {keep_last_n!r}")
        its = self.iterations()
        doomed = set(its[: max(0, len(its) - int(keep_last_n))])
        removed = []
        for f in self.files():
            if f.iteration in doomed:
                f.path.unlink(missing_ok=True)
                removed.append(f.path)
        if removed:
            fsync_dir(self.root)
            logger.info("removed %d old iteration files under %s", len(removed), self.root)
        return removed

    def stats(self, success_threshold: float = 1.0) -> dict[str, Any]:
        """Counts from the file headers (no step is parsed).

        Returns:
            ``{"root", "total_iterations", "total_files", "total_trajectories",
            "total_steps", "successful_trajectories", "dummy_trajectories",
            "total_size_bytes", "total_size_mb", "iterations": [per-iteration dicts
            with iteration, files, trajectories, steps, successful_trajectories,
            size_bytes]}`` (WebGym's keys plus more).

        Raises:
            StorageError: a file is not ours or is inconsistent.
            TrajectoryError: a file (written before ``save_iteration`` enforced
                the final-reward rule) holds a non-dummy trajectory whose final
                reward is None or not a number: success is undefined, so it is
                refused here exactly as :meth:`load_all` and ``from_storage`` do.
        """

        def read(files: list[IterationFile]) -> dict[str, Any]:
            per: dict[int, dict[str, Any]] = {}
            for f in files:
                header = self._read_header(f)
                size = f.path.stat().st_size
                successful = sum(
                    1
                    for r, d in zip(header.final_rewards, header.dummy.tolist(), strict=True)
                    if not d and is_successful(float(r), success_threshold)
                )
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
                "root": str(self.root),
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

        return self._with_listing(None, read)

    # ------------------------------------------------------------------ buffer index

    def build_index(self, last_n_iterations: int | None = None) -> StepIndex:
        """The buffer index of the stored steps, from file headers only.

        Trajectory ids count every stored trajectory (dummies included) in
        :meth:`load_all` order, so errors name the same trajectory number as a
        buffer built from ``load_all()``.

        Raises:
            StorageError: no iteration files.
            TrajectoryError: a non-dummy trajectory's final reward is None or not
                a number (names the trajectory and its file; see :meth:`stats`).
        """
        headers: list[_Header] = self._with_listing(
            last_n_iterations, lambda files: [self._read_header(f) for f in files]
        )
        if not headers:
            raise StorageError(f"no iteration files under {self.root}")
        traj_parts, step_parts, reward_parts, same_parts = [], [], [], []
        file_parts, offset_parts, traj_rewards, crc_parts = [], [], [], []
        prompt_parts: list[NDArray[np.bool_]] = []
        keeps: list[NDArray[np.bool_]] = []
        frame_parts: list[tuple[Any, ...] | None] = []
        traj_file: list[NDArray[np.int32]] = []
        traj_local: list[NDArray[np.int32]] = []
        dummies = 0
        first_traj = 0
        for file_id, h in enumerate(headers):
            n_traj = int(h.lengths.size)
            lengths = h.lengths.astype(np.int64)
            keep = ~h.dummy
            dummies += int(h.dummy.sum())
            rewards = np.zeros(n_traj)
            for t in np.flatnonzero(keep).tolist():
                rewards[t] = final_reward_value(
                    h.final_rewards[t],
                    f"trajectory {first_traj + t} (trajectory {t} of {h.file.path})",
                    int(lengths[t]) - 1,
                )
            step_keep = np.repeat(keep, lengths)
            starts = np.cumsum(lengths) - lengths
            if h.record is not None:  # record steps are stored, never samples
                step_keep[(starts + lengths - 1)[h.record & keep]] = False
            keeps.append(step_keep)
            local_step = np.arange(h.num_steps, dtype=np.int64) - np.repeat(starts, lengths)
            if h.frame_lengths is not None:  # version 3: steps are found through their frame
                offsets = np.full(h.num_steps, -1, dtype=np.int64)
                frame_parts.append(
                    (
                        h.frame_offsets(),
                        h.frame_lengths,
                        h.frame_crc,
                        h.frame_codec,
                        h.message_counts,
                    )
                )
            else:
                offsets = h.body_start + np.cumsum(h.line_lengths) - h.line_lengths
                frame_parts.append(None)
            traj_ids = np.repeat(np.arange(first_traj, first_traj + n_traj), lengths)
            traj_parts.append(traj_ids[step_keep])
            step_parts.append(local_step[step_keep].astype(np.int32))
            reward_parts.append(np.repeat(rewards, lengths)[step_keep])
            same = h.same.copy()
            same[(starts + lengths - 1)[lengths > 0]] = False
            same_parts.append(same[step_keep])
            file_parts.append(np.full(int(step_keep.sum()), file_id, dtype=np.int32))
            offset_parts.append(offsets[step_keep])
            crc_parts.append(h.line_crc[step_keep])
            if h.has_prompt is not None:
                prompt_parts.append(h.has_prompt[step_keep])
            traj_rewards.append(rewards[keep])
            traj_file.append(np.full(n_traj, file_id, dtype=np.int32))
            traj_local.append(np.arange(n_traj, dtype=np.int32))
            first_traj += n_traj
        prompts, texts = _prompts_of(headers, keeps)
        source = _FileSource(
            self,
            [h.file.path for h in headers],
            np.concatenate(file_parts),
            np.concatenate(offset_parts).astype(np.int64),
            np.concatenate(traj_file),
            np.concatenate(traj_local),
            np.concatenate(crc_parts).astype(np.int64),
            _frame_table(headers, frame_parts),
            texts,
            prompts,
        )
        return StepIndex(
            traj=np.concatenate(traj_parts).astype(np.int64),
            step=np.concatenate(step_parts),
            reward=np.concatenate(reward_parts),
            same=np.concatenate(same_parts),
            trajectory_rewards=np.concatenate(traj_rewards),
            dummy_trajectories=dummies,
            computed_steps=0,
            missing_screenshots=0,
            source=source,
            # known only when every file's header has it (older files do not)
            has_prompt=np.concatenate(prompt_parts) if len(prompt_parts) == len(headers) else None,
        )


@dataclass(slots=True)
class _EncodedTrajectory:
    """One trajectory ready to write: its step lines (version 1-2) or frame (version 3)."""

    lines: list[bytes]
    final_reward: Any
    dummy: bool
    same: NDArray[np.bool_]
    has_prompt: NDArray[np.bool_] | None = None
    record: bool = False
    frame: bytes | None = None
    codec: int = _CODEC_RAW
    step_crcs: NDArray[np.uint32] | None = None
    messages: int = 0
    #: ``frame`` is raw and still to be compressed (:meth:`TrajectoryStorage._write`).
    compress: bool = False
    #: Version 4: the file's texts and step references (shared by its trajectories).
    table: _TextTable | None = None

    @property
    def num_steps(self) -> int:
        return int(self.same.size)


class _TextTable:
    """Version 4, while a file is written: its texts (each distinct one once, UTF-8)
    and, per step in file order, the texts its prompt joins.

    A text that begins with most of a text of the previous step (a summary of the
    earlier steps that grows by a line each step) is stored as that text's number,
    the length of the shared start and the rest (:data:`_CODEC_PREFIX`), at most
    :data:`_PREFIX_CHAIN` such links from a text stored whole: a conversation's
    texts then cost what each step adds, not what it repeats.

    Raises (:meth:`add`):
        UnicodeEncodeError: a text holds a lone surrogate (no UTF-8 for it).
    """

    __slots__ = (
        "codecs",
        "counts",
        "depths",
        "ids",
        "refs",
        "relative",
        "responses",
        "separators",
        "texts",
    )

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.texts: list[bytes] = []
        #: Each text's codec (:data:`_CODEC_RAW` or :data:`_CODEC_PREFIX`; :meth:`compress`
        #: makes some :data:`_CODEC_ZSTD`).
        self.codecs: list[int] = []
        #: Each text's number of prefix links to a text stored whole (0: itself).
        self.depths: list[int] = []
        self.counts: list[int] = []
        self.refs: list[int] = []
        self.separators: list[int] = []
        self.responses: list[int] = []
        self.relative: list[bool] = []

    def add(self, text: str, earlier: Sequence[str] = ()) -> int:
        """The number of ``text`` (added when new; ``earlier``: texts of the previous
        step it may extend)."""
        number = self.ids.get(text)
        if number is not None:
            return number
        encoded = text.encode("utf-8")
        codec, depth = _CODEC_RAW, 0
        if len(encoded) >= _PREFIX_MIN:
            best, shared = -1, 0
            # ASCII text: it must start with at least its first half's characters
            half = text[: (len(text) + 1) // 2] if len(encoded) == len(text) else ""
            for other in earlier:
                base = self.ids.get(other)
                if base is None or self.depths[base] >= _PREFIX_CHAIN:
                    continue
                if half and not other.startswith(half):
                    continue  # cannot share half of it (the usual case: one comparison)
                k = _common_prefix(text, other)
                if k > shared:
                    best, shared = base, k
            if best >= 0:
                cut = len(text[:shared].encode("utf-8"))
                if cut >= _PREFIX_SHARE * len(encoded):
                    encoded = _PREFIX_HEAD.pack(best, cut) + encoded[cut:]
                    codec, depth = _CODEC_PREFIX, self.depths[best] + 1
        number = self.ids[text] = len(self.texts)
        self.texts.append(encoded)
        self.codecs.append(codec)
        self.depths.append(depth)
        return number

    def add_step(self, refs: Sequence[int], separator: int, response: int, relative: bool) -> None:
        """The next step's prompt: its texts (none: not split), separator, response text."""
        self.counts.append(len(refs))
        self.refs.extend(refs)
        self.separators.append(separator)
        self.responses.append(response)
        self.relative.append(bool(relative))

    def compress(self, level: int) -> None:
        """Store each text zstandard-compressed where that makes it at most
        :data:`TEXT_COMPRESSION_RATIO` of its size (else as it is: a sample reads it
        without a decompression). Texts under :data:`_TEXT_COMPRESS_MIN` bytes stay as
        they are. A file's texts tend to be alike: when a probe of them (about
        :data:`_TEXT_PROBE`, evenly spread) finds fewer than one in ten that halves, the
        others are not tried (compressing every text costs a write about as much as the
        rest of the file's encoding). Many texts are compressed by zstandard's own
        threads."""
        codecs = self.codecs
        todo = [
            i
            for i, t in enumerate(self.texts)
            if len(t) >= _TEXT_COMPRESS_MIN and codecs[i] == _CODEC_RAW
        ]
        if len(todo) >= 2 * _TEXT_PROBE:
            every = len(todo) // _TEXT_PROBE
            probe = todo[::every]
            if 10 * self._compress(probe, level) < len(probe):
                return
            todo = [i for k, i in enumerate(todo) if k % every]
        self._compress(todo, level)

    def _compress(self, todo: Sequence[int], level: int) -> int:
        """Compress texts ``todo`` where that halves them; returns how many it did."""
        if not todo:
            return 0
        raw = [self.texts[i] for i in todo]
        packed = _compress_each(raw, level)
        done = 0
        for i, text, small in zip(todo, raw, packed, strict=True):
            if len(small) <= TEXT_COMPRESSION_RATIO * len(text):
                self.texts[i] = small
                self.codecs[i] = _CODEC_ZSTD
                done += 1
        return done

    def index(self) -> dict[str, NDArray[Any]]:
        """The header arrays (name -> array in its stored dtype), in
        :data:`_PROMPT_ARRAYS` order."""
        codecs = self.codecs
        return {
            "text_lengths": np.array([len(t) for t in self.texts], dtype="<i4"),
            "text_crc32c": np.array(list(map(_crc32c_function(), self.texts)), dtype="<u4"),
            "text_codec": np.array(codecs, dtype="u1"),
            "prompt_counts": np.array(self.counts, dtype="<i4"),
            "prompt_refs": np.array(self.refs, dtype="<i4"),
            "prompt_separators": np.array(self.separators, dtype="u1"),
            "prompt_responses": np.array(self.responses, dtype="<i4"),
            "prompt_relative": np.array(self.relative, dtype="u1"),
        }


def _common_prefix(a: str, b: str) -> int:
    """The length of the longest common start of ``a`` and ``b`` (a binary search of
    ``startswith``: O(log n) C comparisons, not a Python loop over characters)."""
    if a[:16] != b[:16]:
        return 0
    lo, hi = 16 if len(a) >= 16 and len(b) >= 16 else 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a.startswith(b[lo:mid], lo):
            lo = mid
        else:
            hi = mid - 1
    return lo


#: Version 4 header arrays and their stored dtypes; ``prompt_index_crc32`` is the CRC32
#: of their bytes, in this order.
_PROMPT_ARRAYS = (
    ("text_lengths", "<i4"),
    ("text_crc32c", "<u4"),
    ("text_codec", "u1"),
    ("prompt_counts", "<i4"),
    ("prompt_refs", "<i4"),
    ("prompt_separators", "u1"),
    ("prompt_responses", "<i4"),
    ("prompt_relative", "u1"),
)


def _prompt_index_crc(arrays: Mapping[str, NDArray[Any]]) -> int:
    crc = 0
    for name, dtype in _PROMPT_ARRAYS:
        crc = zlib.crc32(np.ascontiguousarray(arrays[name], dtype=dtype).tobytes(), crc)
    return crc


def _relative(image_path: Any, root: str, inside: str) -> Any:
    """A screenshot path relative to the storage root (``/``-separated) when it lies
    under it, else absolute; anything but a non-empty string as it is. ``root`` is the
    absolute root, ``inside`` the same ending with the path separator."""
    if not isinstance(image_path, str) or image_path == "":
        return image_path
    absolute = os.path.abspath(image_path)
    if absolute.startswith(inside):
        return absolute[len(inside) :].replace(os.sep, "/")
    return "." if absolute == root else absolute


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


def _step_lines(
    t: int, steps: Sequence[dict[str, Any]], relative_urls: Sequence[bool]
) -> list[bytes]:
    """Version 2 step lines: ``{"t", "s", "step"[, "relative_image_urls"]}``."""
    lines = []
    for s, d in enumerate(steps):
        line: dict[str, Any] = {"t": t, "s": s, "step": d}
        if relative_urls[s]:
            line[_RELATIVE_URLS] = True
        lines.append(_dumps(line, t, s) + b"\n")
    return lines


# [copy, dumps] of the compiled replaystore._jsoncopy, or [None, None]; resolved on first use
_KERNEL: list[Any] = []


def _json_kernel() -> list[Any]:
    """``[copy, dumps]`` of ``replaystore._jsoncopy`` (a deep copy of parsed JSON; the
    text :data:`_STEP_ENCODER` writes, or NotImplemented), or ``[None, None]`` (not
    compiled, or ``REPLAYSTORE_JSONCOPY=numpy``: Python's json does the work)."""
    if not _KERNEL:
        from replaystore._kernels import resolve_kernel

        try:
            from replaystore import _jsoncopy as module
        except ImportError:
            module = None
        kernel = resolve_kernel(
            module, None, env="REPLAYSTORE_JSONCOPY", argument="REPLAYSTORE_JSONCOPY"
        )
        _KERNEL[:] = [None, None] if kernel is None else [kernel.copy, kernel.dumps]
    return _KERNEL


def _json_copy() -> Any:
    return _json_kernel()[0]


def _split_prompt(prompt: str, known: dict[str, list[str]]) -> tuple[int, list[str]] | None:
    """``(layout, message texts)`` with ``prompt == opening + separator.join(texts) +
    closing`` exactly for that layout of :data:`_PROMPT_LAYOUTS` (the texts are slices of
    ``prompt``), or None (not written as a JSON list of objects in one of those layouts:
    then the prompt is stored as it is).

    Every text but the last is one JSON object (parsed here, or found in ``known``);
    the last, found as the first text after which no text starts with the same key
    (``{"role"``), is the rest of the prompt, not parsed: a reader that finds it is
    not one JSON value falls back to parsing the joined prompt, as before (same
    result, same error). ``known`` indexes texts already parsed by their first characters: one
    found again at the same place is taken without parsing (a JSON object ends where
    its text ends, so the slice is the same value); new ones are added.
    """
    if prompt.startswith("[{"):
        layouts: tuple[int, ...] = (0, 1)  # which one: the first gap between messages says
    elif prompt.startswith("[\n  {"):
        layouts = (2,)
    elif prompt.startswith("[\n    {"):
        layouts = (3,)
    else:
        return None
    opening, _, closing = _PROMPT_LAYOUTS[layouts[0]]
    if not prompt.endswith("}" + closing) or not prompt.startswith(opening + "{"):
        return None
    parts: list[str] = []
    layout = -1 if len(layouts) > 1 else layouts[0]
    seen_gap = False
    last = len(prompt) - len(closing)
    i = len(opening)
    while True:
        text = None
        for seen in known.get(prompt[i : i + _KNOWN_KEY], ()):
            if prompt.startswith(seen, i):
                text = seen  # the same text object: its hash is made already
                break
        if text is None and seen_gap:
            # No later text starts like this message (its first key): this is the last
            # message, the rest of the prompt.
            quote = prompt.find('"', i + 1)
            first_key = prompt[i : prompt.find('"', quote + 1) + 1]
            if quote < 0 or prompt.find(_PROMPT_LAYOUTS[layout][1] + first_key, i) < 0:
                text = prompt[i:last]
        if text is None:
            try:
                value, end = _SCAN(prompt, i)
            except ValueError:
                return None
            if not isinstance(value, dict):
                return None
            text = prompt[i:end]
            texts = known.setdefault(prompt[i : i + _KNOWN_KEY], [])
            texts.insert(0, text)
            del texts[_KNOWN_PER_KEY:]
        parts.append(text)
        end = i + len(text)
        if end == last:
            return max(layout, 0), parts
        if layout < 0:  # a compact list: ", " or ","
            if prompt.startswith(", {", end):
                layout = 0
            elif prompt.startswith(",{", end):
                layout = 1
            else:
                return None
        separator = _PROMPT_LAYOUTS[layout][1]
        if not prompt.startswith(separator + "{", end):
            return None
        seen_gap = True
        i = end + len(separator)


def _join_prompt(layout: int, parts: Sequence[str]) -> str:
    opening, separator, closing = _PROMPT_LAYOUTS[layout]
    return opening + separator.join(parts) + closing


def _frame_of(
    t: int,
    steps: Sequence[dict[str, Any]],
    relative_urls: Sequence[bool],
    known: dict[str, list[str]],
    table: _TextTable | None = None,
) -> tuple[bytes, NDArray[np.uint32], int]:
    """Version 3: ``(frame, CRC32 of each step's two lines, shared message count)``.

    The frame is UTF-8 text lines: first the trajectory's distinct prompt messages
    (each the exact JSON text it had in its prompt, in order of first use), then
    per step a head line and a step line. The head line is ``{"s": step}``, plus
    ``"u": true`` when the prompt's image URLs are relative to the storage root,
    and, when the prompt was split into shared messages, ``"p": separator, "m":
    [message numbers], "r": raw_response``; the step line is the step's dict, with
    ``raw_prompt`` and ``raw_response`` then left empty (they live in the head).
    ``known``: see :func:`_split_prompt`. ``steps`` are the caller's own dicts: the
    responses of split prompts are emptied in place.

    Version 4 (``table`` given): the messages and the response's JSON text go to the
    file's ``table`` (its numbers in the head: ``"m"``, and ``"x"`` instead of
    ``"r"``), each step's references are appended to it, and the frame holds only
    the head and step lines (message count 0).
    """
    ids: dict[str, int] = {}
    previous: Sequence[str] = ()  # version 4: the texts of the last split prompt
    message_lines: list[bytes] = []
    body: list[bytes] = []
    crcs: list[int] = []
    encode = _STEP_ENCODER.encode
    dumps = _json_kernel()[1]
    for s, d in enumerate(steps):
        url = ',"u":true' if relative_urls[s] else ""
        response = d.get("response")
        prompt = response.get("raw_prompt") if type(response) is dict else None
        split = _split_prompt(prompt, known) if type(prompt) is str and prompt else None
        try:
            if split is not None:
                separator, parts = split
                reply = response["raw_response"]  # type: ignore[index]
                # what encode gives for a string, without JSONEncoder.encode's own checks
                reply = _encode_text(reply) if type(reply) is str else encode(reply)
                if table is not None:
                    refs = [table.add(part, previous) for part in parts]
                    previous = parts
                    answer = table.add(reply)
                    table.add_step(refs, separator, answer, relative_urls[s])
                    numbers = ",".join(map(str, refs))
                    head = f'{{"s":{s}{url},"p":{separator},"m":[{numbers}],"x":{answer}}}\n'
                else:
                    numbers_list = []
                    for part in parts:
                        number = ids.get(part)
                        if number is None:
                            number = ids[part] = len(ids)
                            message_lines.append(part.encode("utf-8") + b"\n")
                        numbers_list.append(str(number))
                    numbers = ",".join(numbers_list)
                    head = f'{{"s":{s}{url},"p":{separator},"m":[{numbers}],"r":{reply}}}\n'
                # the caller's dicts are its own copies: the two texts live elsewhere now
                response["raw_prompt"] = response["raw_response"] = ""  # type: ignore[index]
            else:
                head = f'{{"s":{s}{url}}}\n'
                if table is not None:
                    table.add_step((), _NOT_SPLIT, -1, relative_urls[s])
            line = dumps(d) if dumps is not None else NotImplemented
            if line is NotImplemented:
                line = encode(d)
            head_line = head.encode("utf-8")
            step_line = (line + "\n").encode("utf-8")
        except (TypeError, ValueError) as exc:  # UnicodeEncodeError: a lone surrogate
            raise TrajectoryError(
                f"trajectory {t} step {s} cannot be stored as JSON: {exc}"
            ) from None
        crcs.append(zlib.crc32(step_line, zlib.crc32(head_line)))
        body.append(head_line)
        body.append(step_line)
    return b"".join(message_lines + body), np.array(crcs, dtype=np.uint32), len(ids)


_ZSTD = threading.local()


def _zstd_compressor(level: int) -> Any:
    """This thread's zstandard compressor for ``level`` (they are not thread-safe)."""
    cache = getattr(_ZSTD, "compressors", None)
    if cache is None:
        cache = _ZSTD.compressors = {}
    compressor = cache.get(level)
    if compressor is None:
        compressor = cache[level] = zstandard.ZstdCompressor(
            level=level, write_checksum=False, write_content_size=True
        )
    return compressor


def _compress_each(raw: Sequence[bytes], level: int) -> list[bytes]:
    """Each of ``raw`` as one zstandard frame. From :data:`_PARALLEL_BYTES` in all they
    are compressed by zstandard's own threads (the same bytes as one at a time)."""
    compressor = _zstd_compressor(level)
    threads = min(_COMPRESS_THREADS, os.cpu_count() or 1)
    if threads > 1 and len(raw) > 1 and sum(map(len, raw)) >= _PARALLEL_BYTES:
        try:
            batch = compressor.multi_compress_to_buffer(list(raw), threads=threads)
            return [batch[i].tobytes() for i in range(len(raw))]
        except (AttributeError, NotImplementedError):  # a zstandard backend without it
            pass
    return [compressor.compress(data) for data in raw]


def _zstd_decompress(data: bytes) -> bytes:
    decompressor = getattr(_ZSTD, "decompressor", None)
    if decompressor is None:
        decompressor = _ZSTD.decompressor = zstandard.ZstdDecompressor()
    return bytes(decompressor.decompress(data))


def _renumber(raw: bytes, t: int, where: str) -> bytes:
    try:
        record = json.loads(raw)
        record["t"] = t
    except (json.JSONDecodeError, UnicodeDecodeError, TypeError) as exc:
        raise StorageError(f"{where}: malformed step line ({exc})") from None
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"


def _frame_table(
    headers: Sequence[_Header], parts: Sequence[tuple[Any, ...] | None]
) -> _Frames | None:
    """Per trajectory (all files, in order): where its version 3 frame is; None
    when no file is version 3. Trajectories of older files get length 0."""
    if all(part is None for part in parts):
        return None
    columns: list[list[NDArray[Any]]] = [[], [], [], [], [], []]
    for h, part in zip(headers, parts, strict=True):
        n = int(h.lengths.size)
        if part is None:
            part = tuple(np.zeros(n, dtype=np.int64) for _ in range(5))
        for column, values in zip(columns, (*part, h.lengths), strict=True):
            column.append(np.asarray(values, dtype=np.int64))
    offset, length, crc, codec, messages, steps = (np.concatenate(c) for c in columns)
    return _Frames(
        offset,
        length,
        crc,
        codec.astype(np.uint8),
        messages.astype(np.int32),
        steps.astype(np.int32),
    )


@dataclass(slots=True)
class _Frames:
    """Version 3 frames by global trajectory number (see :func:`_frame_table`)."""

    offset: NDArray[np.int64]
    length: NDArray[np.int64]
    crc: NDArray[np.int64]
    codec: NDArray[np.uint8]
    messages: NDArray[np.int32]
    steps: NDArray[np.int32]


@dataclass(slots=True)
class _TextIndex:
    """Version 4: where a file's texts are: each one's byte offset in the file, length
    and CRC32; they end at byte ``end`` (the file's size)."""

    path: Path
    offsets: NDArray[np.int64]
    lengths: NDArray[np.int32]
    crc: NDArray[np.uint32]
    codec: NDArray[np.uint8]
    end: int


def _check_prompt_index(
    arrays: Mapping[str, NDArray[Any]], crc: Any, n_steps: int, path: Path, texts_start: int
) -> _TextIndex:
    """A version 4 header's prompt arrays checked against each other and their CRC32.

    Raises:
        StorageError: they fail their CRC32, have the wrong sizes, or refer to texts
            that do not exist.
    """
    where = str(path)
    if not isinstance(crc, int) or _prompt_index_crc(arrays) != crc:
        raise StorageError(
            f"{where}: its header's prompt index fails its CRC32 check (the file was changed "
            "or damaged after it was written)"
        )
    lengths = arrays["text_lengths"].astype(np.int64)
    codecs = arrays["text_codec"]
    counts = arrays["prompt_counts"].astype(np.int64)
    refs = arrays["prompt_refs"]
    separators = arrays["prompt_separators"]
    responses = arrays["prompt_responses"]
    n_texts = int(lengths.size)
    split = counts > 0
    ok = (
        arrays["text_crc32c"].size == n_texts
        and codecs.size == n_texts
        and (n_texts == 0 or int(codecs.max()) <= _CODEC_PREFIX)
        and all(arrays[k].size == n_steps for k in ("prompt_counts", "prompt_separators"))
        and all(arrays[k].size == n_steps for k in ("prompt_responses", "prompt_relative"))
        and (n_texts == 0 or int(lengths.min()) >= 0)
        and (n_steps == 0 or int(counts.min()) >= 0)
        and int(refs.size) == int(counts.sum())
        and (refs.size == 0 or (int(refs.min()) >= 0 and int(refs.max()) < n_texts))
        and bool(np.all(np.where(split, separators < len(_PROMPT_LAYOUTS), separators == 255)))
        and bool(np.all(np.where(split, (responses >= 0) & (responses < n_texts), responses < 0)))
    )
    if not ok:
        raise StorageError(f"{where}: its header's prompt index is inconsistent")
    offsets = texts_start + np.cumsum(lengths) - lengths
    return _TextIndex(
        path,
        offsets.astype(np.int64),
        lengths.astype(np.int32),
        arrays["text_crc32c"].astype(np.uint32),
        codecs.astype(np.uint8),
        texts_start + int(lengths.sum()),
    )


class _Texts:
    """Version 4: a file's texts, read through ``data`` (a memory map of the whole
    file: offsets are the file's), each checked against its CRC-32C when first read."""

    __slots__ = ("data", "index", "verified")

    def __init__(self, index: _TextIndex, data: Any, verified: Any = None) -> None:
        self.index = index
        self.data = data
        #: Per text, whether its check passed: a view of a buffer's table of all its
        #: files' texts when given (one record whichever path reads a text), else own.
        self.verified = bytearray(int(index.lengths.size)) if verified is None else verified

    @classmethod
    def mapped(cls, index: _TextIndex, verified: Any = None) -> _Texts:
        """The texts read through a memory map of the file (pages read when touched);
        ``verified``: see :attr:`verified`.

        Raises:
            FileNotFoundError: the file is gone.
            StorageError: its size is not what its header says (or it is empty).
        """
        with open(index.path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size != index.end or size == 0:
                raise StorageError(
                    f"{index.path} changed after the buffer was opened ({size} bytes, its "
                    f"header says {index.end}); reopen the buffer"
                )
            data = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        return cls(index, data, verified)

    def raw(self, i: int) -> bytes:
        """Text ``i``'s bytes (decompressed), checked.

        Raises:
            IndexError: no text ``i``.
            StorageError: it fails its CRC32 check, or does not decompress.
        """
        if i < 0:
            raise IndexError(f"text number {i} is negative")
        index = self.index
        start = int(index.offsets[i])
        raw = self.data[start : start + int(index.lengths[i])]
        if not self.verified[i]:
            if _crc32c(raw) != int(index.crc[i]):
                raise StorageError(
                    f"{index.path}: text {i} fails its CRC-32C check (the file was changed or "
                    "damaged after it was written)"
                )
            self.verified[i] = 1
        codec = index.codec[i]
        if codec == _CODEC_ZSTD:
            return _text_decompress(raw, index.path, i)
        if codec == _CODEC_PREFIX:
            return _text_extend(raw, index.path, i, self.raw)
        return raw

    def text(self, i: int) -> str:
        """Text ``i`` decoded (see :meth:`raw`; StorageError when it is not UTF-8)."""
        try:
            return self.raw(i).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise StorageError(f"{self.index.path}: text {i} is not UTF-8 ({exc})") from None


def _text_extend(raw: bytes, path: Path, i: int, read: Any) -> bytes:
    """A version 4 prefix link (text ``i`` of ``path``, as stored) made whole:
    ``read(base)[:shared] + rest``, ``read`` giving a text of the same file by number.

    Raises:
        StorageError: the link is malformed (its base is not an earlier text, or is
            shorter than the shared length).
    """
    if len(raw) < _PREFIX_HEAD.size:
        raise StorageError(f"{path}: text {i} is a malformed prefix link")
    base, shared = _PREFIX_HEAD.unpack_from(raw)
    if base >= i:
        raise StorageError(f"{path}: text {i} links to text {base}, not an earlier one")
    whole = read(base)
    if len(whole) < shared:
        raise StorageError(f"{path}: text {i} shares {shared} bytes of a shorter text")
    return whole[:shared] + raw[_PREFIX_HEAD.size :]


def _text_decompress(raw: bytes, path: Path, i: int) -> bytes:
    """A compressed version 4 text, decompressed.

    Raises:
        StorageError: it does not decompress.
    """
    try:
        return _zstd_decompress(raw)
    except zstandard.ZstdError as exc:
        raise StorageError(f"{path}: text {i} does not decompress ({exc})") from None


def _check_frames(
    file: IterationFile,
    body_start: int,
    frame_lengths: NDArray[np.int64],
    frame_crc: NDArray[np.int64],
    texts: _TextIndex | None = None,
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
            if _crc32c(handle.read(int(texts.lengths[-1]))) != int(texts.crc[-1]):
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


def _read_frame(
    path: str | Path, offset: int, length: int, crc: int, codec: int, where: str
) -> bytes:
    """The decoded bytes of one version 3 frame, checked against its CRC32.

    Raises:
        FileNotFoundError: the file is gone.
        StorageError: the frame is short, fails its checksum or does not decode.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        raw = os.pread(fd, length, offset)
    finally:
        os.close(fd)
    return _decode_frame(raw, length, crc, codec, where)


def _decode_frame(raw: bytes, length: int, crc: int, codec: int, where: str) -> bytes:
    """A frame as read (``raw``) checked against its length and CRC32, decoded."""
    if len(raw) != length or zlib.crc32(raw) != crc:
        raise StorageError(
            f"{where}: its frame fails its CRC32 check (the file was changed or damaged "
            "after it was written)"
        )
    if codec == _CODEC_RAW:
        return raw
    try:
        return _zstd_decompress(raw)
    except zstandard.ZstdError as exc:
        raise StorageError(f"{where}: its frame does not decompress ({exc})") from None


class _Frame:
    """A decoded version 3 frame: its shared messages, then two lines per step.

    Lines are found by their newlines once (:func:`_split_frame`) and copied out only
    when read; a message is decoded to text when first asked (:meth:`message`), a
    step's head parsed once its checksum passes (:func:`_frame_head`).
    """

    __slots__ = (
        "data",
        "ends",
        "file_texts",
        "heads",
        "n_messages",
        "samples",
        "size",
        "texts",
        "where",
    )

    def __init__(
        self,
        data: bytes,
        ends: list[int],
        n_messages: int,
        n_steps: int,
        where: str,
        file_texts: _Texts | None = None,
    ):
        self.data = data
        #: Version 4: the file's texts, which the heads' message numbers refer to.
        self.file_texts = file_texts
        #: The position of each line's newline in ``data``.
        self.ends = ends
        self.n_messages = n_messages
        #: Each message's text once decoded, else None.
        self.texts: list[str | None] = [None] * n_messages
        #: Each step's head once parsed (its checksum verified), else None.
        self.heads: list[dict[str, Any] | None] = [None] * n_steps
        #: Decoded bytes (what the frame costs in a cache).
        self.size = len(data)
        #: Per step, once asked: ``(parsed messages, raw_response)`` of its split prompt
        #: (shared, never handed out: callers get copies), or False (read the step).
        self.samples: list[tuple[list[Any], Any] | bool | None] | None = None
        self.where = where

    def line(self, k: int) -> bytes:
        """Line ``k`` of the frame, without its newline."""
        return self.data[self.ends[k - 1] + 1 if k else 0 : self.ends[k]]

    def step_line(self, s: int) -> bytes:
        """Step ``s``'s step line (its dict as stored), without its newline."""
        return self.line(self.n_messages + 2 * s + 1)

    def message(self, i: int) -> str:
        """Shared message ``i``'s exact JSON text.

        Raises:
            IndexError: no message ``i``.
            StorageError: the message is not UTF-8.
        """
        if i < 0:
            raise IndexError(f"message number {i} is negative")
        if self.file_texts is not None:
            return self.file_texts.text(i)
        text = self.texts[i]
        if text is None:
            try:
                text = self.texts[i] = self.line(i).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise StorageError(f"{self.where}: malformed prompt message ({exc})") from None
        return text

    @property
    def messages(self) -> list[str]:
        """Every shared message's text (decoded now)."""
        return [self.message(i) for i in range(self.n_messages)]

    @property
    def lines(self) -> list[bytes]:
        """Every step's two lines (head, step), without their newlines."""
        return [self.line(k) for k in range(self.n_messages, len(self.ends))]


def _split_frame(
    data: bytes, n_messages: int, n_steps: int, where: str, texts: _Texts | None = None
) -> _Frame:
    """A frame's lines found (one scan for newlines), checked against its header's counts.

    Raises:
        StorageError: the frame does not hold ``n_messages + 2 * n_steps`` lines.
    """
    ends = []
    find = data.find
    i = find(b"\n")
    while i >= 0:
        ends.append(i)
        i = find(b"\n", i + 1)
    expected = n_messages + 2 * n_steps
    if len(ends) != expected or (ends[-1] if ends else -1) != len(data) - 1:
        raise StorageError(
            f"{where}: its frame holds {len(ends)} lines, its header says "
            f"{n_messages} messages and {n_steps} steps"
        )
    return _Frame(data, ends, n_messages, n_steps, where, texts)


def _loads(text: str) -> Any:
    """``json.loads(text)``, without its wrapper's calls and whitespace scans when the
    text is exactly one JSON value (what the writer stores); anything else goes through
    ``json.loads`` (the same value or the same error)."""
    try:
        value, end = _SCAN_ONCE(text, 0)
    except StopIteration:
        return json.loads(text)
    return value if end == len(text) else json.loads(text)


# [module] of the compiled replaystore._texts, or [None]; resolved on first use
_TEXTS_KERNEL: list[Any] = []


def _texts_kernel() -> Any:
    """``replaystore._texts`` (CRC-32C and batch gathers of format 4 texts), or None
    (not compiled, or ``REPLAYSTORE_TEXTS=numpy``: google-crc32c and Python slices)."""
    if not _TEXTS_KERNEL:
        from replaystore._kernels import resolve_kernel

        try:
            from replaystore import _texts as module
        except ImportError:
            module = None
        kernel = resolve_kernel(module, None, env="REPLAYSTORE_TEXTS", argument="REPLAYSTORE_TEXTS")
        _TEXTS_KERNEL[:] = [kernel]
    return _TEXTS_KERNEL[0]


def _crc32c_function() -> Any:
    """The CRC-32C function :func:`_crc32c` calls (for loops over many texts)."""
    kernel = _texts_kernel()
    return kernel.crc32c if kernel is not None else _google_crc32c


def _crc32c(data: bytes | memoryview) -> int:
    """The CRC-32C of ``data`` (the compiled kernel's, else google-crc32c's: the same)."""
    kernel = _texts_kernel()
    if kernel is not None:
        return int(kernel.crc32c(data))
    return int(_google_crc32c(data))


_from_json: Any
try:  # pydantic-core's JSON parser: the same values as json.loads, ~3x faster on messages
    from pydantic_core import from_json as _from_json
except ImportError:  # pragma: no cover - a dependency; json.loads does the same work
    _from_json = None


def _loads_text(data: bytes | str) -> Any:
    """``json.loads(data)`` for one stored JSON text (UTF-8 bytes or str).

    pydantic-core parses it where it can (it gives the values ``json.loads`` gives,
    tested in tests/trajectories); anything it refuses (a lone surrogate escape,
    trailing text, bad UTF-8) goes to ``json.loads``, whose value or error decides.

    Raises:
        ValueError: not one JSON value (``json.JSONDecodeError``, ``UnicodeDecodeError``).
    """
    if _from_json is not None:
        try:
            return _from_json(data)
        except ValueError:
            pass
    return json.loads(data)


class _Damaged(Exception):
    """A step of a frame fails its checks (the caller names the step)."""


def _frame_head(frame: _Frame, s: int, crc: int) -> dict[str, Any]:
    """Step ``s``'s head, parsed once its two lines pass their checksum.

    Raises:
        _Damaged: the checksum fails or the head is malformed.
        IndexError: no step ``s``.
    """
    if s < 0:
        raise IndexError(f"step {s} is negative")
    head = frame.heads[s]
    if head is not None:
        return head
    k = frame.n_messages + 2 * s
    ends = frame.ends
    start = ends[k - 1] + 1 if k else 0
    if crc != _NO_CRC and zlib.crc32(memoryview(frame.data)[start : ends[k + 1] + 1]) != crc:
        raise _Damaged(
            "step fails its CRC32 check (the file was changed or damaged after it was written)"
        )
    try:
        head = _loads(frame.data[start : ends[k]].decode("utf-8"))
        if not isinstance(head, dict) or int(head["s"]) != s:
            raise ValueError(f"head line names step {head.get('s')!r}, expected {s}")
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError) as exc:
        raise _Damaged(f"malformed step head ({exc})") from None
    frame.heads[s] = head
    return head


def _checked_head(frame: _Frame, s: int, crc: int, where: str) -> tuple[dict[str, Any], bytes]:
    """:func:`_frame_head` and the step line, a failure a :class:`StorageError` at ``where``."""
    try:
        return _frame_head(frame, s, crc), frame.step_line(s)
    except _Damaged as exc:
        raise StorageError(f"{where}: {exc}") from None


def _head_prompt(frame: _Frame, head: Mapping[str, Any]) -> str:
    """The exact stored prompt text of a split prompt (URLs still relative)."""
    return _join_prompt(int(head["p"]), [frame.message(i) for i in head["m"]])


# What a malformed stored step raises while it is decoded (JSONDecodeError and
# UnicodeDecodeError are ValueErrors).
_STEP_ERRORS = (KeyError, IndexError, TypeError, ValueError)


def _frame_step_dict(frame: _Frame, head: Mapping[str, Any], step_raw: bytes, where: str) -> Any:
    """A version 3-4 step (checked by :func:`_frame_head`) as its stored dict: the split
    prompt and its response joined back in, image URLs as stored.

    Raises:
        StorageError: the step or its texts are malformed (named by ``where``).
    """
    try:
        data = json.loads(step_raw)
        if "p" in head:
            response = data["response"]
            response["raw_prompt"] = _head_prompt(frame, head)
            response["raw_response"] = _head_response(frame, head)
    except _STEP_ERRORS as exc:
        raise StorageError(f"{where}: malformed step ({exc})") from None
    return data


def _head_response(frame: _Frame, head: Mapping[str, Any]) -> Any:
    """The ``raw_response`` of a split prompt's step: in its head (version 3), or the
    file's text its head names (version 4).

    Raises:
        KeyError, IndexError, ValueError: the head names no response or a bad one.
        StorageError: the text fails its checks.
    """
    if "r" in head:
        return head["r"]
    if frame.file_texts is None:
        raise KeyError("r")
    return _loads(frame.file_texts.text(int(head["x"])))


class _FileSource:
    """Reads one step (or a step's history) from its iteration file on access.

    Version 1-2 steps: one seek and one line. Version 3 steps: their trajectory's
    frame, decoded once and kept while the decoded frames stay under
    :data:`FRAME_CACHE_BYTES`; the messages of split prompts are parsed once per
    distinct text and copied out (:meth:`sample_parts`).
    """

    __slots__ = (
        "_cache",
        "_cached_bytes",
        "_copy",
        "_file_texts",
        "_first_text",
        "_message_chars",
        "_messages",
        "_mixed",
        "_parsed",
        "_parsed_chars",
        "_paths",
        "_prompts",
        "_root_url",
        "crcs",
        "file_of_step",
        "files",
        "frames",
        "offsets",
        "storage",
        "traj_file",
        "traj_local",
    )

    #: Decoded bytes of the frames kept (the most recently used).
    FRAME_CACHE_BYTES = 64 * 2**20
    #: Characters of parsed prompt messages kept (by their text) before the cache is
    #: cleared (parsed, a message takes a few times its text).
    MESSAGE_CACHE_CHARS = 16 * 2**20

    def __init__(
        self,
        storage: TrajectoryStorage,
        files: list[Path],
        file_of_step: NDArray[np.int32],
        offsets: NDArray[np.int64],
        traj_file: NDArray[np.int32],
        traj_local: NDArray[np.int32],
        crcs: NDArray[np.int64],
        frames: _Frames | None = None,
        texts: Sequence[_TextIndex | None] = (),
        prompts: _Prompts | None = None,
    ) -> None:
        self.storage = storage
        self.crcs = crcs  # CRC32 per indexed step; _NO_CRC for version 1 files
        self.files = files
        self._paths = [str(path) for path in files]
        self.file_of_step = file_of_step
        self.offsets = offsets  # byte offset of each step line; -1 for version 3 steps
        self.traj_file = traj_file
        self.traj_local = traj_local
        self.frames = frames
        self._cache: OrderedDict[int, _Frame] = OrderedDict()
        self._cached_bytes = 0
        # parsed messages by text: (plain, relative URLs resolved)
        self._messages: tuple[dict[str, Any], dict[str, Any]] = ({}, {})
        self._message_chars = 0
        self._copy = _json_copy()
        # whether some steps are version 1-2 lines (their offsets are >= 0)
        self._mixed = bool(offsets.size) and bool(offsets.max() >= 0)
        self._root_url = root_url(storage.root)
        # version 4: each file's text index, and its texts once read (memory-mapped)
        self._file_texts: list[_TextIndex | _Texts | None] = list(texts) or [None] * len(files)
        self._prompts = prompts
        # version 4: the global number of each file's first text
        first, self._first_text = 0, []
        for t in self._file_texts:
            self._first_text.append(first)
            first += 0 if t is None else int(t.lengths.size)  # type: ignore[union-attr]
        # version 4: parsed texts that several steps share, by 2 * text + relative URLs
        self._parsed: dict[int, Any] = {}
        self._parsed_chars = 0

    def __getstate__(self) -> dict[str, Any]:
        # What a copy in another process needs: no decoded frames, parsed texts or
        # memory maps (each process maps the files itself, on first use).
        state = {name: getattr(self, name) for name in self.__slots__}
        state["_cache"] = OrderedDict()
        state["_cached_bytes"] = 0
        state["_messages"] = ({}, {})
        state["_message_chars"] = 0
        state["_parsed"] = {}
        state["_parsed_chars"] = 0
        state["_file_texts"] = [t.index if isinstance(t, _Texts) else t for t in self._file_texts]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            setattr(self, name, value)

    def trajectory_sequence(self) -> _StoredTrajectories:
        """Every trajectory of the indexed files (dummies included), read on access."""
        return _StoredTrajectories(self)

    def describe(self, traj: int, step: int) -> str:
        path = self.files[int(self.traj_file[traj])]
        return f"trajectory {traj} step {step} (trajectory {int(self.traj_local[traj])} of {path})"

    def _removed(self, path: Path) -> StorageError:
        return StorageError(
            f"{path} was removed after the buffer was opened (cleanup_old_iterations "
            "or merge_ranks); reopen the buffer"
        )

    def _frame(self, traj: int) -> _Frame:
        frame = self._cache.get(traj)
        if frame is not None:
            self._cache.move_to_end(traj)
            return frame
        frames = self.frames
        assert frames is not None
        file_id = int(self.traj_file[traj])
        path = self.files[file_id]
        where = f"trajectory {traj} (trajectory {int(self.traj_local[traj])} of {path})"
        try:
            data = _read_frame(
                self._paths[file_id],
                int(frames.offset[traj]),
                int(frames.length[traj]),
                int(frames.crc[traj]),
                int(frames.codec[traj]),
                where,
            )
        except FileNotFoundError:
            raise self._removed(path) from None
        frame = _split_frame(
            data,
            int(frames.messages[traj]),
            int(frames.steps[traj]),
            where,
            self._texts_of(file_id),
        )
        self._cache[traj] = frame
        self._cached_bytes += frame.size
        while self._cached_bytes > self.FRAME_CACHE_BYTES and len(self._cache) > 1:
            self._cached_bytes -= self._cache.popitem(last=False)[1].size
        return frame

    def _texts_of(self, file_id: int) -> _Texts | None:
        """File ``file_id``'s texts (version 4; memory-mapped on first use), else None."""
        texts = self._file_texts[file_id]
        if texts is None or isinstance(texts, _Texts):
            return texts
        verified = None
        if self._prompts is not None:  # one record of checked texts for both read paths
            first = self._first_text[file_id]
            verified = memoryview(self._prompts.verified)[first : first + int(texts.lengths.size)]
        try:
            mapped = _Texts.mapped(texts, verified)
        except FileNotFoundError:
            raise self._removed(self.files[file_id]) from None
        self._file_texts[file_id] = mapped
        return mapped

    def _read(self, pos: int, count: int, traj: int, step: int) -> list[dict[str, Any]]:
        # ``count`` steps ending at step number ``step``, the first at position ``pos``.
        path = self.files[int(self.file_of_step[pos])]
        first = step - count + 1
        out = []
        if int(self.offsets[pos]) < 0:  # version 3: from the trajectory's frame
            frame = self._frame(traj)
            for i in range(count):
                where = self.describe(traj, first + i)
                head, step_raw = _checked_head(frame, first + i, int(self.crcs[pos + i]), where)
                out.append(self.storage._decode_frame_step(frame, head, step_raw, where))
            return out
        try:
            with open(path, "rb") as handle:
                handle.seek(int(self.offsets[pos]))
                lines = [handle.readline() for _ in range(count)]
        except FileNotFoundError:
            raise self._removed(path) from None
        for i, line in enumerate(lines):
            where = self.describe(traj, first + i)
            t, s, mapping = self.storage._decode_line(line, where, int(self.crcs[pos + i]))
            if t != int(self.traj_local[traj]) or s != first + i:
                raise StorageError(f"{where}: the file changed after the buffer was opened")
            out.append(mapping)
        return out

    def step(self, pos: int, traj: int, step: int) -> dict[str, Any]:
        return self._read(pos, 1, traj, step)[0]

    def history(self, pos: int, traj: int, step: int) -> list[dict[str, Any]]:
        if step == 0:
            return []
        return self._read(pos - step, step, traj, step - 1)

    def sample_parts(self, pos: int, traj: int, step: int) -> tuple[list[Any], Any] | None:
        """``(prompt messages, raw_response)`` of a version 3 step whose prompt was split
        into shared messages, without building the step; None otherwise (then read the
        step). The messages equal ``json.loads`` of the step's ``raw_prompt`` (a new
        list of new dicts on every call), and are plain chat messages: a list of dicts,
        each with a string ``role`` and a ``content`` (any other prompt gives None, so
        the reader's own checks name what is wrong).

        Raises:
            StorageError: the frame or the step fails its checksum, or is malformed.
        """
        prompts = self._prompts
        if prompts is not None:
            count = prompts.counts[pos]
            if count >= 0:  # a version 4 step: from its file's texts alone
                return self._text_parts(prompts, pos, count, traj, step) if count else None
        if self._mixed and self.offsets[pos] >= 0:
            return None
        frame = self._cache.get(traj)
        if frame is None:
            frame = self._frame(traj)
        else:
            self._cache.move_to_end(traj)
        if frame.samples is None:
            frame.samples = [None] * len(frame.heads)
        parts = frame.samples[step]
        if parts is None:
            parts = frame.samples[step] = self._parse_sample(frame, pos, traj, step)
        if parts is False:
            return None
        messages, response = parts  # type: ignore[misc]
        copy = self._copy
        if copy is not None:
            copies = [copy(m) for m in messages]
            if NotImplemented not in copies:
                return copies, response
        return json.loads(json.dumps(messages)), response

    def sample_parts_many(self, positions: Sequence[int]) -> list[tuple[list[Any], Any] | None]:
        """:meth:`sample_parts` of many positions at once: for version 4 steps whose
        prompt is split and whose image URLs are as stored, the texts are found with
        array operations; those stored whole are checked and parsed straight from the
        memory maps by one call, the others read one by one. Anything else is None
        (read it with :meth:`sample_parts`, which also names any damage: a batch that
        meets a failed check or a text that is not one JSON value gives None for all
        its positions).
        """
        n = len(positions)
        prompts = self._prompts
        if prompts is None or n == 0:
            return [None] * n
        arrays = prompts.arrays
        pos = np.asarray(positions, dtype=np.int64)
        counts = arrays["counts"][pos].astype(np.int64)
        picked = np.flatnonzero((counts > 0) & (arrays["relative"][pos] == 0))
        if picked.size == 0:
            return [None] * n
        counts = counts[picked]
        width = counts + 1  # each sample's texts: its messages, then its response
        block = np.cumsum(width) - width
        total = int(width.sum())
        slots = np.arange(total) - np.repeat(block, width)  # the slot within its sample
        is_response = slots == np.repeat(counts, width)
        ids = np.repeat(arrays["responses"][pos[picked]], width)
        message_slots = np.flatnonzero(~is_response)
        ids[message_slots] = arrays["refs"][
            (np.repeat(arrays["starts"][pos[picked]], width) + slots)[message_slots]
        ]
        shared = arrays["shared"][ids].astype(bool)
        whole = (arrays["text_codec"][ids] == _CODEC_RAW) & ~shared
        values: list[Any] = [None] * total
        try:
            own = np.flatnonzero(whole)
            own_ids = ids[own]
            parsed: list[Any] = [None] * int(own.size)
            files = arrays["text_file"][own_ids]
            by_file = (
                [own_ids] if _all_equal(files) else [own_ids[files == f] for f in np.unique(files)]
            )
            for numbers in by_file:
                joined = self._joined_texts(prompts, numbers)
                if joined is None:
                    return [None] * n  # sample_parts names the damaged step
                values_of_file = (
                    _from_json(joined) if _from_json is not None else json.loads(joined)
                )
                if type(values_of_file) is not list or len(values_of_file) != numbers.size:
                    return [None] * n
                if len(by_file) == 1:
                    parsed = values_of_file
                else:
                    for k, value in zip(
                        np.flatnonzero(files == arrays["text_file"][numbers[0]]).tolist(),
                        values_of_file,
                        strict=True,
                    ):
                        parsed[k] = value
            # a message that is not a plain chat message: its sample reads its step
            invalid: list[int] = []
            for slot, value, response in zip(
                own.tolist(), parsed, is_response[own].tolist(), strict=True
            ):
                values[slot] = value
                if not response and (
                    type(value) is not dict
                    or type(value.get("role")) is not str
                    or "content" not in value
                ):
                    invalid.append(slot)
            # shared texts: each distinct one parsed once (cached), a copy per slot
            shared_slots = np.flatnonzero(shared)
            if shared_slots.size:
                copy = self._copy
                numbers = ids[shared_slots]
                order = np.argsort(numbers, kind="stable")
                distinct, first_at = np.unique(numbers[order], return_index=True)
                bounds = [*first_at.tolist(), int(order.size)]
                slot_list = shared_slots[order].tolist()
                for k, number in enumerate(distinct.tolist()):
                    template = self._shared_text(prompts, number, 0)
                    group = slot_list[bounds[k] : bounds[k + 1]]
                    if not _is_chat_message(template):
                        invalid.extend(slot for slot in group if not is_response[slot])
                    values[group[0]] = template
                    if type(template) is dict or type(template) is list:
                        for slot in group[1:]:
                            value = copy(template) if copy is not None else NotImplemented
                            if value is NotImplemented:
                                value = json.loads(json.dumps(template))
                            values[slot] = value
                    else:
                        for slot in group[1:]:
                            values[slot] = template
            for slot in np.flatnonzero(~whole & ~shared).tolist():
                value = values[slot] = self._own_text(prompts, int(ids[slot]))
                if not is_response[slot] and not _is_chat_message(value):
                    invalid.append(slot)
        except (ValueError, StorageError, IndexError):
            return [None] * n
        out: list[tuple[list[Any], Any] | None] = [None] * n
        for k, first, count in zip(picked.tolist(), block.tolist(), counts.tolist(), strict=True):
            end = first + count
            out[k] = (values[first:end], values[end])
        if invalid:  # those samples read their steps (sample_parts decides)
            for j in set(np.searchsorted(block, invalid, side="right") - 1):
                out[int(picked[j])] = None
        return out

    def _joined_texts(self, prompts: _Prompts, numbers: NDArray[np.int64]) -> bytes | None:
        """Texts ``numbers`` (stored whole, of one file) as one JSON array,
        ``[t0,t1,...]``, each checked against its CRC-32C on its first read; None when
        one fails its check."""
        arrays = prompts.arrays
        offsets = arrays["text_offset"][numbers]
        lengths = arrays["text_length"][numbers]
        verified = np.frombuffer(prompts.verified, dtype=np.uint8)
        unchecked = verified[numbers] == 0
        data = self._map_of(int(arrays["text_file"][numbers[0]])) if numbers.size else b""
        kernel = _texts_kernel()
        if kernel is not None:
            joined, bad = kernel.gather(
                data, offsets, lengths, arrays["text_crc"][numbers], unchecked
            )
            if bad >= 0:
                return None
        else:
            ends = (offsets + lengths).tolist()
            raws = [data[a:b] for a, b in zip(offsets.tolist(), ends, strict=True)]
            expected = arrays["text_crc"][numbers].tolist()
            for k in np.flatnonzero(unchecked).tolist():
                if _google_crc32c(raws[k]) != expected[k]:
                    return None
            joined = b"[" + b",".join(raws) + b"]"
        verified[numbers[unchecked]] = 1
        return joined

    def _map_of(self, file_id: int) -> Any:
        """File ``file_id``'s memory map (version 4; made on first use), else None."""
        texts = self._file_texts[file_id]
        if type(texts) is not _Texts:
            texts = self._texts_of(file_id)
        return None if texts is None else texts.data

    def _text_parts(
        self, prompts: _Prompts, pos: int, count: int, traj: int, step: int
    ) -> tuple[list[Any], Any] | None:
        """:meth:`sample_parts` of a version 4 step whose prompt joins ``count`` texts.

        The texts only one step reads (each step's own message and response) are parsed
        straight from the memory map, a new value each time (:meth:`_own_text`); shared
        ones (a system prompt, earlier turns) are parsed once and copied
        (:meth:`_shared_text`). This runs for every sample: few calls, no checks twice.
        """
        relative = prompts.relative[pos]
        start = prompts.starts[pos]
        shared = prompts.shared
        messages = []
        try:
            for number in prompts.refs[start : start + count]:
                if shared[number]:
                    message = self._shared_text(prompts, number, relative)
                elif relative:
                    message = self._parse_text(prompts, number, relative)
                else:
                    message = self._own_text(prompts, number)
                if (
                    type(message) is not dict
                    or type(message.get("role")) is not str
                    or "content" not in message
                ):
                    return None  # not a plain chat message: read the step
                messages.append(message)
            number = prompts.responses[pos]
            if shared[number]:
                return messages, self._shared_text(prompts, number, 0)
            return messages, self._own_text(prompts, number)
        except ValueError:  # a text that is not one JSON value: read (parse) the whole step
            return None
        except (StorageError, IndexError) as exc:
            raise StorageError(f"{self.describe(traj, step)}: {exc}") from None

    def _own_text(self, prompts: _Prompts, number: int) -> Any:
        """Text ``number`` parsed straight from its file's memory map (URLs as stored),
        checked against its CRC-32C on first read (a new value on every call).

        Raises:
            ValueError: not one JSON value. StorageError: see :meth:`_raw_text`.
        """
        return _loads_text(self._raw_text(prompts, number))

    def _raw_text(self, prompts: _Prompts, number: int) -> bytes:
        """Text ``number`` (of all files; made whole), checked against its CRC-32C once
        (:meth:`_Texts.raw` of its file).

        Raises:
            StorageError: it fails its check, or its file is gone.
        """
        file_id = prompts.text_file[number]
        texts = self._texts_of(file_id)
        assert texts is not None
        return texts.raw(number - self._first_text[file_id])

    def _parse_text(self, prompts: _Prompts, number: int, relative: int) -> Any:
        """Text ``number`` parsed (a new value on every call); ``relative``: resolve its
        image URLs against the storage root first.

        Raises:
            ValueError: not one JSON value. StorageError: see :meth:`_raw_text`.
        """
        raw = self._raw_text(prompts, number)
        if relative:
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise StorageError(f"a stored prompt text is not UTF-8 ({exc})") from None
            return _loads_text(resolve_prompt(text, self._root_url))
        return _loads_text(raw)

    def _shared_text(self, prompts: _Prompts, number: int, relative: int) -> Any:
        """A text several steps share: parsed once, a copy handed out.

        Raises:
            ValueError: not one JSON value. StorageError: see :meth:`_raw_text`.
        """
        key = 2 * number + (1 if relative else 0)
        parsed = self._parsed.get(key, _MISSING)
        if parsed is _MISSING:
            parsed = self._parse_text(prompts, number, relative)
            if self._parsed_chars > self.MESSAGE_CACHE_CHARS:
                self._parsed.clear()
                self._parsed_chars = 0
            self._parsed[key] = parsed
            self._parsed_chars += prompts.text_length[number]
        if type(parsed) is not dict and type(parsed) is not list:
            return parsed  # immutable
        copy = self._copy
        if copy is not None:
            copied = copy(parsed)
            if copied is not NotImplemented:
                return copied
        return json.loads(json.dumps(parsed))

    def _parse_sample(
        self, frame: _Frame, pos: int, traj: int, step: int
    ) -> tuple[list[Any], Any] | bool:
        """What :meth:`sample_parts` serves for a step, parsed once (False: read the step)."""
        try:
            head = _frame_head(frame, step, int(self.crcs[pos]))
            if "p" not in head:
                return False
            texts = [frame.message(i) for i in head["m"]]
            response = _head_response(frame, head)
        except (_Damaged, IndexError, KeyError, TypeError, ValueError) as exc:
            raise StorageError(f"{self.describe(traj, step)}: {exc}") from None
        relative = "u" in head
        try:
            messages = [self._message(text, relative) for text in texts]
        except ValueError:  # a text that is not one JSON value: parse the whole prompt
            return False
        for m in messages:
            if not _is_chat_message(m):
                return False
        return messages, response

    def _message(self, text: str, relative: bool) -> Any:
        """``json.loads`` of one stored message (its URLs resolved), shared by every step
        that holds the same text (never handed out).

        Raises:
            ValueError: ``text`` is not JSON.
        """
        cache = self._messages[relative]
        parsed = cache.get(text)
        if parsed is None:
            parsed = _loads(resolve_prompt(text, self._root_url) if relative else text)
            if self._message_chars > self.MESSAGE_CACHE_CHARS:
                self._messages = ({}, {})
                self._message_chars = 0
            self._messages[relative][text] = parsed
            self._message_chars += len(text)
        return parsed


_MISSING = object()


def _is_chat_message(value: Any) -> bool:
    """A plain chat message: a dict with a string ``role`` and a ``content``."""
    return type(value) is dict and type(value.get("role")) is str and "content" in value


class _Prompts:
    """Version 4, for a file-backed buffer: per indexed step how many texts its prompt
    joins (-1: not a version 4 step; 0: not split), where they start in ``refs``, its
    response's text and whether its image URLs are relative; per text of all files:
    its file, byte offset, length, CRC32, whether several steps read it, and whether
    it was checked. Each is a memoryview of a compact array (an item read is a plain
    int, several times cheaper than a NumPy scalar); pickled as the arrays."""

    __slots__ = (
        "arrays",
        "counts",
        "refs",
        "relative",
        "responses",
        "shared",
        "starts",
        "text_codec",
        "text_crc",
        "text_file",
        "text_length",
        "text_offset",
        "verified",
    )

    def __init__(self, arrays: dict[str, NDArray[Any]]) -> None:
        self.arrays = arrays
        self.counts = arrays["counts"].data
        self.starts = arrays["starts"].data
        self.responses = arrays["responses"].data
        self.relative = arrays["relative"].data
        self.refs = arrays["refs"].data
        self.text_file = arrays["text_file"].data
        self.text_offset = arrays["text_offset"].data
        self.text_length = arrays["text_length"].data
        self.text_crc = arrays["text_crc"].data
        self.text_codec = arrays["text_codec"].data
        self.shared = arrays["shared"].data
        self.verified = bytearray(len(arrays["text_crc"]))

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Prompts, (self.arrays,))


def _prompts_of(
    headers: Sequence[_Header], keeps: Sequence[NDArray[np.bool_]]
) -> tuple[_Prompts | None, list[_TextIndex | None]]:
    """The :class:`_Prompts` of the indexed steps (``keeps``: per file, which of its
    steps are indexed), None when no file is version 4; and each file's text index."""
    texts = [h.texts for h in headers]
    if all(t is None for t in texts):
        return None, texts
    counts: list[NDArray[Any]] = []
    starts: list[NDArray[Any]] = []
    responses: list[NDArray[Any]] = []
    relative: list[NDArray[Any]] = []
    refs: list[NDArray[Any]] = []
    text_file: list[NDArray[Any]] = []
    text_offset: list[NDArray[Any]] = []
    text_length: list[NDArray[Any]] = []
    text_crc: list[NDArray[Any]] = []
    text_codec: list[NDArray[Any]] = []
    text_base = ref_base = 0
    for file_id, (h, keep) in enumerate(zip(headers, keeps, strict=True)):
        if h.texts is None or h.prompt_counts is None:
            counts.append(np.full(int(keep.sum()), -1, dtype=np.int32))
            for part in (starts, responses):
                part.append(np.zeros(int(keep.sum()), dtype=np.int64))
            relative.append(np.zeros(int(keep.sum()), dtype=np.uint8))
            continue
        assert h.prompt_starts is not None and h.prompt_refs is not None
        assert h.prompt_responses is not None and h.prompt_relative is not None
        counts.append(h.prompt_counts[keep])
        starts.append(h.prompt_starts[keep] + ref_base)
        response = h.prompt_responses.astype(np.int64)
        responses.append(np.where(response >= 0, response + text_base, -1)[keep])
        relative.append(h.prompt_relative[keep].astype(np.uint8))
        refs.append(h.prompt_refs.astype(np.int64) + text_base)
        n_texts = int(h.texts.lengths.size)
        text_file.append(np.full(n_texts, file_id, dtype=np.int32))
        text_offset.append(h.texts.offsets)
        text_length.append(h.texts.lengths)
        text_crc.append(h.texts.crc)
        text_codec.append(h.texts.codec)
        text_base += n_texts
        ref_base += int(h.prompt_refs.size)
    all_refs = np.concatenate(refs) if refs else np.zeros(0, np.int64)
    # texts more than one step (or one step more than once) reads: parsed once, copied
    uses = np.bincount(all_refs, minlength=text_base) if text_base else np.zeros(0, np.int64)
    shared = (uses > 1).astype(np.uint8)

    def joined(parts: list[NDArray[Any]], dtype: Any) -> NDArray[Any]:
        out = np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)
        return np.ascontiguousarray(out)

    # the narrowest integers that hold them (a million steps: 4 bytes each, not 8)
    wide_refs = np.int32 if ref_base < 2**31 else np.int64
    wide_texts = np.int32 if text_base < 2**31 else np.int64
    prompts = _Prompts(
        {
            "counts": joined(counts, np.int32),
            "starts": joined(starts, wide_refs),
            "responses": joined(responses, wide_texts),
            "relative": joined(relative, np.uint8),
            "refs": joined([all_refs], np.int32),
            "text_file": joined(text_file, np.int32),
            "text_offset": joined(text_offset, np.int64),
            "text_length": joined(text_length, np.int32),
            "text_crc": joined(text_crc, np.uint32),
            "text_codec": joined(text_codec, np.uint8),
            "shared": shared,
        }
    )
    # each file's text index as views of the joined arrays (one copy in memory)
    arrays, first = prompts.arrays, 0
    for file_id, index in enumerate(texts):
        if index is None:
            continue
        end = first + int(index.lengths.size)
        texts[file_id] = _TextIndex(
            index.path,
            arrays["text_offset"][first:end],
            arrays["text_length"][first:end],
            arrays["text_crc"][first:end],
            arrays["text_codec"][first:end],
            index.end,
        )
        first = end
    return prompts, texts


def _all_equal(values: NDArray[Any]) -> bool:
    return values.size == 0 or bool((values == values[0]).all())


class _StoredTrajectories(Sequence[list[dict[str, Any]]]):
    """The trajectories behind a :class:`_FileSource`, read file by file on access.

    Trajectory ``t`` lives in file ``traj_file[t]`` at position ``traj_local[t]``;
    the last file read is kept, so iterating reads each file once.
    """

    def __init__(self, source: _FileSource) -> None:
        self._source = source
        self._cached: tuple[int, list[list[dict[str, Any]]]] | None = None

    def __len__(self) -> int:
        return int(self._source.traj_file.size)

    def _trajectories_of(self, file_id: int) -> list[list[dict[str, Any]]]:
        if self._cached is None or self._cached[0] != file_id:
            path = self._source.files[file_id]
            try:
                trajectories = self._source.storage.read_file(path)
            except FileNotFoundError:
                raise StorageError(
                    f"{path} was removed after the buffer was opened (cleanup_old_iterations "
                    "or merge_ranks); reopen the buffer"
                ) from None
            self._cached = (file_id, trajectories)
        return self._cached[1]

    @overload
    def __getitem__(self, index: int) -> list[dict[str, Any]]: ...

    @overload
    def __getitem__(self, index: slice) -> list[list[dict[str, Any]]]: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        n = len(self)
        i = operator.index(index)
        if i < -n or i >= n:
            raise IndexError(f"trajectory index {i} out of range for {n} trajectories")
        i %= n
        file_id = int(self._source.traj_file[i])
        return self._trajectories_of(file_id)[int(self._source.traj_local[i])]

    def __repr__(self) -> str:
        return f"<{len(self)} stored trajectories in {len(self._source.files)} files>"
