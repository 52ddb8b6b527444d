"""`replaystore info` and `--version`: versions, active kernels, optional packages."""

from __future__ import annotations

import importlib.metadata
import json
import platform
import sys

import pytest

import replaystore.transitions.buffer as buffer_module
from replaystore import __version__, sampling
from replaystore.cli import main


def info_json(capsys) -> dict:
    assert main(["info", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def info_text(capsys) -> str:
    assert main(["info"]) == 0
    return capsys.readouterr().out


@pytest.fixture
def kernels_from_environment(monkeypatch):
    monkeypatch.delenv("REPLAYSTORE_SUMTREE", raising=False)
    monkeypatch.delenv("REPLAYSTORE_RINGCOPY", raising=False)


def test_version_shows_versions_and_kernels(capsys, kernels_from_environment):
    assert main(["--version"]) == 0
    first, second, third = capsys.readouterr().out.strip().splitlines()
    assert first == f"replaystore {__version__}"
    assert second.startswith(f"Python {platform.python_version()}, ")
    for package in ("torch", "numpy", "tensordict"):
        assert f"{package} {importlib.metadata.version(package)}" in second
    sumtree = "compiled" if sampling._csumtree is not None else "NumPy"
    assert third.startswith(f"kernels: sumtree {sumtree}")
    assert "ringcopy" in third


def test_info_json_reports_versions_and_the_kernels_buffers_actually_use(
    capsys, kernels_from_environment
):
    info = info_json(capsys)
    assert info["versions"]["replaystore"] == __version__
    assert info["versions"]["python"] == platform.python_version()
    assert info["versions"]["torch"] == importlib.metadata.version("torch")
    assert info["python"]["executable"] == sys.executable
    kernels = {k["name"]: k for k in info["kernels"]}
    tree = sampling.SumTree(8)
    buf = buffer_module.ReplayBuffer("cpu", "cpu", 8, storage="memory")
    assert kernels["sumtree"]["active"] == tree.backend
    assert kernels["ringcopy"]["active"] == buf.add_backend
    assert set(info["cuda"]) == {"available", "devices", "torch_cuda"}


def test_info_lists_optional_packages_with_how_to_install_them(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # as if pandas were not installed
    optional = {o["package"]: o for o in info_json(capsys)["optional"]}
    assert {"pyarrow", "pandas", "gymnasium", "matplotlib", "pydantic"} <= set(optional)
    assert optional["pandas"]["importable"] is False
    assert optional["pandas"]["error"] is None  # simply absent, not broken
    assert optional["pyarrow"]["install"] == "replaystore[parquet]"
    assert optional["gymnasium"]["install"] == "replaystore[demo]"
    for entry in optional.values():
        if entry["importable"]:
            assert entry["version"] == importlib.metadata.version(entry["package"])

    text = info_text(capsys)
    (row,) = [line for line in text.splitlines() if line.split()[:1] == ["pandas"]]
    assert row.split()[1] == "no"


def test_info_text_is_a_table_of_kernels(capsys, monkeypatch):
    monkeypatch.setenv("REPLAYSTORE_SUMTREE", "numpy")
    monkeypatch.delenv("REPLAYSTORE_RINGCOPY", raising=False)
    text = info_text(capsys)
    assert text.startswith(f"replaystore {__version__} (")
    kernels = text.split("compiled kernels:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert kernels[0].split() == ["kernel", "active", "used", "for", "note"]
    sumtree = next(line for line in kernels if line.split()[0] == "sumtree")
    assert sumtree.split()[1] == "NumPy" and "chosen by REPLAYSTORE_SUMTREE=numpy" in sumtree


def test_info_says_how_to_get_a_missing_kernel(capsys, monkeypatch, kernels_from_environment):
    monkeypatch.setitem(sys.modules, "replaystore._sumtree", None)  # as if never compiled
    text = info_text(capsys)
    sumtree = next(line for line in text.splitlines() if line.strip().startswith("sumtree"))
    assert sumtree.split()[1] == "NumPy" and "NOT INSTALLED" in sumtree and "10x" in sumtree
    assert "install a C compiler" in text and "reinstall replaystore" in text
    info = info_json(capsys)
    entry = next(k for k in info["kernels"] if k["name"] == "sumtree")
    assert entry["installed"] is False and entry["active"] == "numpy"


def test_info_is_listed_in_the_top_level_help(capsys):
    assert main(["--help"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "info" in [line.split()[0] for line in lines if line.startswith("    ")]


def test_info_reports_the_tensordict_range_and_sample_path(capsys, monkeypatch):
    from replaystore import _tensordict_compat as compat

    td = info_json(capsys)["tensordict"]
    assert td == {"supported": compat.SUPPORTED, "in_supported_range": True, "fast_path": True}
    assert "tensordict: in the tested range >=0.5,<0.16, fast sample path" in info_text(capsys)
    # A tensordict release outside the range whose private constructor changed.
    monkeypatch.setattr(compat, "FAST_PATH", False)
    monkeypatch.setattr(compat, "in_supported_range", lambda version: False)
    text = info_text(capsys)
    assert "tensordict: OUTSIDE the tested range >=0.5,<0.16; samples built with the public" in text
