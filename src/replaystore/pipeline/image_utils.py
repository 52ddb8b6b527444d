"""WebGym's ``webgym/utils/image_utils.py``, over :mod:`replaystore.pipeline.images`.

``from webgym.utils.image_utils import X`` becomes
``from replaystore.pipeline.image_utils import X`` (or ``from replaystore.pipeline
import X``). Same names, parameters and return types; where WebGym guesses,
these check (see :mod:`replaystore.pipeline.images`):

* :func:`encode_image_to_base64` takes the MIME type from the file's magic bytes
  (WebGym labels every non-``.png`` file ``image/jpeg``, so a WebP screenshot was
  sent as JPEG) and refuses a file that is not a PNG, JPEG, WebP or GIF image;
* :func:`encode_image_to_file_url` percent-encodes the path (WebGym's
  ``"file://" + path`` breaks on a space or ``#``) and refuses a missing file,
  which WebGym would only notice when the model server failed to open it.

All errors are :class:`~replaystore.errors.ImageError`, a ``ValueError``, so
``except ValueError`` written for WebGym still catches them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from replaystore.errors import ImageError
from replaystore.images import image_part_url, image_to_data_url, image_to_file_url

__all__ = [
    "convert_messages_to_path_format",
    "encode_image_to_base64",
    "encode_image_to_file_url",
]


def encode_image_to_base64(image_path: str | os.PathLike[str]) -> str:
    """``data:<mime>;base64,<payload>`` for an image file (for OpenAI-style APIs).

    Cost: reads the whole file; the URL is about 4/3 of the file size.

    Raises:
        ImageError: the file is missing, unreadable, or not a PNG/JPEG/WebP/GIF image.
    """
    return image_to_data_url(image_path)


def encode_image_to_file_url(image_path: str | os.PathLike[str]) -> str:
    """The absolute, percent-encoded ``file://`` URL of an image (for vLLM, which reads it).

    Relative paths are resolved against the current directory.

    Raises:
        ImageError: the file does not exist.
    """
    return image_to_file_url(image_path)


def convert_messages_to_path_format(
    messages: Sequence[Mapping[str, Any]] | Mapping[str, Any],
    trajectory: Sequence[Any] | None = None,
    current_observation: Any = None,
) -> str:
    """Chat messages as the JSON text WebGym stores in ``Response.raw_prompt``.

    A single message dict is wrapped in a list. Every image part must already be
    a ``file://`` URL (screenshots are referenced, not inlined): the stored prompt
    stays small and the replay buffer reads it back with
    :func:`replaystore.trajectories.buffer.parse_prompt`. ``trajectory`` and
    ``current_observation`` are accepted and unused, as in WebGym.

    Returns:
        ``json.dumps(messages, indent=2, ensure_ascii=False)`` (WebGym's exact text).

    Raises:
        ImageError: a message is not a dict, or an image part holds a base64 data
            URL or anything else than a ``file://`` URL (message and part named).

    Cost: one pass over the messages plus the JSON encoding.
    """
    del trajectory, current_observation  # kept for WebGym's signature
    if isinstance(messages, Mapping):
        messages = [messages]
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ImageError(
            f"messages must be a dict or a list of dicts, got {type(messages).__name__}"
        )
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ImageError(f"messages[{i}] is a {type(message).__name__}, not a dict")
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            if not isinstance(part, Mapping):
                continue
            try:
                url = image_part_url(part)
            except ImageError as exc:
                raise ImageError(f"messages[{i}].content[{j}]: {exc}") from None
            if url is None:
                continue
            if url.startswith("data:image"):
                raise ImageError(
                    f"messages[{i}].content[{j}]: base64-encoded images are not stored; "
                    f"use file:// URLs (encode_image_to_file_url). Found: {url[:50]}..."
                )
            if not url.startswith("file://"):
                raise ImageError(
                    f"messages[{i}].content[{j}]: expected a file:// image URL, got {url[:50]!r}"
                )
    return json.dumps(list(messages), indent=2, ensure_ascii=False)
