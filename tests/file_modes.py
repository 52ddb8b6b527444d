"""File-mode checks shared by the umask tests (``tests/test_file_modes.py``) and the demo
runs that check their outputs' modes (``tests/demos/test_quick_demo.py``,
``tests/transitions/test_demo.py``). Importable from any test: ``tests/`` is on ``sys.path``.
"""

from __future__ import annotations

import stat
from pathlib import Path


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def assert_files_have_mode(root: Path, expected: int, *, at_least: int = 1) -> list[Path]:
    """Every regular file under ``root`` (or ``root`` itself) has ``expected`` mode."""
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    assert len(files) >= at_least, f"expected at least {at_least} files under {root}"
    wrong = {
        str(p.relative_to(root.parent)): oct(mode_of(p)) for p in files if mode_of(p) != expected
    }
    assert not wrong, f"files not {oct(expected)}: {wrong}"
    return files
