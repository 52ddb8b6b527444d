"""Screenshot URLs in stored prompts, relative to the storage directory.

A collector stores each step's prompt (``Response.raw_prompt``, the JSON of the
chat messages) with its screenshots as absolute ``file://`` URLs. Stored that
way, a run directory could not be moved: every URL would name the old place.
So :class:`~replaystore.trajectories.storage.TrajectoryStorage` writes the URLs
of images under its directory as relative references (RFC 3986: the path from
the storage directory, percent-encoded, e.g.
``screenshots/iteration_000001/rank000/0000_news-001/step_000.png``), marks the
step line, and turns them back into ``file://`` URLs under its current directory
when the step is read, as it does with ``observation.image_path``. Readers
(buffer, exporter, viewer) see absolute URLs; files written before (absolute
URLs) read as they are.

:func:`relative_prompt` is the write side (parses the prompt once);
:func:`resolve_prompt` the read side: one regular-expression pass over the text,
no JSON parsing, exact because the written text is ``json.dumps`` output (the
only unescaped ``"url": "`` in it are keys of the messages).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["relative_prompt", "resolve_prompt", "root_url"]

# An image URL value (``{"url": ...}`` or ``"image_url": ...``) that has no scheme and
# does not start with "/": a relative reference. Only matches unescaped JSON keys.
_RELATIVE_URL = re.compile(r'"(?:image_)?url": "(?![A-Za-z][A-Za-z0-9+.\-]*:|/)')


def root_url(root: str | os.PathLike[str]) -> str:
    """The ``file://`` URL of a directory, without a trailing slash (percent-encoded)."""
    return Path(os.path.abspath(root)).as_uri().rstrip("/")


def _image_urls(messages: Any) -> list[dict[str, Any]]:
    """The image parts' holders whose ``url`` (or ``image_url``) is a string."""
    found = []
    for message in messages if isinstance(messages, list) else []:
        content = message.get("content") if isinstance(message, Mapping) else None
        for part in content if isinstance(content, list) else []:
            if not isinstance(part, dict) or part.get("type") != "image_url":
                continue
            image = part.get("image_url")
            if isinstance(image, dict) and isinstance(image.get("url"), str):
                found.append(image)
            elif isinstance(image, str):
                found.append(part)
    return found


def relative_prompt(raw_prompt: str, root: str) -> str | None:
    """``raw_prompt`` with the ``file://`` URLs of images under ``root`` made relative.

    Args:
        raw_prompt: a stored prompt (JSON list of chat messages).
        root: :func:`root_url` of the storage directory.

    Returns:
        The rewritten prompt (``json.dumps`` of the messages), or None when it names
        no image under ``root``, is not JSON, or already holds a relative image URL
        (an old bare path: left alone, since reading would resolve it against ``root``).

    Cost: one JSON parse and two encodings, only for prompts that mention ``root``.
    """
    prefix = root + "/"
    if prefix not in raw_prompt:
        return None
    try:
        messages = json.loads(raw_prompt)
    except ValueError:
        return None
    holders = _image_urls(messages)
    if not any(_key_url(h).startswith(prefix) for h in holders):
        return None
    if _RELATIVE_URL.search(json.dumps(messages, ensure_ascii=False)):
        return None
    for holder in holders:
        key = "url" if "url" in holder else "image_url"
        if holder[key].startswith(prefix):
            holder[key] = holder[key][len(prefix) :]
    return json.dumps(messages, ensure_ascii=False)


def _key_url(holder: Mapping[str, Any]) -> str:
    return str(holder["url"] if "url" in holder else holder["image_url"])


def resolve_prompt(raw_prompt: str, root: str) -> str:
    """A prompt written by :func:`relative_prompt` with its relative image URLs made
    ``file://`` URLs under ``root`` (:func:`root_url` of the storage directory now)."""
    return _RELATIVE_URL.sub(lambda m: m.group(0) + root + "/", raw_prompt)
