"""Demo part ``miniwob`` (opt-in: ``--part miniwob``): the loop on MiniWoB++, measured on
seeds it never trained on.

Iteration 0 rolls out the scripted experts (:mod:`replaystore.rollouts.miniwob_experts`)
on training seeds; LLaMA-Factory trains a tiny Qwen2, built here with no download, on
their steps; vLLM serves the checkpoint; from iteration 1 the trained model acts alone.
Every iteration's acting policy (the experts, then each checkpoint), and the untrained
model, play one fixed held-out set of seeds with greedy decoding, scored by the pages'
own reward. Writes ``summary.json`` (``eval`` per iteration) and ``learning_curve.png``.

The quick form runs four easy tasks; the full form the 18 tasks with an expert
(``benchmarks/miniwob_loop.py`` runs either and records the table).

Needs the tool environments (``bash .ci/install-loop-tools``), a Chromium and the
``miniwob`` extra; without them :func:`run` returns one ``SKIPPED`` line saying how to
get them, and writes nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["full_config", "quick_config", "run", "summary_lines"]


_COMMON: dict[str, Any] = {
    "observation": "text",
    "bootstrap": {"source": "scripted"},
    "prompt": {"history_window": 2},
    # MiniWoB++ episodes are all "easy": the 18 tasks need at most 7 steps.
    "rollout": {"workers": 4, "viewport": [400, 300], "max_steps": {"easy": 8}, "settle_s": 0.05},
    "buffer": {"filter_same_screenshot": False},
    "policy": {"max_tokens": 64},
    "train_seeds": "0-99999",
}


def quick_config() -> dict[str, Any]:
    """Four easy tasks (:data:`~replaystore.rollouts.miniwob.QUICK_TASKS`), one trained
    iteration: CI's learning test (``tests/demos/test_miniwob_demo.py``, slow) and
    ``benchmarks/miniwob_loop.py --quick``.

    Demonstrations from 30 training seeds of each task (5 seeds x 6 repeats), 20 epochs
    (300 steps of 8), warm-up over the first 8%. What the number of steps does, measured
    offline on 120 such demonstrations and the experts' held-out prompts
    (``benchmarks/miniwob_action_probe.py``, 2026-11-28, 2-core CPU): 150 steps gave 65%
    of held-out actions right, 300 steps 91%.
    """
    return {
        **_COMMON,
        "tasks": "miniwob:quick",
        "iterations": 2,
        "seeds_per_iteration": 5,
        # The four quick tasks take one step, and a wrong click ends the episode: two
        # steps leave room for one reply that was no action, and keep the untrained
        # model's rollout (every reply cut at max_tokens) to two replies an episode.
        # Eight browser contexts: the whole run as CI runs it took 412 s against 438 s
        # with four, the same held-out figures (2026-11-28, on `chromium --headless`).
        "rollout": {**_COMMON["rollout"], "max_steps": {"easy": 2}, "workers": 8},
        "bootstrap": {**_COMMON["bootstrap"], "repeats": 6},
        "evaluation": {"seeds": "100000-100009"},
        "model": {
            "tiny": {"layers": 2, "hidden": 256, "heads": 4, "vocab": 1024},
            "evaluate_untrained": True,
        },
        "train": {
            "final": False,
            "overrides": {"num_train_epochs": 20, "warmup_ratio": 0.08},
        },
    }


def full_config() -> dict[str, Any]:
    """The 18 tasks with an expert; the model trained on their demonstrations acts once.

    Sized to finish within the hour on 2 CPU cores: demonstrations from 60 training seeds
    of each task, twelve epochs (about 2,540 steps of 8: 790 s in bf16 on a CPU that
    computes it natively, ``train.cpu_bf16``; eight epochs in float32 took 837-902 s, and
    four left tasks the quick run's model learns half-learned: click-tab 0.6,
    focus-text-2 0.2), the quick run's 2-layer tiny model, and one held-out set of 18
    tasks x 10 seeds (180 episodes per evaluation, the untrained model's included).
    """
    return {
        **_COMMON,
        "tasks": "miniwob:experts",
        "iterations": 2,
        "seeds_per_iteration": 10,
        "bootstrap": {**_COMMON["bootstrap"], "repeats": 6},
        "evaluation": {"seeds": "100000-100009"},
        "model": {
            "tiny": {"layers": 2, "hidden": 256, "heads": 4, "vocab": 2048},
            "evaluate_untrained": True,
        },
        "train": {"final": False, "overrides": {"num_train_epochs": 12, "warmup_ratio": 0.05}},
    }


def summary_lines(summary: dict[str, Any], out: Path) -> list[str]:
    """The lines ``replaystore demo`` prints for this part."""
    evaluation = summary.get("evaluation") or {}
    lines = [
        f"MiniWoB++ {evaluation.get('tasks')}: trained on seeds from "
        f"{evaluation.get('train_seeds')}, measured on held-out seeds "
        f"{evaluation.get('seeds')} by the pages' own reward (greedy decoding)",
        "policy: iteration 0 is the scripted experts' demonstrations; from iteration 1 a tiny "
        "Qwen2 trained by LLaMA-Factory and served by vLLM acts alone (no scripted policy)",
    ]
    untrained = (summary.get("untrained") or {}).get("eval")
    if untrained:
        lines.append(f"untrained model: held-out {untrained['mean']:.0%}")
    for row in summary["iterations"]:
        acting = (
            "experts (demonstrations)"
            if row["policy"] == "demonstrations"
            else f"model {row['checkpoint']}"
        )
        held = row.get("eval")
        seconds = sum(float(v) for v in row["seconds"].values())
        line = f"iteration {row['iteration']}: {acting}: "
        if held:
            per_task = ", ".join(f"{n} {r:.0%}" for n, r in held["tasks"].items())
            line += f"held-out {held['mean']:.0%} ({per_task}); "
        line += f"training seeds {row['successful']}/{row['num_tasks']}; {seconds:.0f} s"
        lines.append(line)
    curve = out / "learning_curve.png"
    lines.append(
        f"held-out curve: {curve} (measured; {out / 'summary.json'})"
        if curve.exists()
        else f"measured: {out / 'summary.json'}"
    )
    return lines


def run(out: Path, quick: bool) -> list[str]:
    """Run the MiniWoB++ loop under ``out`` (replacing a previous demo run there).

    Raises:
        LoopStageError: a stage failed (the message names it and its log).
    """
    from .loop import run_loop_part

    try:
        from replaystore.rollouts.miniwob import html_root

        html_root()
    except ImportError as exc:
        return [f"SKIPPED ({exc})"]
    settings = quick_config() if quick else full_config()
    return run_loop_part("miniwob", out, settings, summary_lines)
