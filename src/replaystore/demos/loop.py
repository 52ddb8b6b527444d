"""Demo part ``loop`` (opt-in: ``--part loop``): WebGym's loop, closed for real.

Iteration 0 rolls out the local website suite's scripted expert in headless
Chromium (demonstrations); LLaMA-Factory trains a tiny Qwen2, built here with
no download, on the successful steps; vLLM serves the checkpoint; from
iteration 1 the trained model acts alone in the browser, and its own successes
are added to the training data (filtered behaviour cloning, then expert
iteration). The untrained model is rolled out once first, for the baseline.

Needs the two tool environments (``bash .ci/install-loop-tools``) and a
Chromium. Without them :func:`run` returns one ``SKIPPED`` line with the exact
set-up command and writes nothing. See ``docs/loop.md``.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["full_config", "quick_config", "run", "run_loop_part", "summary_lines"]


#: Settings both modes share: the tiny text model on the local suite, small pages,
#: three seeded repeats of the expert (its few wasted clicks vary the histories).
_COMMON: dict[str, Any] = {
    "observation": "text",
    "bootstrap": {"source": "scripted", "repeats": 3, "mistake_rate": 0.3},
    "prompt": {"history_window": 2},
    "rollout": {
        "workers": 4,
        "viewport": [640, 420],
        "max_steps": {"easy": 6, "medium": 8, "hard": 10},
    },
    "policy": {"max_tokens": 128},
}


def quick_config() -> dict[str, Any]:
    """Two iterations: demonstrations and training, then the trained model acts: a smoke
    run of the loop's stages with the real tools on the bundled suite (CI).

    Learning is measured on MiniWoB++ held-out seeds (``--part miniwob``,
    ``benchmarks/miniwob_loop.py``); on the suite, where training and evaluation share the
    same 16 instances, a success rate would be memorisation, so this run is kept short:
    one demonstration repeat, a 2-layer model, two epochs, replies of at most 48 tokens
    (the demonstrations' longest is 36 with this model's tokenizer; a model that has not
    learned writes until the limit at every step). Measured alone on 2 cores
    (2026-11-28): 168 s with four epochs and 128 tokens, of which training 48 s and the
    model's rollout 54 s.
    """
    return {
        **_COMMON,
        "iterations": 2,
        "bootstrap": {**_COMMON["bootstrap"], "repeats": 1},
        "model": {
            "tiny": {"layers": 2, "hidden": 256, "heads": 4, "vocab": 1024},
            "evaluate_untrained": False,
        },
        "policy": {**_COMMON["policy"], "max_tokens": 48},
        "train": {"final": False, "overrides": {"num_train_epochs": 2}},
    }


def full_config() -> dict[str, Any]:
    """The untrained baseline, then two iterations of the model acting (the first of them
    also trains on its own successes)."""
    return {
        **_COMMON,
        "iterations": 3,
        "model": {
            "tiny": {"layers": 4, "hidden": 256, "heads": 4, "vocab": 1024},
            "evaluate_untrained": True,
        },
        "train": {"final": False, "overrides": {"num_train_epochs": 12}},
    }


def summary_lines(summary: dict[str, Any], out: Path) -> list[str]:
    """The lines ``replaystore demo`` prints for this part."""
    lines = [
        "policy: iteration 0 is the scripted expert's demonstrations; from iteration 1 a tiny "
        "Qwen2 trained by LLaMA-Factory on the stored rollouts and served by vLLM acts alone "
        "(no scripted policy)",
    ]
    untrained = summary.get("untrained")
    if untrained:
        lines.append(
            f"untrained model: {untrained['successful']}/{untrained['num_tasks']} tasks "
            f"= {untrained['success_rate']:.0%}"
        )
    for row in summary["iterations"]:
        acting = (
            "scripted expert (demonstrations)"
            if row["policy"] == "demonstrations"
            else f"model {row['checkpoint']}"
        )
        loss = row.get("train_loss")
        trained = (
            f"; trained {row['trained_checkpoint']} "
            f"(loss {loss['first']:.2f} -> {loss['last']:.3f})"
            if loss and loss.get("first") is not None
            else ""
        )
        times = ", ".join(f"{k} {v:.0f} s" for k, v in row["seconds"].items() if v >= 0.5)
        lines.append(
            f"iteration {row['iteration']}: {acting}: {row['successful']}/{row['num_tasks']} "
            f"= {row['success_rate']:.0%}{trained} ({times})"
        )
    rates = [f"{row['success_rate']:.0%}" for row in summary["iterations"]]
    if untrained:
        rates.insert(0, f"{untrained['success_rate']:.0%} untrained")
    lines.append(f"success rate: {' -> '.join(rates)} (measured, {out / 'summary.json'})")
    lines.append(f"look at the rollouts: replaystore view {out / 'storage'}")
    return lines


def run(out: Path, quick: bool) -> list[str]:
    """Run the loop under ``out`` (replacing a previous demo run there); the summary lines.

    Raises:
        LoopStageError: a stage failed (the message names it and its log).
    """
    settings = quick_config() if quick else full_config()
    return run_loop_part("loop", out, settings, summary_lines)


def run_loop_part(
    part: str,
    out: Path,
    settings: dict[str, Any],
    lines: Callable[[dict[str, Any], Path], list[str]],
) -> list[str]:
    """Run a demo part that is a loop (``loop``, ``miniwob``): ``settings`` under ``out``
    (a previous demo run there is replaced), then ``lines(summary, out)``. Without the
    tool environments or a browser, one ``SKIPPED`` line saying how to get them.

    Raises:
        LoopStageError: a stage failed (the message names it and its log).
    """
    from replaystore.loop import LoopConfig, ToolsMissingError, default_tools_dir, find_tools
    from replaystore.loop.runner import LoopRunner
    from replaystore.loop.tools import INSTALL_COMMAND
    from replaystore.rollouts.browser import BrowserUnavailableError

    log = logging.getLogger(f"replaystore.demos.{part}")
    try:
        find_tools(default_tools_dir())
    except ToolsMissingError as exc:
        log.warning("%s demo skipped: %s", part, exc)
        return [
            f"SKIPPED (no tool environments in {default_tools_dir()}): set them up with "
            f"`{INSTALL_COMMAND}` from a clone of the repository, then run "
            f"`replaystore demo --part {part}`"
        ]
    out = Path(out).absolute()
    if (out / "journal.json").exists():
        shutil.rmtree(out)  # a previous demo run: the demo starts afresh
    config = LoopConfig.from_mapping({**settings, "out": str(out)}, base_dir=out)
    try:
        summary = LoopRunner(config, report=lambda line: log.info("%s", line), progress=False).run()
    except BrowserUnavailableError as exc:
        return [f"SKIPPED (no browser): {exc}"]
    return lines(summary, out)
