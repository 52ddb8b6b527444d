"""The distributed layer uses only a transition buffer's public API (issue 24: no ``buf._prio``)."""

from __future__ import annotations

import ast
from pathlib import Path

import replaystore.distributed as distributed

SOURCES = sorted(Path(distributed.__file__).parent.glob("*.py"))


def private_buffer_reads(path: Path) -> list[str]:
    """``<x>.buf._name`` / ``buf._name`` attribute reads in ``path``, as ``file:line name``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")):
            continue
        owner = node.value
        name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", None)
        if name == "buf" and not node.attr.startswith("__"):
            found.append(f"{path.name}:{node.lineno} {node.attr}")
    return found


def test_the_distributed_modules_read_no_private_attribute_of_a_buffer() -> None:
    assert SOURCES, "no distributed modules found"
    found = [hit for path in SOURCES for hit in private_buffer_reads(path)]
    assert not found, f"use the buffer's public API (priorities_at, priority_stats): {found}"
