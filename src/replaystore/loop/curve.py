"""The loop's learning curve: held-out success per iteration, as a PNG beside ``summary.json``.

One point per iteration, numbered as the loop numbers them (0 is iteration 0), each
labelled by what acted in it (the demonstrations, or the checkpoint served); the mean
over the held-out tasks is the thick line, each task a thin one, the untrained model a
dashed line, and the training rollouts' success (on their own fresh seeds) a dotted
one. Drawn with matplotlib (the ``loop`` extra) without a display.
"""

from __future__ import annotations

import io
import logging
from pathlib import Path
from typing import Any

from replaystore.atomic import atomic_write_bytes

__all__ = ["write_learning_curve"]

logger = logging.getLogger("replaystore.loop")


def _label(row: dict[str, Any]) -> str:
    who = "demonstrations" if row.get("policy") == "demonstrations" else row.get("checkpoint")
    return f"{row['iteration']}\n{who or 'model'}"


def write_learning_curve(summary: dict[str, Any], path: Path) -> Path | None:
    """Draw ``summary``'s held-out curve to ``path`` (atomically); the path, or None when
    matplotlib is missing (logged) or no iteration has a held-out evaluation yet."""
    rows = [r for r in summary.get("iterations", []) if r.get("eval")]
    if not rows:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("learning curve not drawn: matplotlib is missing (pip install matplotlib)")
        return None
    xs = [int(r["iteration"]) for r in rows]
    figure, axes = plt.subplots(figsize=(7.5, 4.5), dpi=110)
    names = sorted({n for r in rows for n in r["eval"]["tasks"]})
    for name in names:
        ys = [r["eval"]["tasks"].get(name) for r in rows]
        axes.plot(xs, ys, linewidth=0.9, alpha=0.55, marker=".", label=name)
    axes.plot(
        xs,
        [r["eval"]["mean"] for r in rows],
        color="black",
        linewidth=2.6,
        marker="o",
        label="held-out mean",
    )
    train = [(int(r["iteration"]), r.get("success_rate")) for r in rows]
    axes.plot(
        [x for x, _ in train],
        [y for _, y in train],
        color="grey",
        linestyle=":",
        marker="s",
        label="training rollouts",
    )
    untrained = ((summary.get("untrained") or {}).get("eval") or {}).get("mean")
    if isinstance(untrained, int | float):
        axes.axhline(untrained, color="red", linestyle="--", linewidth=1.2, label="untrained")
    axes.set_xticks(xs, [_label(r) for r in rows], fontsize=8)
    axes.set_ylim(-0.03, 1.03)
    axes.set_xlabel("loop iteration (what acted)")
    axes.set_ylabel("success on held-out seeds")
    seeds = (summary.get("evaluation") or {}).get("seeds")
    axes.set_title(f"MiniWoB++ held-out success (seeds {seeds})" if seeds else "held-out success")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    plt.close(figure)
    atomic_write_bytes(path, buffer.getvalue())
    return path
