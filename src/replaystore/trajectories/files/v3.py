"""Format 3: one frame per trajectory (stored as it is, or one zstandard frame). A
frame decodes to UTF-8 lines: the trajectory's distinct prompt messages, then per
step a head line (step number, the message numbers of its prompt and their layout,
``raw_response``) and the step's dict. Format 4 (:mod:`.v4`) keeps these frames and
moves the texts out to a table of the file; the heads then name its texts."""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from replaystore.errors import StorageError, TrajectoryError
from replaystore.trajectories.components import step_from_dict
from replaystore.trajectories.files.frames import NO_CRC
from replaystore.trajectories.files.jsonfast import (
    STEP_ENCODER,
    encode_text,
    json_kernel,
    loads,
)
from replaystore.trajectories.files.naming import resolve_image
from replaystore.trajectories.files.prompts import NOT_SPLIT, join_prompt, split_prompt
from replaystore.trajectories.prompt_urls import resolve_prompt, root_url

if TYPE_CHECKING:
    from replaystore.trajectories.files.v4 import Texts, TextTable


def frame_of(
    t: int,
    steps: Sequence[dict[str, Any]],
    relative_urls: Sequence[bool],
    known: dict[str, list[str]],
    table: TextTable | None = None,
) -> tuple[bytes, NDArray[np.uint32], int]:
    """Version 3: ``(frame, CRC32 of each step's two lines, shared message count)``.

    The frame is UTF-8 text lines: first the trajectory's distinct prompt messages
    (each the exact JSON text it had in its prompt, in order of first use), then
    per step a head line and a step line. The head line is ``{"s": step}``, plus
    ``"u": true`` when the prompt's image URLs are relative to the storage root,
    and, when the prompt was split into shared messages, ``"p": separator, "m":
    [message numbers], "r": raw_response``; the step line is the step's dict, with
    ``raw_prompt`` and ``raw_response`` then left empty (they live in the head).
    ``known``: see :func:`split_prompt`. ``steps`` are the caller's own dicts: the
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
    encode = STEP_ENCODER.encode
    dumps = json_kernel()[1]
    for s, d in enumerate(steps):
        url = ',"u":true' if relative_urls[s] else ""
        response = d.get("response")
        prompt = response.get("raw_prompt") if type(response) is dict else None
        split = split_prompt(prompt, known) if type(prompt) is str and prompt else None
        try:
            if split is not None:
                separator, parts = split
                reply = response["raw_response"]  # type: ignore[index]
                # what encode gives for a string, without JSONEncoder.encode's own checks
                reply = encode_text(reply) if type(reply) is str else encode(reply)
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
                    table.add_step((), NOT_SPLIT, -1, relative_urls[s])
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


class Frame:
    """A decoded version 3 frame: its shared messages, then two lines per step.

    Lines are found by their newlines once (:func:`split_frame`) and copied out only
    when read; a message is decoded to text when first asked (:meth:`message`), a
    step's head parsed once its checksum passes (:func:`frame_head`).
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
        file_texts: Texts | None = None,
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


def split_frame(
    data: bytes, n_messages: int, n_steps: int, where: str, texts: Texts | None = None
) -> Frame:
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
    return Frame(data, ends, n_messages, n_steps, where, texts)


class Damaged(Exception):
    """A step of a frame fails its checks (the caller names the step)."""


def frame_head(frame: Frame, s: int, crc: int) -> dict[str, Any]:
    """Step ``s``'s head, parsed once its two lines pass their checksum.

    Raises:
        Damaged: the checksum fails or the head is malformed.
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
    if crc != NO_CRC and zlib.crc32(memoryview(frame.data)[start : ends[k + 1] + 1]) != crc:
        raise Damaged(
            "step fails its CRC32 check (the file was changed or damaged after it was written)"
        )
    try:
        head = loads(frame.data[start : ends[k]].decode("utf-8"))
        if not isinstance(head, dict) or int(head["s"]) != s:
            raise ValueError(f"head line names step {head.get('s')!r}, expected {s}")
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError) as exc:
        raise Damaged(f"malformed step head ({exc})") from None
    frame.heads[s] = head
    return head


def checked_head(frame: Frame, s: int, crc: int, where: str) -> tuple[dict[str, Any], bytes]:
    """:func:`frame_head` and the step line, a failure a :class:`StorageError` at ``where``."""
    try:
        return frame_head(frame, s, crc), frame.step_line(s)
    except Damaged as exc:
        raise StorageError(f"{where}: {exc}") from None


def _head_prompt(frame: Frame, head: Mapping[str, Any]) -> str:
    """The exact stored prompt text of a split prompt (URLs still relative)."""
    return join_prompt(int(head["p"]), [frame.message(i) for i in head["m"]])


# What a malformed stored step raises while it is decoded (JSONDecodeError and
# UnicodeDecodeError are ValueErrors).
_STEP_ERRORS = (KeyError, IndexError, TypeError, ValueError)


def frame_step_dict(frame: Frame, head: Mapping[str, Any], step_raw: bytes, where: str) -> Any:
    """A version 3-4 step (checked by :func:`frame_head`) as its stored dict: the split
    prompt and its response joined back in, image URLs as stored.

    Raises:
        StorageError: the step or its texts are malformed (named by ``where``).
    """
    try:
        data = json.loads(step_raw)
        if "p" in head:
            response = data["response"]
            response["raw_prompt"] = _head_prompt(frame, head)
            response["raw_response"] = head_response(frame, head)
    except _STEP_ERRORS as exc:
        raise StorageError(f"{where}: malformed step ({exc})") from None
    return data


def head_response(frame: Frame, head: Mapping[str, Any]) -> Any:
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
    return loads(frame.file_texts.text(int(head["x"])))


def decode_frame_step(
    frame: Frame, head: Mapping[str, Any], step_raw: bytes, where: str, root: Path
) -> dict[str, Any]:
    """A version 3-4 step (checked by :func:`frame_head`) as a step mapping; ``root``:
    the storage root (relative screenshot paths and prompt URLs are resolved against it)."""
    data = frame_step_dict(frame, head, step_raw, where)
    try:
        if head.get("u"):
            data["response"]["raw_prompt"] = resolve_prompt(
                data["response"]["raw_prompt"], root_url(root)
            )
        step = step_from_dict(data)
    except _STEP_ERRORS as exc:
        raise StorageError(f"{where}: malformed step ({exc})") from None
    observation = step["observation"]
    observation.image_path = resolve_image(root, observation.image_path)
    return step
