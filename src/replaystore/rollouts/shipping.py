"""A finished task's outcome as bytes, screenshots included: how a Ray rollout actor
ships a trajectory to its driver, which writes it into the run's storage.

No pickle of our own formats crosses the wire: :func:`pack_outcome` writes a small
binary envelope, a JSON header (the task, status, reward, error, seconds and the
trajectory as :func:`~replaystore.trajectories.components.trajectory_to_dicts`)
followed by the screenshots' PNG bytes; :func:`unpack_outcome` reads it back and
:meth:`ShippedOutcome.write` puts the screenshots under the driver's screenshot root (atomic
writes) and returns a :class:`~replaystore.rollouts.outcomes.TaskOutcome` whose
paths (``image_path``, the ``file://`` URLs of stored prompts) point there.

Layout: ``b"RSO1"``, the header's length (8 bytes, big-endian), the header (UTF-8
JSON), then the PNGs back to back; the header's ``images`` lists each as
``[name, offset, length]`` (offsets from the first PNG byte).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replaystore.atomic import atomic_write_bytes
from replaystore.errors import SchemaError
from replaystore.trajectories.components import (
    Task,
    trajectory_from_dicts,
    trajectory_to_dicts,
)

from .outcomes import TaskOutcome

__all__ = ["MAGIC", "ShippedOutcome", "pack_outcome", "unpack_outcome"]

#: The first bytes of a packed outcome (format version 1).
MAGIC = b"RSO1"
_LENGTH = struct.Struct(">Q")


def pack_outcome(
    outcome: TaskOutcome,
    root: str | Path,
    *,
    index: int,
    timings: dict[str, float] | None = None,
) -> bytes:
    """``outcome`` and the screenshots it names under ``root`` as one bytes object.

    Args:
        outcome: a finished task (:meth:`RolloutCollector.run_task`'s result).
        root: the screenshot root on this machine; every ``image_path`` under it is
            shipped (by its path relative to ``root``), and ``root`` is replaced by
            the driver's screenshot root in every string of the trajectory (stored
            prompts name screenshots by ``file://`` URL).
        index: the task's position in the driver's task list (its key).
        timings: the task's step timings (seconds by part), shipped in the header.

    Raises:
        OSError: a screenshot the trajectory names cannot be read.

    Cost: one JSON encoding of the trajectory and one read of each screenshot.
    """
    base = Path(root)
    steps = trajectory_to_dicts(outcome.trajectory)
    seen: set[str] = set()
    blobs: list[bytes] = []
    images: list[list[Any]] = []
    offset = 0
    for step in steps:
        path = str(step["observation"].get("image_path") or "")
        if not path or path in seen:
            continue
        seen.add(path)
        candidate = Path(path)
        if not candidate.is_relative_to(base) or not candidate.is_file():
            continue  # not a screenshot of this rollout: kept as a path only
        data = candidate.read_bytes()
        images.append([candidate.relative_to(base).as_posix(), offset, len(data)])
        blobs.append(data)
        offset += len(data)
    header = {
        "index": int(index),
        "root": str(base),
        "task": outcome.task.to_dict(),
        "status": outcome.status,
        "reward": float(outcome.reward),
        "error": outcome.error,
        "seconds": float(outcome.seconds),
        "timings": dict(timings or {}),
        "steps": steps,
        "images": images,
    }
    encoded = json.dumps(header, ensure_ascii=False).encode("utf-8")
    return b"".join([MAGIC, _LENGTH.pack(len(encoded)), encoded, *blobs])


@dataclass(slots=True)
class ShippedOutcome:
    """A packed outcome read back (:func:`unpack_outcome`), not yet written anywhere.

    Attributes:
        index: the task's position in the driver's task list.
        header: the JSON header (see the module docstring).
        images: screenshot path relative to the screenshot root -> PNG bytes.
    """

    index: int
    header: dict[str, Any]
    images: dict[str, bytes]

    @property
    def steps(self) -> int:
        """How many steps the trajectory has."""
        return len(self.header["steps"])

    def write(self, root: str | Path) -> TaskOutcome:
        """Write the screenshots under ``root`` (the driver's screenshot root; atomic
        writes) and return the outcome with every path under the actor's root moved there.

        Cost: one write (with fsync) per screenshot, one JSON round trip of the steps.
        """
        target = Path(root)
        for name, data in self.images.items():
            path = target / name
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(path, data)
        text = json.dumps(self.header["steps"], ensure_ascii=False)
        source = Path(str(self.header["root"]))
        pairs = [(str(source), str(target))]
        if source.is_absolute():  # file:// URLs first: they hold the plain path too
            pairs.insert(0, (source.as_uri(), target.resolve().as_uri()))
        for old, new in pairs:
            # As they appear inside JSON strings (a path's backslashes are escaped there).
            text = text.replace(json.dumps(old)[1:-1], json.dumps(new)[1:-1])
        steps = trajectory_from_dicts(json.loads(text))
        h = self.header
        return TaskOutcome(
            Task.from_dict(h["task"]),
            str(h["status"]),
            steps,
            float(h["reward"]),
            h["error"],
            float(h["seconds"]),
        )


def unpack_outcome(data: bytes) -> ShippedOutcome:
    """Read what :func:`pack_outcome` wrote.

    Raises:
        SchemaError: ``data`` is not a packed outcome (wrong magic, cut short, a
            header that is not JSON, an image past the end).
    """
    view = memoryview(data)
    start = len(MAGIC) + _LENGTH.size
    if bytes(view[: len(MAGIC)]) != MAGIC or len(view) < start:
        raise SchemaError("not a packed rollout outcome (its first bytes are not RSO1)")
    (length,) = _LENGTH.unpack(view[len(MAGIC) : start])
    if start + length > len(view):
        raise SchemaError(f"packed rollout outcome cut short: header of {length} bytes")
    try:
        header = json.loads(bytes(view[start : start + length]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SchemaError(f"packed rollout outcome: bad header: {exc}") from None
    body = view[start + length :]
    images: dict[str, bytes] = {}
    for name, offset, size in header.get("images", []):
        parts = str(name).split("/")
        if offset < 0 or offset + size > len(body) or any(p in ("", ".", "..") for p in parts):
            raise SchemaError(f"packed rollout outcome: image {name!r} is out of bounds")
        images[name] = bytes(body[offset : offset + size])
    return ShippedOutcome(int(header["index"]), header, images)
