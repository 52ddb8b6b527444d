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
  character for character
  (:func:`~replaystore.trajectories.files.prompts.split_prompt`; compact lists, and
  WebGym's ``json.dumps(messages, indent=2, ensure_ascii=False)``). A file-backed
  buffer keeps decoded frames (up to 64 MiB) and parses each distinct message once
  (:meth:`~replaystore.trajectories.files.reader.FileSource.sample_parts`).
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

Code: this module holds :class:`TrajectoryStorage`; the file format lives in the
package :mod:`replaystore.trajectories.files` (naming, header, one codec module per
format version, the cached reader, writing, merging, statistics, the buffer index).

On save: page metadata is stripped to ``title`` and ``url`` (unless
``keep_page_metadata``); each trajectory's first step gets
``trajectory_metadata["keypoint_step_ids"]`` (the steps whose reward has
``submit``); a missing ``same_as_next_screenshot`` is computed from the
screenshots' pixels and stored (last steps: never same-as-next).
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from replaystore.atomic import fsync_dir
from replaystore.errors import ArgumentError, StorageError
from replaystore.formats.trajectory_header import FORMAT as FORMAT
from replaystore.formats.trajectory_header import READABLE_VERSIONS as READABLE_VERSIONS
from replaystore.formats.trajectory_header import VERSION as VERSION
from replaystore.formats.trajectory_header import WRITABLE_VERSIONS as WRITABLE_VERSIONS
from replaystore.formats.trajectory_header import Header, read_header, stats_of
from replaystore.trajectories.files.frames import COMPRESSION_LEVEL as COMPRESSION_LEVEL
from replaystore.trajectories.files.frames import NO_CRC
from replaystore.trajectories.files.index import build_step_index
from replaystore.trajectories.files.lines import decode_line
from replaystore.trajectories.files.load import (
    edge_records,
    read_trajectories,
    trajectory_steps,
)
from replaystore.trajectories.files.merge import reencode
from replaystore.trajectories.files.naming import (
    STALE_TEMP_AGE_S,
    IterationFile,
    iteration_file,
    list_files,
    merged_path,
    rank_path,
    readable_files,
    remove_stale_temporaries,
    with_listing,
)
from replaystore.trajectories.files.v4 import TEXT_COMPRESSION_RATIO as TEXT_COMPRESSION_RATIO
from replaystore.trajectories.files.v4 import TextTable
from replaystore.trajectories.files.writer import EncodedTrajectory, encode_trajectory, write_file
from replaystore.trajectories.index import StepIndex
from replaystore.trajectories.prompt_urls import root_url
from replaystore.trajectories.screenshots import ScreenshotFingerprinter

__all__ = ["IterationFile", "TrajectoryStorage"]

logger = logging.getLogger("replaystore.trajectories.storage")


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
        return remove_stale_temporaries(self.root, older_than_s)

    def __repr__(self) -> str:
        return f"TrajectoryStorage({str(self.root)!r})"

    # ------------------------------------------------------------------ listing

    def files(self) -> list[IterationFile]:
        """Every iteration file, sorted by (iteration, rank); merged files first."""
        return list_files(self.root)

    def iterations(self) -> list[int]:
        """Iteration numbers present, ascending."""
        return sorted({f.iteration for f in self.files()})

    def next_iteration(self) -> int:
        """One more than the highest iteration present (1 for an empty storage)."""
        its = self.iterations()
        return its[-1] + 1 if its else 1

    def _readable_files(self, last_n_iterations: int | None) -> list[IterationFile]:
        return readable_files(self.files(), last_n_iterations)

    def _with_listing(self, last_n_iterations: int | None, read: Any) -> Any:
        return with_listing(lambda: self._readable_files(last_n_iterations), read)

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
        target = self._new_file(iteration, rank)
        header_meta = dict(metadata or {})
        header_meta.setdefault("timestamp", _dt.datetime.now(_dt.UTC).isoformat())
        keep = self.keep_page_metadata if keep_page_metadata is None else bool(keep_page_metadata)
        known: dict[str, list[str]] = {}  # prompt messages seen in this iteration
        table = TextTable() if self.format_version >= 4 else None
        roots = self._root_strings(refresh=True)
        encoded = [
            encode_trajectory(
                t,
                traj,
                keep,
                known,
                table,
                format_version=self.format_version,
                fingerprinter=self._fingerprinter,
                roots=roots,
            )
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

    def _new_file(self, iteration: int, rank: int | None) -> Path:
        """The path :meth:`save_iteration` writes (``rank`` None: the merged file).

        Raises:
            StorageError: it (or the iteration's merged file) exists, or, for the
                merged file, the iteration has rank files.
        """
        merged = merged_path(self.root, iteration)
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
            target = rank_path(self.root, iteration, rank)
        for existing in (target, merged):
            if existing.exists():
                raise StorageError(
                    f"{existing} already exists: iteration files are immutable "
                    "(pick another iteration or rank)"
                )
        return target

    def _root_strings(self, refresh: bool = False) -> tuple[str, str, str]:
        """``(root_url, absolute root, absolute root + separator)``; ``refresh`` makes
        them again (once per save: a relative root depends on the current directory)."""
        cached = getattr(self, "_roots", None)
        if cached is None or refresh or cached[0] is not self.root:
            root = os.path.abspath(self.root)
            cached = (self.root, root_url(self.root), root, root.rstrip(os.sep) + os.sep)
            self._roots = cached
        return cached[1], cached[2], cached[3]

    def _write(
        self,
        target: Path,
        iteration: int,
        rank: int | None,
        metadata: Mapping[str, Any],
        trajectories: Sequence[EncodedTrajectory],
    ) -> None:
        write_file(
            target,
            iteration,
            rank,
            metadata,
            trajectories,
            format_version=self.format_version,
            compression_level=self.compression_level,
        )

    # ------------------------------------------------------------------ reading

    def read_header(self, file: IterationFile) -> Header:
        """The parsed header of ``file`` (its index: trajectory lengths, final rewards,
        flags, per-step checksums, and where each step's line, frame or texts are),
        checked against the file: its size and its last frame, line and text.

        Raises:
            FileNotFoundError: the file is gone.
            StorageError: not an iteration file of ours (or of a version not read), or
                its header or body is inconsistent or damaged.
            TrajectoryError: a non-dummy trajectory's final reward breaks the
                final-reward rule (see :meth:`stats`).
        """
        return read_header(file)

    def edge_records(self, header: Header) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
        """Per trajectory of a file: its first and last step records, ``{"step": the
        step's dict as stored}`` (screenshot paths as stored; version 3: without the
        prompt and response texts), for indexes such as the viewer's. Version 3 frames
        are checked (CRC32); version 1-2 lines are read as they are.

        Raises:
            StorageError: a frame or line is damaged or not JSON.
        """
        return edge_records(header)

    def trajectory_steps(
        self, header: Header, t: int, first: int, count: int, where: str
    ) -> list[dict[str, Any]]:
        """Steps ``first .. first+count-1`` of trajectory ``t`` of a version 3-4 file
        (``header``: :meth:`read_header` of it), decoded as :meth:`load_all` decodes
        them (checksums verified); ``where`` names the trajectory in errors.

        Raises:
            FileNotFoundError: the file is gone.
            StorageError: the frame or a step is damaged.
        """
        return trajectory_steps(header, t, first, count, where, self.root)

    def decode_line(
        self, line: bytes, where: str, crc: int = NO_CRC
    ) -> tuple[int, int, dict[str, Any]]:
        """One version 1-2 step line (as stored, with its newline) decoded as
        :meth:`load_all` decodes it: ``(trajectory number in its file, step number,
        step mapping)``; ``crc``: the line's CRC32 from the header (the default: not
        checked); ``where`` names the line in errors.

        Raises:
            StorageError: the line fails its CRC32 check or is malformed.
        """
        return decode_line(line, where, crc, self.root)

    def _read_file(self, file: IterationFile) -> tuple[Header, list[list[dict[str, Any]]]]:
        header = read_header(file)
        return header, read_trajectories(header, self.root)

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
        header = read_header(file)
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
            file = iteration_file(file)
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
        return [read_header(f).metadata for f in files]

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
        merged = merged_path(self.root, int(iteration))
        ranks = [f for f in group if f.rank is not None]
        if not group:
            raise StorageError(f"iteration {iteration} has no files under {self.root}")
        if any(f.rank is None for f in group) and not ranks:
            return merged
        if merged.exists():
            raise StorageError(
                f"iteration {iteration} has both a merged file and rank files; remove one"
            )
        encoded: list[EncodedTrajectory] = []
        rank_meta: dict[str, Any] = {}
        table = TextTable() if self.format_version >= 4 else None  # one for the merged file
        for f in ranks:
            header = read_header(f)
            rank_meta[str(f.rank)] = header.metadata
            encoded.extend(reencode(header, len(encoded), self.format_version, table))
        metadata = {"merged_ranks": [f.rank for f in ranks], "rank_metadata": rank_meta}
        self._write(merged, int(iteration), None, metadata, encoded)
        for f in ranks:
            f.path.unlink(missing_ok=True)
        fsync_dir(self.root)
        logger.info("merged %d rank files of iteration %d into %s", len(ranks), iteration, merged)
        return merged

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
            header = read_header(f)
            if header.version >= self.format_version:
                continue
            encoded = reencode(header, 0, self.format_version)
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

        return self._with_listing(None, lambda files: stats_of(files, self.root, success_threshold))

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
        headers: list[Header] = self._with_listing(
            last_n_iterations, lambda files: [read_header(f) for f in files]
        )
        if not headers:
            raise StorageError(f"no iteration files under {self.root}")
        return build_step_index(self, headers)
