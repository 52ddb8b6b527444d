"""The parts of ``replaystore demo``, one module per part of the library.

Each part module defines ``run(out: pathlib.Path, quick: bool) -> list[str]``:
it does real work with the library, writes its outputs under ``out`` and
returns the summary lines the CLI prints.
"""

from __future__ import annotations

PARTS: tuple[str, ...] = ("transitions",)
