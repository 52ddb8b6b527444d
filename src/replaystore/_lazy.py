"""Lazy package attributes: names resolved from their modules on first access.

Keeps ``import replaystore`` (and ``import replaystore.pipeline``) from importing
torch and every buffer up front.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, namespace: dict[str, Any], names: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package`` resolving ``names`` (name -> module).

    A resolved name is cached in ``namespace`` (the package's ``globals()``), so
    the module-level ``__getattr__`` runs once per name.
    """

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(names))

    return __getattr__, __dir__
