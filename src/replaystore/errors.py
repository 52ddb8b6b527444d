"""Exceptions raised by replaystore.

Every error the library raises on bad input or bad state derives from
:class:`ReplayStoreError`, so callers can catch the whole family at once. Each
subclass also derives from the built-in exception a caller would expect
(``ValueError``, ``IndexError``, ...), so ``except ValueError`` keeps working
for code written against the seed systems.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Collection
from typing import Any, TypeVar

__all__ = [
    "ArgumentError",
    "ArgumentTypeError",
    "BufferIndexError",
    "CheckpointError",
    "CompiledKernelWarning",
    "ConfigError",
    "EmptyBufferError",
    "ExportError",
    "ImageError",
    "ModelServerError",
    "PriorityError",
    "QueryError",
    "RateLimitTimeout",
    "ReplayStoreError",
    "SchemaError",
    "StorageError",
    "TrajectoryError",
    "UnsafeFileError",
    "check_choice",
    "check_int",
    "check_number",
]

_T = TypeVar("_T")


class ReplayStoreError(Exception):
    """Base class of every error replaystore raises on purpose."""


class SchemaError(ReplayStoreError, ValueError):
    """Data does not match the schema of the store (key, shape, dtype or field)."""


class EmptyBufferError(ReplayStoreError, LookupError):
    """Sampling was asked of a buffer (or a query) that holds no items."""


class QueryError(ReplayStoreError, ValueError):
    """A query condition is malformed: unknown operator or field, bad value type."""


class StorageError(ReplayStoreError, OSError):
    """A storage backend failed to read or write, or its files are not ours."""


class CheckpointError(ReplayStoreError, ValueError):
    """A checkpoint is missing, incomplete, or incompatible with the buffer."""


class TrajectoryError(ReplayStoreError, ValueError):
    """A trajectory or step is malformed; the message names the trajectory and step."""


class UnsafeFileError(ReplayStoreError, ValueError):
    """A file asked us to execute or import something we do not allow."""


class ExportError(ReplayStoreError, ValueError):
    """A record cannot be exported (e.g. image placeholders do not match images)."""


class BufferIndexError(ReplayStoreError, IndexError):
    """An index names no stored item (negative, or at or past the number of stored items)."""


class PriorityError(ReplayStoreError, ValueError):
    """A priority update is invalid: NaN, infinite or negative values, or mismatched lengths."""


class ImageError(ReplayStoreError, ValueError):
    """An image file or data URL is unreadable, not an image, or of an unsupported type."""


class ModelServerError(ReplayStoreError, RuntimeError):
    """A model server (OpenAI chat-completions protocol, e.g. vLLM) refused a request, kept
    failing after retries, or answered in a shape the protocol does not allow.

    ``status`` is the last HTTP status (``None`` for timeouts and connection errors).
    """

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class RateLimitTimeout(ReplayStoreError, TimeoutError):
    """A call waited for a buffer's rate limiter longer than its ``timeout``.

    Raised by ``sample_batch(..., timeout=)`` (too few items yet, or the learner
    is ahead of ``samples_per_insert``) and ``add``/``add_batch(..., timeout=)``
    (the actors are ahead). A ``TimeoutError``, so ``except TimeoutError`` works.

    Attributes:
        requested: items the call asked to sample or insert.
        completed: items it inserted before timing out (``add_batch`` goes on in
            parts, see :class:`~replaystore.transitions.RateLimiter`); always 0
            for a sample, which counts nothing when it times out.
    """

    def __init__(self, message: str, *, requested: int = 0, completed: int = 0) -> None:
        super().__init__(message)
        self.requested = requested
        self.completed = completed


class ArgumentError(ReplayStoreError, ValueError):
    """An argument of a public call is invalid: out of range, or not one of the accepted names.

    The one family for argument validation (batch sizes, capacities, sampler or
    storage names, exponents): the message names the argument, what it must be
    and what it got. A ``ValueError``, so ``except ValueError`` keeps working.
    :func:`check_int`, :func:`check_number` and :func:`check_choice` raise it.
    """


class ArgumentTypeError(ArgumentError, TypeError):
    """An argument is of the wrong type (a string or ``None`` where an integer is expected).

    Both an :class:`ArgumentError` (a ``ValueError``) and a ``TypeError``, so callers
    catching either keep working.
    """


class ConfigError(ArgumentError):
    """A setting is missing, out of range or of the wrong kind (config, options, mode)."""


class CompiledKernelWarning(UserWarning):
    """A compiled kernel is not installed, so a slower NumPy fallback is in use.

    Emitted at most once per process, at the first use of a fallback the user did
    not choose. Silence it by installing the kernels (a C compiler, then reinstall
    replaystore), by choosing NumPy explicitly (``REPLAYSTORE_SUMTREE=numpy``,
    ``REPLAYSTORE_RINGCOPY=numpy``, or the constructor's ``backend`` /
    ``add_backend``), or with
    ``warnings.filterwarnings("ignore", category=CompiledKernelWarning)``.
    """


# --------------------------------------------------------------- argument checks
# Small validators every package can use at its boundary, so the same mistake
# gets the same exception type and wording everywhere.


def check_int(value: Any, name: str, *, minimum: int | None = None) -> int:
    """``value`` as an ``int``, or :class:`ArgumentError` naming ``name``.

    Accepts Python and NumPy integers and integral floats (``3.0``); refuses
    ``bool``, non-integral numbers and non-numbers.

    Args:
        value: the argument.
        name: its name, as the caller spells it (``"batch_size"``).
        minimum: smallest allowed value (inclusive), or None for no bound.

    Raises:
        ArgumentTypeError: not a number (or a ``bool``).
        ArgumentError: not integral, or below ``minimum``.
    """
    if minimum is None:
        need = "an integer"
    else:
        need = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ArgumentTypeError(f"{name} must be {need}, got {value!r}")
    if isinstance(value, numbers.Integral):
        result = int(value)
    elif math.isfinite(value) and float(value).is_integer():
        result = int(float(value))
    else:
        raise ArgumentError(f"{name} must be {need}, got {value!r}")
    if minimum is not None and result < minimum:
        raise ArgumentError(f"{name} must be {need}, got {value!r}")
    return result


def check_number(
    value: Any,
    name: str,
    *,
    minimum: float | None = None,
    strict: bool = False,
) -> float:
    """``value`` as a finite ``float``, or :class:`ArgumentError` naming ``name``.

    Args:
        value: the argument (a Python or NumPy real number, not a ``bool``).
        name: its name.
        minimum: lower bound, or None.
        strict: the bound is exclusive (``> minimum``) instead of ``>= minimum``.

    Raises:
        ArgumentTypeError: not a real number (or a ``bool``).
        ArgumentError: NaN, infinite, or outside the bound.
    """
    bound = "" if minimum is None else f" and {'>' if strict else '>='} {minimum:g}"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ArgumentTypeError(f"{name} must be a finite number{bound}, got {value!r}")
    result = float(value)
    below = minimum is not None and (result <= minimum if strict else result < minimum)
    if not math.isfinite(result) or below:
        raise ArgumentError(f"{name} must be finite{bound}, got {value!r}")
    return result


def check_choice(value: _T, name: str, choices: Collection[_T]) -> _T:
    """``value`` if it is one of ``choices``, else :class:`ArgumentError` listing them.

    Raises:
        ArgumentError: ``value`` is not one of ``choices`` (unhashable values too).
    """
    try:
        ok = value in choices
    except TypeError:  # an unhashable value in a set
        ok = False
    if not ok:
        listed = ", ".join(repr(c) for c in choices)
        raise ArgumentError(f"{name} must be one of {listed}, got {value!r}")
    return value
