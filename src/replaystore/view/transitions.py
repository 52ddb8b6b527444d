"""Read-only summary of a transitions buffer: a checkpoint or a memory-mapped directory.

* a checkpoint (``<name>.metadata`` + its data directory) is read and verified
  with :func:`~replaystore.transitions.checkpoint.read_checkpoint` (sizes, CRCs);
* a memmap directory (``buffer.json`` + column files) is mapped with
  ``numpy.memmap(mode="r")``: the pages of the columns shown are read, nothing
  is written (the buffer's own reopen maps them read-write).

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
    order = {k: _chronological(columns[k], size, capacity, pointer) for k in names}
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


def read_transitions(kind: str, target: str | Path) -> TransitionsSummary:
    """Summarise the buffer at ``target``.

    Args:
        kind: ``"transitions_checkpoint"`` (``target`` is the ``.metadata`` file)
            or ``"transitions_memmap"`` (``target`` is the directory holding
            ``buffer.json``).

    Raises:
        StorageError: files missing, truncated or malformed (a checkpoint's
            :class:`~replaystore.errors.CheckpointError` is a StorageError too).
        ValueError: an unknown ``kind``.

    Cost: a checkpoint is read whole (and CRC-checked); a memmap maps its files
    and reads the reward, done and priority columns.
    """
    target = Path(target)
    if kind == "transitions_checkpoint":
        import torch

        from replaystore.transitions.checkpoint import read_checkpoint

        prefix = target.with_name(target.name.removesuffix(".metadata"))
        snap = read_checkpoint(prefix)
        fields = [
            {"name": f.name, "dtype": str(f.dtype).removeprefix("torch."), "shape": list(f.shape)}
            for f in snap.fields
        ]
        columns = {  # NumPy has no bfloat16: such columns are shown as float32
            k: (v.float() if v.dtype == torch.bfloat16 else v).numpy()
            for k, v in snap.columns.items()
        }
        return _summarise(
            kind, target, snap.capacity, snap.size, snap.pointer, fields, columns, snap.priorities
        )
    if kind == "transitions_memmap":
        from replaystore.transitions.schema import dtype_from_name, numpy_dtype
        from replaystore.transitions.storage import MemmapStorage

        meta = MemmapStorage.read_meta(target)
        if meta is None:
            raise StorageError(f"{target} has no buffer.json")
        try:
            capacity, size, pointer = int(meta["capacity"]), int(meta["size"]), int(meta["pointer"])
            specs = list(meta["fields"])
        except (KeyError, TypeError, ValueError) as exc:
            raise StorageError(f"malformed {target / 'buffer.json'}: {exc!r}") from None
        fields, columns = [], {}
        for spec in specs:
            name, shape = str(spec["name"]), tuple(int(s) for s in spec["shape"])
            fields.append({"name": name, "dtype": str(spec["dtype"]), "shape": list(shape)})
            npd = numpy_dtype(dtype_from_name(str(spec["dtype"])))
            file = target / str(spec.get("file", ""))
            if npd is None or not file.is_file() or capacity == 0:
                continue
            expected = capacity * int(np.prod(shape, dtype=np.int64)) * npd.itemsize
            if file.stat().st_size != expected:
                raise StorageError(
                    f"column file {file} has {file.stat().st_size} bytes, expected {expected}"
                )
            columns[name] = np.memmap(file, dtype=npd, mode="r", shape=(capacity, *shape))
        priorities = None
        if "priorities" in meta:
            pfile = target / str(meta["priorities"].get("file", "priorities.bin"))
            if pfile.is_file():
                priorities = np.memmap(pfile, dtype="<f8", mode="r")
        return _summarise(kind, target, capacity, size, pointer, fields, columns, priorities)
    raise ValueError(f"unknown transitions kind {kind!r}")
