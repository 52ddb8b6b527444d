"""JSON and text speed-ups of the trajectory files: the step encoder, a ``json.loads``
without its wrapper's work, pydantic-core parsing of stored texts, and the compiled
kernels (``replaystore._jsoncopy``: deep copies and step dumps; ``replaystore._texts``:
CRC-32C and the samples of format 4 texts), each resolved on first use."""

from __future__ import annotations

import json
from typing import Any

from google_crc32c import value as _google_crc32c

# Encoders made once (json.dumps with options builds one per call).
STEP_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
SCAN = json.JSONDecoder().raw_decode
# STEP_ENCODER.encode of a str (ensure_ascii=False): the JSON string literal
encode_text = json.encoder.encode_basestring
_SCAN_ONCE = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


# [copy, dumps] of the compiled replaystore._jsoncopy, or [None, None]; resolved on first use
_KERNEL: list[Any] = []


def json_kernel() -> list[Any]:
    """``[copy, dumps]`` of ``replaystore._jsoncopy`` (a deep copy of parsed JSON; the
    text :data:`STEP_ENCODER` writes, or NotImplemented), or ``[None, None]`` (not
    compiled, or ``REPLAYSTORE_JSONCOPY=numpy``: Python's json does the work)."""
    if not _KERNEL:
        from replaystore._kernels import resolve_kernel

        try:
            from replaystore import _jsoncopy as module
        except ImportError:
            module = None
        kernel = resolve_kernel(
            module, None, env="REPLAYSTORE_JSONCOPY", argument="REPLAYSTORE_JSONCOPY"
        )
        _KERNEL[:] = [None, None] if kernel is None else [kernel.copy, kernel.dumps]
    return _KERNEL


def json_copy() -> Any:
    return json_kernel()[0]


def loads(text: str) -> Any:
    """``json.loads(text)``, without its wrapper's calls and whitespace scans when the
    text is exactly one JSON value (what the writer stores); anything else goes through
    ``json.loads`` (the same value or the same error)."""
    try:
        value, end = _SCAN_ONCE(text, 0)
    except StopIteration:
        return json.loads(text)
    return value if end == len(text) else json.loads(text)


# [module] of the compiled replaystore._texts, or [None]; resolved on first use
_TEXTS_KERNEL: list[Any] = []


def texts_kernel() -> Any:
    """``replaystore._texts`` (CRC-32C and the samples of format 4 texts), or None
    (not compiled, or ``REPLAYSTORE_TEXTS=numpy``: google-crc32c and Python slices)."""
    if not _TEXTS_KERNEL:
        from replaystore._kernels import resolve_kernel

        try:
            from replaystore import _texts as module
        except ImportError:
            module = None
        kernel = resolve_kernel(module, None, env="REPLAYSTORE_TEXTS", argument="REPLAYSTORE_TEXTS")
        _TEXTS_KERNEL[:] = [kernel]
    return _TEXTS_KERNEL[0]


def crc32c_function() -> Any:
    """The CRC-32C function :func:`crc32c` calls (for loops over many texts)."""
    kernel = texts_kernel()
    return kernel.crc32c if kernel is not None else _google_crc32c


def crc32c(data: bytes | memoryview) -> int:
    """The CRC-32C of ``data`` (the compiled kernel's, else google-crc32c's: the same)."""
    kernel = texts_kernel()
    if kernel is not None:
        return int(kernel.crc32c(data))
    return int(_google_crc32c(data))


from_json: Any
try:  # pydantic-core's JSON parser: the same values as json.loads, ~3x faster on messages
    from pydantic_core import from_json as from_json
except ImportError:  # pragma: no cover - a dependency; json.loads does the same work
    from_json = None


def loads_text(data: bytes | str) -> Any:
    """``json.loads(data)`` for one stored JSON text (UTF-8 bytes or str).

    pydantic-core parses it where it can (it gives the values ``json.loads`` gives,
    tested in tests/trajectories); anything it refuses (a lone surrogate escape,
    trailing text, bad UTF-8) goes to ``json.loads``, whose value or error decides.

    Raises:
        ValueError: not one JSON value (``json.JSONDecodeError``, ``UnicodeDecodeError``).
    """
    if from_json is not None:
        try:
            return from_json(data)
        except ValueError:
            pass
    return json.loads(data)
