"""The ``train`` stage: ``llamafactory-cli train`` on a YAML made from the template, the
overrides and this iteration's dataset, written through the checkpoint's ``.partial``
(:mod:`replaystore.loop.partial`); the checkpoint it writes is what iteration ``k + 1``
serves."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..partial import build_directory
from ..tools import (
    LoopStageError,
    checkpoint_weights,
    cpu_bf16_arguments,
    is_adapter,
    preference_arguments,
    read_losses,
    run_training,
    template_text,
    training_arguments,
)
from .base import Outcome, Recovery, Stage
from .context import DATASET_NAME

if TYPE_CHECKING:
    from .context import RunContext

__all__ = ["TrainStage", "nothing_to_train"]


def _precision(arguments: dict[str, Any]) -> str:
    """How the trainer computes, in words, from its arguments."""
    half = "bf16" if arguments.get("bf16") else "fp16" if arguments.get("fp16") else None
    if half is None:
        return "float32"
    return f"{half} on the CPU" if arguments.get("use_cpu") else half


def nothing_to_train(ctx: RunContext, k: int) -> LoopStageError:
    """Why iteration ``k`` has no dataset to train on (the buffer's counts named)."""
    record = ctx.journal.iteration(k)
    kind = ctx.config.train_stage(k)
    if kind == "sft":
        return LoopStageError(
            f"train (iteration {k}): no successful trajectory to train on yet "
            f"(success rate {record['stages']['evaluate']['success_rate']:.0%}); "
            "bootstrap from demonstrations (bootstrap.source: scripted) or "
            "lower buffer.filter_successful_only"
        )
    facts = record["stages"].get("buffer", {})
    counted = f"{facts.get('steps', 0)} steps, {facts.get('desirable', 0)} of them successful"
    if kind == "kto":
        return LoopStageError(
            f"train (iteration {k}): nothing to train kto on ({counted}): the "
            "buffer's iterations hold no model step with a stored prompt"
        )
    return LoopStageError(
        f"train (iteration {k}): nothing to train dpo on ({counted}; pairs: "
        f"{facts.get('pairs')}); a DPO pair needs a success and a failure at "
        "the same state: repeat attempts (bootstrap.repeats, "
        "policy.temperature > 0) or train kto"
    )


@dataclass
class TrainStage(Stage[None]):
    """Train iteration ``k``'s checkpoint on its dataset (``has_data``: the export found
    something to train on, else the stage fails saying why). Recovery keeps a checkpoint
    renamed into place before the loop died (the trainer had returned); one still in its
    ``.partial`` may hold weights the trainer was writing when it was killed: redone."""

    name = "train"
    recovery = Recovery.KEEP
    keeps_partial = False

    k: int
    has_data: bool = True

    def output(self, ctx: RunContext) -> Path:
        return ctx.paths.checkpoint_dir(self.k)

    def complete(self, directory: Path) -> bool:
        return bool(checkpoint_weights(directory))

    def recovered(self, ctx: RunContext) -> Outcome[None]:
        # Trained before the loop died: the journal was not written yet.
        output = self.output(ctx)
        losses = read_losses(output / "trainer_log.jsonl")
        facts = {
            "recovered": True,
            "kind": ctx.config.train_stage(self.k),
            "steps": len(losses),
            "loss_first": losses[0] if losses else None,
            "loss_last": losses[-1] if losses else None,
            "checkpoint": ctx.paths.rel(output),
        }
        report = (
            f"iteration {self.k}: checkpoint {ctx.paths.rel(output)} already trained; not redone"
        )
        return Outcome(None, facts, report=report, seconds=0.0)

    def start_from(self, ctx: RunContext) -> tuple[Path | str, Path | str | None]:
        """The model training starts from, and the adapter it goes on training (LoRA:
        every adapter is trained on the base model; ``train.init: previous`` goes on
        training the adapter that acted, LLaMA-Factory resuming it, trainable)."""
        paths = ctx.paths
        previous = ctx.config["train"]["init"] == "previous"
        start_from = paths.acting_checkpoint(self.k) if previous else paths.initial_model
        if ctx.training_preview().get("finetuning_type") != "lora":
            return start_from, None
        adapter = start_from if is_adapter(start_from) else None
        return (adapter if adapter is not None else paths.initial_model), adapter

    @staticmethod
    def cpu_bf16(ctx: RunContext, arguments: dict[str, Any]) -> dict[str, Any]:
        """What ``train.cpu_bf16`` adds to ``arguments`` (:func:`cpu_bf16_arguments`)."""
        train = ctx.config["train"]
        return cpu_bf16_arguments(
            arguments,
            train["cpu_bf16"],
            overrides=train["overrides"],
            env={str(a): str(b) for a, b in train["env"].items()},
        )

    def arguments(self, ctx: RunContext, output_dir: Path) -> dict[str, Any]:
        """The training YAML's arguments, writing into ``output_dir``."""
        cfg = ctx.config
        dataset = ctx.paths.iteration_dir(self.k) / "dataset"
        info = json.loads((dataset / "dataset_info.json").read_text(encoding="utf-8"))
        start_from, adapter = self.start_from(ctx)
        lora = ctx.training_preview().get("finetuning_type") == "lora"
        arguments = training_arguments(
            template_text(cfg.train_template(), cfg["observation"]),
            model=ctx.paths.initial_model if lora else start_from,
            dataset_dir=dataset,
            dataset=DATASET_NAME,
            output_dir=output_dir,
            overrides=cfg["train"]["overrides"],
            has_images=cfg["observation"] == "screenshot",
            settings=cfg.training_settings(),
            adapter=adapter,
        )
        arguments.update(self.cpu_bf16(ctx, arguments))
        if f"{DATASET_NAME}_val" in info and "eval_dataset" not in arguments:
            arguments["eval_dataset"] = f"{DATASET_NAME}_val"
        kind = cfg.train_stage(self.k)
        return arguments if kind == "sft" else preference_arguments(arguments, kind)

    def _train(self, ctx: RunContext, partial: Path, log: Path) -> Any:
        """Run the trainer into ``partial``; its result (child processes are tracked)."""
        result = run_training(
            ctx.tools.train_command,
            self.arguments(ctx, partial),
            yaml_path=ctx.paths.iteration_dir(self.k) / "train.yaml",
            log_path=log,
            env={str(a): str(b) for a, b in ctx.config["train"]["env"].items()},
            marker=ctx.marker,
            stage=f"train (iteration {self.k})",
            on_child=ctx.children.append,
        )
        ctx.children.clear()
        return result

    def run(self, ctx: RunContext) -> Outcome[None]:
        if not self.has_data:
            raise nothing_to_train(ctx, self.k)
        kind = ctx.config.train_stage(self.k)
        output = self.output(ctx)
        start_from, _ = self.start_from(ctx)
        log = ctx.paths.log(f"train-{self.k:03d}.log")
        preview = ctx.training_preview()
        precision = _precision({**preview, **self.cpu_bf16(ctx, preview)})
        ctx.report(
            f"iteration {self.k}: training ({kind}, {precision}) from "
            f"{ctx.paths.rel(start_from)} (log {ctx.paths.rel(log)})"
        )
        result = build_directory(output, lambda partial: self._train(ctx, partial, log))
        facts = {
            **result.facts(),
            "checkpoint": ctx.paths.rel(output),
            "started_from": ctx.paths.rel(start_from),
            "log": ctx.paths.rel(log),
            "kind": kind,
            "precision": precision,
        }
        loss = (
            f"loss {result.loss_first:.3f} -> {result.loss_last:.3f}"
            if result.loss_first is not None and result.loss_last is not None
            else "no loss logged"
        )
        report = (
            f"iteration {self.k}: trained {ctx.paths.rel(output)} in {result.seconds:.1f} s "
            f"({result.steps} steps, {loss})"
        )
        return Outcome(None, facts, report=report, seconds=result.seconds)
