"""``replaystore info``: versions, the active compiled kernels and the optional packages present."""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
from pathlib import Path
from typing import Any

from replaystore import __version__
from replaystore.cli._common import Parser, one_line, table

__all__ = ["DESCRIPTION", "add_arguments", "run", "version_text"]

DESCRIPTION = (
    "Print replaystore's version and where it is installed, the versions of "
    "Python, torch, numpy and tensordict, whether CUDA is available, which "
    "implementation of each compiled kernel is active (compiled or the slower NumPy "
    "fallback) and which optional packages import. Paste it into a bug report."
)


def add_arguments(parser: Parser) -> None:
    """The options of ``replaystore info``."""
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")


_CORE_PACKAGES = ("torch", "numpy", "tensordict")

# (import name, distribution, how to install it, what needs it)
_OPTIONAL_PACKAGES = (
    ("pyarrow", "pyarrow", "replaystore[parquet]", "Parquet task files (pipeline task sampler)"),
    ("pandas", "pandas", "replaystore[pandas]", "DataFrames in the WebGym utils drop-ins"),
    ("gymnasium", "gymnasium", "replaystore[demo]", "the demo's DQN part, the DQN example"),
    ("matplotlib", "matplotlib", "replaystore[demo]", "the demo's plots"),
    ("pydantic", "pydantic", "pydantic", "AWorld-style pydantic models in experience rows"),
    ("starlette", "starlette", "replaystore[view]", "replaystore view (with jinja2, uvicorn)"),
    ("jinja2", "jinja2", "replaystore[view]", "replaystore view's templates"),
    ("uvicorn", "uvicorn", "replaystore[view]", "replaystore view's server"),
    ("ray", "ray", "replaystore[ray]", "replaystore.distributed, the distributed demo"),
    ("torchrl", "torchrl", "replaystore[bench]", "benchmarks/ (peer comparison)"),
    ("stable_baselines3", "stable-baselines3", "replaystore[bench]", "benchmarks/"),
    ("cpprb", "cpprb", "replaystore[bench]", "benchmarks/"),
)


def _dist_version(name: str) -> str | None:
    import importlib.metadata  # ~20 ms: only when versions are asked for

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _versions() -> dict[str, Any]:
    """Versions from package metadata: cheap, imports nothing."""
    return {
        "replaystore": __version__,
        "python": platform.python_version(),
        **{name: _dist_version(name) for name in _CORE_PACKAGES},
    }


def _optional_packages() -> list[dict[str, Any]]:
    """Each optional package, imported for real (a broken install shows its error)."""
    out = []
    for module, dist, install, used_for in _OPTIONAL_PACKAGES:
        entry: dict[str, Any] = {"package": dist, "install": install, "used_for": used_for}
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            # Not installed is no error; a dependency of it missing is one (a broken install).
            error = None if exc.name == module else one_line(exc)
            entry.update(importable=False, version=None, error=error)
        except Exception as exc:  # any failure to import means "not usable": say why
            entry.update(importable=False, version=None, error=one_line(exc))
        else:
            entry.update(importable=True, version=_dist_version(dist), error=None)
        out.append(entry)
    return out


def _environment_info() -> dict[str, Any]:
    import torch

    from replaystore._kernels import kernel_report

    package = Path(__file__).resolve().parents[1]  # replaystore/, not replaystore/cli/
    return {
        "versions": _versions(),
        "python": {
            "implementation": platform.python_implementation(),
            "executable": sys.executable,
        },
        "platform": platform.platform(),
        "package_path": str(package),
        "cuda": {
            "available": torch.cuda.is_available(),
            "devices": torch.cuda.device_count() if torch.cuda.is_available() else 0,
            "torch_cuda": torch.version.cuda,
        },
        "kernels": kernel_report(),
        "tensordict": _tensordict_info(),
        "optional": _optional_packages(),
    }


def _tensordict_info() -> dict[str, Any]:
    from replaystore import _tensordict_compat as compat

    version = _dist_version("tensordict") or ""
    return {
        "supported": compat.SUPPORTED,
        "in_supported_range": compat.in_supported_range(version),
        "fast_path": compat.FAST_PATH,
    }


def _kernel_summary() -> str:
    from replaystore._kernels import kernel_report

    words = {"c": "compiled", "numpy": "NumPy", "error": "error"}
    parts = []
    for k in kernel_report():
        text = f"{k['name']} {words[k['active']]}"
        if k["active"] != "c":
            text += f" ({k['note']})"
        parts.append(text)
    return ", ".join(parts)


def version_text() -> str:
    """What ``replaystore --version`` prints: versions and the active kernels."""
    v = _versions()
    packages = ", ".join(f"{name} {v[name] or 'not installed'}" for name in _CORE_PACKAGES)
    return (
        f"replaystore {v['replaystore']}\n"
        f"Python {v['python']}, {packages}\n"
        f"kernels: {_kernel_summary()}"
    )


def run(args: argparse.Namespace) -> int:
    """Print the environment report (text or ``--json``); returns the exit status."""
    info = _environment_info()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    v = info["versions"]
    print(f"replaystore {v['replaystore']} ({info['package_path']})")
    python = info["python"]
    print(f"Python {v['python']} ({python['implementation']}, {python['executable']})")
    print(f"platform: {info['platform']}")
    cuda = info["cuda"]
    gpus = f"available, {cuda['devices']} device(s)" if cuda["available"] else "not available"
    packages = [(name, v[name] or "NOT INSTALLED") for name in _CORE_PACKAGES]
    print("\npackages:")
    for line in table(("package", "version"), packages, "ll", indent="  "):
        print(line)
    build = f"torch built for CUDA {cuda['torch_cuda']}" if cuda["torch_cuda"] else "CPU-only torch"
    print(f"  CUDA: {gpus} ({build})")
    td = info["tensordict"]
    if td["in_supported_range"] and td["fast_path"]:
        print(f"  tensordict: in the tested range {td['supported']}, fast sample path")
    else:
        where = "in" if td["in_supported_range"] else "OUTSIDE"
        path = (
            "fast sample path"
            if td["fast_path"]
            else ("samples built with the public TensorDict() (about 4 us more per sample)")
        )
        print(f"  tensordict: {where} the tested range {td['supported']}; {path}")
    print("\ncompiled kernels:")
    active = {"c": "compiled", "numpy": "NumPy", "error": "ERROR"}
    kernels = [(k["name"], active[k["active"]], k["used_by"], k["note"]) for k in info["kernels"]]
    for line in table(("kernel", "active", "used for", "note"), kernels, "llll", indent="  "):
        print(line)
    if any(not k["installed"] for k in info["kernels"]):
        print(
            "  the compiled kernels are built at install time: install a C compiler (gcc or "
            "clang; MSVC Build Tools on Windows), then reinstall replaystore"
        )
    print("\noptional packages:")
    rows = [
        (
            o["package"],
            o["version"] if o["importable"] else "no" if o["error"] is None else "BROKEN",
            o["install"],
            o["used_for"] if o["error"] is None else f"{o['used_for']}; import fails: {o['error']}",
        )
        for o in info["optional"]
    ]
    for line in table(("package", "present", "install", "used for"), rows, "llll", indent="  "):
        print(line)
    return 0
