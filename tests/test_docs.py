"""Documentation that runs: every code block of README.md and docs/**/*.md, and the site build.

Each fenced code block of a Markdown file is one test item (``test_doc_block``), with an id
``<file>:<line>`` naming the line of its opening fence. The blocks of one file run in order, in
one shared namespace, in a fresh temporary working directory for that file, so a page reads
top to bottom like a session a user pastes into Python.

Markers are HTML comments, which GitHub and MkDocs both leave out of the rendered page:

* ```` ```python ```` blocks run, always, unless the comment just before the fence says
  ``<!-- docs-test: skip REASON -->``. Skipped blocks are reported as skipped items with
  their reason, so ``pytest -ra`` lists and counts them.
* ``<!-- docs-test: setup`` ... ``-->`` is a hidden Python block (setup the reader does not
  need to see, e.g. making a small file to read); it runs at its place in the file.
* ```` ```bash ```` / ```` ```console ```` blocks run only when marked
  ``<!-- docs-test: run -->``: each command (``$ `` prompts and ``\\`` continuations
  understood) must be a ``replaystore ...`` command, which is run in-process through
  :func:`replaystore.cli.main` and must exit 0 (``<!-- docs-test: run exit=2 -->``: 2).
  Any other block that contains a ``replaystore`` command must be marked ``run`` or
  ``skip`` (``test_cli_blocks_are_marked``).
* Blocks between ``<!-- ci:... -->`` markers are the install commands ``.ci/run`` executes;
  they are skipped here with that reason.

This file runs on one ``pytest-xdist`` worker (``--dist loadfile`` is in the project's pytest
options), so a page runs top to bottom in one process. When an item
runs without the items before it all the same (``-k``), the missing earlier blocks of its
file run first in that process.

``replaystore demo`` commands are seeded and write only under their ``--out`` folder; the
same command (README.md and docs/cli.md both run the quick trajectories demo) runs once per
test session, under a lock shared by the workers, and a page that runs it again gets a copy
of what it wrote (``_run_demo_once``): the command is run, once, not skipped.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

README_LIMIT_BYTES = 15 * 1024

_FENCE = re.compile(r"^(?P<indent>[ ]{0,8})(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
_MARK = re.compile(r"^\s*<!--\s*docs-test:\s*(?P<verb>run|skip)\b(?P<rest>.*?)-->\s*$")
_SETUP_OPEN = re.compile(r"^\s*<!--\s*docs-test:\s*setup\s*$")
_CI_OPEN = re.compile(r"^\s*<!--\s*ci:(?P<name>[\w-]+)\s*-->\s*$")
_CI_CLOSE = re.compile(r"^\s*<!--\s*/ci:[\w-]+\s*-->\s*$")
_ABSOLUTE_PATH = re.compile(r"""["'\s=](/(?:data|home|mnt|root|Users|srv|opt|tmp|var)/)""")


@dataclass(slots=True)
class Block:
    """One fenced (or hidden setup) code block of a Markdown file."""

    path: Path
    line: int  # 1-based line of the opening fence (or of the setup comment)
    lang: str  # "python", "bash", "console", "text", ... ("python" for setup blocks)
    code: str  # the block's text, fence indentation removed
    action: str  # "python" | "cli" | "skip" | "show"
    reason: str = ""  # why it is skipped (action "skip")
    setup: bool = False
    exit_status: int = 0  # what every command of a "cli" block must exit with

    @property
    def id(self) -> str:
        kind = "setup" if self.setup else self.lang or "plain"
        return f"{self.path.relative_to(ROOT).as_posix()}:{self.line}:{kind}"


def markdown_files() -> list[Path]:
    """README.md and every page under docs/, in a stable order."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def parse_blocks(path: Path) -> list[Block]:
    """Every code block of ``path`` with what the test does with it (see the module doc)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    mark: tuple[str, str] | None = None  # (verb, reason) of the comment before a fence
    ci_block: str | None = None
    i = 0
    while i < len(lines):
        text = lines[i]
        if _SETUP_OPEN.match(text):
            start = i
            body: list[str] = []
            i += 1
            while i < len(lines) and lines[i].strip() != "-->":
                body.append(lines[i])
                i += 1
            if i == len(lines):
                raise ValueError(f"{path}:{start + 1}: docs-test setup comment is never closed")
            blocks.append(Block(path, start + 1, "python", "\n".join(body), "python", setup=True))
            i += 1
            continue
        if m := _MARK.match(text):
            mark = (m["verb"], m["rest"].strip())
            i += 1
            continue
        if m := _CI_OPEN.match(text):
            ci_block = m["name"]
            i += 1
            continue
        if _CI_CLOSE.match(text):
            ci_block = None
            i += 1
            continue
        fence = _FENCE.match(text)
        if fence is None:
            if text.strip():
                mark = None  # a marker applies only to the fence right after it
            i += 1
            continue
        indent, ticks = fence["indent"], fence["fence"]
        lang = fence["info"].strip().split(" ")[0].lstrip(".{").rstrip("}").lower()
        start = i
        body = []
        i += 1
        while i < len(lines):
            candidate = lines[i]
            stripped = candidate.strip()
            if stripped.startswith(ticks[0] * len(ticks)) and set(stripped) == {ticks[0]}:
                break
            body.append(candidate[len(indent) :] if candidate.startswith(indent) else candidate)
            i += 1
        if i == len(lines):
            raise ValueError(f"{path}:{start + 1}: code fence is never closed")
        i += 1
        code = "\n".join(body)
        if ci_block is not None:
            action, reason = "skip", f"install command of .ci/run (<!-- ci:{ci_block} -->)"
        elif mark is not None and mark[0] == "skip":
            if not mark[1]:
                raise ValueError(f"{path}:{start + 1}: docs-test skip needs a reason")
            action, reason = "skip", mark[1]
        elif lang in ("python", "py"):
            action, reason = "python", ""
        elif mark is not None and mark[0] == "run":
            if lang not in ("bash", "console", "sh", "shell"):
                raise ValueError(f"{path}:{start + 1}: docs-test run applies to shell blocks")
            action, reason = "cli", ""
        else:
            action, reason = "show", ""
        block = Block(path, start + 1, lang, code, action, reason)
        if action == "cli" and mark is not None and mark[1]:
            status = re.fullmatch(r"exit=(\d+)", mark[1])
            if status is None:
                raise ValueError(f"{path}:{start + 1}: docs-test run takes only exit=N")
            block.exit_status = int(status.group(1))
        blocks.append(block)
        mark = None
    return blocks


def _all_blocks() -> list[Block]:
    return [block for path in markdown_files() for block in parse_blocks(path)]


ALL_BLOCKS = _all_blocks()
RUNNABLE = [b for b in ALL_BLOCKS if b.action != "show"]


def shell_commands(code: str) -> list[list[str]]:
    """The commands of a shell block: ``$ `` prompts (console) or every line (bash)."""
    lines = code.splitlines()
    prompted = any(line.startswith("$ ") for line in lines)
    commands: list[str] = []
    pending = ""
    for line in lines:
        if prompted and not pending:
            if not line.startswith("$ "):
                continue  # output shown after a prompt
            line = line[2:]
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        commands.append(pending + stripped)
        pending = ""
    return [shlex.split(command, comments=True) for command in commands]


# --- running the blocks of one file in order ----------------------------------------------


@dataclass
class _FileState:
    namespace: dict[str, Any]
    workdir: Path
    done: int = 0  # how many of the file's blocks have run
    failed: str | None = None  # id of the block that failed, if one did


_STATES: dict[Path, _FileState] = {}


def _run_python(block: Block, namespace: dict[str, Any]) -> None:
    # Pad so that tracebacks name the Markdown line of the failing code.
    source = "\n" * block.line + block.code
    exec(compile(source, str(block.path), "exec"), namespace)


#: Where ``replaystore demo`` outputs are kept for the session (set by ``test_doc_block``:
#: a folder every xdist worker of this session sees).
_DEMO_CACHE: list[Path] = []


def _copy(source: Path, target: Path) -> None:
    """A folder with everything in it, or a file."""
    if source.is_dir():
        shutil.copytree(source, target)
    else:
        shutil.copy2(source, target)


def _run_demo_once(argv: list[str], run: Any) -> int:
    """Run ``argv`` (a ``replaystore demo`` command) in the working directory, or, when the
    same command already ran in this session (in any worker), copy what it wrote here.

    The first run's new top-level entries of the working directory are kept under the
    session's cache; its exit status is returned either way (a failed run is not kept, so
    the next page runs the command again and fails on its own)."""
    root = _DEMO_CACHE[0]
    root.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256(shlex.join(argv).encode()).hexdigest()[:16]
    kept = root / key
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other workers wait for the first run
        if (kept / "done").exists():
            for entry in (kept / "files").iterdir():
                _copy(entry, Path.cwd() / entry.name)
            return 0
        before = set(os.listdir("."))
        status = run()
        if status == 0:
            shutil.rmtree(kept, ignore_errors=True)
            (kept / "files").mkdir(parents=True)
            for name in sorted(set(os.listdir(".")) - before):
                _copy(Path(name), kept / "files" / name)
            (kept / "done").write_text(shlex.join(argv))
        return status


def _run_cli(block: Block) -> None:
    from replaystore.cli import main

    for argv in shell_commands(block.code):
        if not argv or argv[0] != "replaystore":
            raise AssertionError(
                f"{block.id}: only `replaystore ...` commands can run, got {shlex.join(argv)!r}"
            )
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            if argv[1:2] == ["demo"] and block.exit_status == 0:
                status = _run_demo_once(argv, lambda argv=argv: main(argv[1:]))
            else:
                status = main(argv[1:])
        if status != block.exit_status:
            raise AssertionError(
                f"{block.id}: `{shlex.join(argv)}` exited {status}, "
                f"expected {block.exit_status}\n"
                f"stdout:\n{out.getvalue()}\nstderr:\n{err.getvalue()}"
            )


def _run(block: Block) -> None:
    if block.action == "python":
        _run_python(block, _STATES[block.path].namespace)
    elif block.action == "cli":
        _run_cli(block)


@pytest.mark.parametrize(
    "block",
    RUNNABLE,
    ids=[b.id for b in RUNNABLE],
)
def test_doc_block(block: Block, tmp_path_factory: pytest.TempPathFactory) -> None:
    if not _DEMO_CACHE:
        base = tmp_path_factory.getbasetemp()
        _DEMO_CACHE.append(
            (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "docs-demo-outputs"
        )
    if block.action == "skip":
        pytest.skip(f"not run: {block.reason}")
    blocks = [b for b in RUNNABLE if b.path == block.path]
    position = blocks.index(block)
    state = _STATES.get(block.path)
    if state is None or state.done > position:
        workdir = tmp_path_factory.mktemp("docs-" + block.path.stem)
        # A real module in sys.modules, so that dataclasses, pickling and typing
        # resolve names defined by a page as they would in a script.
        module = types.ModuleType("_docs_" + re.sub(r"\W", "_", str(block.path)))
        sys.modules[module.__name__] = module
        state = _STATES[block.path] = _FileState(module.__dict__, workdir)
    if state.failed is not None:
        pytest.fail(f"not run: an earlier block of this file failed ({state.failed})")
    previous = os.getcwd()
    os.chdir(state.workdir)
    try:
        for earlier in blocks[state.done : position + 1]:
            try:
                _run(earlier)
            except BaseException:
                state.failed = earlier.id
                raise
            state.done += 1
    finally:
        os.chdir(previous)


# --- rules every page follows -------------------------------------------------------------


def test_cli_blocks_are_marked() -> None:
    """A shell block with a replaystore command either runs here or says why it cannot."""
    unmarked = [
        b.id
        for b in ALL_BLOCKS
        if b.action == "show" and re.search(r"(^|\$ |&& )replaystore ", b.code, re.MULTILINE)
    ]
    assert unmarked == [], f"mark these with <!-- docs-test: run --> or skip REASON: {unmarked}"


def test_no_block_uses_absolute_paths() -> None:
    """Examples write under the reader's working directory, never to /data, /home, ..."""

    def code(block: Block) -> str:  # shell blocks: the commands, not the output shown
        if block.action == "cli":
            return "\n".join(shlex.join(argv) for argv in shell_commands(block.code))
        return block.code

    offenders = [
        f"{b.id}: {m.group(1)}"
        for b in ALL_BLOCKS
        if b.action in ("python", "cli")
        for m in [_ABSOLUTE_PATH.search(" " + code(b))]
        if m
    ]
    assert offenders == []


def test_every_page_has_runnable_python() -> None:
    """The pages that teach an API show it in code that runs (not only skipped blocks)."""
    for name in ("transitions", "experience", "trajectories", "pipeline"):
        page = DOCS / f"{name}.md"
        assert any(b.action == "python" and not b.setup for b in parse_blocks(page)), page


def test_readme_is_a_front_page() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.encode()) <= README_LIMIT_BYTES, "README.md: move detail into docs/"
    for marker in ("ci:demo -->", "/ci:demo -->", "ci:test -->", "/ci:test -->"):
        assert text.count("<!-- " + marker) == 1, marker
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / link).is_file(), f"README links to a missing page: {link}"


def test_parser_finds_marked_blocks(tmp_path: Path) -> None:
    """The Markdown forms above are read as documented (so no block escapes the tests)."""
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- docs-test: setup\nx = 1\n-->\n\n"
        "```python\nprint(x)\n```\n\n"
        "<!-- docs-test: skip needs a GPU -->\n```python\nimport cuda_only\n```\n\n"
        "<!-- docs-test: run -->\n```console\n$ replaystore stats a \\\n    --json\nout\n```\n\n"
        "1. item\n\n    ```python\n    y = 2\n    ```\n\n"
        "```text\nnot code\n```\n",
        encoding="utf-8",
    )
    found = [(b.line, b.action, b.setup, b.reason, b.code) for b in parse_blocks(page)]
    assert found == [
        (1, "python", True, "", "x = 1"),
        (5, "python", False, "", "print(x)"),
        (10, "skip", False, "needs a GPU", "import cuda_only"),
        (15, "cli", False, "", "$ replaystore stats a \\\n    --json\nout"),
        (23, "python", False, "", "y = 2"),
        (27, "show", False, "", "not code"),
    ]
    assert shell_commands(found[3][4]) == [["replaystore", "stats", "a", "--json"]]


# --- the site ----------------------------------------------------------------------------


def test_mkdocs_site_builds_strict(tmp_path: Path) -> None:
    """`mkdocs build --strict`: broken links, pages missing from nav and docstring warnings fail."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "WARNING" not in output, output
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "reference" / "transitions" / "index.html").is_file()
