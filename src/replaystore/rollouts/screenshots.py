"""A rollout's screenshots: where they go, how one is taken, how it is written.

* :func:`default_screenshot_root`: ``screenshots/`` inside the storage (the default of
  :class:`~replaystore.rollouts.collector.RolloutCollector` and of the loop);
* :func:`screenshot_folder`: one iteration's (and rank's) folder under that root;
* :func:`take_screenshot`: a page's PNG, retried when Chromium has no frame ready;
* :func:`write_png`: the PNG written atomically, with its pixel fingerprint.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from replaystore.atomic import atomic_write_bytes
from replaystore.trajectories.screenshots import fingerprint_image

__all__ = [
    "SCREENSHOT_TRIES",
    "default_screenshot_root",
    "screenshot_folder",
    "take_screenshot",
    "write_png",
]

logger = logging.getLogger("replaystore.rollouts.screenshots")

#: How many times :func:`take_screenshot` tries a capture.
SCREENSHOT_TRIES = 3


def default_screenshot_root(storage_root: Path) -> Path:
    """Where a rollout's screenshots go by default: ``screenshots/`` inside the storage,
    which stores their paths relative to itself (the directory can be moved)."""
    return Path(storage_root) / "screenshots"


def screenshot_folder(screenshot_root: Path, iteration: int, rank: int | None = None) -> Path:
    """The folder of one iteration's screenshots under ``screenshot_root`` (``rank``: of
    that rank's): ``iteration_<N>[/rank<R>]``. Removing it removes an interrupted try's."""
    folder = Path(screenshot_root) / f"iteration_{iteration:06d}"
    return folder if rank is None else folder / f"rank{rank:03d}"


async def take_screenshot(page: Any, task_id: str, tries: int = SCREENSHOT_TRIES) -> bytes:
    """``page``'s PNG screenshot, tried up to ``tries`` times (0.1 s, then 0.2 s apart).

    Chromium sometimes refuses a capture on a busy machine ("Unable to capture
    screenshot": its compositor had no frame ready) and gives one a moment later;
    one such refusal should not fail the whole task. A closed page is not retried.

    Raises:
        playwright.async_api.Error: every try failed (the last try's error).
    """
    from playwright.async_api import Error as PlaywrightError

    attempt = 1
    while True:
        try:
            png: bytes = await page.screenshot(type="png", caret="hide")
            return png
        except PlaywrightError as exc:
            if attempt >= tries or page.is_closed():
                raise
            first_line = (str(exc).strip().splitlines() or [repr(exc)])[0]
            logger.warning(
                "screenshot failed (try %d/%d, task %s): %s", attempt, tries, task_id, first_line
            )
            await asyncio.sleep(0.1 * 2 ** (attempt - 1))
            attempt += 1


def write_png(path: Path, data: bytes) -> bytes | None:
    """Write the screenshot atomically; its pixel fingerprint (None if it cannot be decoded:
    the storage then computes the flag itself)."""
    atomic_write_bytes(path, data)
    try:
        return fingerprint_image(path)
    except (OSError, ValueError) as exc:
        logger.warning("screenshot %s cannot be fingerprinted: %s", path, exc)
        return None
