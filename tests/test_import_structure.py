"""Import structure: no import cycle between any two modules of the library, none
between trajectories and pipeline, and the torch-free imports (pipeline, storage,
the ``stats`` command's readers).

The graph is read from the source (AST), so it also sees imports inside functions
(a lazy import still makes the importer depend on the imported module, and a cycle
through one is a cycle all the same: the blocklist one ran through a module
``__getattr__``); only ``if TYPE_CHECKING:`` blocks are left out (they never run).
Importing a submodule also imports its parent packages; those implicit edges are not
counted (a package whose ``__init__`` imports its own submodules is not a cycle).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "replaystore"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _runtime_imports(tree: ast.Module) -> Iterable[ast.Import | ast.ImportFrom]:
    """Every import statement except those under ``if TYPE_CHECKING:``."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                stack.extend(child.orelse)
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                yield child
            stack.append(child)


def import_graph() -> dict[str, set[str]]:
    """``module -> replaystore modules it imports`` for every module under src/replaystore."""
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        targets: set[str] = set()
        for node in _runtime_imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
                continue
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:  # ``from pkg import submodule`` imports the submodule
                sub = f"{base}.{alias.name}"
                targets.add(sub if sub in files else base)
        graph[name] = {t for t in targets if t in files and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or None when it is acyclic."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = {start}, [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each group of modules that import each other (an SCC of ``graph``)."""
    found = []
    remaining = {m: set(ts) for m, ts in graph.items()}
    while (cycle := find_cycle(remaining)) is not None:
        found.append(cycle)
        backwards: dict[str, set[str]] = {}
        for m, ts in remaining.items():
            for t in ts:
                backwards.setdefault(t, set()).add(m)
        group = _reachable(remaining, cycle[0]) & _reachable(backwards, cycle[0])
        remaining = {m: ts - group for m, ts in remaining.items() if m not in group}
    return found


def test_the_library_has_no_import_cycle() -> None:
    graph = import_graph()
    assert len(graph) > 50  # the walk found the whole package
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_cycles_lists_one_cycle_per_group() -> None:
    graph = {"a": {"b"}, "b": {"a", "c"}, "c": {"d"}, "d": {"c"}, "e": {"a"}}
    assert cycles(graph) == [["a", "b", "a"], ["c", "d", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def _subpackage(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2])


def test_find_cycle_finds_cycles() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_trajectories_and_pipeline_do_not_import_each_other() -> None:
    graph = import_graph()
    assert "replaystore.trajectories.storage" in graph  # the walk found the package
    pair = {"replaystore.trajectories", "replaystore.pipeline"}
    packages: dict[str, set[str]] = {p: set() for p in pair}
    edges = []
    for module, targets in graph.items():
        for target in targets:
            a, b = _subpackage(module), _subpackage(target)
            if a in pair and b in pair and a != b:
                packages[a].add(b)
                edges.append(f"{module} -> {target}")
    assert find_cycle(packages) is None, "trajectories <-> pipeline:\n" + "\n".join(sorted(edges))


def test_no_import_cycle_inside_trajectories() -> None:
    graph = import_graph()
    inside = {
        m: {t for t in ts if t.startswith("replaystore.trajectories.")}
        for m, ts in graph.items()
        if m.startswith("replaystore.trajectories.")
    }
    assert find_cycle(inside) is None, find_cycle(inside)
    # the rules and the step index sit below both storage and the buffer
    assert "replaystore.trajectories.index" in inside["replaystore.trajectories.storage"]
    assert "replaystore.trajectories.index" in inside["replaystore.trajectories.buffer"]


def test_images_sit_below_trajectories_and_pipeline() -> None:
    graph = import_graph()
    assert not {t for t in graph["replaystore.images"] if _subpackage(t) != t}, graph[
        "replaystore.images"
    ]
    import replaystore.images as images
    import replaystore.pipeline.images as compat

    assert compat.__all__ is images.__all__  # one list of names
    for name in images.__all__:  # the old import path gives the same objects
        assert getattr(compat, name) is getattr(images, name)


def _loaded_after(code: str) -> dict[str, bool]:
    """Run ``code`` in a fresh interpreter; which heavy modules it left in sys.modules."""
    probe = (
        f"{code}\nimport json, sys\n"
        "print(json.dumps({m: m in sys.modules for m in ('torch', 'pandas', 'PIL')}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "code",
    [
        "from replaystore.pipeline import TaskHistory, DEFAULT_LEVEL_WEIGHTS",
        "from replaystore.pipeline import TaskSampler, Blocklist, BlocklistManager",
        "from replaystore.pipeline import RolloutSampler, TaskHistoryManager, load_tasks",
        "from replaystore.pipeline import load_all_trajectories, encode_image_to_base64",
        "import replaystore.pipeline.images, replaystore.images",
        "from replaystore.trajectories import TrajectoryStorage, Task, Step, step_from_dict",
        "from replaystore.trajectories import ConversationBuilder, export_llamafactory",
        "from replaystore.trajectories.index import StepIndex, final_reward_value",
        "from replaystore.formats.detect import detect, detect_with_storage",
        "from replaystore.formats.trajectory_header import read_header",
        "from replaystore.formats.transitions_buffer import read_buffer_meta, read_summary",
        "from replaystore.formats.postgres_experience import read_summary",
        "from replaystore.formats.sqlite_experience import read_summary",
        "from replaystore.formats.transitions_checkpoint import read_checkpoint_meta",
    ],
)
def test_pipeline_and_storage_imports_are_torch_free(code: str) -> None:
    loaded = _loaded_after(code)
    assert not loaded["torch"], f"{code!r} imports torch"
    assert not loaded["pandas"], f"{code!r} imports pandas"


#: The modules that write the on-disk formats (and the packages that hold them).
WRITERS = (
    "replaystore.experience",
    "replaystore.transitions",
    "replaystore.trajectories.storage",
    "replaystore.trajectories.buffer",
    "replaystore.trajectories.files.writer",
    "replaystore.trajectories.files.merge",
)


def test_format_readers_import_no_writer() -> None:
    graph = import_graph()
    readers = [m for m in graph if m.startswith("replaystore.formats.")]
    assert "replaystore.formats.trajectory_header" in readers  # the walk found them
    for module in readers:
        reached = _reachable(graph, module)
        writers = sorted(
            m for m in reached if any(m == w or m.startswith(w + ".") for w in WRITERS)
        )
        assert not writers, f"{module} imports the writers {writers}"


def test_the_buffer_still_imports_torch_when_asked() -> None:
    assert _loaded_after("from replaystore.trajectories import ReplayBuffer")["torch"]
