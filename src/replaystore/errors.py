"""Exceptions raised by replaystore.

Every error the library raises on bad input or bad state derives from
:class:`ReplayStoreError`, so callers can catch the whole family at once. Each
subclass also derives from the built-in exception a caller would expect
(``ValueError``, ``IndexError``, ...), so ``except ValueError`` keeps working
for code written against the seed systems.
"""

from __future__ import annotations

__all__ = [
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
    "ReplayStoreError",
    "SchemaError",
    "StorageError",
    "TrajectoryError",
    "UnsafeFileError",
]


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


class ConfigError(ReplayStoreError, ValueError):
    """An argument is out of range or of the wrong kind (capacity, page, batch size, mode)."""


class CompiledKernelWarning(UserWarning):
    """A compiled kernel is not installed, so a slower NumPy fallback is in use.

    Emitted at most once per process, at the first use of a fallback the user did
    not choose. Silence it by installing the kernels (a C compiler, then reinstall
    replaystore), by choosing NumPy explicitly (``REPLAYSTORE_SUMTREE=numpy``,
    ``REPLAYSTORE_RINGCOPY=numpy``, or the constructor's ``backend`` /
    ``add_backend``), or with
    ``warnings.filterwarnings("ignore", category=CompiledKernelWarning)``.
    """
