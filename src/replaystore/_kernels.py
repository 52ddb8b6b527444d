"""Choosing between an optional compiled kernel and its NumPy fallback."""

from __future__ import annotations

import os
from types import ModuleType


def resolve_kernel(
    module: ModuleType | None, choice: str | None, *, env: str, argument: str
) -> ModuleType | None:
    """The compiled ``module`` to use, or None for the NumPy fallback.

    Args:
        module: the imported extension, or None when it is not installed.
        choice: ``"auto"`` (compiled when installed), ``"c"`` (compiled, or an
            error), ``"numpy"``; None reads the environment variable ``env``
            (default ``"auto"``).
        env: the environment variable consulted when ``choice`` is None.
        argument: the keyword that carries ``choice``, for error messages.

    Raises:
        ValueError: an unknown choice. ImportError: ``"c"`` without the extension.
    """
    name = os.environ.get(env, "auto") if choice is None else choice
    if name not in ("auto", "c", "numpy"):
        source = argument if choice is not None else env
        raise ValueError(f"{source} must be 'auto', 'c' or 'numpy', got {name!r}")
    if name == "numpy":
        return None
    if module is None and name == "c":
        raise ImportError(
            f"the compiled kernel for {argument}='c' is not installed; reinstall replaystore "
            f"with a C compiler available, or use {argument}='numpy'"
        )
    return module
