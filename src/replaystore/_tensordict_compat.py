"""Building sample TensorDicts fast, with a public-API fallback.

:func:`batch_tensordict` is how the transition buffer wraps the columns it
gathered for a sample. TensorDict's public constructor
(``TensorDict(entries, batch_size=[n], device=device)``) validates every entry
and costs about 5 µs; the private ``TensorDict._new_unsafe`` plus setting the
device directly costs under 1 µs (measured with tensordict 0.15.3, five
entries, n=256), which is a visible share of a CartPole-sized sample.

The private path is used only after a probe at import shows it still builds
what the public constructor builds (same keys, same tensors, batch size and
device). If a tensordict release renames or changes it, the probe fails and
every call uses the public constructor: slower, never wrong. The supported
range is pinned in ``pyproject.toml`` (``tensordict>=0.5,<0.16``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, cast

import torch
from tensordict import TensorDict

__all__ = [
    "FAST_PATH",
    "SUPPORTED",
    "batch_tensordict",
    "in_supported_range",
    "public_tensordict",
    "shaped_tensordict",
]

log = logging.getLogger("replaystore.tensordict")

SUPPORTED = ">=0.5,<0.16"
"""The tensordict versions replaystore is tested with (``pyproject.toml`` pins the same)."""
_LOWEST, _FIRST_UNTESTED = (0, 5), (0, 16)


def in_supported_range(version: str) -> bool:
    """Whether tensordict ``version`` (``"0.15.3"``, ``"0.16.0rc1"``...) is in :data:`SUPPORTED`.

    Compares major.minor only; an unparsable version is out of range.
    """
    parts = version.split(".")
    try:
        key = (int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or "x"))
    except (IndexError, ValueError):
        return False
    return _LOWEST <= key < _FIRST_UNTESTED


_Builder = Callable[[dict[str, torch.Tensor], int, torch.device], TensorDict]


def public_tensordict(entries: dict[str, torch.Tensor], n: int, device: torch.device) -> TensorDict:
    """``TensorDict(entries, batch_size=[n], device=device)``: the checked public constructor.

    Raises whatever TensorDict raises for entries whose leading dimension is not
    ``n`` or that live on another device.
    """
    return TensorDict(entries, batch_size=torch.Size([n]), device=device)


def _unchecked_tensordict(
    entries: dict[str, torch.Tensor], n: int, device: torch.device
) -> TensorDict:
    # Private tensordict API: only used once _probe() has accepted it. The cast:
    # its stub wants dict[NestedKey, Tensor | TensorCollection] (invariant).
    source = cast("dict[Any, Any]", entries)
    td = TensorDict._new_unsafe(source, batch_size=torch.Size([n]), nested=False)
    td._device = device
    return td


def _agrees(built: TensorDict, entries: dict[str, torch.Tensor], n: int, dev: torch.device) -> bool:
    return (
        type(built) is TensorDict
        and built.batch_size == torch.Size([n])
        and built.device == dev
        and set(built.keys()) == set(entries)
        and all(built.get(k) is v for k, v in entries.items())
    )


def _probe(candidate: _Builder) -> _Builder:
    """``candidate`` if it builds what the public constructor builds, else the public one."""
    device = torch.device("cpu")
    entries = {"a": torch.zeros(3, 2), "b": torch.arange(3)}
    try:
        built = candidate(dict(entries), 3, device)
        ok = _agrees(built, entries, 3, device)
    except Exception as exc:  # any failure of a private API means: do not use it
        log.info(
            "tensordict fast path unavailable (%s: %s); using TensorDict()", type(exc).__name__, exc
        )
        return public_tensordict
    if not ok:
        log.info("tensordict fast path builds a different TensorDict; using TensorDict()")
        return public_tensordict
    return candidate


_BUILDER: _Builder = _probe(_unchecked_tensordict)

FAST_PATH: bool = _BUILDER is _unchecked_tensordict
"""Whether this tensordict version passed the probe (``replaystore info`` material)."""


def batch_tensordict(entries: dict[str, torch.Tensor], n: int, device: torch.device) -> TensorDict:
    """A TensorDict of batch size ``[n]`` on ``device`` holding ``entries`` (not copied).

    For entries the caller built itself: every tensor must already have leading
    dimension ``n`` and live on ``device``. On the fast path this is not checked
    (under 1 µs); on the fallback the public constructor checks it (about 5 µs).
    """
    return _BUILDER(entries, n, device)


def shaped_tensordict(
    entries: dict[str, torch.Tensor], shape: tuple[int, ...], device: torch.device
) -> TensorDict:
    """A TensorDict of batch size ``shape`` (e.g. ``[S, L]``) on ``device`` holding ``entries``.

    The same contract and fast path as :func:`batch_tensordict` (the fast path is
    used only when the probe accepted it), for batch sizes of any rank.
    """
    size = torch.Size(shape)
    if not FAST_PATH:
        return TensorDict(entries, batch_size=size, device=device)
    source = cast("dict[Any, Any]", entries)
    td = TensorDict._new_unsafe(source, batch_size=size, nested=False)
    td._device = device
    return td
