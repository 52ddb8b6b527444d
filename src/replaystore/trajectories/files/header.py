"""The header of an iteration file: the names of :mod:`replaystore.formats.trajectory_header`,
where the format's read side lives (kept so that this import path still works)."""

from __future__ import annotations

# The same names and the same objects: one list, kept in replaystore.formats.
from replaystore.formats.trajectory_header import *  # noqa: F403
from replaystore.formats.trajectory_header import __all__ as __all__
