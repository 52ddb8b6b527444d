"""Reads of prompts as WebGym writes them (issue 39): compact against WebGym-formatted.

    python benchmarks/webgym_prompts.py [--webgym-src DIR] [--quick] [--out benchmarks/RESULTS.md]

WebGym stores every step's ``raw_prompt`` as ``json.dumps(messages, indent=2,
ensure_ascii=False)`` (``convert_messages_to_path_format`` in
``webgym/utils/image_utils.py``, called by its ``WebAgent`` for every step). With
``--webgym-src`` (a WebGym checkout), that function itself writes the prompts; else the
same ``json.dumps`` call does. The same 5,000 WebGym-shaped steps (benchmarks/trajectories.py,
``webgym_shaped``) are saved twice, with compact prompts (``json.dumps(messages)``) and
WebGym's, then read back by a freshly opened file-backed buffer, side by side:

* **draw**: ``ReplayBuffer.from_storage(root)`` then ``get_training_samples(1000, 1.0)``;
* **messages**: ``s["message"]`` of those 1,000 samples (cold: the first draw of a freshly
  opened buffer; median of 7 fresh buffers);
* **dataset**: ``buffer[i]["message"]`` for 1,000 random indices, one call each (a torch
  ``DataLoader`` without ``batch_size`` reads so), and the same 1,000 through
  ``DataLoader(buffer, batch_size=32, sampler=indices, collate_fn=list)``, which calls the
  buffer's ``__getitems__`` once per batch (fresh buffers, median of 7), beside the same
  ``DataLoader`` over a dataset that returns its index (the loader's own work);
* **raw_prompt round trip**: every stored prompt read back equals the written text.

A new process's first pydantic-core parse makes the parser's string cache: a one-off of
the process, not of a buffer. Each child pays it first, before it opens the storage, and
its time is printed in its own column (as the ``DataLoader``'s one-off start-up is paid
before that column is timed).

The reads are timed three ways: in **a fresh process** that imports the library, opens the
storage and reads (as a training process does, and as the issue's own reproduction ran:
each of the 7 repeats is its own child process, compact and WebGym-formatted prompts
taking turns), in a fresh process that has first read 3 other fresh buffers, and in
**the writing process**, which still holds the 5,000 steps it wrote and read back (about
230,000 Python objects: the same reads there take longer, measured in RESULTS.md).

The goal (issue 39): WebGym-formatted prompts read in <= 5 ms per 1,000 samples cold, as
compact ones do, judged on the fresh-process figure. Each figure is measured once per run
(medians of 7 fresh buffers).
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from pydantic_core import from_json
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_summary, markdown_table, replace_generated_block

from replaystore.trajectories.buffer import ReplayBuffer
from replaystore.trajectories.storage import TrajectoryStorage
from trajectories import webgym_shaped

BEGIN = "<!-- BEGIN GENERATED: webgym_prompts -->"
END = "<!-- END GENERATED: webgym_prompts -->"


def webgym_writer(src: Path | None) -> tuple[Any, str]:
    """WebGym's prompt writer and where it comes from: with ``src``, its own
    ``convert_messages_to_path_format``, loaded from ``webgym/utils/image_utils.py`` alone
    (the package's ``__init__`` imports its whole rollout stack)."""
    if src is not None:
        import importlib.util

        path = src / "webgym" / "utils" / "image_utils.py"
        spec = importlib.util.spec_from_file_location("webgym_image_utils", path)
        if spec is None or spec.loader is None:
            raise SystemExit(f"--webgym-src: no {path}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.convert_messages_to_path_format, (
            "WebGym's own convert_messages_to_path_format (indent=2, ensure_ascii=False)"
        )

    def dumps(messages: Any) -> str:
        return json.dumps(messages, indent=2, ensure_ascii=False)

    return dumps, "json.dumps(messages, indent=2, ensure_ascii=False), WebGym's call"


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def measure_once(root: Path, k: int, seed: int) -> dict[str, float]:
    """One cold measurement (seconds each): open + draw, the messages of the draw;
    ``buffer[i]`` of ``k`` random indices on a second freshly opened buffer; the same
    indices through a ``DataLoader`` (batches of 32) over a third; and that loader over
    a dataset of indices (the loader's own work)."""
    gc.collect()
    start = time.perf_counter()
    buffer = ReplayBuffer.from_storage(root, filter_successful_only=False)
    samples = buffer.get_training_samples(k, 1.0, seed=seed)
    draw = time.perf_counter() - start
    start = time.perf_counter()
    for sample in samples:
        sample["message"]
    read = time.perf_counter() - start
    fresh = ReplayBuffer.from_storage(root, filter_successful_only=False)
    indices = np.random.default_rng(seed).integers(0, len(fresh), k).tolist()
    start = time.perf_counter()
    for i in indices:
        fresh[i]["message"]
    items = time.perf_counter() - start
    fresh = ReplayBuffer.from_storage(root, filter_successful_only=False)
    # A process's first DataLoader pays a one-off start-up (lazy imports, about 3 ms)
    # that would fall on whichever is timed first: paid here, before either.
    list(DataLoader(_Indices(1), batch_size=1, collate_fn=list))
    loader = DataLoader(fresh, batch_size=32, sampler=indices, collate_fn=list)
    start = time.perf_counter()
    for batch in loader:
        for sample in batch:
            sample["message"]
    loaded = time.perf_counter() - start
    # The DataLoader's own work, the floor of the column above: the same indices and
    # batches over a dataset that returns its index.
    start = time.perf_counter()
    for batch in DataLoader(_Indices(len(fresh)), batch_size=32, sampler=indices, collate_fn=list):
        for _sample in batch:
            pass
    alone = time.perf_counter() - start
    return {"draw": draw, "read": read, "items": items, "loader": loaded, "alone": alone}


class _Indices(Dataset):  # type: ignore[type-arg]
    """A dataset whose item ``i`` is ``i``: what a ``DataLoader`` costs by itself."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def _medians(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: _median([run[key] for run in runs]) for key in runs[0]}


def measure(root: Path, k: int, repeats: int) -> dict[str, float]:
    """Medians of ``repeats`` cold measurements in this (the writing) process."""
    return _medians([measure_once(root, k, seed) for seed in range(repeats)])


def measure_fresh(roots: list[Path], k: int, repeats: int, warm: int = 0) -> list[dict[str, float]]:
    """Per root, medians of ``repeats`` cold measurements, each in a new Python process
    that imports the library, then opens the root and reads (this script's ``--child``);
    with ``warm``, the process first opens and reads ``warm`` other fresh buffers
    (other seeds, not timed), as a training process that opens the storage again each
    iteration has. The roots take turns (one child each, then the next seed), so a
    change in the machine's speed during the run falls on every root alike."""
    runs: list[list[dict[str, float]]] = [[] for _ in roots]
    for seed in range(repeats):
        for runs_of_root, root in zip(runs, roots, strict=True):
            child = ["--child", str(root), "--k", str(k), "--seed", str(seed)]
            done = subprocess.run(
                [sys.executable, __file__, *child, "--warm", str(warm)],
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                raise SystemExit(f"the measuring child failed:\n{done.stderr}")
            runs_of_root.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return [_medians(r) for r in runs]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--webgym-src", type=Path, help="a WebGym checkout: its writer")
    parser.add_argument("--quick", action="store_true", help="500 steps (smoke test)")
    parser.add_argument("--out", type=Path, help="Markdown file whose generated part to replace")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)  # measure_fresh's
    parser.add_argument("--k", type=int, default=1_000, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--warm", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        # A process's first pydantic-core parse makes the parser's string cache (0.27 ms
        # and 70 fresh pages in a bare process here; 0.06-0.07 ms in this child): a
        # one-off of the process, not of a buffer, paid (and timed) before anything else,
        # as the DataLoader's start-up is below.
        start = time.perf_counter()
        from_json(b'{"role": "user", "content": "x"}')
        parser_start = time.perf_counter() - start
        for other in range(args.warm):
            measure_once(args.child, args.k, 1_000 + other)
        figures = measure_once(args.child, args.k, args.seed)
        print(json.dumps({**figures, "parser_start": parser_start}))
        return 0
    n, k, repeats = (500, 100, 3) if args.quick else (5_000, 1_000, 7)
    writer, source = webgym_writer(args.webgym_src)
    names = ("compact", "webgym")
    results: dict[tuple[str, str], dict[str, float]] = {}
    facts = {}
    with tempfile.TemporaryDirectory() as tmp:
        roots = [Path(tmp) / name for name in names]
        for name, text, root in zip(names, (json.dumps, writer), roots, strict=True):
            trajectories = webgym_shaped(n, prompt_text=text)
            TrajectoryStorage(root).save_iteration(1, trajectories)
            stored = TrajectoryStorage(root).load_all()
            same = all(
                a["response"].raw_prompt == b["response"].raw_prompt
                for got, wrote in zip(stored, trajectories, strict=True)
                for a, b in zip(got, wrote, strict=True)
            )
            chars = sum(len(s["response"].raw_prompt) for t in trajectories for s in t) / n
            label = "compact (json.dumps(messages))" if name == "compact" else source
            facts[name] = (label, chars, same)
            # timed while this process still holds what it wrote and read back
            results[name, "writing process"] = measure(root, k, repeats)
            del trajectories, stored
        for where, warm in (("fresh process", 0), ("process that read 3 buffers before", 3)):
            for name, figures in zip(names, measure_fresh(roots, k, repeats, warm), strict=True):
                results[name, where] = figures
    rows = []
    wheres = ("fresh process", "process that read 3 buffers before", "writing process")
    for name in names:
        label, chars, same = facts[name]
        for where in wheres:
            figures = results[name, where]
            rows.append(
                [
                    label,
                    where,
                    f"{chars:,.0f}",
                    f"{figures['draw'] * 1e3:.1f} ms",
                    f"{figures['read'] * 1e3:.1f} ms",
                    f"{figures['items'] * 1e3:.1f} ms",
                    f"{figures['loader'] * 1e3:.1f} ms",
                    f"{figures['alone'] * 1e3:.1f} ms",
                    f"{figures['parser_start'] * 1e3:.2f} ms" if "parser_start" in figures else "-",
                    "yes" if same else "**no**",
                ]
            )
    verdicts = []
    for where in wheres:
        webgym, compact = results["webgym", where], results["compact", where]
        verdicts.append(
            f"- {where}: WebGym-formatted / compact, messages "
            f"{webgym['read'] / compact['read']:.2f}x; WebGym-formatted messages "
            f"{webgym['read'] * 1e3:.1f} ms, buffer[i] {webgym['items'] * 1e3:.1f} ms, "
            f"DataLoader {webgym['loader'] * 1e3:.1f} ms per {k:,} cold"
        )
    verdict = []
    for where in ("fresh process", "process that read 3 buffers before"):
        per = {key: value * 1_000 / k for key, value in results["webgym", where].items()}
        verdict.append(
            f"- goal <= 5 ms per 1,000 from a freshly opened buffer, {where}: WebGym-formatted "
            "messages "
            + ("**met**" if per["read"] <= 5e-3 else "**not met**")
            + "; DataLoader (batches of 32): "
            + ("**met**" if per["loader"] <= 5e-3 else "**not met**")
            + "; buffer[i] one by one: "
            + ("**met**" if per["items"] <= 5e-3 else "**not met**")
        )
    body = "\n".join(
        [
            f"{n:,} WebGym-shaped steps, {k:,} samples, medians of {repeats} fresh buffers; "
            f"{machine_summary()}",
            "",
            markdown_table(
                [
                    "prompts written by",
                    "read in",
                    "prompt chars/step",
                    f"open + draw {k:,}",
                    f"messages of {k:,} (cold)",
                    f"buffer[i] x {k:,} (cold)",
                    f"DataLoader, batches of 32, {k:,} (cold)",
                    "the DataLoader alone",
                    "the process's first JSON parse (paid before)",
                    "raw_prompt byte for byte",
                ],
                rows,
            ),
            "",
            *verdicts,
            *verdict,
        ]
    )
    print(body)
    if args.out:
        replace_generated_block(args.out, BEGIN, END, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
