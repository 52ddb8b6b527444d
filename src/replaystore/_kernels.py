"""Choosing between an optional compiled kernel and its NumPy fallback.

Small C extensions are built at install time when a C compiler is present
(see ``setup.py``); without one the install still succeeds and each caller
uses its NumPy implementation, which gives the same results more slowly. That
silent slowdown is the one thing a user cannot see, so the first time a
fallback is used because the extension is missing (not because the user asked
for NumPy), :func:`resolve_kernel` emits one :class:`CompiledKernelWarning`
per process saying what is slower and how to get the compiled kernel.
:func:`kernel_report` describes every kernel for ``replaystore info``.
"""

from __future__ import annotations

import importlib
import os
import threading
import warnings
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from replaystore.errors import ArgumentError, CompiledKernelWarning, ConfigError

__all__ = [
    "KERNELS",
    "CompiledKernelWarning",
    "Kernel",
    "kernel_report",
    "resolve_kernel",
]


@dataclass(frozen=True, slots=True)
class Kernel:
    """One optional compiled kernel."""

    name: str
    """Short name, as ``replaystore info`` shows it."""
    module: str
    """Import path of the extension module."""
    env: str
    """Environment variable choosing ``auto`` / ``c`` / ``numpy``."""
    used_by: str
    """What runs on it."""
    fallback_cost: str
    """What the NumPy fallback costs, in words."""


KERNELS: tuple[Kernel, ...] = (
    Kernel(
        name="sumtree",
        module="replaystore._sumtree",
        env="REPLAYSTORE_SUMTREE",
        used_by="prioritized sampling (SumTree sample/update)",
        fallback_cost="about 10x slower prioritized sampling and priority updates",
    ),
    Kernel(
        name="ringcopy",
        module="replaystore._ringcopy",
        env="REPLAYSTORE_RINGCOPY",
        used_by="transition buffer adds on CPU storage (check-and-copy)",
        fallback_cost="about 4x slower TransitionBuffer.add/add_batch",
    ),
    Kernel(
        name="recency",
        module="replaystore._recency",
        env="REPLAYSTORE_RECENCY",
        used_by="recency-biased sampling (trajectory buffer get_training_samples)",
        fallback_cost="about 2x slower recency-biased sampling",
    ),
    Kernel(
        name="jsoncopy",
        module="replaystore._jsoncopy",
        env="REPLAYSTORE_JSONCOPY",
        used_by="the experience store's row checks and JSON encoding (in-memory store, "
        "SQLite/PostgreSQL/multi-process writes, snapshot=True)",
        fallback_cost="about 2-3x slower experience store/store_batch (Python's json instead)",
    ),
    Kernel(
        name="texts",
        module="replaystore._texts",
        env="REPLAYSTORE_TEXTS",
        used_by="reading samples from format 4 trajectory files (CRC-32C checks, one JSON "
        "array per batch) and writing their checksums",
        fallback_cost="about 1.3x slower cold reads of file-backed trajectory samples",
    ),
    Kernel(
        name="nstep",
        module="replaystore._nstep",
        env="REPLAYSTORE_NSTEP",
        used_by="n-step returns at sample time (ReplayBuffer(n_step>1) on CPU storage)",
        fallback_cost="about 2x slower n-step sample_batch (NumPy passes instead of one loop)",
    ),
)

_CHOICES = ("auto", "c", "numpy")
_warned = False
_warn_lock = threading.Lock()


def _kernel_for_env(env: str) -> Kernel | None:
    return next((k for k in KERNELS if k.env == env), None)


def _installed(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def _warn_fallback(env: str) -> None:
    """Warn, once per process, that the kernel chosen through ``env`` fell back to NumPy."""
    global _warned
    with _warn_lock:
        if _warned:
            return
        _warned = True
    kernel = _kernel_for_env(env)
    if kernel is None:  # a kernel not in KERNELS: say what we know
        what, cost, module = f"the kernel chosen by {env}", "slower", "its extension module"
    else:
        what, cost, module = kernel.used_by, kernel.fallback_cost, kernel.module
    others = [
        k.module
        for k in KERNELS
        if k.env != env and os.environ.get(k.env, "auto") != "numpy" and not _installed(k.module)
    ]
    also = f" ({', '.join(others)} is missing too)" if others else ""
    warnings.warn(
        f"replaystore's compiled kernel {module} is not installed{also}, so {what} uses the "
        f"NumPy fallback: {cost}. The kernels are built when replaystore is installed with a "
        "C compiler available (gcc or clang; on Windows, the MSVC Build Tools): install one, "
        "then reinstall replaystore (from a checkout: pip install --force-reinstall "
        "--no-deps -e .). 'replaystore info' shows the active kernels; set "
        f"{env}=numpy to choose the NumPy kernel on purpose and silence this warning.",
        CompiledKernelWarning,
        stacklevel=5,  # the caller of SumTree(...) or TransitionBuffer(...)
    )


def resolve_kernel(
    module: ModuleType | None, choice: str | None, *, env: str, argument: str
) -> ModuleType | None:
    """The compiled ``module`` to use, or None for the NumPy fallback.

    The first time in a process that ``"auto"`` resolves to the fallback because
    ``module`` is None (the extension was not built), a
    :class:`CompiledKernelWarning` is emitted; an explicit ``"numpy"`` never warns.

    Args:
        module: the imported extension, or None when it is not installed.
        choice: ``"auto"`` (compiled when installed), ``"c"`` (compiled, or an
            error), ``"numpy"``; None reads the environment variable ``env``
            (default ``"auto"``).
        env: the environment variable consulted when ``choice`` is None; also
            names the kernel in the warning (one of :data:`KERNELS`' ``env``).
        argument: the keyword that carries ``choice``, for error messages.

    Raises:
        ArgumentError: an unknown ``choice``; ConfigError: an unknown value of ``env``
            (both ``ValueError``). ImportError: ``"c"`` without the extension.
    """
    name = os.environ.get(env, "auto") if choice is None else choice
    if name not in _CHOICES:
        source = argument if choice is not None else env
        error = ArgumentError if choice is not None else ConfigError  # both ValueErrors
        raise error(f"{source} must be 'auto', 'c' or 'numpy', got {name!r}")
    if name == "numpy":
        return None
    if module is None and name == "c":
        raise ImportError(
            f"the compiled kernel for {argument}='c' is not installed; reinstall replaystore "
            f"with a C compiler available, or use {argument}='numpy'"
        )
    if module is None:
        _warn_fallback(env)
    return module


def kernel_report() -> list[dict[str, Any]]:
    """One entry per kernel of :data:`KERNELS`: what it is and which implementation is active.

    Each entry has ``name``, ``module``, ``env``, ``used_by``, ``installed``
    (the extension imports), ``setting`` (the environment variable's value,
    ``"auto"`` when unset), ``active`` (``"c"``, ``"numpy"``, or ``"error"``
    when the setting is invalid or asks for a missing kernel) and ``note`` (why,
    in words). Reads the environment; imports the extensions; emits no warning.
    """
    report = []
    for kernel in KERNELS:
        installed = _installed(kernel.module)
        setting = os.environ.get(kernel.env, "auto")
        if setting not in _CHOICES:
            active, note = "error", f"{kernel.env}={setting!r} is not 'auto', 'c' or 'numpy'"
        elif setting == "numpy":
            active, note = "numpy", f"chosen by {kernel.env}=numpy"
        elif installed:
            active, note = "c", f"{kernel.module} loaded"
        elif setting == "c":
            active, note = "error", f"{kernel.env}=c but {kernel.module} is not installed"
        else:
            active, note = "numpy", f"NOT INSTALLED: {kernel.fallback_cost}"
        report.append(
            {
                "name": kernel.name,
                "module": kernel.module,
                "env": kernel.env,
                "used_by": kernel.used_by,
                "installed": installed,
                "setting": setting,
                "active": active,
                "note": note,
            }
        )
    return report
