"""Passwords out of text before it reaches a person or a file: :func:`redact`.

A store URL (``postgresql://user:secret@host/db``) carries its password; every
message, log record, page, progress bar and config that may show a URL passes
through :func:`redact`, which writes the password as ``***``. Cheap to import
(no replaystore imports), so the command line can use it on every error.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import unquote, urlsplit

__all__ = ["MASK", "RedactingFormatter", "redact", "redact_data", "url_passwords"]

MASK = "***"

# scheme://user:PASSWORD@ : the password runs to the last "@" before whitespace or a
# quote (a raw "@" in a password must not leave its tail behind).
_URL_PASSWORD = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/?#@'\"]*):[^\s'\"]*@")
# libpq's keyword form and the URL query parameter: password=secret, password='a b'.
_KEYWORD_PASSWORD = re.compile(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&'\"]+)", re.I)


def url_passwords(words: Iterable[str]) -> list[str]:
    """The passwords of the URLs among ``words`` (as written and percent-decoded).

    For :func:`redact`'s ``secrets``: a driver's error message may quote a password
    outside any URL (libpq's "invalid percent-encoded token" does).
    """
    found: set[str] = set()
    for word in words:
        if "://" not in word:
            continue
        try:
            password = urlsplit(word).password
        except ValueError:  # a malformed URL (a bad port, an unclosed bracket)
            password = None
        if password:
            found.update({password, unquote(password)})
    return sorted(found, key=len, reverse=True)


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with the password of every URL in it (and every ``password=`` value)
    written as ``***``; each of ``secrets`` is masked wherever it appears.

    Cost: two regular-expression passes over ``text``.
    """
    text = _URL_PASSWORD.sub(rf"\1:{MASK}@", text)
    text = _KEYWORD_PASSWORD.sub(rf"\1{MASK}", text)
    for secret in secrets:
        if secret:
            text = text.replace(secret, MASK)
    return text


def redact_data(value: Any) -> Any:
    """``value`` (JSON-like: dicts, lists, tuples, strings) with :func:`redact` applied
    to every string in it, keys included; other values are returned as they are."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact_data(k): redact_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_data(v) for v in value]
    if isinstance(value, tuple):
        return tuple(redact_data(v) for v in value)
    return value


class RedactingFormatter(logging.Formatter):
    """A :class:`logging.Formatter` whose output (message, traceback) is :func:`redact`-ed."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))
