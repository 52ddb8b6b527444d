"""The cached reader of a file-backed buffer: :class:`FileSource` reads one step (or
a step's history) from its iteration file on access, choosing by the step's format:
a line (formats 1-2), its trajectory's decoded frame, kept in a cache (format 3), or
its prompt's texts alone, memory-mapped (format 4, :meth:`FileSource.sample_parts`).
:class:`_StoredTrajectories` gives the files' trajectories as a sequence."""

from __future__ import annotations

import json
import operator
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

import numpy as np
from google_crc32c import value as _google_crc32c
from numpy.typing import NDArray

from replaystore.errors import StorageError
from replaystore.trajectories.files.frames import CODEC_RAW, read_frame
from replaystore.trajectories.files.jsonfast import (
    crc32c_function,
    from_json,
    json_copy,
    loads,
    loads_text,
    texts_kernel,
)
from replaystore.trajectories.files.lines import decode_line
from replaystore.trajectories.files.v3 import (
    Damaged,
    Frame,
    checked_head,
    decode_frame_step,
    frame_head,
    head_response,
    split_frame,
)
from replaystore.trajectories.files.v4 import TextIndex, Texts
from replaystore.trajectories.prompt_urls import resolve_prompt, root_url

if TYPE_CHECKING:
    from replaystore.trajectories.storage import TrajectoryStorage


@dataclass(slots=True)
class FrameTable:
    """Version 3 frames by global trajectory number (see :func:`_frame_table`)."""

    offset: NDArray[np.int64]
    length: NDArray[np.int64]
    crc: NDArray[np.int64]
    codec: NDArray[np.uint8]
    messages: NDArray[np.int32]
    steps: NDArray[np.int32]


@dataclass(slots=True)
class _TextSlots:
    """The texts :meth:`FileSource.sample_parts_many` fills: slot ``i`` holds text
    ``ids[i]`` of ``prompts`` (a message, or the response where ``is_response``),
    parsed into ``values[i]``; ``invalid`` lists the message slots that are not a
    plain chat message (their samples read their steps)."""

    prompts: Prompts
    ids: NDArray[Any]
    is_response: NDArray[np.bool_]
    values: list[Any]
    invalid: list[int]


class FileSource:
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
        "_crc32c",
        "_file_texts",
        "_first_text",
        "_maps",
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
        frames: FrameTable | None = None,
        texts: Sequence[TextIndex | None] = (),
        prompts: Prompts | None = None,
    ) -> None:
        self.storage = storage
        self.crcs = crcs  # CRC32 per indexed step; NO_CRC for version 1 files
        self.files = files
        self._paths = [str(path) for path in files]
        self.file_of_step = file_of_step
        self.offsets = offsets  # byte offset of each step line; -1 for version 3 steps
        self.traj_file = traj_file
        self.traj_local = traj_local
        self.frames = frames
        self._cache: OrderedDict[int, Frame] = OrderedDict()
        self._cached_bytes = 0
        # parsed messages by text: (plain, relative URLs resolved)
        self._messages: tuple[dict[str, Any], dict[str, Any]] = ({}, {})
        self._message_chars = 0
        self._copy = json_copy()
        self._crc32c = crc32c_function()
        # whether some steps are version 1-2 lines (their offsets are >= 0)
        self._mixed = bool(offsets.size) and bool(offsets.max() >= 0)
        self._root_url = root_url(storage.root)
        # version 4: each file's text index, and its texts once read (memory-mapped)
        self._file_texts: list[TextIndex | Texts | None] = list(texts) or [None] * len(files)
        # version 4: each file's memory map once made (what the texts kernel reads)
        self._maps: list[Any] = [None] * len(self._file_texts)
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
        state["_file_texts"] = [t.index if isinstance(t, Texts) else t for t in self._file_texts]
        state["_maps"] = [None] * len(self._file_texts)
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

    def _frame(self, traj: int) -> Frame:
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
            data = read_frame(
                self._paths[file_id],
                int(frames.offset[traj]),
                int(frames.length[traj]),
                int(frames.crc[traj]),
                int(frames.codec[traj]),
                where,
            )
        except FileNotFoundError:
            raise self._removed(path) from None
        frame = split_frame(
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

    def _texts_of(self, file_id: int) -> Texts | None:
        """File ``file_id``'s texts (version 4; memory-mapped on first use), else None."""
        texts = self._file_texts[file_id]
        if texts is None or isinstance(texts, Texts):
            return texts
        verified = None
        if self._prompts is not None:  # one record of checked texts for both read paths
            first = self._first_text[file_id]
            verified = memoryview(self._prompts.verified)[first : first + int(texts.lengths.size)]
        try:
            mapped = Texts.mapped(texts, verified)
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
                head, step_raw = checked_head(frame, first + i, int(self.crcs[pos + i]), where)
                out.append(decode_frame_step(frame, head, step_raw, where, self.storage.root))
            return out
        try:
            with open(path, "rb") as handle:
                handle.seek(int(self.offsets[pos]))
                lines = [handle.readline() for _ in range(count)]
        except FileNotFoundError:
            raise self._removed(path) from None
        for i, line in enumerate(lines):
            where = self.describe(traj, first + i)
            t, s, mapping = decode_line(line, where, int(self.crcs[pos + i]), self.storage.root)
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
                if not count:
                    return None
                kernel = texts_kernel()
                if kernel is not None:
                    read = self._kernel_samples(kernel, prompts, [pos])[0]
                    if read is not None:
                        return read
                # anything else (and a damaged text, named here): one text at a time
                return self._text_parts(prompts, pos, count, traj, step)
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
        kernel = texts_kernel()
        if kernel is not None:  # every sample's texts found, checked and parsed in C
            return self._kernel_samples(
                kernel, prompts, positions if type(positions) is list else list(positions)
            )
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
        whole = (arrays["text_codec"][ids] == CODEC_RAW) & ~shared
        batch = _TextSlots(prompts, ids, is_response, [None] * total, [])
        values, invalid = batch.values, batch.invalid
        try:
            if not self._own_values(batch, whole):
                return [None] * n  # sample_parts names the damaged step
            self._shared_values(batch, shared)
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

    def _own_values(self, batch: _TextSlots, whole: NDArray[np.bool_]) -> bool:
        """:meth:`sample_parts_many` without the texts kernel: the texts stored whole
        and read by one step (slots ``whole``) checked and parsed into
        ``batch.values``, each on its own straight from its file's memory map; the
        slots whose message is not a plain chat message are added to
        ``batch.invalid``. False when a text fails its check.

        Raises:
            ValueError: a text is not one JSON value. StorageError, IndexError.
        """
        prompts, ids = batch.prompts, batch.ids
        arrays = prompts.arrays
        own = np.flatnonzero(whole)
        own_ids = ids[own]
        files = arrays["text_file"][own_ids]
        verified = np.frombuffer(prompts.verified, dtype=np.uint8)
        values, invalid, is_response = batch.values, batch.invalid, batch.is_response
        for f in np.unique(files).tolist():
            numbers, slots = own_ids[files == f], own[files == f]
            unchecked = verified[numbers] == 0
            data = self._map_of(f)
            starts = arrays["text_offset"][numbers].tolist()
            ends = (arrays["text_offset"][numbers] + arrays["text_length"][numbers]).tolist()
            expected = arrays["text_crc"][numbers].tolist()
            check = unchecked.tolist()
            for k, slot in enumerate(slots.tolist()):
                raw = data[starts[k] : ends[k]]
                if check[k] and _google_crc32c(raw) != expected[k]:
                    return False
                value = values[slot] = _LOADS(raw)
                if not is_response[slot] and not _is_chat_message(value):
                    invalid.append(slot)
            verified[numbers[unchecked]] = 1
        return True

    def _shared_values(self, batch: _TextSlots, shared: NDArray[np.bool_]) -> None:
        """:meth:`sample_parts_many`: the texts several steps share (slots ``shared``),
        each distinct one parsed once (cached), a copy per slot, into ``batch.values``;
        slots whose message is not a plain chat message are added to ``batch.invalid``.

        Raises:
            ValueError: a text is not one JSON value. StorageError, IndexError.
        """
        prompts, ids, is_response = batch.prompts, batch.ids, batch.is_response
        values, invalid = batch.values, batch.invalid
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

    def _map_of(self, file_id: int) -> Any:
        """File ``file_id``'s memory map (version 4; made on first use, and kept in
        ``_maps``), else None."""
        texts = self._file_texts[file_id]
        if type(texts) is not Texts:
            texts = self._texts_of(file_id)
        data = None if texts is None else texts.data
        self._maps[file_id] = data
        return data

    def _kernel_samples(
        self, kernel: Any, prompts: Prompts, positions: list[int]
    ) -> list[tuple[list[Any], Any] | None]:
        """The texts kernel's ``samples`` of ``positions`` with this reader's maps,
        callbacks and cache of shared texts."""
        return kernel.samples(
            positions,
            prompts.kernel_arrays,
            self._maps,
            self._map_of,
            self._kernel_text,
            _LOADS,
            self._parsed,
            self._copy,
        )

    def _kernel_text(self, number: int) -> Any:
        """Text ``number`` parsed, a new value (shared or compressed: what the texts
        kernel's ``samples`` asks for).

        Raises:
            ValueError: not one JSON value. StorageError, IndexError.
        """
        prompts = self._prompts
        assert prompts is not None
        if prompts.shared[number]:
            return self._shared_text(prompts, number, 0)
        return self._own_text(prompts, number)

    def _text_parts(
        self, prompts: Prompts, pos: int, count: int, traj: int, step: int
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

    def _own_text(self, prompts: Prompts, number: int) -> Any:
        """Text ``number`` parsed straight from its file's memory map (URLs as stored),
        checked against its CRC-32C on first read (a new value on every call).

        A text stored whole is sliced and checked here, from ``prompts``' arrays (plain
        ints), the rest by :meth:`_raw_text`: every ``buffer[i]`` reads two or three.

        Raises:
            ValueError: not one JSON value. StorageError: see :meth:`_raw_text`.
        """
        if prompts.text_codec[number] != CODEC_RAW:
            return loads_text(self._raw_text(prompts, number))
        file_id = prompts.text_file[number]
        texts = self._file_texts[file_id]
        if type(texts) is not Texts:
            texts = self._texts_of(file_id)
        start = prompts.text_offset[number]
        raw = texts.data[start : start + prompts.text_length[number]]  # type: ignore[union-attr]
        if not prompts.verified[number]:
            if self._crc32c(raw) != prompts.text_crc[number]:
                return loads_text(self._raw_text(prompts, number))  # names the failure
            prompts.verified[number] = 1
        if from_json is not None:
            try:
                return from_json(raw)
            except ValueError:
                pass
        return json.loads(raw)

    def _raw_text(self, prompts: Prompts, number: int) -> bytes:
        """Text ``number`` (of all files; made whole), checked against its CRC-32C once
        (:meth:`Texts.raw` of its file).

        Raises:
            StorageError: it fails its check, or its file is gone.
        """
        file_id = prompts.text_file[number]
        texts = self._texts_of(file_id)
        assert texts is not None
        return texts.raw(number - self._first_text[file_id])

    def _parse_text(self, prompts: Prompts, number: int, relative: int) -> Any:
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
            return loads_text(resolve_prompt(text, self._root_url))
        return loads_text(raw)

    def _shared_text(self, prompts: Prompts, number: int, relative: int) -> Any:
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
        self, frame: Frame, pos: int, traj: int, step: int
    ) -> tuple[list[Any], Any] | bool:
        """What :meth:`sample_parts` serves for a step, parsed once (False: read the step)."""
        try:
            head = frame_head(frame, step, int(self.crcs[pos]))
            if "p" not in head:
                return False
            texts = [frame.message(i) for i in head["m"]]
            response = head_response(frame, head)
        except (Damaged, IndexError, KeyError, TypeError, ValueError) as exc:
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
            parsed = loads(resolve_prompt(text, self._root_url) if relative else text)
            if self._message_chars > self.MESSAGE_CACHE_CHARS:
                self._messages = ({}, {})
                self._message_chars = 0
            self._messages[relative][text] = parsed
            self._message_chars += len(text)
        return parsed


_MISSING = object()
# what parses a text the texts kernel reads
_LOADS = from_json if from_json is not None else json.loads


def _is_chat_message(value: Any) -> bool:
    """A plain chat message: a dict with a string ``role`` and a ``content``."""
    return type(value) is dict and type(value.get("role")) is str and "content" in value


class Prompts:
    """Version 4, for a file-backed buffer: per indexed step how many texts its prompt
    joins (-1: not a version 4 step; 0: not split), where they start in ``refs``, its
    response's text and whether its image URLs are relative; per text of all files:
    its file, byte offset, length, CRC32, whether several steps read it, and whether
    it was checked. Each is a memoryview of a compact array (an item read is a plain
    int, several times cheaper than a NumPy scalar); pickled as the arrays."""

    __slots__ = (
        "arrays",
        "counts",
        "kernel_arrays",
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
        # what the compiled kernel's samples() reads, in its order
        self.kernel_arrays = (
            *(arrays[name] for name in _KERNEL_ARRAYS),
            self.verified,
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (Prompts, (self.arrays,))


# Prompts' arrays as replaystore._texts.samples takes them (then ``verified``).
_KERNEL_ARRAYS = (
    "counts",
    "starts",
    "responses",
    "relative",
    "refs",
    "shared",
    "text_codec",
    "text_file",
    "text_offset",
    "text_length",
    "text_crc",
)


class _StoredTrajectories(Sequence[list[dict[str, Any]]]):
    """The trajectories behind a :class:`FileSource`, read file by file on access.

    Trajectory ``t`` lives in file ``traj_file[t]`` at position ``traj_local[t]``;
    the last file read is kept, so iterating reads each file once.
    """

    def __init__(self, source: FileSource) -> None:
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
