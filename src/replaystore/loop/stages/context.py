"""The run context every stage runs over: config, paths, journal, tools, server, reporter.

One :class:`RunContext` per run replaces the state the stages used to share as
attributes of the runner; :class:`RunPaths` names every place in the run directory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..tools import template_text, training_arguments
from .serve import ModelServer

if TYPE_CHECKING:
    from ..config import LoopConfig
    from ..journal import Journal
    from ..processes import ChildProcess
    from ..tools import ToolPaths

__all__ = ["DATASET_NAME", "RunContext", "RunPaths"]

#: Name of the dataset entry each iteration exports.
DATASET_NAME = "webagent"


@dataclass(frozen=True)
class RunPaths:
    """The places of one run directory ``out`` (``config``: for the initial model)."""

    out: Path
    config: LoopConfig

    def rel(self, path: Path | str | None) -> str | None:
        """``path`` relative to the run directory (the journal stays valid after a move); a
        hub id as it is."""
        if path is None:
            return None
        try:
            return str(Path(path).relative_to(self.out))
        except ValueError:
            return str(path)

    def iteration_dir(self, k: int) -> Path:
        return self.out / "iterations" / f"{k:03d}"

    def checkpoint_dir(self, k: int) -> Path:
        """Where iteration ``k``'s training writes its checkpoint."""
        return self.out / "checkpoints" / f"{k:03d}"

    def log(self, name: str) -> Path:
        return self.out / "logs" / name

    @property
    def storage_root(self) -> Path:
        return self.out / "storage"

    @property
    def screenshot_root(self) -> Path:
        """Screenshots live inside the storage, which stores their paths relative to itself:
        the run directory can be moved."""
        from replaystore.rollouts.screenshots import default_screenshot_root

        return default_screenshot_root(self.storage_root)

    @property
    def blocklist(self) -> Path:
        return self.out / "blocklist.jsonl"

    @property
    def initial_model(self) -> Path | str:
        """The model iteration 0 trains: ``model.path`` (a directory, or a hub id passed on
        unchanged), else the tiny model of this run."""
        source = self.config.model_source()
        return source if source is not None else self.out / "model"

    def acting_checkpoint(self, k: int) -> Path | str:
        """The model acting in iteration ``k`` (``train.init: previous`` starts from it)."""
        return self.initial_model if k == 0 else self.checkpoint_dir(k - 1)


@dataclass
class RunContext:
    """What the stages of one run share.

    Args:
        config: the checked configuration.
        paths: the run directory's places.
        journal: the run's journal.
        tools: the LLaMA-Factory / vLLM environments.
        report: called with one line per finished stage.
        progress: progress bars during rollouts (None: on a TTY).
        marker: the run's marker, inherited by every child process.
        server: the model server handle (what is served now).
        children: child processes running now (stopped on an interrupt).
        experiment: the experiment logger while one is open.
        miniwob_url: the MiniWoB++ pages' URL while a MiniWoB++ run runs.
    """

    config: LoopConfig
    paths: RunPaths
    journal: Journal
    tools: ToolPaths
    report: Callable[[str], None]
    progress: bool | None = None
    marker: str | None = None
    server: ModelServer = field(default_factory=ModelServer)
    children: list[ChildProcess] = field(default_factory=list)
    experiment: Any = None
    miniwob_url: str | None = None

    def storage(self) -> Any:
        """The run's trajectory storage (opened afresh: it lists the files stored now)."""
        from replaystore.trajectories.storage import TrajectoryStorage

        return TrajectoryStorage(self.paths.storage_root)

    def training_preview(self) -> dict[str, Any]:
        """The training arguments every iteration shares (template, ``train.finetuning_type``
        and ``train.lora``, the overrides): what is trained, full or LoRA, of which rank."""
        cfg = self.config
        template = template_text(cfg.train_template(), cfg["observation"])
        return training_arguments(
            template,
            model="",
            dataset_dir=self.paths.out,
            dataset=DATASET_NAME,
            output_dir=self.paths.out,
            overrides=cfg["train"]["overrides"],
            settings=cfg.training_settings(),
        )
