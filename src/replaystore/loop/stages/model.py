"""The ``model`` stage (iteration 0, when ``model.path`` is unset): the run's tiny model,
its tokenizer trained on iteration 0's dataset (or the built-in text), plus, on MiniWoB++,
the words the pages draw their names and labels from, written through ``model.partial``
(:mod:`replaystore.loop.partial`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replaystore.atomic import atomic_write_text

from ..partial import build_directory
from ..tools import checkpoint_weights, make_tiny_model
from .base import Outcome, Stage

if TYPE_CHECKING:
    from .context import RunContext

__all__ = ["ModelStage"]


@dataclass
class ModelStage(Stage[None]):
    """Build ``<run>/model`` from ``model.tiny``, its tokenizer trained on ``corpus`` and
    on ``vocabulary``.

    ``vocabulary``: words the environment's pages are made of (MiniWoB++'s word lists,
    :func:`~replaystore.rollouts.miniwob.page_vocabulary`), written one a line, eight
    times each, to ``model/vocabulary.txt`` and added to the corpus, so that each of them
    is one token (measured: 236 of MiniWoB++'s 238 words with a 2,048-token BPE, against
    178 from the demonstrations alone; a name spelled in 2-5 pieces must be copied piece
    by piece). A goal's name and the page's then share one token.
    """

    name = "model"

    k: int = 0
    corpus: list[Path] = field(default_factory=list)
    vocabulary: list[str] = field(default_factory=list)

    #: Lines each vocabulary word gets in ``vocabulary.txt`` (enough for the BPE to merge
    #: it whole before it spends merges on rarer pairs of the demonstrations).
    REPEATS = 8

    def finished(self, ctx: RunContext) -> dict[str, Any] | None:
        record = super().finished(ctx)
        return (
            record if record is not None and checkpoint_weights(ctx.paths.out / "model") else None
        )

    def run(self, ctx: RunContext) -> Outcome[None]:
        # model.tiny's keys (checked by LoopConfig: no others) are make_tiny_model's
        # keywords: layers, hidden, heads, vocab, seed, pretrain_steps.
        tiny = ctx.config["model"]["tiny"]

        def build(partial: Path) -> dict[str, Any]:
            corpus = list(self.corpus)
            if self.vocabulary:
                partial.mkdir(parents=True, exist_ok=True)
                words = partial / "vocabulary.txt"
                atomic_write_text(words, "".join(f"{w}\n" * self.REPEATS for w in self.vocabulary))
                corpus.append(words)
            return make_tiny_model(
                ctx.tools.train_python,
                partial,
                corpus=corpus,
                log_path=ctx.paths.log("model.log"),
                marker=ctx.marker,
                **tiny,
            )

        settings = build_directory(ctx.paths.out / "model", build)
        report = (
            f"tiny model: Qwen2, {settings['layers']} layers, hidden {settings['hidden']}, "
            f"{settings['vocab_size']}-token BPE trained on "
            f"{'iteration 0 data' if self.corpus else 'the built-in text'}"
            f"{f' and {len(self.vocabulary)} page words' if self.vocabulary else ''}, "
            f"{int(settings['parameters']):,} parameters (model/)"
        )
        return Outcome(None, {"settings": settings, "path": "model"}, report=report)
