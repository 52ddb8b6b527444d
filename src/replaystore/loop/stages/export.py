"""The ``export`` stage: the buffer's draw exported as the iteration's LLaMA-Factory
dataset (ShareGPT records for SFT, preference records for KTO/DPO), written through
``dataset.partial`` (:mod:`replaystore.loop.partial`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from ..partial import build_directory
from .base import Outcome, Stage, now, run_stage
from .buffer import Draw, buffer_stage
from .context import DATASET_NAME

if TYPE_CHECKING:
    from pathlib import Path

    from replaystore.trajectories.export import Kind

    from .context import RunContext

__all__ = ["ExportStage"]


@dataclass
class ExportStage(Stage[bool]):
    """Iteration ``k``'s buffer (its own journal entry) and dataset; whether there is
    anything to train on. No sample: an empty ``export`` stage and no dataset."""

    name = "export"

    k: int

    def resume(self, ctx: RunContext, record: dict[str, Any]) -> bool:
        return bool(record.get("num_train"))

    def run(self, ctx: RunContext) -> Outcome[bool]:
        draw = run_stage(ctx, buffer_stage(ctx, self.k))
        if not draw.samples:
            facts = {"num_train": 0, "dataset": None, "kind": draw.kind}
            return Outcome(False, facts, seconds=0.0)
        target = ctx.paths.iteration_dir(self.k) / "dataset"
        started = now()
        report = build_directory(target, lambda partial: self._export(ctx, draw, partial))
        facts = {
            "num_train": report.num_train,
            "num_val": report.num_val,
            "images": report.num_image_refs,
            "dataset": ctx.paths.rel(target),
            "kind": draw.kind,
        }
        line = (
            f"iteration {self.k}: {draw.made}; exported {report.num_train} records to "
            f"{ctx.paths.rel(target)}"
        )
        return Outcome(report.num_train > 0, facts, report=line, seconds=now() - started)

    def _export(self, ctx: RunContext, draw: Draw, directory: Path) -> Any:
        """``draw`` exported into ``directory``; the export report."""
        from replaystore.trajectories.export import export_llamafactory

        cfg = ctx.config
        screenshots = cfg["observation"] == "screenshot"
        report = export_llamafactory(
            draw.samples,
            directory,
            dataset_name=DATASET_NAME,
            kind=cast("Kind", draw.kind),
            val_ratio=cfg["buffer"]["val_ratio"],
            seed=cfg["seed"] + self.k,
            copy_images=screenshots,
            image_root=ctx.paths.out if screenshots else None,
        )
        copies = cfg["train"]["name_swaps"]
        if copies and draw.kind == "sft":
            report.num_train = self._swap_names(cfg, report.train_file, copies)
        return report

    def _swap_names(self, cfg: Any, path: Path, copies: int) -> int:
        """Add ``copies`` name-swapped copies of the training records (``train.name_swaps``,
        :func:`~replaystore.loop.augment.swap_names`); the number of records now."""
        import json

        import numpy as np

        from replaystore.atomic import atomic_write_text
        from replaystore.rollouts.miniwob import page_vocabulary

        from ..augment import swap_names

        records = json.loads(path.read_text(encoding="utf-8"))
        rng = np.random.default_rng(cfg["seed"] + self.k)
        records = swap_names(records, page_vocabulary(), copies, rng)
        atomic_write_text(path, json.dumps(records, ensure_ascii=False, indent=1))
        return len(records)
