"""No module of the library reads another module's private (``_name``) names.

A module's ``_name`` is its own business: another module that imports it (``from
replaystore.x import _helper``) or reads it off an object (``storage._read_header(f)``)
is tied to internals that can change without notice. What one module offers another is
public, documented, and covered by the first module's tests.

Allowed, because they are not another module's private names:

* private *modules* (``from replaystore import _sumtree``: a compiled kernel is private to
  the package, and its users import the module, not a name inside it);
* a private attribute the reading module defines itself (``other._buffer`` in a class's
  ``__eq__``, a factory filling ``table._scratch`` of the class it defines);
* the public methods of named tuples (``_replace``, ``_asdict``, ``_fields``, ``_make``);
* third-party internals named in :data:`THIRD_PARTY`, each with why.
"""

from __future__ import annotations

import ast
from pathlib import Path

import replaystore

ROOT = Path(replaystore.__file__).parent
NAMEDTUPLE_API = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}
#: (module path, attribute) pairs that read a third-party library's private API on purpose.
THIRD_PARTY = {
    # The probe for tensordict's fast constructor, with a public fallback when it is gone
    # or changed meaning (tests/test_tensordict_compat.py).
    ("_tensordict_compat.py", "_new_unsafe"),
}


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(dotted: str) -> bool:
    base = ROOT.parent / dotted.replace(".", "/")  # the library's own modules
    return (
        base.with_suffix(".py").exists()
        or base.is_dir()
        or any(base.parent.glob(base.name + ".*.so"))
    )


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _own_names(tree: ast.AST) -> set[str]:
    """Every name ``tree`` defines: functions, classes, assigned names and attributes,
    ``__slots__`` entries."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets
        ):
            names.update(
                c.value
                for c in ast.walk(node.value)
                if isinstance(c, ast.Constant) and isinstance(c.value, str)
            )
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def private_reads(path: Path, root: Path = ROOT) -> list[str]:
    """Another module's private names that ``path`` (a module of the package at ``root``)
    imports or reads, as ``file:line what``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    me, where = _module_name(path, root), path.relative_to(root).as_posix()
    own = _own_names(tree)
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").startswith("replaystore")
            and node.module != me
        ):
            for alias in node.names:
                if _private(alias.name) and not _is_module(f"{node.module}.{alias.name}"):
                    found.append(f"{where}:{node.lineno} imports {node.module}.{alias.name}")
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if node.attr in own or node.attr in NAMEDTUPLE_API:
                continue
            if (where, node.attr) in THIRD_PARTY:
                continue
            found.append(f"{where}:{node.lineno} reads {ast.unparse(owner)}.{node.attr}")
    return found


def test_no_module_reads_another_modules_private_names() -> None:
    sources = sorted(ROOT.rglob("*.py"))
    assert len(sources) > 100, "the walk did not find the library's modules"
    found = [hit for path in sources for hit in private_reads(path)]
    assert not found, "make these public (named, documented) or move them:\n" + "\n".join(found)


def test_the_check_finds_both_kinds_of_private_read(tmp_path: Path) -> None:
    # The check itself: an import of another module's private name and a private method
    # read off another module's object are both found; the module's own are not.
    root = tmp_path / "replaystore"
    root.mkdir()
    module = root / "_private_names_probe.py"
    module.write_text(
        "from replaystore.pipeline.blocklist import _entry_is, Blocklist\n"
        "class Mine:\n"
        "    def __init__(self):\n"
        "        self._own = 1\n"
        "    def same(self, other):\n"
        "        return other._own\n"
        "def read(storage):\n"
        "    return storage._read_header(1), Mine()._own\n",
        encoding="utf-8",
    )
    assert private_reads(module, root) == [
        "_private_names_probe.py:1 imports replaystore.pipeline.blocklist._entry_is",
        "_private_names_probe.py:8 reads storage._read_header",
    ]
