"""The ``.partial``-then-rename step of every stage that produces a directory: the
names of :mod:`replaystore.loop.partial`, where it lives (the loop's tools use it
too, below the stages)."""

from __future__ import annotations

from ..partial import build_directory, keep_finished, partial_path

__all__ = ["build_directory", "keep_finished", "partial_path"]
