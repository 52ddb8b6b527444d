"""The order CI's test steps hand work out in (``tests/conftest.py``): the longest test
files first, the files that start Ray in-process last, and no name in the list of long
files that has stopped naming a file (a renamed file would silently lose its place)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from types import SimpleNamespace

from conftest import _LONGEST_FIRST, _RAY_FILES, pytest_collection_modifyitems

ROOT = Path(__file__).resolve().parents[1]


def test_every_long_file_named_exists() -> None:
    missing = [name for name in _LONGEST_FIRST if not (ROOT / "tests" / name).is_file()]
    assert not missing, f"tests/conftest.py _LONGEST_FIRST names no such file: {missing}"
    assert len(set(_LONGEST_FIRST)) == len(_LONGEST_FIRST)


def _item(path: str) -> SimpleNamespace:
    config = SimpleNamespace(rootpath=ROOT)
    return SimpleNamespace(path=ROOT / path, config=config, nodeid=path)


def test_long_files_go_first_and_ray_files_last_keeping_the_rest_in_place() -> None:
    names = [
        "tests/test_atomic.py",
        "tests/distributed/test_remote.py",
        "tests/loop/test_lora_training.py",
        "tests/test_sampling.py",
        "tests/distributed/test_buffer_privacy.py",
        "tests/demos/test_miniwob_demo.py",
        "tests/test_docs.py",
    ]
    items = [_item(n) for n in names]
    pytest_collection_modifyitems(SimpleNamespace(), items)  # type: ignore[arg-type]
    assert [i.nodeid for i in items] == [
        "tests/demos/test_miniwob_demo.py",
        "tests/loop/test_lora_training.py",
        "tests/test_atomic.py",
        "tests/test_sampling.py",
        "tests/test_docs.py",
        "tests/distributed/test_remote.py",
        "tests/distributed/test_buffer_privacy.py",
    ]
    assert "distributed" in _RAY_FILES


def test_the_docs_page_that_repeats_the_readmes_demo_goes_last() -> None:
    items = [
        _item("tests/test_docs.py"),
        _item("tests/distributed/test_remote.py"),
        _item("tests/test_docs.py"),
    ]
    items[0].nodeid = "tests/test_docs.py::test_doc_block[docs/cli.md:28:console]"
    items[2].nodeid = "tests/test_docs.py::test_doc_block[README.md:194:console]"
    pytest_collection_modifyitems(SimpleNamespace(), items)  # type: ignore[arg-type]
    assert [i.nodeid.split("[")[-1] for i in items] == [
        "README.md:194:console]",
        "tests/distributed/test_remote.py",
        "docs/cli.md:28:console]",
    ]


def test_xdist_keeps_the_collection_order() -> None:
    """pytest-xdist reorders scopes by their number of tests unless told not to."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    addopts = pyproject["tool"]["pytest"]["ini_options"]["addopts"]
    assert "--no-loadscope-reorder" in addopts.split()


def test_a_files_tests_run_on_one_worker() -> None:
    """--dist loadfile: a module fixture (a Ray runtime, a browser) is set up once per
    file. --dist loadgroup's groups are lost with pytest 9.2 and pytest-xdist 3.8 (the
    group goes into a node-id attribute pytest no longer reads), which set up each Ray
    file's runtime on both workers."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    addopts = pyproject["tool"]["pytest"]["ini_options"]["addopts"].split()
    assert addopts[addopts.index("--dist") + 1] == "loadfile"
