"""Every file write in the library goes through ``replaystore.atomic``, or is a listed exception.

A static scan (the AST of every module under ``src/replaystore``) finds the calls
that create, overwrite, append to or rename files: ``open``/``Path.open`` with a
writing mode, ``write_text``/``write_bytes``, ``os.open`` with writing flags,
``os.replace``/``os.rename``, ``shutil`` copies and moves, ``torch.save``,
``np.save*``/``tofile``, ``np.memmap`` opened for writing, ``tempfile.mkstemp``,
and ``savefig`` to anything but an ``io.BytesIO``. Outside ``atomic.py`` each
must be in ``EXCEPTIONS`` with the reason it does not need (or cannot use)
``atomic_open``: a new write elsewhere
fails here until it is routed through ``replaystore.atomic`` or its reason is
written down. ``atomic.py`` itself holds the one temp-file/fsync/rename
sequence and the umask rule (``tests/test_file_modes.py``).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "replaystore"

# (file relative to src/replaystore, enclosing function, call) -> why it is not atomic.py's.
EXCEPTIONS: dict[tuple[str, str, str], str] = {
    ("transitions/checkpoint.py", "_write_bytes", "open(w)"): (
        "data files of a checkpoint go into a fresh uniquely named directory, are "
        "fsynced, and become visible only when .metadata is replaced with atomic_write_json"
    ),
    ("transitions/storage.py", "MemmapStorage._map", "np.memmap(w)"): (
        "the memory-mapped ring is updated in place by design; its own flush protocol "
        "(data, then the metadata file through replaystore.atomic) makes it crash-safe"
    ),
    ("transitions/storage.py", "TemporaryDirectory.__init__", "tempfile.mkdtemp"): (
        "a private scratch directory for an unnamed memory-mapped buffer, removed on close"
    ),
    ("rollouts/ray_worker.py", "RolloutWorker.start", "tempfile.mkdtemp"): (
        "a Ray rollout actor's private scratch directory (its screenshots until shipped to "
        "the driver, which writes them atomically), removed when the actor stops"
    ),
    ("pipeline/blocklist.py", "Blocklist._locked", "os.open(write)"): (
        "the lock file: created (mode 0o666 & ~umask) and opened for flock, never written"
    ),
    ("pipeline/blocklist.py", "Blocklist._append_entry", "os.open(write)"): (
        "an append-only journal: one O_APPEND write of one complete line per record, "
        "under the exclusive lock; whole-file rewrites go through atomic_open"
    ),
    ("loop/processes.py", "ChildProcess.start", "open(w)"): (
        "a child process's output, appended to its log file for people to read; never read "
        "back as data"
    ),
    ("loop/runner.py", "LoopRunner._run_lock", "open(w)"): (
        "the run directory's lock file: flock'd, holds the pid for the error message only"
    ),
    ("loop/partial.py", "_commit", "os.replace"): (
        "renames a complete .partial directory (dataset, tiny model, checkpoint, merged "
        "model) into place: the directory's commit"
    ),
    ("loop/tools.py", "_append", "open(w)"): (
        "adds the adapter requests and the server's answers to the server's log, for people "
        "to read; never read back as data"
    ),
    ("loop/tiny_model.py", "_atomic_write_text", "open(w)"): (
        "atomic.py's temp file + fsync + rename, written out: the script runs in the "
        "LLaMA-Factory environment, where replaystore is not installed"
    ),
    ("loop/tiny_model.py", "_atomic_write_text", "os.replace"): (
        "the rename of that same sequence"
    ),
    ("experience/storage/sqlite/storage.py", "_create_file", "os.open(write)"): (
        "creates the empty database file with mode 0o666 & ~umask before SQLite opens "
        "it; SQLite's journal makes its own writes atomic"
    ),
}

_WRITE_MODE_CHARS = set("wax+")
_WRITE_FLAGS = {"O_WRONLY", "O_RDWR", "O_CREAT", "O_APPEND", "O_TRUNC"}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return "?"


def _mode(call: ast.Call, position: int) -> str | None:
    """The mode argument: its text, "w?" when computed (counted as writing), None if absent."""
    node = next((kw.value for kw in call.keywords if kw.arg == "mode"), None)
    if node is None and len(call.args) > position:
        node = call.args[position]
    if node is None:
        return None
    return str(node.value) if isinstance(node, ast.Constant) else "w?"


def _in_memory_names(function: ast.AST | None) -> set[str]:
    """Names bound to ``io.BytesIO()`` / ``io.StringIO()`` in ``function``."""
    if function is None:
        return set()
    return {
        target.id
        for node in ast.walk(function)
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Call)
        and _dotted(node.value.func) in {"io.BytesIO", "io.StringIO"}
        for target in node.targets
        if isinstance(target, ast.Name)
    }


def _classify(call: ast.Call, function: ast.AST | None = None) -> str | None:
    """The kind of file write ``call`` is, or None. ``function``: the enclosing one."""
    name = _dotted(call.func)
    last = name.rsplit(".", 1)[-1]
    if name == "open":
        mode = _mode(call, 1)
        return "open(w)" if mode is not None and _WRITE_MODE_CHARS & set(mode) else None
    if last == "open" and name != "os.open":
        # Path.open(mode) and friends; a computed first argument (Image.open(path),
        # webbrowser.open(url), zip.open(member)) is not a mode, a computed mode= is.
        mode = _mode(call, 0)
        first = call.args[0] if call.args else None
        if mode == "w?" and not any(kw.arg == "mode" for kw in call.keywords):
            mode = None if not isinstance(first, ast.Constant) else mode
        return "open(w)" if mode is not None and _WRITE_MODE_CHARS & set(mode) else None
    if name == "os.open":
        flags = {n.attr for n in ast.walk(call) if isinstance(n, ast.Attribute)}
        return "os.open(write)" if flags & _WRITE_FLAGS else None
    if name == "np.memmap" or name == "numpy.memmap":
        mode = _mode(call, 99)
        return "np.memmap(w)" if mode is not None and mode != "r" else None
    if last == "savefig":
        first = call.args[0] if call.args else None
        in_memory = isinstance(first, ast.Name) and first.id in _in_memory_names(function)
        return None if in_memory else last
    if last in {"write_text", "write_bytes", "tofile"}:
        return last
    if name in {
        "os.replace",
        "os.rename",
        "shutil.move",
        "shutil.copy",
        "shutil.copy2",
        "shutil.copyfile",
        "torch.save",
        "np.save",
        "np.savez",
        "np.savez_compressed",
        "tempfile.mkstemp",
        "tempfile.mkdtemp",
        "tempfile.NamedTemporaryFile",
    }:
        return name
    return None


def _writes(path: Path) -> list[tuple[str, str, int]]:
    """(enclosing function qualname, call kind, line) of every write in one module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[tuple[str, str, int]] = []

    def visit(node: ast.AST, scope: list[str], function: ast.AST | None) -> None:
        for child in ast.iter_child_nodes(node):
            inner, inner_function = scope, function
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = [*scope, child.name]
                if not isinstance(child, ast.ClassDef):
                    inner_function = child
            if isinstance(child, ast.Call):
                kind = _classify(child, function)
                if kind is not None:
                    found.append((".".join(scope) or "<module>", kind, child.lineno))
            visit(child, inner, inner_function)

    visit(tree, [], None)
    return found


def _all_writes() -> dict[tuple[str, str, str], list[int]]:
    writes: dict[tuple[str, str, str], list[int]] = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel == "atomic.py":
            continue
        for function, kind, line in _writes(path):
            writes.setdefault((rel, function, kind), []).append(line)
    return writes


def test_every_file_write_is_atomic_or_a_listed_exception() -> None:
    unlisted = {
        f"{rel}:{lines[0]} {kind} in {function}"
        for (rel, function, kind), lines in _all_writes().items()
        if (rel, function, kind) not in EXCEPTIONS
    }
    assert not unlisted, (
        "file writes outside replaystore.atomic (use atomic_open / atomic_write_*, or add "
        f"the call to EXCEPTIONS with its reason): {sorted(unlisted)}"
    )


def test_every_exception_still_exists() -> None:
    stale = set(EXCEPTIONS) - set(_all_writes())
    assert not stale, f"EXCEPTIONS lists writes that are gone: {sorted(stale)}"


def test_the_scan_finds_the_writes_it_is_meant_to(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "import os, shutil, torch, numpy as np\n"
        "from pathlib import Path\n"
        "def f(p):\n"
        "    open(p, 'w'); open(p, mode='ab'); open(p); open(p, 'rb')\n"
        "    Path(p).open('x'); Path(p).write_text('a'); Path(p).write_bytes(b'')\n"
        "    os.open(p, os.O_WRONLY | os.O_CREAT); os.open(p, os.O_RDONLY)\n"
        "    os.replace(p, p); shutil.move(p, p); torch.save({}, p); np.save(p, 1)\n"
        "    np.memmap(p, mode='r'); np.memmap(p, dtype='u1', mode='w+'); fig.savefig(p)\n"
        "    np.memmap(p, mode='w+' if p else 'r+'); open(p, 'w' if p else 'r')\n"
        "    webbrowser.open(p); Image.open(p); Path(p).open(mode=m); Path(p).open('r')\n"
        "    png = io.BytesIO(); fig.savefig(png)\n",
        encoding="utf-8",
    )
    kinds = sorted(kind for _, kind, _ in _writes(module))
    assert kinds == sorted(
        [
            "open(w)",
            "open(w)",
            "open(w)",
            "write_text",
            "write_bytes",
            "os.open(write)",
            "os.replace",
            "shutil.move",
            "torch.save",
            "np.save",
            "np.memmap(w)",
            "np.memmap(w)",
            "open(w)",
            "open(w)",
            "savefig",
        ]
    )
