"""A missing compiled kernel is said once, at first use; an explicit NumPy choice is silent."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import replaystore.transitions.writer as writer_module
from replaystore import _kernels, sampling
from replaystore.errors import CompiledKernelWarning
from replaystore.sampling import SumTree
from replaystore.transitions import ReplayBuffer


@pytest.fixture
def fresh_process(monkeypatch):
    """As if nothing had warned yet in this process, with no kernel chosen by environment."""
    monkeypatch.setattr(_kernels, "_warned", False)
    for kernel in _kernels.KERNELS:
        monkeypatch.delenv(kernel.env, raising=False)


def kernel_warnings(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, CompiledKernelWarning)]


def test_missing_sumtree_warns_once_at_first_use(fresh_process, monkeypatch):
    monkeypatch.setattr(sampling, "_csumtree", None)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        tree = SumTree(16)
        SumTree(16)
        SumTree(32, backend="auto")
    (message,) = kernel_warnings(record)
    assert tree.backend == "numpy"
    assert record[0].filename == __file__  # points at the user's line, not library internals
    assert "replaystore._sumtree is not installed" in message
    assert "prioritized sampling" in message and "10x slower" in message
    assert "C compiler" in message and "reinstall" in message
    assert "REPLAYSTORE_SUMTREE=numpy" in message


def test_missing_ringcopy_warns_at_first_buffer(fresh_process, monkeypatch):
    monkeypatch.setattr(writer_module, "_cringcopy", None)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        buf = ReplayBuffer("cpu", "cpu", 8, storage="memory", seed=0)
        buf.add({"obs": np.zeros(3, np.float32), "action": 1})
    (message,) = kernel_warnings(record)
    assert buf.add_backend == "numpy"
    assert "replaystore._ringcopy is not installed" in message
    assert "REPLAYSTORE_RINGCOPY=numpy" in message


def test_only_one_warning_for_both_missing_kernels(fresh_process, monkeypatch):
    monkeypatch.setattr(sampling, "_csumtree", None)
    monkeypatch.setattr(writer_module, "_cringcopy", None)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        ReplayBuffer("cpu", "cpu", 8, sampler="prioritized", storage="memory", seed=0)
        SumTree(8)
    assert len(kernel_warnings(record)) == 1


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_explicit_numpy_choice_never_warns(fresh_process, monkeypatch, how):
    monkeypatch.setattr(sampling, "_csumtree", None)
    monkeypatch.setattr(writer_module, "_cringcopy", None)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        if how == "argument":
            tree = SumTree(8, backend="numpy")
            buf = ReplayBuffer("cpu", "cpu", 8, storage="memory", add_backend="numpy")
        else:
            monkeypatch.setenv("REPLAYSTORE_SUMTREE", "numpy")
            monkeypatch.setenv("REPLAYSTORE_RINGCOPY", "numpy")
            tree = SumTree(8)
            buf = ReplayBuffer("cpu", "cpu", 8, storage="memory")
    assert kernel_warnings(record) == []
    assert tree.backend == buf.add_backend == "numpy"
    assert _kernels._warned is False  # a later unintended fallback would still be reported


def test_installed_kernels_never_warn(fresh_process):
    if sampling._csumtree is None or writer_module._cringcopy is None:
        pytest.skip("this install has no compiled kernels")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        SumTree(8)
        ReplayBuffer("cpu", "cpu", 8, sampler="prioritized", storage="memory")
    assert kernel_warnings(record) == []


def test_missing_c_choice_still_raises_instead_of_warning(fresh_process, monkeypatch):
    monkeypatch.setattr(sampling, "_csumtree", None)
    with pytest.raises(ImportError, match="backend='c'"):
        SumTree(8, backend="c")
    assert _kernels._warned is False


def test_install_without_extensions_warns_once_in_a_fresh_process():
    # The extensions made unimportable before replaystore is imported, as on a machine
    # where pip had no C compiler: one warning for the whole session, naming both.
    # (Only the NumPy-only sampling module is imported: no torch start-up cost.)
    script = textwrap.dedent(
        """
        import sys, warnings
        sys.modules["replaystore._sumtree"] = None
        sys.modules["replaystore._ringcopy"] = None
        warnings.simplefilter("always")
        from replaystore.sampling import SumTree
        trees = [SumTree(64) for _ in range(3)]
        trees[0].update([1, 5], [1.0, 3.0])
        print(trees[0].backend, sorted(set(trees[0].sample(100, rng=0).tolist())))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "numpy [1, 5]"
    assert proc.stderr.count("CompiledKernelWarning") == 1, proc.stderr
    assert "is missing too" in proc.stderr


def test_kernel_report_names_the_active_implementation(monkeypatch):
    monkeypatch.setenv("REPLAYSTORE_SUMTREE", "numpy")
    monkeypatch.setenv("REPLAYSTORE_RINGCOPY", "fortran")
    report = {entry["name"]: entry for entry in _kernels.kernel_report()}
    assert set(report) == {"sumtree", "ringcopy", "recency", "jsoncopy", "nstep", "texts"}
    assert report["sumtree"]["active"] == "numpy"
    assert report["sumtree"]["note"] == "chosen by REPLAYSTORE_SUMTREE=numpy"
    assert report["ringcopy"]["active"] == "error"
    assert "'fortran'" in report["ringcopy"]["note"]
    monkeypatch.delenv("REPLAYSTORE_SUMTREE")
    entry = next(e for e in _kernels.kernel_report() if e["name"] == "sumtree")
    assert entry["active"] == ("c" if entry["installed"] else "numpy")
