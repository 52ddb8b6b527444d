"""Screenshots as URLs for vision models: ``file://`` URLs, base64 data URLs, and back.

WebGym's ``webgym/utils/image_utils.py`` guesses the MIME type from the file
extension (anything that is not ``.png`` becomes ``image/jpeg``) and builds
``file://`` URLs by string concatenation (a space or ``#`` in a path breaks
them). Here the type comes from the file's magic bytes, ``file://`` URLs are
absolute and percent-encoded, and every error names the file (or the message
and content part) it is about.

Supported types: PNG, JPEG, WebP and GIF.

Message lists are OpenAI-style chat messages: ``content`` is a string or a list
of parts, and an image part is ``{"type": "image_url", "image_url": {"url": URL}}``
(the bare-string form ``"image_url": URL`` is also accepted and kept). The
conversions never modify their input; they return new lists.

This module sits below both :mod:`replaystore.trajectories` and
:mod:`replaystore.pipeline` (it imports neither, nor torch);
``replaystore.pipeline.images`` re-exports it unchanged for compatibility.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from replaystore.atomic import atomic_write_bytes
from replaystore.errors import ImageError

__all__ = [
    "EXTENSIONS",
    "data_url_to_file",
    "decode_data_url",
    "file_url_to_path",
    "image_mime_type",
    "image_part_url",
    "image_to_data_url",
    "image_to_file_url",
    "messages_to_data_urls",
    "messages_to_file_urls",
    "read_image",
    "sniff_mime_type",
]

#: File extension written for each supported MIME type.
EXTENSIONS: dict[str, str] = {
    "image/png": ".png",
    "image/jpeg": ".jpg",
    "image/webp": ".webp",
    "image/gif": ".gif",
}

_HEADER_BYTES = 12


def sniff_mime_type(data: bytes) -> str | None:
    """The MIME type of an image from its first bytes, or ``None`` if not a supported type.

    Only the first 12 bytes are looked at; ``data`` may be just that prefix.
    """
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def _read(file: Path, size: int = -1) -> bytes:
    try:
        with file.open("rb") as handle:
            return handle.read(size)
    except FileNotFoundError:
        raise ImageError(f"image file not found: {file}") from None
    except OSError as exc:
        raise ImageError(f"cannot read image file {file}: {exc}") from exc


def _mime_of(file: Path, head: bytes) -> str:
    mime = sniff_mime_type(head[:_HEADER_BYTES])
    if mime is None:
        raise ImageError(f"{file} is not a PNG, JPEG, WebP or GIF image (starts with {head[:8]!r})")
    return mime


def read_image(path: str | os.PathLike[str]) -> tuple[str, bytes]:
    """The MIME type (from the magic bytes) and the bytes of an image file.

    Raises:
        ImageError: the file is missing, unreadable, or not a supported image type.
    """
    file = Path(path)
    data = _read(file)
    return _mime_of(file, data), data


def image_mime_type(path: str | os.PathLike[str]) -> str:
    """The MIME type of an image file, from its magic bytes (the extension is ignored).

    Reads only the file's first 12 bytes.

    Raises:
        ImageError: the file is missing, unreadable, or not a supported image type.
    """
    file = Path(path)
    return _mime_of(file, _read(file, _HEADER_BYTES))


def image_to_data_url(path: str | os.PathLike[str]) -> str:
    """``data:<mime>;base64,<payload>`` for an image file; MIME type from its magic bytes.

    Cost: reads the whole file; the URL is about 4/3 of the file size.

    Raises:
        ImageError: the file is missing, unreadable, or not a supported image type.
    """
    mime, data = read_image(path)
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def image_to_file_url(path: str | os.PathLike[str]) -> str:
    """The absolute, percent-encoded ``file://`` URL of an existing file.

    Relative paths are resolved against the current directory (symlinks are kept).

    Raises:
        ImageError: the file does not exist.
    """
    file = Path(os.path.abspath(path))
    if not file.is_file():
        raise ImageError(f"image file not found: {file}")
    return file.as_uri()


def file_url_to_path(url: str) -> Path:
    """The local path of a ``file://`` URL (percent-escapes decoded).

    Accepts ``file:///abs/path`` and ``file://localhost/abs/path``. Does not
    check that the file exists.

    Raises:
        ImageError: ``url`` is not a local ``file://`` URL.
    """
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme != "file":
        raise ImageError(f"not a file:// URL: {url[:80]!r}")
    if parsed.netloc not in ("", "localhost"):
        raise ImageError(f"file URL names a remote host {parsed.netloc!r}: {url[:80]!r}")
    return Path(urllib.request.url2pathname(parsed.path))


def decode_data_url(url: str) -> tuple[str, bytes]:
    """The MIME type (from the decoded bytes' magic) and bytes of a base64 image data URL.

    The type declared in the URL is not trusted: WebGym labels every non-PNG
    file ``image/jpeg``, so the decoded bytes decide.

    Raises:
        ImageError: not a ``data:...;base64,`` URL, invalid base64, or not a supported image.
    """
    if not url.startswith("data:"):
        raise ImageError(f"not a data URL: {url[:40]!r}")
    header, sep, payload = url.partition(",")
    if not sep:
        raise ImageError(f"data URL has no ',' before its payload: {url[:40]!r}")
    params = header[len("data:") :].split(";")
    if "base64" not in params[1:]:
        raise ImageError(f"data URL is not base64-encoded: {header[:60]!r}")
    declared = params[0]
    if declared and not declared.startswith("image/"):
        raise ImageError(f"data URL declares {declared!r}, not an image type")
    try:
        data = base64.b64decode("".join(payload.split()), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ImageError(f"data URL ({header[:40]}) has invalid base64: {exc}") from None
    mime = sniff_mime_type(data[:_HEADER_BYTES])
    if mime is None:
        raise ImageError(
            f"data URL ({header[:40]}) does not hold a PNG, JPEG, WebP or GIF image "
            f"(starts with {data[:8]!r})"
        )
    return mime, data


def data_url_to_file(url: str, out_dir: str | os.PathLike[str]) -> Path:
    """Decode a base64 image data URL into ``out_dir/<content hash><ext>``; return the path.

    The name is the first 32 hex digits of the SHA-256 of the image bytes, so
    the same image is stored once however often it occurs; an existing file of
    that name is reused, not rewritten. Written atomically. ``out_dir`` is
    created if missing.

    Raises:
        ImageError: see :func:`decode_data_url`.
    """
    mime, data = decode_data_url(url)
    directory = Path(out_dir)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"{hashlib.sha256(data).hexdigest()[:32]}{EXTENSIONS[mime]}"
    if not target.is_file():
        atomic_write_bytes(target, data)
    return target.absolute()


def image_part_url(part: Mapping[str, Any]) -> str | None:
    """The URL of an ``image_url`` content part, or ``None`` if ``part`` is not an image part.

    Raises:
        ImageError: an ``image_url`` part without a string URL.
    """
    if part.get("type") != "image_url":
        return None
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, Mapping) else image
    if not isinstance(url, str):
        raise ImageError(f"image_url part has no string url: {part!r:.120}")
    return url


def _with_url(part: Mapping[str, Any], url: str) -> dict[str, Any]:
    new = dict(part)
    image = part["image_url"]
    new["image_url"] = {**image, "url": url} if isinstance(image, Mapping) else url
    return new


def _convert(
    messages: Sequence[Mapping[str, Any]], convert: Callable[[str], str]
) -> list[dict[str, Any]]:
    """Copy ``messages``, passing each image URL through ``convert`` (cached per URL)."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ImageError(f"messages must be a list of dicts, got {type(messages).__name__}")
    cache: dict[str, str] = {}
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ImageError(f"messages[{i}] is a {type(message).__name__}, not a dict")
        new_message = dict(message)
        content = message.get("content")
        if isinstance(content, list):
            parts: list[Any] = []
            for j, part in enumerate(content):
                url = image_part_url(part) if isinstance(part, Mapping) else None
                if url is None:
                    parts.append(dict(part) if isinstance(part, Mapping) else part)
                    continue
                if url not in cache:
                    try:
                        cache[url] = convert(url)
                    except ImageError as exc:
                        raise ImageError(f"messages[{i}].content[{j}]: {exc}") from None
                parts.append(_with_url(part, cache[url]))
            new_message["content"] = parts
        out.append(new_message)
    return out


def _local_path(url: str) -> Path | None:
    """Path for ``file://`` URLs and bare paths; ``None`` for data/http(s) URLs."""
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme == "file":
        return file_url_to_path(url)
    if scheme in ("data", "http", "https"):
        return None
    if scheme and len(scheme) > 1:  # one letter is a Windows drive, i.e. a bare path
        raise ImageError(f"unsupported image URL scheme {scheme!r}: {url[:80]!r}")
    return Path(url)


def messages_to_data_urls(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A copy of ``messages`` with every local image (``file://`` URL or path) inlined as base64.

    Data URLs and ``http(s)`` URLs are kept as they are. Each distinct file is
    read once. Cost: reads every referenced file.

    Raises:
        ImageError: a referenced file is missing or not an image (message and part named).
    """

    def convert(url: str) -> str:
        path = _local_path(url)
        return url if path is None else image_to_data_url(path)

    return _convert(messages, convert)


def messages_to_file_urls(
    messages: Sequence[Mapping[str, Any]], out_dir: str | os.PathLike[str]
) -> list[dict[str, Any]]:
    """A copy of ``messages`` with every data URL written to ``out_dir`` and replaced by its
    ``file://`` URL.

    Files are named by content hash (see :func:`data_url_to_file`), so repeated
    screenshots are stored once. ``file://`` and ``http(s)`` URLs are kept; bare
    paths become ``file://`` URLs.

    Raises:
        ImageError: a data URL is malformed or not an image (message and part named).
    """

    def convert(url: str) -> str:
        if url.startswith("data:"):
            return data_url_to_file(url, out_dir).as_uri()
        path = _local_path(url)
        if path is None or urllib.parse.urlsplit(url).scheme == "file":
            return url
        return image_to_file_url(path)

    return _convert(messages, convert)
