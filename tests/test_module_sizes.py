"""One room per idea: no module of the library over 1,000 lines, and no function over 80
lines in the packages whose code grew fastest (``loop/``, ``trajectories/``).

A module that outgrows the limit holds more than one idea: split it along its seams (a
codec per format, a stage per module), as ``trajectories/files/`` and ``loop/stages/``
are split. A module's limit counts every line; a function's counts its signature and body
without its docstring (a public function's docstring may be long: it is the reference).
"""

from __future__ import annotations

import ast
from pathlib import Path

import replaystore

ROOT = Path(replaystore.__file__).parent
MAX_MODULE_LINES = 1000
MAX_FUNCTION_LINES = 80
FUNCTION_LIMITED = ("loop", "trajectories")


def long_functions(path: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """``name (lines)`` of every function or method in ``path`` longer than ``limit``
    lines, decorators and docstring excluded."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            lines = node.end_lineno - node.lineno + 1
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                assert first.end_lineno is not None
                lines -= first.end_lineno - first.lineno + 1
            if lines > limit:
                found.append(f"{node.name} ({lines})")
    return found


def test_no_module_is_over_the_limit() -> None:
    sources = sorted(ROOT.rglob("*.py"))
    assert len(sources) > 100
    sizes = {
        p.relative_to(ROOT).as_posix(): len(p.read_text(encoding="utf-8").splitlines())
        for p in sources
    }
    over = {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES}
    assert not over, f"modules over {MAX_MODULE_LINES} lines: {over}"


def test_no_function_is_over_the_limit_in_loop_and_trajectories() -> None:
    over = {}
    for package in FUNCTION_LIMITED:
        for path in sorted((ROOT / package).rglob("*.py")):
            found = long_functions(path)
            if found:
                over[path.relative_to(ROOT).as_posix()] = found
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines: {over}"


def test_long_functions_counts_a_functions_lines(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(80))
    module = tmp_path / "m.py"
    doc = '    """A docstring\n\n    of three lines."""'
    module.write_text(
        f"def short():\n{doc}\n    pass\n\n\ndef long():\n{doc}\n{body}\n", encoding="utf-8"
    )
    assert long_functions(module) == ["long (81)"]  # the docstring's 3 lines left out
    assert long_functions(module, limit=81) == []
