"""The ``model`` stage (iteration 0, when ``model.path`` is unset): the run's tiny model,
its tokenizer trained on iteration 0's dataset (or the built-in text), written through
``model.partial`` (:mod:`replaystore.loop.partial`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..partial import build_directory
from ..tools import checkpoint_weights, make_tiny_model
from .base import Outcome, Stage

if TYPE_CHECKING:
    from .context import RunContext

__all__ = ["ModelStage"]


@dataclass
class ModelStage(Stage[None]):
    """Build ``<run>/model`` from ``model.tiny``, its tokenizer trained on ``corpus``."""

    name = "model"

    k: int = 0
    corpus: list[Path] = field(default_factory=list)

    def finished(self, ctx: RunContext) -> dict[str, Any] | None:
        record = super().finished(ctx)
        return (
            record if record is not None and checkpoint_weights(ctx.paths.out / "model") else None
        )

    def run(self, ctx: RunContext) -> Outcome[None]:
        # model.tiny's keys (checked by LoopConfig: no others) are make_tiny_model's
        # keywords: layers, hidden, heads, vocab, seed, pretrain_steps.
        tiny = ctx.config["model"]["tiny"]
        settings = build_directory(
            ctx.paths.out / "model",
            lambda partial: make_tiny_model(
                ctx.tools.train_python,
                partial,
                corpus=self.corpus,
                log_path=ctx.paths.log("model.log"),
                marker=ctx.marker,
                **tiny,
            ),
        )
        report = (
            f"tiny model: Qwen2, {settings['layers']} layers, hidden {settings['hidden']}, "
            f"{settings['vocab_size']}-token BPE trained on "
            f"{'iteration 0 data' if self.corpus else 'the built-in text'}, "
            f"{int(settings['parameters']):,} parameters (model/)"
        )
        return Outcome(None, {"settings": settings, "path": "model"}, report=report)
