"""The ``replaystore`` command.

Subcommands:

* ``demo``: run the end-to-end demo of every part of the library;
* ``stats PATH``: summarise a trajectory storage directory, a SQLite experience
  store, a transitions checkpoint or a memory-mapped transitions buffer;
* ``export STORE --out DIR``: sample a trajectory storage and write a
  LLaMA-Factory dataset (ShareGPT or OpenAI messages);
* ``copy SRC DST``: copy an experience store (SQLite file or ``sqlite:///`` URL,
  ``postgresql://`` URL) into another, verifying the row count;
* ``import-webgym FILE... --out DIR``: import WebGym ``.pt`` iteration files
  safely (no pickle code runs) into a trajectory storage;
* ``view PATH``: a local, read-only web page over any of those stores;
* ``info``: versions, the active compiled kernels and the optional packages
  present (``--version`` prints the short form).

User errors (a missing file, a bad option, a file that is not what it should
be, an unsafe pickle) are printed as one line on stderr with exit status 2; an
unknown option or command gets a "did you mean" suggestion and a pointer to the
help of the command it was given to. Anything else is a bug and keeps its
traceback. Long work shows a progress bar on stderr when stderr is a terminal,
and nothing otherwise.
"""

from __future__ import annotations

import argparse
import datetime as dt
import difflib
import importlib
import importlib.metadata
import itertools
import json
import logging
import math
import platform
import re
import shlex
import sqlite3
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from replaystore import __version__
from replaystore.errors import ReplayStoreError
from replaystore.redaction import RedactingFormatter, redact, url_passwords

__all__ = ["main"]

SQLITE_MAGIC = b"SQLite format 3\x00"
CHECKPOINT_FORMAT_PREFIX = "replaystore.transitions.checkpoint/"


class _UsageError(Exception):
    """A mistake in how the command was called: one line, exit status 2."""


# argparse's own message for a bad choice (of a command or of an option's value).
_INVALID_CHOICE = re.compile(r"invalid choice: '(?P<value>[^']*)' \(choose from (?P<choices>.*)\)")
# What argparse takes for a negative number (a value, not an option).
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


def _did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """``"; did you mean X?"`` for the closest candidate, or ``""`` when none is close."""
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line on stderr (exit status 2), with a
    suggestion for a mistyped choice and a pointer to this (sub)command's help."""

    def error(self, message: str) -> NoReturn:
        found = _INVALID_CHOICE.search(message)
        if found:
            choices = [c.strip().strip("'\"") for c in found["choices"].split(",")]
            message += _did_you_mean(found["value"], choices)
        message = redact(message)  # a URL given where a command or option was expected
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")

    def option_names(self) -> list[str]:
        """Every option string this parser accepts (``-h``, ``--out``, ...)."""
        return [o for action in self._actions for o in action.option_strings]

    def check_option(self, token: str) -> None:
        """Exit with a usage error when ``token`` (an ``-x`` / ``--name[=value]`` word)
        is no option of this parser, nor a unique prefix of one (argparse's abbreviations)."""
        if token == "-" or _NEGATIVE_NUMBER.match(token):
            return
        name = token.split("=", 1)[0]
        names = self.option_names()
        known = name in names or (name.startswith("--") and any(n.startswith(name) for n in names))
        if not name.startswith("--") and len(name) > 2:  # -vh: bundled short flags
            known = name[:2] in names
        if not known:
            longs = [n for n in names if n.startswith("--")]
            self.error(f"unrecognized option {name!r}{_did_you_mean(name, longs)}")


def _check_options(parser: _Parser, commands: dict[str, _Parser], argv: Sequence[str]) -> None:
    """Report the first unknown option in ``argv`` against the parser it was given to.

    argparse alone reports ``replaystore --verison`` as a missing command and an
    unknown subcommand option against the top-level help; this runs first and
    names the option, the closest real one, and the right ``--help``.
    """
    owner = parser
    for token in argv:
        if token == "--":
            return
        if token.startswith("-"):
            owner.check_option(token)
        elif owner is parser:  # the top level has no option that takes a value
            if token not in commands:
                return  # argparse reports the unknown command, with a suggestion
            owner = commands[token]


def _progress(items: Iterable[Any] | None, total: int, desc: str, unit: str = "sample") -> Any:
    """``items`` (or, with None, a bar to ``update`` by hand) with a tqdm bar on
    stderr when it is a terminal; quiet otherwise."""
    from tqdm import tqdm

    return tqdm(items, total=total, desc=desc, unit=unit, disable=not sys.stderr.isatty())


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _table(
    header: Sequence[str], rows: Sequence[Sequence[Any]], align: str, indent: str = "    "
) -> list[str]:
    """Text table lines; ``align`` has one ``l`` (left) or ``r`` (right) per column."""
    cells = [list(map(str, header))] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = []
    for row in cells:
        padded = [
            c.rjust(w) if a == "r" else c.ljust(w)
            for c, w, a in zip(row, widths, align, strict=True)
        ]
        lines.append((indent + "  ".join(padded)).rstrip())
    return lines


# --------------------------------------------------------------------------- demo


def _cmd_demo(args: argparse.Namespace) -> int:
    from replaystore.demos import OPT_IN_PARTS, PARTS

    parts = PARTS if not args.part else tuple(args.part)
    known = PARTS + OPT_IN_PARTS
    unknown = [p for p in parts if p not in known]
    if unknown:
        raise _UsageError(
            f"unknown demo part {unknown[0]!r}{_did_you_mean(unknown[0], known)} "
            f"(choose from {', '.join(known)})"
        )
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise _UsageError(
            f"--out {out} exists and is not a directory; give a new or an existing directory"
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _UsageError(f"cannot create the --out directory {out}: {exc.strerror}") from None
    mode = "quick" if args.quick else "full"
    print(f"replaystore {__version__} demo ({mode}); outputs under {out.resolve()}")
    if args.quick:
        print("quick mode: small smoke runs that check every part works, not full training")
    done: list[tuple[str, float, Path]] = []
    for part in parts:
        module = importlib.import_module(f"replaystore.demos.{part}")
        print(f"\n== {part} ==", flush=True)
        start = time.perf_counter()
        lines = module.run(out / part, quick=args.quick)
        seconds = time.perf_counter() - start
        for line in lines:
            print(f"  {line}")
        print(f"  ({seconds:.1f} s)", flush=True)
        done.append((part, seconds, (out / part).resolve()))
    print("\n== summary ==")
    rows = [(p, f"{s:.1f}", d) for p, s, d in done]
    for line in _table(("part", "seconds", "outputs"), rows, "lrl", indent="  "):
        print(line)
    print(f"  total {sum(s for _, s, _ in done):.1f} s")
    views = _demo_view_paths([d for _, _, d in done])
    if views:
        print("\nlook at the outputs in a browser (read-only; Ctrl-C stops):")
        for path in views:
            print(f"  replaystore view {shlex.quote(str(path))}")
    return 0


def _demo_view_paths(part_dirs: Sequence[Path]) -> list[Path]:
    """What ``replaystore view`` opens among the demo parts' outputs that exist."""
    candidates = ("storage", "experience.sqlite", "checkpoint/buffer.metadata")
    out = []
    for directory in part_dirs:
        for name in candidates:
            if (directory / name).exists():
                # the trajectories part: its directory (storage/ and screenshots/ inside)
                out.append(directory if name == "storage" else directory / name)
    return out


# --------------------------------------------------------------------------- stats


def _detect(path: Path) -> tuple[str, Path]:
    """What ``path`` is: ``(kind, file or directory to read)``.

    Raises:
        _UsageError: ``path`` does not exist or is none of the known kinds.
    """
    if path.is_dir():
        # Cheap checks first: the trajectory storage import pulls in torch.
        if (path / "buffer.json").is_file():
            return "transitions_memmap", path
        checkpoints = sorted(path.glob("*.metadata"))
        if len(checkpoints) == 1:
            return "transitions_checkpoint", checkpoints[0]
        from replaystore.trajectories.storage import TrajectoryStorage

        if TrajectoryStorage(path).files():
            return "trajectory_storage", path
        raise _UsageError(
            f"{path} is a directory with no trajectory iteration files (iteration_*.jsonl), "
            "no memory-mapped transitions buffer (buffer.json) and no single checkpoint "
            "(*.metadata)"
        )
    if path.is_file():
        with open(path, "rb") as handle:
            head = handle.read(len(SQLITE_MAGIC))
        if head == SQLITE_MAGIC:
            return "sqlite_experience_store", path
        if path.name.endswith(".metadata"):
            return "transitions_checkpoint", path
        if path.name == "buffer.json":
            return "transitions_memmap", path.parent
        if path.name.startswith("iteration_") and path.suffix == ".jsonl":
            raise _UsageError(
                f"{path} is one trajectory iteration file: pass its directory ({path.parent})"
            )
        raise _UsageError(
            f"cannot tell what {path} is: expected a trajectory storage directory, a SQLite "
            "experience store, a transitions checkpoint (<name>.metadata) or a memmap "
            "buffer directory"
        )
    metadata = path.with_name(path.name + ".metadata")
    if metadata.is_file():  # a checkpoint named by its prefix, as save()/load() take it
        return "transitions_checkpoint", metadata
    raise _UsageError(f"{path} does not exist")


def _trajectory_stats(path: Path, success_threshold: float) -> dict[str, Any]:
    from replaystore.trajectories.storage import TrajectoryStorage

    stats = TrajectoryStorage(path).stats(success_threshold=success_threshold)
    stats["root"] = str(path.resolve())
    valid = stats["total_trajectories"] - stats["dummy_trajectories"]
    stats["success_rate"] = stats["successful_trajectories"] / valid if valid else 0.0
    stats["success_threshold"] = success_threshold
    return stats


def _print_trajectory_stats(s: dict[str, Any]) -> None:
    its = [row["iteration"] for row in s["iterations"]]
    print(f"trajectory storage: {s['root']}")
    print(
        f"  iterations: {s['total_iterations']} ({its[0]}-{its[-1]}), files: "
        f"{s['total_files']}, size: {_human_bytes(s['total_size_bytes'])}"
    )
    print(
        f"  trajectories: {s['total_trajectories']} ({s['dummy_trajectories']} dummy), "
        f"successful: {s['successful_trajectories']} ({100 * s['success_rate']:.1f}% of "
        f"non-dummy, final reward >= {s['success_threshold']:g})"
    )
    print(f"  steps: {s['total_steps']}")
    rows = []
    for row in s["iterations"]:
        valid = row["trajectories"] - row["dummy_trajectories"]
        rate = f"{100 * row['successful_trajectories'] / valid:.1f}%" if valid else "-"
        rows.append(
            (
                row["iteration"],
                row["files"],
                row["trajectories"],
                row["steps"],
                row["successful_trajectories"],
                rate,
                row["dummy_trajectories"],
                _human_bytes(row["size_bytes"]),
            )
        )
    print("  per iteration:")
    header = ("iteration", "files", "trajectories", "steps", "successful", "rate", "dummy", "size")
    for line in _table(header, rows, "rrrrrrrr"):
        print(line)


def _sqlite_stats(path: Path) -> dict[str, Any]:
    # Read-only on purpose: opening it with SqliteStorage would create its tables in
    # any SQLite file and switch it to WAL mode; a summary must not modify the file.
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise _UsageError(f"cannot open SQLite file {path}: {exc}") from None
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        columns = (
            {r[1] for r in conn.execute("PRAGMA table_info(rows)")} if "rows" in tables else set()
        )
        needed = {"task_id", "task_name", "agent_id", "step", "execute_time"}
        if not needed <= columns:
            raise _UsageError(
                f"{path} is a SQLite database but not a replaystore experience store "
                "(no 'rows' table with task_id, agent_id, step, execute_time)"
            )
        n_rows, n_tasks, n_names, min_step, max_step, t0, t1 = conn.execute(
            "SELECT COUNT(*), COUNT(DISTINCT task_id), COUNT(DISTINCT task_name), "
            "MIN(step), MAX(step), MIN(execute_time), MAX(execute_time) FROM rows"
        ).fetchone()
        agents = [
            {"agent_id": a, "rows": n, "tasks": t}
            for a, n, t in conn.execute(
                "SELECT agent_id, COUNT(*), COUNT(DISTINCT task_id) FROM rows "
                "GROUP BY agent_id ORDER BY COUNT(*) DESC, agent_id"
            )
        ]
    except sqlite3.DatabaseError as exc:
        raise _UsageError(f"cannot read SQLite file {path}: {exc}") from None
    finally:
        conn.close()

    def iso(t: Any) -> str | None:
        if not isinstance(t, int | float) or not math.isfinite(t):
            return None
        return dt.datetime.fromtimestamp(t, tz=dt.UTC).isoformat(timespec="seconds")

    return {
        "path": str(path.resolve()),
        "size_bytes": path.stat().st_size,
        "rows": n_rows,
        "tasks": n_tasks,
        "task_names": n_names,
        "agents": len(agents),
        "steps": [min_step, max_step],
        "execute_time": [iso(t0), iso(t1)],
        "per_agent": agents,
    }


def _print_sqlite_stats(s: dict[str, Any]) -> None:
    print(f"SQLite experience store: {s['path']} ({_human_bytes(s['size_bytes'])})")
    _print_store_body(s)


def _print_store_body(s: dict[str, Any]) -> None:
    print(
        f"  rows: {s['rows']}, tasks: {s['tasks']}, task names: {s['task_names']}, "
        f"agents: {s['agents']}"
    )
    if s["rows"]:
        print(f"  steps: {s['steps'][0]}-{s['steps'][1]}")
        print(f"  execute_time: {s['execute_time'][0]} .. {s['execute_time'][1]}")
        print("  per agent:")
        rows = [(a["agent_id"], a["rows"], a["tasks"]) for a in s["per_agent"]]
        for line in _table(("agent_id", "rows", "tasks"), rows, "lrr"):
            print(line)


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _UsageError(f"{path} is not valid JSON: {exc}") from None


def _fields(meta: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for f in meta.get("fields") or []:
        out.append({"name": f.get("name"), "dtype": f.get("dtype"), "shape": f.get("shape")})
    return out


def _objectrl_torch_stats(meta_path: Path) -> dict[str, Any]:
    """The summary of ObjectRL's ``torch.save`` metadata file, read as ``load`` reads it:
    the pickle's opcodes only, nothing unpickled (the reader imports torch)."""
    from replaystore.transitions.checkpoint import read_objectrl_metadata

    meta = read_objectrl_metadata(meta_path.with_name(meta_path.name.removesuffix(".metadata")))
    if meta is None:
        raise _UsageError(f"{meta_path} is a zip archive but not ObjectRL's metadata")
    return {
        "path": str(meta_path.resolve()),
        "format": "objectrl-metadata-only",
        "buffer_size": meta.buffer_size,
        "data_size": meta.data_size,
        "pointer": meta.pointer,
        "note": "metadata only (ObjectRL's format, torch.save): no transitions are stored",
    }


def _checkpoint_stats(meta_path: Path) -> dict[str, Any]:
    with open(meta_path, "rb") as handle:
        if handle.read(4) == b"PK\x03\x04":  # a zip archive: what torch.save writes
            return _objectrl_torch_stats(meta_path)
    meta = _load_json(meta_path)
    keys = {"buffer_size", "data_size", "pointer"}
    if not isinstance(meta, dict) or not keys <= meta.keys():
        raise _UsageError(
            f"{meta_path} is not a transitions checkpoint (no buffer_size/data_size/pointer)"
        )
    out: dict[str, Any] = {
        "path": str(meta_path.resolve()),
        "format": meta.get("format", "objectrl-metadata-only"),
        "buffer_size": meta["buffer_size"],
        "data_size": meta["data_size"],
        "pointer": meta["pointer"],
    }
    fmt = meta.get("format")
    if fmt is None:
        out["note"] = "metadata only (ObjectRL's format): no transitions are stored"
        return out
    # The format tag is part of the file format (replaystore.transitions.checkpoint);
    # matching it here avoids importing torch and tensordict for a summary.
    if not str(fmt).startswith(CHECKPOINT_FORMAT_PREFIX):
        raise _UsageError(f"{meta_path} has an unknown checkpoint format {fmt!r}")
    sampler = dict(meta.get("sampler") or {})
    sampler.pop("priorities", None)
    data_dir = meta_path.parent / str(meta.get("data_dir"))
    fields = meta.get("fields") or []
    expected = [(data_dir / f["file"], f["nbytes"]) for f in fields]
    if (meta.get("sampler") or {}).get("priorities"):
        p = meta["sampler"]["priorities"]
        expected.append((data_dir / p["file"], p["nbytes"]))
    complete = all(f.is_file() and f.stat().st_size == n for f, n in expected)
    out.update(
        sampler=sampler,
        fields=_fields(meta),
        data_dir=str(data_dir.resolve()),
        data_bytes=sum(n for _, n in expected),
        data_files_complete=complete,
    )
    return out


def _memmap_stats(directory: Path) -> dict[str, Any]:
    meta = _load_json(directory / "buffer.json")
    if not isinstance(meta, dict) or not {"capacity", "size", "pointer"} <= meta.keys():
        raise _UsageError(f"{directory / 'buffer.json'} is not a memory-mapped transitions buffer")
    files = [directory / f["file"] for f in meta.get("fields") or [] if "file" in f]
    return {
        "path": str(directory.resolve()),
        "format": meta.get("format"),
        "buffer_size": meta["capacity"],
        "data_size": meta["size"],
        "pointer": meta["pointer"],
        "prioritized": "priorities" in meta,
        "fields": _fields(meta),
        "file_bytes": sum(f.stat().st_size for f in files if f.is_file()),
    }


def _print_transitions_stats(kind: str, s: dict[str, Any]) -> None:
    title = "transitions checkpoint" if kind == "transitions_checkpoint" else "memmap buffer"
    print(f"{title}: {s['path']} ({s['format']})")
    print(
        f"  buffer_size: {s['buffer_size']}, data_size: {s['data_size']}, pointer: {s['pointer']}"
    )
    if "note" in s:
        print(f"  {s['note']}")
        return
    if "sampler" in s:
        params = ", ".join(
            f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}"
            for k, v in s["sampler"].items()
            if k != "kind"
        )
        kind_name = s["sampler"].get("kind", "?")
        print(f"  sampler: {kind_name}" + (f" ({params})" if params else ""))
        state = (
            "complete" if s["data_files_complete"] else "INCOMPLETE (files missing or truncated)"
        )
        print(f"  data: {s['data_dir']} ({_human_bytes(s['data_bytes'])}, {state})")
    else:
        print(f"  prioritized: {'yes' if s['prioritized'] else 'no'}")
        print(f"  column files: {_human_bytes(s['file_bytes'])}")
    fields = [
        (f["name"], f["dtype"], "x".join(map(str, f["shape"])) or "scalar") for f in s["fields"]
    ]
    print("  fields:")
    for line in _table(("name", "dtype", "shape"), fields, "lll"):
        print(line)


def _postgres_stats(url: str) -> dict[str, Any]:
    """The experience store summary of a ``postgresql://`` URL, in one read-only transaction."""
    from replaystore.experience.storage.postgres import read_summary

    try:
        return read_summary(url)
    except ReplayStoreError as exc:
        raise _UsageError(str(exc)) from None


def _print_postgres_stats(s: dict[str, Any]) -> None:
    print(
        f"PostgreSQL experience store: {s['url']} schema {s['schema']} "
        f"(layout version {s['version']}, {_human_bytes(s['size_bytes'])})"
    )
    _print_store_body(s)


def _store_path(text: str) -> Path:
    """The file a store argument names: a plain path, or the path of a ``sqlite:///`` URL."""
    from replaystore.experience.storage.urls import sqlite_path

    try:
        path = sqlite_path(text)
    except ReplayStoreError as exc:
        raise _UsageError(str(exc)) from None
    if path is None:
        raise _UsageError(
            f"unsupported URL {text!r}: give a path, sqlite:///path or postgresql://..."
        )
    return Path(path)


def _cmd_stats(args: argparse.Namespace) -> int:
    if ":" not in args.path:
        # Never a URL (every scheme needs a colon): skip the URL helpers, whose import
        # loads the whole experience package (~0.1 s) for nothing.
        return _print_stats(args, Path(args.path))
    from replaystore.experience.storage.urls import is_postgres_url

    if is_postgres_url(args.path):
        summary = _postgres_stats(args.path)
        if args.json:
            print(json.dumps({"kind": "postgres_experience_store", **summary}, indent=2))
        else:
            _print_postgres_stats(summary)
        return 0
    return _print_stats(args, _store_path(args.path))


def _print_stats(args: argparse.Namespace, path: Path) -> int:
    """Detect what the local ``path`` is, then print its summary (text or ``--json``)."""
    kind, target = _detect(path)
    if kind == "trajectory_storage":
        summary = _trajectory_stats(target, args.success_threshold)
    elif kind == "sqlite_experience_store":
        summary = _sqlite_stats(target)
    elif kind == "transitions_checkpoint":
        summary = _checkpoint_stats(target)
    else:
        summary = _memmap_stats(target)
    if args.json:
        print(json.dumps({"kind": kind, **summary}, indent=2))
    elif kind == "trajectory_storage":
        _print_trajectory_stats(summary)
    elif kind == "sqlite_experience_store":
        _print_sqlite_stats(summary)
    else:
        _print_transitions_stats(kind, summary)
    return 0


# --------------------------------------------------------------------------- export


def _cmd_export(args: argparse.Namespace) -> int:
    from replaystore.experience.storage.urls import is_postgres_url

    if is_postgres_url(args.store):  # before the trajectory imports (torch): fail fast
        raise _UsageError(
            f"{args.store} is an experience store; export reads a trajectory storage "
            "directory (copy an experience store with: replaystore copy SRC DST)"
        )
    from replaystore.trajectories import TrajectoryBuffer, TrajectoryStorage
    from replaystore.trajectories.context import ConversationBuilder
    from replaystore.trajectories.export import export_llamafactory

    store = _store_path(args.store)
    if not store.is_dir():
        raise _UsageError(f"{store} is not a directory (expected a trajectory storage)")
    if not TrajectoryStorage(store).files():
        raise _UsageError(f"{store} holds no trajectory iteration files (iteration_*.jsonl)")
    buffer = TrajectoryBuffer.from_storage(
        store,
        last_n_iterations=args.last_n_iterations,
        agent=ConversationBuilder(history_window=args.history_window),
        filter_successful_only=not args.all,
        filter_same_screenshot=not args.keep_same_screenshot,
        seed=args.seed,
    )
    # --all: every kept step, successful or not (e.g. for reward-aware training).
    chosen = buffer.get_training_samples(
        args.num_samples,
        recency_bias_power=args.recency_bias_power,
        seed=args.seed,
        eligible_only=not args.all,
    )
    pool = len(buffer) if args.all else buffer.num_eligible
    what = "samples" if args.all else "training-eligible samples"
    # Materialise each sample (parse or build its prompt) under the progress bar.
    read = iter(chosen)
    samples = list(_progress(read, len(chosen), "reading samples"))
    report = export_llamafactory(
        samples,
        Path(args.out),
        dataset_name=args.dataset_name,
        format=args.format,
        val_ratio=args.val_ratio,
        seed=args.seed,
        file_format=args.file_format,
        copy_images=args.copy_images,
        on_error=args.on_error,
        image_root=args.image_root,
    )
    stats = buffer.stats
    print(
        f"exported {report.num_train} train + {report.num_val} validation records "
        f"({args.format}) from {len(samples)} of {pool} {what} "
        f"({stats.samples} steps, {stats.trajectories} trajectories in {store})"
    )
    print(f"  records:      {report.train_file}")
    if report.val_file is not None:
        print(f"  validation:   {report.val_file}")
    entries = [report.dataset_name] + ([f"{report.dataset_name}_val"] if report.val_file else [])
    print(f"  dataset_info: {report.dataset_info_file} (entries: {', '.join(entries)})")
    if args.copy_images or report.images_written:
        where = f"{report.images_written} new files in {report.out_dir / 'images'}"
    else:
        where = "screenshots referenced by absolute path"
    print(f"  images:       {report.num_image_refs} references ({where})")
    if report.rejected:
        print(f"  rejected:     {len(report.rejected)} samples (listed in the log)")
    return 0


# --------------------------------------------------------------------------- copy


def _open_store(target: str, role: str) -> Any:
    from replaystore.experience.storage.urls import is_postgres_url, open_storage

    if not is_postgres_url(target):
        path = _store_path(target)
        if role == "source" and not path.is_file():
            raise _UsageError(f"source store {path} does not exist")
        if path.is_file():
            with open(path, "rb") as handle:
                if handle.read(len(SQLITE_MAGIC)) != SQLITE_MAGIC:
                    raise _UsageError(f"{role} {path} is not a SQLite experience store")
        target = str(path)
    return open_storage(target)


def _cmd_copy(args: argparse.Namespace) -> int:
    from replaystore.experience.storage.urls import iter_store

    if args.src == args.dst:
        raise _UsageError("SRC and DST are the same store")
    src = _open_store(args.src, "source")
    dst = _open_store(args.dst, "destination")
    before = dst.size()
    if before and not args.append:
        raise _UsageError(
            f"destination {redact(args.dst)} already holds {before} rows: pass --append to "
            "add to it"
        )
    total = src.size()
    copied = 0
    start = time.perf_counter()
    with _progress(None, total, "copying", unit="row") as bar:
        for batch in iter_store(src, args.batch_size):
            dst.add_batch(batch)
            copied += len(batch)
            bar.update(len(batch))
    after = dst.size()
    if copied != total or after != before + copied:
        print(
            f"replaystore copy: error: row count mismatch: source had {total} rows, "
            f"{copied} were read, destination went from {before} to {after} "
            "(was a store written to during the copy?)",
            file=sys.stderr,
        )
        return 1
    secs = time.perf_counter() - start
    print(
        f"copied {copied} rows from {redact(args.src)} to {redact(args.dst)} in {secs:.1f} s; "
        f"verified: destination holds {after} rows"
    )
    for store in (src, dst):
        store.close()
    return 0


# --------------------------------------------------------------------------- import-webgym


def _cmd_import_webgym(args: argparse.Namespace) -> int:
    from replaystore.trajectories.storage import TrajectoryStorage
    from replaystore.trajectories.webgym_import import import_webgym

    paths = [Path(p) for p in args.files]
    for p in paths:
        if not p.exists():
            raise _UsageError(f"{p} does not exist")
    if len(paths) > 1 and any(p.is_dir() for p in paths):
        raise _UsageError("give either one directory or one or more files, not both")
    storage = TrajectoryStorage(args.out, keep_page_metadata=args.keep_page_metadata)
    bar = None

    def advance(count: int, total: int, _: Any) -> None:
        nonlocal bar
        if bar is None:
            bar = _progress(None, total, "importing", unit="file")
        bar.update(1)

    try:
        done = import_webgym(paths[0] if len(paths) == 1 else paths, storage, progress=advance)
    finally:
        if bar is not None:
            bar.close()
    trajectories = sum(d.trajectories for d in done)
    steps = sum(d.steps for d in done)
    print(
        f"imported {len(done)} file(s) into {storage.root.resolve()}: "
        f"{trajectories} trajectories, {steps} steps"
    )
    for d in done:
        print(
            f"  {d.source} -> iteration {d.iteration} rank {d.rank}: "
            f"{d.trajectories} trajectories, {d.steps} steps ({d.written.name})"
        )
    return 0


# --------------------------------------------------------------------------- info

_CORE_PACKAGES = ("torch", "numpy", "tensordict")

# (import name, distribution, how to install it, what needs it)
_OPTIONAL_PACKAGES = (
    ("pyarrow", "pyarrow", "replaystore[parquet]", "Parquet task files (pipeline task sampler)"),
    ("pandas", "pandas", "replaystore[pandas]", "DataFrames in the WebGym utils drop-ins"),
    ("gymnasium", "gymnasium", "replaystore[demo]", "the demo's DQN part, the DQN example"),
    ("matplotlib", "matplotlib", "replaystore[demo]", "the demo's plots"),
    ("pydantic", "pydantic", "pydantic", "AWorld-style pydantic models in experience rows"),
    ("starlette", "starlette", "replaystore[view]", "replaystore view (with jinja2, uvicorn)"),
    ("jinja2", "jinja2", "replaystore[view]", "replaystore view's templates"),
    ("uvicorn", "uvicorn", "replaystore[view]", "replaystore view's server"),
    ("ray", "ray", "replaystore[ray]", "replaystore.distributed, the distributed demo"),
    ("torchrl", "torchrl", "replaystore[bench]", "benchmarks/ (peer comparison)"),
    ("stable_baselines3", "stable-baselines3", "replaystore[bench]", "benchmarks/"),
    ("cpprb", "cpprb", "replaystore[bench]", "benchmarks/"),
)


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _versions() -> dict[str, Any]:
    """Versions from package metadata: cheap, imports nothing."""
    return {
        "replaystore": __version__,
        "python": platform.python_version(),
        **{name: _dist_version(name) for name in _CORE_PACKAGES},
    }


def _optional_packages() -> list[dict[str, Any]]:
    """Each optional package, imported for real (a broken install shows its error)."""
    out = []
    for module, dist, install, used_for in _OPTIONAL_PACKAGES:
        entry: dict[str, Any] = {"package": dist, "install": install, "used_for": used_for}
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            # Not installed is no error; a dependency of it missing is one (a broken install).
            error = None if exc.name == module else _one_line(exc)
            entry.update(importable=False, version=None, error=error)
        except Exception as exc:  # any failure to import means "not usable": say why
            entry.update(importable=False, version=None, error=_one_line(exc))
        else:
            entry.update(importable=True, version=_dist_version(dist), error=None)
        out.append(entry)
    return out


def _environment_info() -> dict[str, Any]:
    import torch

    from replaystore._kernels import kernel_report

    package = Path(__file__).resolve().parent
    return {
        "versions": _versions(),
        "python": {
            "implementation": platform.python_implementation(),
            "executable": sys.executable,
        },
        "platform": platform.platform(),
        "package_path": str(package),
        "cuda": {
            "available": torch.cuda.is_available(),
            "devices": torch.cuda.device_count() if torch.cuda.is_available() else 0,
            "torch_cuda": torch.version.cuda,
        },
        "kernels": kernel_report(),
        "tensordict": _tensordict_info(),
        "optional": _optional_packages(),
    }


def _tensordict_info() -> dict[str, Any]:
    from replaystore import _tensordict_compat as compat

    version = _dist_version("tensordict") or ""
    return {
        "supported": compat.SUPPORTED,
        "in_supported_range": compat.in_supported_range(version),
        "fast_path": compat.FAST_PATH,
    }


def _kernel_summary() -> str:
    from replaystore._kernels import kernel_report

    words = {"c": "compiled", "numpy": "NumPy", "error": "error"}
    parts = []
    for k in kernel_report():
        text = f"{k['name']} {words[k['active']]}"
        if k["active"] != "c":
            text += f" ({k['note']})"
        parts.append(text)
    return ", ".join(parts)


def _version_text() -> str:
    v = _versions()
    packages = ", ".join(f"{name} {v[name] or 'not installed'}" for name in _CORE_PACKAGES)
    return (
        f"replaystore {v['replaystore']}\n"
        f"Python {v['python']}, {packages}\n"
        f"kernels: {_kernel_summary()}"
    )


class _VersionAction(argparse.Action):
    """``--version``: versions and active kernels, computed only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> NoReturn:
        print(_version_text())
        parser.exit(0)


def _cmd_rollout(args: argparse.Namespace) -> int:
    import asyncio

    from replaystore.rollouts.chat_client import DEFAULT_REQUEST_TIMEOUT_S

    request_timeout = args.request_timeout or DEFAULT_REQUEST_TIMEOUT_S
    if request_timeout >= args.step_timeout:
        raise _UsageError(
            f"--request-timeout {request_timeout:g} must be shorter than --step-timeout "
            f"{args.step_timeout:g} (a timed-out request is retried inside its step)"
        )
    try:
        from replaystore.rollouts.browser import BrowserUnavailableError, require_playwright
        from replaystore.rollouts.runner import rollout

        require_playwright()
    except ImportError as exc:
        print(f"replaystore rollout: {exc}", file=sys.stderr)
        return 2
    try:
        result = asyncio.run(
            rollout(
                args.tasks,
                args.out,
                policy=args.policy,
                base_url=args.base_url,
                model=args.model,
                api_key=args.api_key,
                workers=args.workers,
                iteration=args.iteration,
                rank=args.rank,
                logger_backend=args.logger,
                cdp_urls=args.cdp or None,
                max_tasks=args.max_tasks,
                observation=args.observation,
                request_timeout_s=request_timeout,
                max_concurrency=args.max_concurrency,
                step_timeout_s=args.step_timeout,
                task_timeout_s=args.task_timeout,
            )
        )
    except BrowserUnavailableError as exc:
        print(f"replaystore rollout: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before the iteration started, or after its file was written
        print("interrupted (Ctrl-C)", file=sys.stderr)
        return 130
    if result.model_server_error is not None:
        return _rollout_server_failure(result)
    counts = ", ".join(f"{k} {v}" for k, v in sorted(result.status_counts().items()))
    print(
        f"iteration {result.iteration} rank {result.rank}: {len(result.outcomes)} tasks "
        f"({counts}), success {100 * result.success_rate:.0f}%, {result.steps} steps, "
        f"{result.steps_per_second:.2f} steps/s"
    )
    if result.blocklist_skipped:
        print(_blocklist_skip_line(result.blocklist_skipped, Path(args.out)))
    if result.blocked_sites:
        print(f"blocked (added to the blocklist): {', '.join(result.blocked_sites)}")
    if result.path is not None:
        print(f"stored: {result.path}")
    if result.interrupted:
        print(_interrupted_line(result), file=sys.stderr)
        return 130
    return 0


def _interrupted_line(result: Any) -> str:
    """What an iteration stopped by Ctrl-C saved: the finished trajectories, or nothing."""
    if result.path is None:
        return "interrupted: no task had finished; nothing was saved"
    return (
        f"interrupted: {len(result.outcomes)} finished trajectories saved in {result.path}; "
        f"{len(result.skipped)} tasks cut or not started (its metadata's skipped_task_ids)"
    )


def _blocklist_skip_line(skipped: dict[str, int], out: Path) -> str:
    """How many tasks the blocklist left out, of which sites, and how to clear an entry."""
    sites = ", ".join(f"{site} ({n})" for site, n in skipped.items())
    file = out / "blocklist.jsonl"
    return (
        f"skipped {sum(skipped.values())} tasks on the blocklist: {sites}; clear with: "
        f"replaystore blocklist remove SITE --file {file} (or: replaystore blocklist clear "
        f"--file {file})"
    )


def _cmd_blocklist(args: argparse.Namespace) -> int:
    from replaystore.pipeline.blocklist import Blocklist, _entry_site

    target = Path(args.file)
    if target.is_dir() and not (target / "blocklist.jsonl").exists():
        raise _UsageError(f"{target} holds no blocklist.jsonl")
    if not target.is_dir() and not target.exists():
        raise _UsageError(f"{target} does not exist")
    blocklist = Blocklist(target)
    if args.action == "list":
        entries = blocklist.entries(include_expired=args.all)
        for site in sorted({_entry_site(e) for e in entries}):
            times = [e.get("blocked_at", "?") for e in entries if _entry_site(e) == site]
            print(f"{site}\t{len(times)} entries, last {max(map(str, times))}")
        if not entries:
            print(f"no {'entries' if args.all else 'blocked sites'} in {blocklist.path}")
        return 0
    if args.action == "remove":
        if not args.site:
            raise _UsageError("remove needs a SITE (as 'replaystore blocklist list' shows it)")
        try:
            removed = blocklist.remove(args.site)
        except ValueError as exc:
            raise _UsageError(str(exc)) from None
        print(f"removed {removed} entries of {args.site} from {blocklist.path}")
        return 0
    if args.site:
        raise _UsageError("clear takes no SITE")
    print(f"removed {blocklist.clear()} entries from {blocklist.path}")
    return 0


def _rollout_server_failure(result: Any) -> int:
    """The one line of an iteration that failed on the model server; its exit status.

    2 (a usage error: the command needs another flag) for a text-only model sent
    screenshots, 1 (the run failed) when every task failed on the server.
    """
    message = " ".join(str(result.model_server_error).split())
    if result.text_only_model:
        print(
            "replaystore rollout: error: the model server serves a text-only model "
            f"({message}): run with --observation text",
            file=sys.stderr,
        )
        return 2
    stored = f"; trajectories stored in {result.path}" if result.path is not None else ""
    print(
        f"replaystore rollout: error: all {len(result.outcomes)} tasks failed on the model "
        f"server: {message}{stored}",
        file=sys.stderr,
    )
    return 1


def _cmd_loop(args: argparse.Namespace) -> int:
    from replaystore.loop import (
        LoopInterrupted,
        LoopStageError,
        ToolsMissingError,
        default_tools_dir,
        find_tools,
        load_config,
        make_tiny_model,
        run_loop,
    )

    if args.make_tiny_model is not None:
        tools = find_tools(
            Path(args.tools_dir) if args.tools_dir else default_tools_dir(), need_vllm=False
        )
        target = Path(args.make_tiny_model)
        if target.exists() and any(target.iterdir()):
            raise _UsageError(f"--make-tiny-model {target} exists and is not empty")
        settings = make_tiny_model(
            tools.train_python, target, corpus=[Path(c) for c in args.corpus or []]
        )
        print(
            f"tiny Qwen2 in {target}: {settings['layers']} layers, hidden {settings['hidden']}, "
            f"{settings['vocab_size']}-token BPE, {int(settings['parameters']):,} parameters"
        )
        return 0
    if args.config is None and not args.resume:
        raise _UsageError("give --config loop.yaml (or --make-tiny-model DIR); see docs/loop.md")
    overrides: dict[str, Any] = {"out": args.out, "tools_dir": args.tools_dir}
    if args.config is None:
        # --resume --out DIR: the run's own copy of its effective config.
        if args.out is None:
            raise _UsageError("--resume without --config needs --out RUN_DIR")
        config_path: Path | None = Path(args.out) / "loop.yaml"
        overrides["out"] = str(Path(args.out).absolute())
    else:
        config_path = Path(args.config)
    config = load_config(config_path, overrides)
    if args.config is None:
        resume = f"replaystore loop --resume --out {shlex.quote(str(args.out))}"
    else:
        out = f" --out {shlex.quote(str(args.out))}" if args.out else ""
        resume = f"replaystore loop --config {shlex.quote(str(args.config))}{out} --resume"
    print(f"replaystore loop: run directory {config.out}", flush=True)
    try:
        summary = run_loop(
            config,
            resume=args.resume,
            iterations=args.iterations,
            report=lambda line: print(f"  {line}", flush=True),
        )
    except ToolsMissingError as exc:
        print(f"replaystore loop: error: {exc}", file=sys.stderr)
        return 2
    except LoopStageError as exc:
        print(f"replaystore loop: failed: {_one_line(exc)}", file=sys.stderr)
        print(f"resume after fixing it: {resume}", file=sys.stderr)
        return 1
    except LoopInterrupted as exc:
        print(
            f"replaystore loop: {exc}; finished stages are kept: continue with {resume}",
            file=sys.stderr,
        )
        return 130
    rates = " -> ".join(
        f"{row['success_rate']:.0%} ({row['policy']})" for row in summary["iterations"]
    )
    untrained = summary.get("untrained")
    if untrained:
        rates = f"untrained {untrained['success_rate']:.0%}; " + rates
    print(f"success rate per iteration: {rates}")
    print(f"summary: {config.out / 'summary.json'}")
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    info = _environment_info()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    v = info["versions"]
    print(f"replaystore {v['replaystore']} ({info['package_path']})")
    python = info["python"]
    print(f"Python {v['python']} ({python['implementation']}, {python['executable']})")
    print(f"platform: {info['platform']}")
    cuda = info["cuda"]
    gpus = f"available, {cuda['devices']} device(s)" if cuda["available"] else "not available"
    packages = [(name, v[name] or "NOT INSTALLED") for name in _CORE_PACKAGES]
    print("\npackages:")
    for line in _table(("package", "version"), packages, "ll", indent="  "):
        print(line)
    build = f"torch built for CUDA {cuda['torch_cuda']}" if cuda["torch_cuda"] else "CPU-only torch"
    print(f"  CUDA: {gpus} ({build})")
    td = info["tensordict"]
    if td["in_supported_range"] and td["fast_path"]:
        print(f"  tensordict: in the tested range {td['supported']}, fast sample path")
    else:
        where = "in" if td["in_supported_range"] else "OUTSIDE"
        path = (
            "fast sample path"
            if td["fast_path"]
            else ("samples built with the public TensorDict() (about 4 us more per sample)")
        )
        print(f"  tensordict: {where} the tested range {td['supported']}; {path}")
    print("\ncompiled kernels:")
    active = {"c": "compiled", "numpy": "NumPy", "error": "ERROR"}
    kernels = [(k["name"], active[k["active"]], k["used_by"], k["note"]) for k in info["kernels"]]
    for line in _table(("kernel", "active", "used for", "note"), kernels, "llll", indent="  "):
        print(line)
    if any(not k["installed"] for k in info["kernels"]):
        print(
            "  the compiled kernels are built at install time: install a C compiler (gcc or "
            "clang; MSVC Build Tools on Windows), then reinstall replaystore"
        )
    print("\noptional packages:")
    rows = [
        (
            o["package"],
            o["version"] if o["importable"] else "no" if o["error"] is None else "BROKEN",
            o["install"],
            o["used_for"] if o["error"] is None else f"{o['used_for']}; import fails: {o['error']}",
        )
        for o in info["optional"]
    ]
    for line in _table(("package", "present", "install", "used for"), rows, "llll", indent="  "):
        print(line)
    return 0


# --------------------------------------------------------------------------- view


def _view_target(text: str) -> tuple[str, str, Path | None]:
    """``(kind, target, default image root)`` of ``replaystore view``'s PATH argument.

    Kinds are detected as ``stats`` detects them; a directory holding a trajectory
    storage in ``storage/`` (a demo or rollout output directory) opens that storage
    with screenshots allowed from the whole directory.
    """
    from replaystore.experience.storage.urls import is_postgres_url

    if is_postgres_url(text):
        return "postgres_experience_store", text, None
    path = _store_path(text)
    no_other = not (path / "buffer.json").is_file() and len(list(path.glob("*.metadata"))) != 1
    if path.is_dir() and no_other:
        from replaystore.trajectories.storage import TrajectoryStorage

        # stale_temp_age_s=None: opening a storage would otherwise remove abandoned
        # temporary files (as _detect's does); the viewer writes nothing.
        if TrajectoryStorage(path, stale_temp_age_s=None).files():
            return "trajectory_storage", str(path), None
        if TrajectoryStorage(path / "storage", stale_temp_age_s=None).files():
            return "trajectory_storage", str(path / "storage"), path
    kind, target = _detect(path)
    return kind, str(target), None


def _cmd_view(args: argparse.Namespace) -> int:
    from replaystore.view import serve

    kind, target, image_root = _view_target(args.path)
    if args.image_root is not None:
        if kind != "trajectory_storage":
            raise _UsageError("--image-root applies to a trajectory storage only")
        image_root = Path(args.image_root)
        if not image_root.is_dir():
            raise _UsageError(f"--image-root {image_root} is not a directory")
    if args.port > 65535:
        raise _UsageError(f"--port must be <= 65535, got {args.port}")
    options = {"image_root": image_root} if kind == "trajectory_storage" else {}

    def ready(url: str) -> None:
        print(f"replaystore view: {kind.replace('_', ' ')} {redact(target)}", flush=True)
        print(f"  serving on {url} (read-only; Ctrl-C stops)", flush=True)

    try:
        serve(
            kind,
            target,
            host=args.host,
            port=args.port,
            open_browser=args.open,
            allow_hosts=args.allow_host,
            on_ready=ready,
            **options,
        )
    except ImportError as exc:
        raise _UsageError(str(exc)) from None
    except KeyboardInterrupt:
        pass
    except SystemExit as exc:  # uvicorn's way out when it cannot bind (it logged why)
        if exc.code:
            raise _UsageError(
                f"cannot serve on {args.host}:{args.port} (in use, or not an address of "
                "this machine?)"
            ) from None
    return 0


# --------------------------------------------------------------------------- parser


def _int_at_least(low: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    return parse


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def _finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be finite, got {text!r}")
    return value


def _ratio(text: str) -> float:
    value = _finite_float(text)
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text!r}")
    return value


def _parser() -> _Parser:
    parser = _Parser(
        prog="replaystore",
        description="Store and sample reinforcement-learning experience.",
        epilog="Run 'replaystore COMMAND --help' for the options of a command.",
    )
    parser.add_argument(
        "--version",
        action=_VersionAction,
        help="show versions and the active compiled kernels, and exit",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = sub.add_parser(
        "demo",
        help="run the end-to-end demo of every part of the library",
        description="Run every part of the library for real on generated or embedded data "
        "(no network) and print a summary with where the outputs are.",
    )
    demo.add_argument(
        "--out", default="demo-output", help="output directory (default: %(default)s)"
    )
    demo.add_argument(
        "--quick", action="store_true", help="smaller runs (for CI): well under a minute in total"
    )
    demo.add_argument(
        "--part",
        action="append",
        help="run only this part (repeatable); default: all but the opt-in "
        "'distributed' (Ray: pip install \"replaystore[ray]\") and 'loop' (LLaMA-Factory "
        "and vLLM: bash .ci/install-loop-tools)",
    )
    demo.set_defaults(func=_cmd_demo)

    stats = sub.add_parser(
        "stats",
        help="summarise a trajectory storage, SQLite experience store or transitions buffer",
        description="Detect what PATH is and print a summary: a trajectory storage directory "
        "(iterations, trajectories, steps, success rate), a SQLite experience store (rows, "
        "tasks, agents), a transitions checkpoint (<name>.metadata, or <name> itself) or a "
        "memory-mapped transitions buffer directory (buffer.json). Reads only; never "
        "modifies PATH.",
    )
    stats.add_argument(
        "path",
        metavar="PATH",
        help="what to summarise: a path, a sqlite:///path URL or a postgresql:// URL",
    )
    stats.add_argument("--json", action="store_true", help="print machine-readable JSON")
    stats.add_argument(
        "--success-threshold",
        type=_finite_float,
        default=1.0,
        help="trajectory storage: a trajectory is successful when its final reward is >= "
        "this (default: %(default)s)",
    )
    stats.set_defaults(func=_cmd_stats)

    export = sub.add_parser(
        "export",
        help="write a LLaMA-Factory dataset from a trajectory storage",
        description="Open the trajectory storage STORE as a replay buffer, draw samples "
        "(recency-biased when --num-samples is below what is available) and write a "
        "LLaMA-Factory dataset in --out: the records, an optional validation split and "
        "dataset_info.json. Steps without a stored prompt get one from the default "
        "ConversationBuilder.",
    )
    export.add_argument("store", metavar="STORE", help="trajectory storage directory")
    export.add_argument("--out", required=True, help="dataset directory (created if missing)")
    export.add_argument(
        "--format",
        choices=("sharegpt", "openai"),
        default="sharegpt",
        help="record format (default: %(default)s)",
    )
    export.add_argument(
        "--num-samples",
        type=_int_at_least(0),
        default=None,
        help="how many samples (default: all available)",
    )
    export.add_argument(
        "--recency-bias-power",
        type=_finite_float,
        default=1.0,
        help="weight (rank+1)**P by recency; 1.0 draws uniformly (default: %(default)s)",
    )
    export.add_argument(
        "--val-ratio",
        type=_ratio,
        default=0.0,
        help="share of records for a validation split, in [0, 1) (default: %(default)s)",
    )
    export.add_argument(
        "--seed", type=int, default=0, help="seed of sampling and shuffle (default: %(default)s)"
    )
    which = export.add_mutually_exclusive_group()
    which.add_argument(
        "--filter-successful-only",
        dest="all",
        action="store_false",
        help="only training-eligible steps: successful trajectories, changed screenshots (default)",
    )
    which.add_argument(
        "--all",
        dest="all",
        action="store_true",
        help="every step, successful or not",
    )
    export.set_defaults(all=False)
    export.add_argument(
        "--keep-same-screenshot",
        action="store_true",
        help="keep steps whose screenshot equals the next one's (filtered by default)",
    )
    export.add_argument(
        "--last-n-iterations",
        type=_int_at_least(1),
        default=None,
        help="only the most recent N iterations (default: all)",
    )
    export.add_argument(
        "--dataset-name",
        default="replaystore",
        help="entry name in dataset_info.json and file stem (default: %(default)s)",
    )
    export.add_argument(
        "--file-format",
        choices=("json", "jsonl"),
        default="json",
        help="one JSON array or JSON lines (default: %(default)s)",
    )
    export.add_argument(
        "--copy-images",
        action="store_true",
        help="copy screenshots into OUT/images (a self-contained dataset); default: "
        "reference them by absolute path",
    )
    export.add_argument(
        "--image-root",
        metavar="DIR",
        default=None,
        help="refuse screenshots that resolve outside DIR (symlinks and '..' followed), e.g. "
        "the storage's parent for trajectories you did not write; default: no restriction",
    )
    export.add_argument(
        "--history-window",
        type=_int_at_least(0),
        default=4,
        help="previous steps shown in full in rebuilt prompts (default: %(default)s)",
    )
    export.add_argument(
        "--on-error",
        choices=("raise", "skip"),
        default="raise",
        help="a sample that cannot be exported: fail and write nothing, or leave it out "
        "(default: %(default)s)",
    )
    export.set_defaults(func=_cmd_export)

    copy = sub.add_parser(
        "copy",
        help="copy an experience store between SQLite and PostgreSQL",
        description="Copy every row of the experience store SRC into DST, in insertion "
        "order, batch by batch, then verify DST's row count. A store is a SQLite file "
        "path, a sqlite:///path URL (sqlite:////abs/path for an absolute path) or a "
        "postgresql://user@host/db[?schema=NAME] URL. DST is created when missing and "
        "must be empty unless --append. Copy a store no one is writing to.",
    )
    copy.add_argument("src", metavar="SRC", help="store to read")
    copy.add_argument("dst", metavar="DST", help="store to write")
    copy.add_argument("--append", action="store_true", help="add to a DST that already holds rows")
    copy.add_argument(
        "--batch-size",
        type=_int_at_least(1),
        default=5000,
        help="rows per transaction in DST (default: %(default)s)",
    )
    copy.set_defaults(func=_cmd_copy)

    imp = sub.add_parser(
        "import-webgym",
        help="import WebGym .pt iteration files safely into a trajectory storage",
        description="Read WebGym's torch.save'd iteration files (train_trajectories.pt."
        "iterationN[_rank_R], or a directory of them) without running pickle code: only "
        "WebGym's component classes, plain containers and tensors are allowed, anything "
        "else is refused naming the global. Writes one JSONL iteration file per source file.",
    )
    imp.add_argument(
        "files", nargs="+", metavar="FILE", help="WebGym .pt files, or one directory of them"
    )
    imp.add_argument("--out", required=True, help="trajectory storage directory to write into")
    imp.add_argument(
        "--keep-page-metadata",
        action="store_true",
        help="keep every page-metadata field (default: only title and url)",
    )
    imp.set_defaults(func=_cmd_import_webgym)

    ro = sub.add_parser(
        "rollout",
        help="run one web-agent rollout iteration in a real browser",
        description="Roll out tasks in headless Chromium (system Chromium, REPLAYSTORE_CHROMIUM, "
        "or --cdp URLs of running browsers) with a policy, evaluate the answers, and store the "
        "trajectories under OUT/storage (one file per iteration and rank). Anti-bot sites go "
        "to OUT/blocklist.jsonl, attempts to OUT/task_history.json. Ctrl-C stops and keeps "
        "every finished trajectory. Needs the rollouts extra.",
    )
    ro.add_argument(
        "--tasks",
        default="suite",
        help="task file (JSONL/CSV/Parquet), or 'suite' (default): the bundled local website suite",
    )
    ro.add_argument("--policy", choices=("scripted", "openai"), default="scripted")
    ro.add_argument("--base-url", help="OpenAI-compatible server, e.g. http://HOST:8000/v1 (vLLM)")
    ro.add_argument("--model", help="model name the server serves")
    ro.add_argument("--api-key", help="API key for the server (vLLM: any value unless set)")
    ro.add_argument(
        "--observation",
        choices=("screenshot", "text"),
        default="screenshot",
        help="what the model is shown: 'screenshot' (default: screenshot, accessibility tree "
        "and URL) or 'text' (accessibility tree and URL; for a text-only model)",
    )
    ro.add_argument(
        "--workers", type=_int_at_least(1), default=4, help="browser contexts at once (default 4)"
    )
    ro.add_argument("--iteration", type=int, help="iteration number (default: the next one)")
    ro.add_argument("--rank", type=int, default=0, help="this process's rank (default 0)")
    ro.add_argument(
        "--max-tasks",
        type=_int_at_least(1),
        help="roll out only the first N tasks not on the blocklist",
    )
    ro.add_argument(
        "--step-timeout",
        type=_positive_seconds,
        default=120.0,
        metavar="S",
        help="seconds one step (screenshot, model, action) may take (default 120); a cut "
        "step keeps its screenshot, prompt and the model's reply",
    )
    ro.add_argument(
        "--request-timeout",
        type=_positive_seconds,
        metavar="S",
        help="seconds one request to the model server may take (default 30; --policy openai); "
        "must be shorter than --step-timeout so that a timed-out request is retried",
    )
    ro.add_argument(
        "--task-timeout",
        type=_positive_seconds,
        default=1800.0,
        metavar="S",
        help="seconds one task may take (default 1800)",
    )
    ro.add_argument(
        "--max-concurrency",
        type=_int_at_least(1),
        default=8,
        metavar="N",
        help="requests in flight to the model server at once (default 8; --policy openai)",
    )
    ro.add_argument("--cdp", action="append", metavar="URL", help="CDP endpoint (repeatable)")
    ro.add_argument("--out", required=True, help="run directory")
    ro.add_argument("--logger", choices=("none", "wandb", "tensorboard"), default="none")
    ro.set_defaults(func=_cmd_rollout)

    bl = sub.add_parser(
        "blocklist",
        help="list or clear the sites a rollout's blocklist leaves out",
        description="Show or edit a blocklist (RUN/blocklist.jsonl): 'list' prints the blocked "
        "sites (scheme://host:port), 'remove SITE' deletes the entries of one site (a bare "
        "host: every entry of that host), 'clear' deletes every entry. Safe while rollouts "
        "run (the file is locked).",
    )
    bl.add_argument("action", choices=("list", "remove", "clear"))
    bl.add_argument("site", nargs="?", metavar="SITE", help="the site to remove (remove only)")
    bl.add_argument(
        "--file",
        required=True,
        metavar="PATH",
        help="the blocklist file, or the run directory that holds blocklist.jsonl",
    )
    bl.add_argument("--all", action="store_true", help="list: expired entries too")
    bl.set_defaults(func=_cmd_blocklist)

    loop = sub.add_parser(
        "loop",
        help="close WebGym's loop: roll out, train with LLaMA-Factory, serve with vLLM, repeat",
        description="Run iterations of sample -> serve -> roll out (headless Chromium) -> "
        "evaluate -> store -> buffer -> export -> train (llamafactory-cli), each serving the "
        "checkpoint the previous one trained (vLLM). LLaMA-Factory and vLLM run from their own "
        "environments (bash .ci/install-loop-tools). Every finished stage is journaled: "
        "--resume continues after a crash or Ctrl-C. Writes OUT/summary.json. Guide: "
        "docs/loop.md.",
    )
    loop.add_argument("--config", metavar="YAML", help="the loop config (docs/loop.md)")
    loop.add_argument(
        "--iterations", type=_int_at_least(1), help="iterations to run (default: the config's)"
    )
    loop.add_argument("--resume", action="store_true", help="continue the run in its directory")
    loop.add_argument("--out", metavar="DIR", help="run directory (overrides the config's out)")
    loop.add_argument(
        "--tools-dir",
        metavar="DIR",
        help="where the LLaMA-Factory and vLLM environments are (default: "
        "$REPLAYSTORE_LOOP_TOOLS or ~/.cache/replaystore/loop-tools)",
    )
    loop.add_argument(
        "--make-tiny-model",
        metavar="DIR",
        help="only build a tiny Qwen2 chat model in DIR (no download) and exit",
    )
    loop.add_argument(
        "--corpus",
        action="append",
        metavar="FILE",
        help="with --make-tiny-model: text or LLaMA-Factory JSON the tokenizer learns from "
        "(repeatable)",
    )
    loop.set_defaults(func=_cmd_loop)

    view = sub.add_parser(
        "view",
        help="browse a store in a local, read-only web page",
        description="Serve a read-only web app over PATH: a trajectory storage directory (or a "
        "directory with one in storage/, like the demo's and rollout's outputs), a SQLite "
        "experience store, a postgresql:// URL, a transitions checkpoint or a memory-mapped "
        "transitions buffer. Binds 127.0.0.1 unless --host says otherwise. Nothing in PATH is "
        "ever written. Needs the view extra.",
    )
    view.add_argument("path", metavar="PATH", help="the store (as for 'replaystore stats')")
    view.add_argument(
        "--host",
        default="127.0.0.1",
        help="interface to bind (default: %(default)s; another one is reachable by others "
        "and gets a warning)",
    )
    view.add_argument(
        "--port", type=_int_at_least(0), default=8765, help="TCP port (default: %(default)s)"
    )
    view.add_argument("--open", action="store_true", help="open the page in a web browser")
    view.add_argument(
        "--image-root",
        metavar="DIR",
        default=None,
        help="serve screenshots only from inside DIR (default: the storage directory, or "
        "the directory given as PATH)",
    )
    view.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer requests for Host NAME, e.g. behind a reverse proxy (repeatable; "
        "on a loopback address only localhost, 127.0.0.1 and [::1] are answered otherwise)",
    )
    view.set_defaults(func=_cmd_view)

    info = sub.add_parser(
        "info",
        help="show versions, the active compiled kernels and the optional packages present",
        description="Print replaystore's version and where it is installed, the versions of "
        "Python, torch, numpy and tensordict, whether CUDA is available, which "
        "implementation of each compiled kernel is active (compiled or the slower NumPy "
        "fallback) and which optional packages import. Paste it into a bug report.",
    )
    info.add_argument("--json", action="store_true", help="print machine-readable JSON")
    info.set_defaults(func=_cmd_info)
    return parser


def _commands(parser: argparse.ArgumentParser) -> dict[str, _Parser]:
    """The subcommand parsers of ``parser``, by name."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("the parser has no subcommands")


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror and exc.filename is not None:
        # "[Errno 17] File exists: 'x'" -> "x: File exists"
        target = f"{exc.filename} -> {exc.filename2}" if exc.filename2 else str(exc.filename)
        return f"{target}: {exc.strerror}"
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    # A line ending in ":" introduces the next ("nothing was written: sample 3: ...").
    text = lines[0]
    for before, line in itertools.pairwise(lines):
        text += (" " if before.endswith(":") else "; ") + line
    return text


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``replaystore`` command; returns the exit status.

    Never raises SystemExit: ``--help`` and ``--version`` return 0, usage errors 2
    (after printing), so in-process callers get the status the shell would.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    commands = _commands(parser)
    try:
        _check_options(parser, commands, argv)
        args, extras = parser.parse_known_args(argv)
        if extras:  # stray positional words: report them against the command they followed
            commands[args.command].error(f"unrecognized arguments: {' '.join(extras)}")
    except SystemExit as exc:  # argparse's way out of --help, --version and usage errors
        return exc.code if isinstance(exc.code, int) else 2
    handler = logging.StreamHandler()  # a store URL in a log record: no password
    handler.setFormatter(RedactingFormatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, handlers=[handler])
    try:
        return int(args.func(args))
    except (_UsageError, ReplayStoreError, OSError) as exc:
        line = redact(_one_line(exc), url_passwords(argv))
        print(f"replaystore {args.command}: error: {line}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
