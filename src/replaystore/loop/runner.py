"""WebGym's outer loop, closed: roll out, store, build the buffer, export, train, serve.

One iteration ``k`` (0-based) runs these stages, each recorded in the journal
(:mod:`.journal`) when it finishes:

1. ``sample``: the iteration's tasks (:class:`~replaystore.pipeline.TaskSampler`
   with the task history rebuilt from the stored rollouts and the blocklist).
2. ``serve``: the policy's checkpoint is served (vLLM in its own environment,
   or the user's server after a reload command), ready when ``/v1/models`` lists it.
3. ``rollout``: :class:`~replaystore.rollouts.collector.RolloutCollector` in
   headless Chromium (or ``--cdp`` browsers); the evaluator scores each answer;
   the iteration's trajectories are stored as one iteration file (atomic).
4. ``evaluate``: the iteration's success rate, read back from the stored file.
   ``heldout`` (MiniWoB++ tasks): the acting policy (the experts in iteration 0,
   then each checkpoint) plays the fixed held-out set (``evaluation.seeds``, never
   trained on) with greedy decoding; success per task and their mean, scored by the
   pages' own reward, stored apart in ``heldout/`` and never trained on.
5. ``buffer`` and ``export``: the trajectory buffer over the stored iterations
   (successful trajectories, repeated screenshots dropped, recency-weighted
   draw) exported as a LLaMA-Factory ShareGPT dataset.
6. ``model`` and ``baseline`` (iteration 0 only, when asked): build the tiny
   model, its tokenizer trained on iteration 0's dataset; roll out the untrained
   model once for the learning curve (kept apart from the training data).
7. ``train``: ``llamafactory-cli train`` on a YAML made from the template, the
   overrides and this iteration's dataset; the checkpoint it writes is what
   iteration ``k + 1`` serves.

Iteration 0 rolls out demonstrations (the suite's scripted expert, or an
existing trajectory storage) when ``bootstrap.source`` is set: filtered
behaviour cloning to start, then expert iteration on the model's own
successful rollouts, as WebGym trains.

Crash safety: every output of a stage is written atomically or into a
``.partial`` directory renamed when complete, then the journal records the
stage. ``--resume`` skips recorded stages, and recognises outputs that were
complete when the loop died before writing the journal (a stored rollout, a
checkpoint with weights), so nothing stored is rolled out twice and no finished
training is redone.

Each stage is an object of :mod:`.stages` (one module each) run over one
:class:`~.stages.RunContext` by :func:`~.stages.run_stage`, which skips the stages
the journal marks done, times the others, journals them and reports them; this
module holds the runner that orders them, the run's lock, signals, task suite and
experiment logger, and the summary.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from replaystore.atomic import atomic_write_json, atomic_write_text
from replaystore.errors import ConfigError

from .config import LoopConfig
from .journal import Journal
from .processes import MARKER_VAR, kill_strays, run_marker
from .stages import DATASET_NAME, RunContext, RunPaths, run_stage
from .stages.baseline import BaselineStage
from .stages.evaluate import EvaluateStage
from .stages.export import ExportStage
from .stages.heldout import HeldoutStage
from .stages.model import ModelStage
from .stages.rollout import RolloutStage
from .stages.sample import SampleStage
from .stages.serve import ModelServer
from .stages.train import TrainStage
from .tools import LoopStageError, check_hub_model, find_tools

__all__ = ["LoopInterrupted", "LoopRunner", "run_loop"]

logger = logging.getLogger("replaystore.loop")


class LoopInterrupted(KeyboardInterrupt):
    """The loop was stopped by SIGINT or SIGTERM (children were stopped; resume with --resume)."""


def _now() -> float:
    return time.perf_counter()


class LoopRunner:
    """Runs (or resumes) a loop in ``config.out``; see the module docstring.

    Args:
        config: the checked configuration.
        resume: continue the run in ``config.out`` from its journal.
        report: called with one line per finished stage (the CLI prints them).
        progress: progress bars during rollouts (None: on a TTY).

    Raises (from :meth:`run`):
        ConfigError: a bad config, ``resume`` without a journal, or a new run over one.
        ToolsMissingError: the LLaMA-Factory or vLLM environment is missing.
        LoopStageError: a stage failed (the stage, the iteration and the log are named).
        LoopInterrupted: Ctrl-C or SIGTERM (children are stopped first).
    """

    def __init__(
        self,
        config: LoopConfig,
        *,
        resume: bool = False,
        report: Callable[[str], None] | None = None,
        progress: bool | None = None,
    ) -> None:
        self.config = config
        self.resume = resume
        self.report = report or (lambda line: logger.info("%s", line))
        self.progress = progress
        self.out = config.out
        self.paths = RunPaths(config.out, config)
        #: What the stages share while the loop runs (None before :meth:`run`).
        self.ctx: RunContext | None = None

    # ------------------------------------------------------------------ paths

    def rel(self, path: Path | str | None) -> str | None:
        """``path`` relative to the run directory (the journal stays valid after a move); a
        hub id as it is."""
        return self.paths.rel(path)

    def iteration_dir(self, k: int) -> Path:
        return self.paths.iteration_dir(k)

    def checkpoint_dir(self, k: int) -> Path:
        """Where iteration ``k``'s training writes its checkpoint."""
        return self.paths.checkpoint_dir(k)

    @property
    def storage_root(self) -> Path:
        return self.paths.storage_root

    @property
    def screenshot_root(self) -> Path:
        """Screenshots live inside the storage (see :class:`~.stages.RunPaths`)."""
        return self.paths.screenshot_root

    @property
    def initial_model(self) -> Path | str:
        """The model iteration 0 trains: ``model.path`` (a directory, or a hub id passed on
        unchanged), else the tiny model of this run."""
        return self.paths.initial_model

    def acting_checkpoint(self, k: int) -> Path | str:
        """The model acting in iteration ``k`` (``train.init: previous`` starts from it)."""
        return self.paths.acting_checkpoint(k)

    # ------------------------------------------------------------------ run

    def run(self, iterations: int | None = None) -> dict[str, Any]:
        """Run iterations ``0 .. n-1`` (``n``: ``iterations`` or the config's); the summary.

        Finished stages recorded in the journal are skipped (``resume``).
        """
        cfg = self.config
        n = cfg["iterations"] if iterations is None else int(iterations)
        if n < 1:
            raise ConfigError(f"iterations must be >= 1, got {n}")
        self.out.mkdir(parents=True, exist_ok=True)
        with self._run_lock():
            return self._run(n)

    @contextlib.contextmanager
    def _run_lock(self) -> Iterator[None]:
        """One loop per run directory: a second one (same run, another process) is refused
        instead of killing the first one's children as strays."""
        import fcntl

        path = self.out / ".loop.lock"
        handle = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - closed below
        try:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                handle.seek(0)
                holder = handle.read().strip() or "another process"
                raise ConfigError(
                    f"{self.out} is in use by another replaystore loop (pid {holder}); "
                    "wait for it or stop it first"
                ) from None
            handle.seek(0)
            handle.truncate()
            handle.write(str(os.getpid()))
            handle.flush()
            yield
        finally:
            handle.close()

    def _start(self, n: int) -> RunContext:
        """The run's context: the journal opened, the tools found, strays of a killed run
        of this directory stopped, the effective config written."""
        cfg = self.config
        source = cfg.model_source()
        if isinstance(source, str):  # a hub id: cached or reachable, before anything runs
            check_hub_model(source)
        journal = Journal.open(self.out, resume=self.resume, config=cfg)
        # A model is served unless only the demonstrations act: a later iteration, a
        # final training, or the untrained model's baseline (iteration 0) all serve one.
        needs_model = (
            n > 1
            or not cfg.uses_demonstrations
            or cfg["train"]["final"]
            or cfg["model"]["evaluate_untrained"]
        )
        tools = find_tools(
            cfg.tools_dir,
            train_command=cfg["train"]["command"],
            vllm_python=cfg["serve"]["python"],
            need_vllm=cfg["serve"]["base_url"] is None and needs_model,
        )
        marker = run_marker(journal.token)
        kill_strays(journal.token, own_marker=marker)
        atomic_write_text(self.out / "loop.yaml", _dump_yaml(journal.data["config"]))
        return RunContext(
            config=cfg,
            paths=self.paths,
            journal=journal,
            tools=tools,
            report=self.report,
            progress=self.progress,
            marker=marker,
            server=ModelServer(served_name=cfg["model"]["name"]),
        )

    def _run(self, n: int) -> dict[str, Any]:
        self.ctx = ctx = self._start(n)
        previous = os.environ.get(MARKER_VAR)
        os.environ[MARKER_VAR] = ctx.marker or ""  # browsers and tools inherit it
        try:
            with self._signals(), self._suite(ctx) as tasks_file, self._experiment_logger(ctx):
                for k in range(n):
                    self._iteration(ctx, k, tasks_file, last=k == n - 1)
                    self._write_summary(ctx)
        finally:
            self._stop_children(ctx)
            if previous is None:
                os.environ.pop(MARKER_VAR, None)
            else:
                os.environ[MARKER_VAR] = previous
        return self._write_summary(ctx)

    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        """SIGTERM (and SIGINT) raise :class:`LoopInterrupted` in the main thread."""

        def stop(signum: int, _frame: Any) -> None:
            raise LoopInterrupted(f"stopped by {signal.Signals(signum).name}")

        installed = []
        with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
            for sig in (signal.SIGTERM, signal.SIGINT):
                installed.append((sig, signal.signal(sig, stop)))
        try:
            yield
        finally:
            for sig, handler in installed:
                signal.signal(sig, handler)

    @contextlib.contextmanager
    def _suite(self, ctx: RunContext) -> Iterator[Path]:
        """The task file; for ``tasks: suite`` the local suite runs on the run's fixed port."""
        cfg = self.config
        tasks_file = self.out / "tasks.jsonl"
        if cfg.on_miniwob:
            # The pages' port is free to change between resumes: nothing the model reads
            # shows it (the page text has no URL, prompts leave out a loopback port), and
            # the tasks are made again from their names and seeds.
            from replaystore.rollouts.miniwob import MiniWoBServer

            with MiniWoBServer() as server:
                ctx.miniwob_url = server.url
                try:
                    yield tasks_file
                finally:
                    ctx.miniwob_url = None
            return
        if cfg["tasks"] != "suite":
            source = cfg.path(cfg["tasks"])
            if not source.exists():
                raise ConfigError(f"tasks: {source} does not exist")
            yield source
            return
        from replaystore.rollouts.sites import LocalSuite

        port = ctx.journal.data.get("suite_port") or cfg["rollout"]["suite_port"]
        try:
            suite = LocalSuite(port=int(port)).start()
        except OSError as exc:
            raise LoopStageError(
                f"sample: the local website suite cannot listen on port {port} ({exc.strerror}); "
                "the run keeps one port so that prompts stay the same: free it and resume"
            ) from None
        try:
            if ctx.journal.data.get("suite_port") != suite.port:
                ctx.journal.data["suite_port"] = suite.port
                ctx.journal.save()
            suite.write_tasks(tasks_file)
            yield tasks_file
        finally:
            suite.stop()

    @contextlib.contextmanager
    def _experiment_logger(self, ctx: RunContext) -> Iterator[None]:
        backend = self.config["logger"]
        if backend == "none":
            yield
            return
        from replaystore.rollouts.experiment_logger import ExperimentLogger

        ctx.experiment = ExperimentLogger(
            backend,
            log_dir=self.out / "logs" / backend,
            project="replaystore-loop",
            run_name=f"loop-{ctx.journal.token}",
            config=self.config.data,
        )
        try:
            yield
        finally:
            ctx.experiment.close()
            ctx.experiment = None

    def _stop_children(self, ctx: RunContext) -> None:
        ctx.server.stop()
        for child in ctx.children:
            child.stop(grace_s=5.0)
        ctx.children.clear()
        kill_strays(ctx.journal.token, own_marker=None)

    # ------------------------------------------------------------------ one iteration

    def _iteration(self, ctx: RunContext, k: int, tasks_file: Path, *, last: bool) -> None:
        """Run the unfinished stages of iteration ``k``; its wall time goes to the journal
        (``wall_s``, summed over resumed runs) for the loop's overhead share."""
        started = _now()
        self._stages(ctx, k, tasks_file, last=last)
        record = ctx.journal.iteration(k)
        record["wall_s"] = round(float(record.get("wall_s", 0.0)) + _now() - started, 3)
        ctx.journal.save()

    def _stages(self, ctx: RunContext, k: int, tasks_file: Path, *, last: bool) -> None:
        """Iteration ``k``'s stages in order; :func:`~.stages.run_stage` skips finished ones."""
        cfg = self.config
        record = ctx.journal.iteration(k)
        demos = k == 0 and cfg.uses_demonstrations
        record["policy"] = "demonstrations" if demos else "model"
        acting = None if demos else self.paths.acting_checkpoint(k)
        record["checkpoint"] = self.paths.rel(acting)
        ctx.journal.save()
        builds_model = k == 0 and cfg["model"]["path"] is None
        if builds_model and not demos:
            run_stage(ctx, ModelStage(0, corpus=[], vocabulary=_page_vocabulary(cfg)))

        tasks = run_stage(ctx, SampleStage(k, tasks_file))
        run_stage(ctx, RolloutStage(k, tasks, acting))
        run_stage(ctx, EvaluateStage(k))
        if cfg.on_miniwob:
            run_stage(ctx, HeldoutStage(k, acting))
        ctx.server.stop_after_rollouts()
        has_data = run_stage(ctx, ExportStage(k))
        if builds_model and demos:
            corpus = [self.paths.iteration_dir(0) / "dataset" / f"{DATASET_NAME}.json"]
            vocabulary = _page_vocabulary(cfg)
            run_stage(
                ctx,
                ModelStage(0, corpus=[p for p in corpus if p.exists()], vocabulary=vocabulary),
            )
        if k == 0 and cfg["model"]["evaluate_untrained"]:
            run_stage(ctx, BaselineStage(tasks))
        if not last or cfg["train"]["final"]:
            run_stage(ctx, TrainStage(k, has_data))

    # ------------------------------------------------------------------ summary

    def summary(self) -> dict[str, Any]:
        """``{"iterations": [...], "untrained": {...}}`` from the journal (see docs/loop.md)."""
        if self.ctx is None:
            raise RuntimeError("the loop has not run: no journal to summarise")
        return summarize(self.ctx.journal, self.config)

    def _write_summary(self, ctx: RunContext) -> dict[str, Any]:
        summary = summarize(ctx.journal, self.config)
        atomic_write_json(self.out / "summary.json", summary)
        if self.config.on_miniwob and any(r["eval"] for r in summary["iterations"]):
            from .curve import write_learning_curve

            write_learning_curve(summary, self.out / "learning_curve.png")
        if ctx.experiment is not None and summary["iterations"]:
            _log_metrics(ctx.experiment, summary["iterations"][-1])
        return summary


def _row(record: dict[str, Any]) -> dict[str, Any] | None:
    """The summary row of an iteration's journal record (None: not evaluated yet)."""
    stages = record.get("stages", {})
    evaluate = stages.get("evaluate") or {}
    if not evaluate.get("done"):
        return None
    train = stages.get("train") or {}
    heldout = stages.get("heldout") or {}
    sample = stages.get("sample") or {}
    seconds = {
        name: round(float(stage.get("seconds", 0.0)), 3)
        for name, stage in stages.items()
        if isinstance(stage, dict) and stage.get("done")
    }
    return {
        "iteration": record["iteration"],
        "policy": record.get("policy"),
        "checkpoint": record.get("checkpoint"),
        "success_rate": evaluate.get("success_rate"),
        "num_tasks": evaluate.get("num_tasks"),
        "successful": evaluate.get("successful"),
        "train_loss": {
            "first": train.get("loss_first"),
            "last": train.get("loss_last"),
        }
        if train.get("done")
        else None,
        "trained_checkpoint": train.get("checkpoint"),
        "train_stage": train.get("kind", "sft") if train.get("done") else None,
        "train_seeds": sample.get("seeds"),
        "eval": {
            "tasks": {n: r["success_rate"] for n, r in heldout["tasks"].items()},
            "mean": heldout["mean"],
            "episodes": heldout["episodes"],
            "seeds": heldout["seeds"],
        }
        if heldout.get("done")
        else None,
        "seconds": seconds,
        "wall_s": record.get("wall_s"),
        "overhead_share": _overhead_share(stages, record.get("wall_s")),
    }


def summarize(journal: Journal, config: LoopConfig) -> dict[str, Any]:
    """``{"iterations": [...], "untrained": {...}}`` from ``journal`` (see docs/loop.md)."""
    rows = [row for row in map(_row, journal.data["iterations"]) if row is not None]
    untrained = journal.data.get("baseline")
    if untrained and untrained.get("eval"):
        # One shape for every held-out figure: {"tasks": {name: rate}, "mean", ...}.
        held = untrained["eval"]
        untrained = {
            **untrained,
            "eval": {
                **held,
                "tasks": {n: r["success_rate"] for n, r in held["tasks"].items()},
            },
        }
    out: dict[str, Any] = {"iterations": rows, "untrained": untrained}
    if config.on_miniwob:
        out["evaluation"] = {
            "tasks": config.evaluation_tasks(),
            "seeds": str(config["evaluation"]["seeds"]),
            "train_seeds": str(config["train_seeds"]),
            "scored_by": "the pages' own reward (WOB_RAW_REWARD_GLOBAL > 0), greedy decoding",
        }
    return out


def _log_metrics(experiment: Any, row: dict[str, Any]) -> None:
    metrics: dict[str, float] = {"loop/success_rate": float(row["success_rate"] or 0.0)}
    if row.get("eval"):
        metrics["loop/heldout/mean"] = float(row["eval"]["mean"])
        for name, rate in row["eval"]["tasks"].items():
            metrics[f"loop/heldout/{name}"] = float(rate)
    loss = row.get("train_loss") or {}
    for key in ("first", "last"):
        if isinstance(loss.get(key), int | float):
            metrics[f"loop/train_loss_{key}"] = float(loss[key])
    for stage, seconds in row["seconds"].items():
        metrics[f"loop/seconds/{stage}"] = float(seconds)
    experiment.log_scalars(int(row["iteration"]) + 1, metrics)


#: Stages whose time is the tools' (browser, server, trainer), not the loop's.
_TOOL_STAGES = ("serve", "rollout", "model", "baseline", "train")


def _overhead_share(stages: dict[str, Any], wall_s: float | None = None) -> float | None:
    """The loop's own share of the iteration's wall time: everything but the time spent in
    the tools (server start, the rollout's browser and model calls, the trainer, the tiny
    model builder), the collector's own per-step work counted as the loop's.

    Without ``wall_s`` (a journal from before it was recorded) the stages' sum stands in."""
    done = {n: s for n, s in stages.items() if isinstance(s, dict) and s.get("done")}
    total = float(wall_s) if wall_s else sum(float(s.get("seconds", 0.0)) for s in done.values())
    if total <= 0:
        return None
    tools = sum(float(s.get("seconds", 0.0)) for n, s in done.items() if n in _TOOL_STAGES)
    timings = (done.get("rollout") or {}).get("timings") or {}
    tools -= float(timings.get("overhead", 0.0))
    return round(max(0.0, total - tools) / total, 5)


def _dump_yaml(data: dict[str, Any]) -> str:
    import yaml

    return "# the effective loop configuration of this run (defaults included)\n" + yaml.safe_dump(
        data, sort_keys=False
    )


def run_loop(
    config: LoopConfig,
    *,
    resume: bool = False,
    iterations: int | None = None,
    report: Callable[[str], None] | None = None,
    progress: bool | None = None,
) -> dict[str, Any]:
    """Run or resume the loop of ``config``; returns the summary written to ``summary.json``.

    See :class:`LoopRunner` for what it raises.
    """
    return LoopRunner(config, resume=resume, report=report, progress=progress).run(iterations)


def _page_vocabulary(config: LoopConfig) -> list[str]:
    """The words the tiny model's tokenizer learns besides iteration 0's data: MiniWoB++'s
    word lists on a MiniWoB++ run (:class:`~.stages.model.ModelStage`), else none."""
    if not config.on_miniwob:
        return []
    from replaystore.rollouts.miniwob import page_vocabulary

    return page_vocabulary()
