"""Ray, imported lazily, and how errors cross the actor boundary.

Ray is an optional dependency (the ``ray`` extra); nothing outside
``replaystore.distributed`` imports it, and this package only imports it when
an actor is created or a call is made, so ``import replaystore.distributed``
works (and fails clearly on first use) without it.
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any, NoReturn

from replaystore.errors import ReplayStoreError

logger = logging.getLogger("replaystore.distributed")

_INSTALL = 'pip install "replaystore[ray]"'


class RemoteActorError(ReplayStoreError, RuntimeError):
    """An actor that hosts a buffer or a shard is dead or unreachable.

    The message names the actor (``shard 1 of 'replay'``) and says whether Ray
    will restart it (``max_restarts``) and from which checkpoint.
    """


def import_ray() -> ModuleType:
    """``import ray``, or an ImportError that says how to install it.

    Raises:
        ImportError: Ray is not installed (the message names the ``ray`` extra).
    """
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - exercised only without ray
        raise ImportError(
            f"replaystore.distributed needs Ray, which is not installed: {_INSTALL}"
        ) from exc
    return ray


def require_initialized(ray: ModuleType) -> None:
    """Raise a clear error when no Ray runtime is connected.

    Raises:
        RuntimeError: ``ray.init()`` (or ``ray.init(address=...)``) was not called.
    """
    if not ray.is_initialized():
        raise RuntimeError(
            "Ray is not initialized: call ray.init() (one machine) or "
            "ray.init(address='auto') (an existing cluster) first"
        )


def reraise(exc: BaseException, what: str) -> NoReturn:
    """Re-raise a Ray error on the caller's side as the original exception.

    A ``RayTaskError`` (the remote method raised) becomes the exception the
    method raised, same type and message; a dead or unreachable actor becomes
    :class:`RemoteActorError` naming ``what``.
    """
    ray = import_ray()
    if isinstance(exc, ray.exceptions.RayTaskError):
        cause: Any = getattr(exc, "cause", None)
        if isinstance(cause, BaseException):
            raise cause.with_traceback(None) from None
        raise exc
    if isinstance(exc, ray.exceptions.RayActorError | ray.exceptions.ActorUnavailableError):
        raise RemoteActorError(f"{what} is dead or unreachable: {exc}") from exc
    raise exc


def get(refs: Any, what: str) -> Any:
    """``ray.get(refs)`` with errors re-raised as the original type (see :func:`reraise`)."""
    ray = import_ray()
    try:
        return ray.get(refs)
    except ray.exceptions.RayError as exc:
        reraise(exc, what)
