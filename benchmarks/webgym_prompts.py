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
  opened buffer; median of 5 fresh buffers);
* **dataset**: ``buffer[i]["message"]`` for 1,000 random indices, as a torch
  ``DataLoader`` over the buffer reads it (fresh buffer, median of 5);
* **raw_prompt round trip**: every stored prompt read back equals the written text.

The goal (issue 39): WebGym-formatted prompts read in <= 5 ms per 1,000 samples cold, as
compact ones do. Each figure is measured once per run (medians of 5 fresh buffers).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

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


def measure(root: Path, k: int, repeats: int) -> dict[str, float]:
    draws, reads, items = [], [], []
    for seed in range(repeats):
        gc.collect()
        start = time.perf_counter()
        buffer = ReplayBuffer.from_storage(root, filter_successful_only=False)
        samples = buffer.get_training_samples(k, 1.0, seed=seed)
        draws.append(time.perf_counter() - start)
        start = time.perf_counter()
        for sample in samples:
            sample["message"]
        reads.append(time.perf_counter() - start)
        fresh = ReplayBuffer.from_storage(root, filter_successful_only=False)
        indices = np.random.default_rng(seed).integers(0, len(fresh), k).tolist()
        start = time.perf_counter()
        for i in indices:
            fresh[i]["message"]
        items.append(time.perf_counter() - start)
    return {"draw": _median(draws), "read": _median(reads), "items": _median(items)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--webgym-src", type=Path, help="a WebGym checkout: its writer")
    parser.add_argument("--quick", action="store_true", help="500 steps (smoke test)")
    parser.add_argument("--out", type=Path, help="Markdown file whose generated part to replace")
    args = parser.parse_args(argv)
    n, k, repeats = (500, 100, 3) if args.quick else (5_000, 1_000, 5)
    writer, source = webgym_writer(args.webgym_src)
    rows, results = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in (("compact", json.dumps), ("webgym", writer)):
            trajectories = webgym_shaped(n, prompt_text=text)
            root = Path(tmp) / name
            TrajectoryStorage(root).save_iteration(1, trajectories)
            stored = TrajectoryStorage(root).load_all()
            same = all(
                a["response"].raw_prompt == b["response"].raw_prompt
                for got, wrote in zip(stored, trajectories, strict=True)
                for a, b in zip(got, wrote, strict=True)
            )
            figures = measure(root, k, repeats)
            results[name] = figures
            chars = sum(len(s["response"].raw_prompt) for t in trajectories for s in t) / n
            rows.append(
                [
                    "compact (json.dumps(messages))" if name == "compact" else source,
                    f"{chars:,.0f}",
                    f"{figures['draw'] * 1e3:.1f} ms",
                    f"{figures['read'] * 1e3:.1f} ms",
                    f"{figures['items'] * 1e3:.1f} ms",
                    "yes" if same else "**no**",
                ]
            )
    ratio = results["webgym"]["read"] / results["compact"]["read"]
    body = "\n".join(
        [
            f"{n:,} WebGym-shaped steps, {k:,} samples; {machine_summary()}",
            "",
            markdown_table(
                [
                    "prompts written by",
                    "prompt chars/step",
                    f"open + draw {k:,}",
                    f"messages of {k:,} (cold)",
                    f"buffer[i] x {k:,} (cold)",
                    "raw_prompt byte for byte",
                ],
                rows,
            ),
            "",
            f"WebGym-formatted / compact, messages: {ratio:.2f}x; goal <= 5 ms per 1,000 cold: "
            + ("**met**" if results["webgym"]["read"] <= 5e-3 else "**not met**"),
        ]
    )
    print(body)
    if args.out:
        replace_generated_block(args.out, BEGIN, END, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
