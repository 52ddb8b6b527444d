"""Read-only summary of a transitions buffer: a checkpoint or a memory-mapped directory.

* a checkpoint (``<name>.metadata`` + the data directory it names) and
* a memmap directory (``buffer.json`` + column files)

have their column files mapped with ``numpy.memmap(mode="r")``: only the pages
of the columns shown (reward, done, priorities) are read, and nothing is
written (the buffer's own reopen maps its files read-write). A checkpoint's
metadata is read by :func:`~replaystore.formats.transitions_checkpoint.read_checkpoint_meta`
(as ``replaystore stats`` reads it); every file name read from a checkpoint or a
``buffer.json`` is confined to its directory
(:func:`~replaystore.formats.transitions_checkpoint.confine_name`), so a crafted
file cannot make the viewer map another file.

Episode returns are the sums of the reward column between done flags (the first
column named ``done``, ``terminated``, ``terminal`` or ``dones``; ``truncated``
also ends an episode), in chronological order (oldest first, following the
ring's pointer). Once the ring has wrapped, the oldest episode's start is gone,
so that first partial episode is left out; an unfinished last episode too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from replaystore.errors import StorageError
from replaystore.formats.transitions_buffer import META_NAME, PRIORITIES_NAME, read_buffer_meta
from replaystore.formats.transitions_checkpoint import (
    confine_name,
    is_zip_archive,
    read_checkpoint_meta,
)

__all__ = ["TransitionsSummary", "read_transitions"]

_REWARD_KEYS = ("reward", "rewards", "r")
_DONE_KEYS = ("done", "terminated", "terminal", "dones")
_TRUNC_KEYS = ("truncated", "truncation", "timeout")


@dataclass(slots=True)
class TransitionsSummary:
    """What the transitions page shows.

    ``fields``: ``[{"name", "dtype", "shape"}]``; ``rewards``/``priorities``/
    ``episode_returns``: 1-D arrays (None when the buffer has no such column).
    """

    kind: str
    path: Path
    capacity: int
    size: int
    pointer: int
    fields: list[dict[str, Any]]
    rewards: NDArray[np.float64] | None
    priorities: NDArray[np.float64] | None
    episode_returns: NDArray[np.float64] | None
    reward_key: str | None
    done_key: str | None

    @property
    def fill(self) -> float:
        """size / capacity (0 for a zero-capacity buffer)."""
        return self.size / self.capacity if self.capacity else 0.0


def _first(names: list[str], candidates: tuple[str, ...]) -> str | None:
    return next((c for c in candidates if c in names), None)


def _chronological(column: NDArray[Any], size: int, capacity: int, pointer: int) -> NDArray[Any]:
    """Rows oldest first: once full, the oldest row is at ``pointer``."""
    if size >= capacity and capacity > 0:
        return np.roll(column[:size], -pointer, axis=0)
    return column[:size]


def _episode_returns(
    reward: NDArray[Any], done: NDArray[Any], wrapped: bool
) -> NDArray[np.float64]:
    """Sums of ``reward`` over complete episodes (``done`` ends one), vectorised."""
    r = reward.reshape(reward.shape[0], -1).sum(axis=1).astype(np.float64)
    ends = np.flatnonzero(done.reshape(done.shape[0], -1).any(axis=1))
    if ends.size == 0:
        return np.zeros(0)
    cum = np.concatenate([[0.0], np.cumsum(r)])
    starts = np.concatenate([[0], ends[:-1] + 1])
    returns = cum[ends + 1] - cum[starts]
    return returns[1:] if wrapped else returns


def _summarise(
    kind: str,
    path: Path,
    capacity: int,
    size: int,
    pointer: int,
    fields: list[dict[str, Any]],
    columns: dict[str, NDArray[Any]],
    priorities: NDArray[Any] | None,
) -> TransitionsSummary:
    names = list(columns)
    reward_key, done_key = _first(names, _REWARD_KEYS), _first(names, _DONE_KEYS)
    trunc_key = _first(names, _TRUNC_KEYS)
    shown = [k for k in (reward_key, done_key, trunc_key) if k is not None]
    # only the columns shown are read (observations may be gigabytes of images)
    order = {k: _chronological(columns[k], size, capacity, pointer) for k in shown}
    rewards = order[reward_key].astype(np.float64).ravel() if reward_key else None
    returns = None
    if reward_key and done_key:
        done = order[done_key].astype(bool)
        if trunc_key:
            done = done | order[trunc_key].astype(bool).reshape(done.shape)
        returns = _episode_returns(order[reward_key], done, size >= capacity)
    pri = None if priorities is None else np.asarray(priorities[:size], dtype=np.float64)
    return TransitionsSummary(
        kind, path, capacity, size, pointer, fields, rewards, pri, returns, reward_key, done_key
    )


def _map_column(file: Path, dtype_name: str, shape: tuple[int, ...], rows: int) -> Any:
    """``file`` mapped read-only as ``rows`` items of ``shape``; None for a dtype NumPy lacks.

    Raises:
        StorageError: the file is missing or its size is not ``rows`` items.
    """
    from replaystore.transitions.schema import dtype_from_name, numpy_dtype

    try:
        npd = numpy_dtype(dtype_from_name(dtype_name))
    except (KeyError, ValueError, TypeError):
        raise StorageError(f"{file}: unknown dtype {dtype_name!r}") from None
    if npd is None:
        return None
    expected = rows * int(np.prod(shape, dtype=np.int64)) * npd.itemsize
    if not file.is_file():
        raise StorageError(f"column file {file} is missing")
    if file.stat().st_size != expected:
        raise StorageError(
            f"column file {file} has {file.stat().st_size} bytes, expected {expected}"
        )
    if expected == 0:
        return np.zeros((rows, *shape), dtype=npd)
    return np.memmap(file, dtype=npd, mode="r", shape=(rows, *shape))


def _layout(
    meta: dict[str, Any], where: Path, capacity_key: str, size_key: str
) -> tuple[int, int, int, list[dict[str, Any]]]:
    try:
        capacity, size = int(meta[capacity_key]), int(meta[size_key])
        pointer = int(meta["pointer"])
        fields = [
            {
                "name": str(f["name"]),
                "dtype": str(f["dtype"]),
                "shape": [int(d) for d in f["shape"]],
                "file": str(f["file"]),
            }
            for f in meta["fields"]
        ]
    except (KeyError, TypeError, ValueError) as exc:
        raise StorageError(f"malformed {where}: {exc!r}") from None
    if not 0 <= size <= capacity:
        raise StorageError(f"{where}: size {size} outside 0..capacity {capacity}")
    return capacity, size, pointer, fields


def read_transitions(kind: str, target: str | Path) -> TransitionsSummary:
    """Summarise the buffer at ``target``, mapping its column files read-only.

    Args:
        kind: ``"transitions_checkpoint"`` (``target`` is the ``.metadata`` file)
            or ``"transitions_memmap"`` (``target`` is the directory holding
            ``buffer.json``).

    Raises:
        StorageError: files missing, of the wrong size, or malformed metadata; an
            ObjectRL metadata-only checkpoint (it holds no transitions).
        ValueError: an unknown ``kind``.

    Cost: reads the metadata and maps the column files (``numpy.memmap``,
    ``mode="r"``); only the reward, done and priority columns are read, so a
    checkpoint of millions of image observations opens in milliseconds. Sizes
    are checked; a checkpoint's CRCs are not (``ReplayBuffer.load`` checks them).
    """
    target = Path(target)
    if kind == "transitions_checkpoint":
        if is_zip_archive(target):
            raise StorageError(
                f"{target} is ObjectRL's metadata-only checkpoint (torch.save): it holds no "
                "transitions to show"
            )
        # The one reader of the format: it confines every name the file gives to the
        # checkpoint's directory, so a crafted checkpoint cannot make the viewer map
        # another file.
        ckpt = read_checkpoint_meta(target)
        if ckpt.data_dir is None:
            raise StorageError(
                f"{target} is ObjectRL's metadata-only checkpoint: it holds no transitions to show"
            )
        capacity, size, pointer = ckpt.buffer_size, ckpt.data_size, ckpt.pointer
        if not 0 <= size <= capacity:
            raise StorageError(f"{target}: size {size} outside 0..capacity {capacity}")
        fields: list[dict[str, Any]] = [
            {"name": c.name, "dtype": c.dtype, "shape": list(c.shape), "file": c.path}
            for c in ckpt.columns
        ]
        rows = size  # a checkpoint stores rows 0..size-1 only
        pri_file = None if ckpt.priorities is None else ckpt.priorities.path
    elif kind == "transitions_memmap":
        found = read_buffer_meta(target)
        if found is None:
            raise StorageError(f"{target} has no {META_NAME}")
        meta = dict(found)
        where = target / META_NAME
        capacity, size, pointer, fields = _layout(meta, where, "capacity", "size")
        for f in fields:
            f["file"] = confine_name(target, f["file"], where, "column file")
        rows = capacity  # the column files span the whole ring
        pri_meta = meta.get("priorities")
        pri_file = None
        if pri_meta:
            name = pri_meta.get("file", PRIORITIES_NAME)
            pri_file = confine_name(target, name, where, "priorities file")
    else:
        raise ValueError(f"unknown transitions kind {kind!r}")
    columns: dict[str, Any] = {}
    for f in fields:  # every file path is confined to the buffer's directory by now
        column = _map_column(f.pop("file"), f["dtype"], tuple(f["shape"]), rows)
        if column is not None:
            columns[f["name"]] = column
    priorities = None
    if pri_file is not None:
        priorities = _map_column(pri_file, "float64", (), rows)
    return _summarise(kind, target, capacity, size, pointer, fields, columns, priorities)
