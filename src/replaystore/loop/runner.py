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
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from replaystore.atomic import atomic_write_json, atomic_write_text
from replaystore.errors import ConfigError

from .config import LoopConfig
from .journal import Journal
from .processes import MARKER_VAR, ChildProcess, kill_strays, run_marker
from .tools import (
    ExternalServer,
    LoopStageError,
    ToolPaths,
    VllmServer,
    check_hub_model,
    checkpoint_weights,
    find_tools,
    is_adapter,
    make_tiny_model,
    merge_adapter,
    preference_arguments,
    read_losses,
    run_training,
    template_text,
    training_arguments,
)

if TYPE_CHECKING:
    from replaystore.trajectories.export import Kind

__all__ = ["LoopInterrupted", "LoopRunner", "run_loop"]

logger = logging.getLogger("replaystore.loop")

#: Name of the dataset entry each iteration exports.
DATASET_NAME = "webagent"


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
        self.journal: Journal | None = None
        self.server: VllmServer | ExternalServer | None = None
        self.children: list[ChildProcess] = []
        self.tools: ToolPaths | None = None
        self.marker: str | None = None
        self.experiment: Any = None
        #: The model the server serves now (None: nothing served): a LoRA adapter's
        #: directory while the server serves it on top of the base model.
        self.serving: Path | str | None = None
        #: The name the acting policy asks the server for (``model.name``, or the
        #: adapter's: ``<model.name>-<iteration>``).
        self.served_name: str = config["model"]["name"]
        #: The whole model the vLLM server was started with (adapters go on top of it).
        self.serving_base: Path | str | None = None
        #: The MiniWoB++ pages' URL while a MiniWoB++ run runs.
        self.miniwob_url: str | None = None

    # ------------------------------------------------------------------ paths

    def rel(self, path: Path | str | None) -> str | None:
        """``path`` relative to the run directory (the journal stays valid after a move); a
        hub id as it is."""
        if path is None:
            return None
        try:
            return str(Path(path).relative_to(self.out))
        except ValueError:
            return str(path)

    def abs(self, value: str | None) -> Path | None:
        if value is None:
            return None
        path = Path(value)
        return path if path.is_absolute() else self.out / path

    def iteration_dir(self, k: int) -> Path:
        return self.out / "iterations" / f"{k:03d}"

    def checkpoint_dir(self, k: int) -> Path:
        """Where iteration ``k``'s training writes its checkpoint."""
        return self.out / "checkpoints" / f"{k:03d}"

    @property
    def storage_root(self) -> Path:
        return self.out / "storage"

    @property
    def screenshot_root(self) -> Path:
        """Screenshots live inside the storage, which stores their paths relative to itself:
        the run directory can be moved."""
        return self.storage_root / "screenshots"

    @property
    def initial_model(self) -> Path | str:
        """The model iteration 0 trains: ``model.path`` (a directory, or a hub id passed on
        unchanged), else the tiny model of this run."""
        source = self.config.model_source()
        return source if source is not None else self.out / "model"

    def acting_checkpoint(self, k: int) -> Path | str:
        """The model acting in iteration ``k`` (``train.init: previous`` starts from it)."""
        return self.initial_model if k == 0 else self.checkpoint_dir(k - 1)

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

    def _run(self, n: int) -> dict[str, Any]:
        cfg = self.config
        source = cfg.model_source()
        if isinstance(source, str):  # a hub id: cached or reachable, before anything runs
            check_hub_model(source)
        self.journal = Journal.open(self.out, resume=self.resume, config=cfg)
        # A model is served unless only the demonstrations act: a later iteration, a
        # final training, or the untrained model's baseline (iteration 0) all serve one.
        needs_model = (
            n > 1
            or not cfg.uses_demonstrations
            or cfg["train"]["final"]
            or cfg["model"]["evaluate_untrained"]
        )
        self.tools = find_tools(
            cfg.tools_dir,
            train_command=cfg["train"]["command"],
            vllm_python=cfg["serve"]["python"],
            need_vllm=cfg["serve"]["base_url"] is None and needs_model,
        )
        token = self.journal.token
        self.marker = run_marker(token)
        kill_strays(token, own_marker=self.marker)
        atomic_write_text(self.out / "loop.yaml", _dump_yaml(self.journal.data["config"]))
        previous = os.environ.get(MARKER_VAR)
        os.environ[MARKER_VAR] = self.marker  # browsers and tools inherit it
        try:
            with self._signals(), self._suite() as tasks_file, self._experiment_logger():
                for k in range(n):
                    self._iteration(k, tasks_file, last=k == n - 1)
                    self._write_summary()
        finally:
            self._stop_children()
            if previous is None:
                os.environ.pop(MARKER_VAR, None)
            else:
                os.environ[MARKER_VAR] = previous
        return self._write_summary()

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
    def _suite(self) -> Iterator[Path]:
        """The task file; for ``tasks: suite`` the local suite runs on the run's fixed port."""
        assert self.journal is not None
        cfg = self.config
        tasks_file = self.out / "tasks.jsonl"
        if cfg.on_miniwob:
            # The pages' port is free to change between resumes: nothing the model reads
            # shows it (the page text has no URL, prompts leave out a loopback port), and
            # the tasks are made again from their names and seeds.
            from replaystore.rollouts.miniwob import MiniWoBServer

            with MiniWoBServer() as server:
                self.miniwob_url = server.url
                try:
                    yield tasks_file
                finally:
                    self.miniwob_url = None
            return
        if cfg["tasks"] != "suite":
            source = cfg.path(cfg["tasks"])
            if not source.exists():
                raise ConfigError(f"tasks: {source} does not exist")
            yield source
            return
        from replaystore.rollouts.sites import LocalSuite

        port = self.journal.data.get("suite_port") or cfg["rollout"]["suite_port"]
        try:
            suite = LocalSuite(port=int(port)).start()
        except OSError as exc:
            raise LoopStageError(
                f"sample: the local website suite cannot listen on port {port} ({exc.strerror}); "
                "the run keeps one port so that prompts stay the same: free it and resume"
            ) from None
        try:
            if self.journal.data.get("suite_port") != suite.port:
                self.journal.data["suite_port"] = suite.port
                self.journal.save()
            suite.write_tasks(tasks_file)
            yield tasks_file
        finally:
            suite.stop()

    @contextlib.contextmanager
    def _experiment_logger(self) -> Iterator[None]:
        backend = self.config["logger"]
        if backend == "none":
            yield
            return
        from replaystore.rollouts.experiment_logger import ExperimentLogger

        self.experiment = ExperimentLogger(
            backend,
            log_dir=self.out / "logs" / backend,
            project="replaystore-loop",
            run_name=f"loop-{self.journal.token if self.journal else 'run'}",
            config=self.config.data,
        )
        try:
            yield
        finally:
            self.experiment.close()
            self.experiment = None

    def _stop_children(self) -> None:
        if self.server is not None:
            self.server.stop()
        for child in self.children:
            child.stop(grace_s=5.0)
        self.children.clear()
        if self.marker is not None and self.journal is not None:
            kill_strays(self.journal.token, own_marker=None)

    # ------------------------------------------------------------------ one iteration

    def _iteration(self, k: int, tasks_file: Path, *, last: bool) -> None:
        """Run the unfinished stages of iteration ``k``; its wall time goes to the journal
        (``wall_s``, summed over resumed runs) for the loop's overhead share."""
        assert self.journal is not None
        started = _now()
        self._stages(k, tasks_file, last=last)
        record = self.journal.iteration(k)
        record["wall_s"] = round(float(record.get("wall_s", 0.0)) + _now() - started, 3)
        self.journal.save()

    def _stages(self, k: int, tasks_file: Path, *, last: bool) -> None:
        assert self.journal is not None
        cfg = self.config
        record = self.journal.iteration(k)
        demos = k == 0 and cfg.uses_demonstrations
        record["policy"] = "demonstrations" if demos else "model"
        acting = None if demos else self.acting_checkpoint(k)
        record["checkpoint"] = self.rel(acting)
        self.journal.save()
        if k == 0 and not demos and cfg["model"]["path"] is None:
            self._stage_model(0, corpus=[])

        tasks = self._stage_sample(k, tasks_file)
        self._stage_rollout(k, tasks, acting)
        self._stage_evaluate(k)
        if cfg.on_miniwob:
            self._stage_heldout(k, acting)
        self._stop_server()
        has_data = self._stage_export(k)
        if k == 0 and demos and cfg["model"]["path"] is None:
            corpus = [self.iteration_dir(0) / "dataset" / f"{DATASET_NAME}.json"]
            self._stage_model(0, corpus=[p for p in corpus if p.exists()])
        if k == 0 and cfg["model"]["evaluate_untrained"]:
            self._stage_baseline(tasks)
        if not last or cfg["train"]["final"]:
            if has_data:
                self._stage_train(k)
            elif not self.journal.done(k, "train") and cfg.train_stage(k) != "sft":
                facts = record["stages"].get("buffer", {})
                counted = (
                    f"{facts.get('steps', 0)} steps, {facts.get('desirable', 0)} of them successful"
                )
                if cfg.train_stage(k) == "kto":
                    raise LoopStageError(
                        f"train (iteration {k}): nothing to train kto on ({counted}): the "
                        "buffer's iterations hold no model step with a stored prompt"
                    )
                raise LoopStageError(
                    f"train (iteration {k}): nothing to train dpo on ({counted}; pairs: "
                    f"{facts.get('pairs')}); a DPO pair needs a success and a failure at "
                    "the same state: repeat attempts (bootstrap.repeats, "
                    "policy.temperature > 0) or train kto"
                )
            elif not self.journal.done(k, "train"):
                raise LoopStageError(
                    f"train (iteration {k}): no successful trajectory to train on yet "
                    f"(success rate {record['stages']['evaluate']['success_rate']:.0%}); "
                    "bootstrap from demonstrations (bootstrap.source: scripted) or "
                    "lower buffer.filter_successful_only"
                )

    def _stage_sample(self, k: int, tasks_file: Path) -> list[Any]:
        assert self.journal is not None
        from replaystore.pipeline.blocklist import Blocklist
        from replaystore.pipeline.task_history import TaskHistory
        from replaystore.pipeline.task_sampler import TaskSampler, load_tasks

        path = self.iteration_dir(k) / "tasks.jsonl"
        if self.config.on_miniwob:
            return self._sample_miniwob(k, path)
        if self.journal.done(k, "sample") and path.exists():
            return load_tasks(path)
        started = _now()
        history = TaskHistory()
        storage = self._storage()
        if storage.iterations():
            history.update(t for t in storage.load_all() if _status(t) not in ("navigation_error",))
        blocklist = Blocklist(self.out / "blocklist.jsonl")
        sampler = TaskSampler(
            tasks_file, history=history, blocklist=blocklist, seed=self.config["seed"]
        )
        eligible = int((~sampler.blocked_mask()).sum())
        wanted = self.config["tasks_per_iteration"]
        n = eligible if wanted is None else min(int(wanted), eligible)
        if n == 0:
            raise LoopStageError(
                f"sample (iteration {k}): every task's website is on the blocklist "
                f"({self.out / 'blocklist.jsonl'})"
            )
        import numpy as np

        tasks = sampler.sample_train(n, seed=np.random.default_rng([self.config["seed"], k]))
        lines = [json.dumps(t.to_dict(), ensure_ascii=False) for t in tasks]
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, "\n".join(lines) + "\n")
        blocked = sorted(blocklist.get_blocked_domains())
        self.journal.finish(
            k, "sample", seconds=_now() - started, num_tasks=len(tasks), blocked=blocked
        )
        return tasks

    def _sample_miniwob(self, k: int, path: Path) -> list[Any]:
        """Iteration ``k``'s MiniWoB++ tasks: every training task on its fresh seeds.

        Made again on a resume (the same names and seeds, the pages' current URL)."""
        assert self.journal is not None and self.miniwob_url is not None
        from replaystore.rollouts.miniwob import miniwob_tasks

        seeds = self.config.train_seeds(k)
        tasks = miniwob_tasks(
            self.config["tasks"], seeds, self.miniwob_url, max_steps=self._miniwob_steps
        )
        if not self.journal.done(k, "sample"):
            lines = [json.dumps(t.to_dict(), ensure_ascii=False) for t in tasks]
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, "\n".join(lines) + "\n")
            self.journal.finish(
                k, "sample", seconds=0.0, num_tasks=len(tasks), seeds=[seeds[0], seeds[-1]]
            )
        return tasks

    def heldout_tasks(self) -> list[Any]:
        """The fixed held-out MiniWoB++ set (every evaluation task on every held-out seed)."""
        assert self.miniwob_url is not None
        from replaystore.rollouts.miniwob import miniwob_tasks

        seeds = self.config["evaluation"]["seeds"]
        return miniwob_tasks(
            self.config.evaluation_tasks(), seeds, self.miniwob_url, max_steps=self._miniwob_steps
        )

    @property
    def _miniwob_steps(self) -> int:
        """A MiniWoB++ episode's step budget: ``rollout.max_steps.easy`` (every task is easy)."""
        return int(self.config["rollout"]["max_steps"]["easy"])

    def _stop_server(self) -> None:
        """Stop the server once its rollouts are done, so that the trainer has the machine
        to itself. A server of LoRA adapters stays up: the next adapter is loaded into it
        (on a GPU, leave the trainer room: ``--gpu-memory-utilization`` in
        ``serve.extra_args``). :meth:`_stop_children` stops it at the end."""
        if isinstance(self.server, VllmServer) and self.server.lora_rank is not None:
            return
        if self.server is not None:
            self.server.stop()
        self.serving = None

    def _storage(self) -> Any:
        from replaystore.trajectories.storage import TrajectoryStorage

        return TrajectoryStorage(self.storage_root)

    def _stage_rollout(self, k: int, tasks: list[Any], acting: Path | str | None) -> None:
        """Roll out (or import) iteration ``k``'s trajectories into one iteration file.

        Demonstrations may be rolled out ``bootstrap.repeats`` times (one rank file
        each, the scripted expert seeded differently per repeat); the rank files are
        then merged. A rank file already written by a killed run is kept, not redone.
        """
        assert self.journal is not None
        if self.journal.done(k, "rollout"):
            return
        storage = self._storage()
        number = k + 1
        if self._merged(storage, number):
            # The loop died after the iteration file was written, before the journal was.
            self.journal.finish(k, "rollout", seconds=0.0, recovered=True)
            self.report(f"iteration {k}: rollout already stored ({storage.root}); not redone")
            return
        source = self.config["bootstrap"]["source"]
        if acting is None and source not in (None, "scripted"):
            self._import_demonstrations(k, self.config.path(source))
            return
        repeats = self.config["bootstrap"]["repeats"] if acting is None else 1
        if self.config.on_miniwob:
            repeats = 1  # the demonstrations' repeats are more seeds (_sample_miniwob)
        base_url = None
        if acting is not None:
            base_url = self._serve(k, acting, stage=f"serve (iteration {k})")
        started = _now()
        steps = 0
        statuses: Counter[str] = Counter()
        timings: Counter[str] = Counter()
        try:
            for rank in range(repeats):
                if any(f.iteration == number and f.rank == rank for f in storage.files()):
                    continue  # stored before the loop was killed
                folder = self.screenshot_root / f"iteration_{number:06d}" / f"rank{rank:03d}"
                shutil.rmtree(folder, ignore_errors=True)  # an interrupted try's leftovers
                result = self._roll_out(
                    tasks,
                    storage,
                    number,
                    rank=rank,
                    base_url=base_url,
                    screenshot_root=self.screenshot_root,
                    metadata={
                        "policy": "demonstrations" if acting is None else "model",
                        "checkpoint": self.rel(acting),
                        "loop_iteration": k,
                    },
                )
                error = getattr(result, "model_server_error", None)
                if error:
                    raise LoopStageError(
                        f"rollout (iteration {k}): the model server failed: {error}; see "
                        f"{self.out / 'logs' / f'serve-{k:03d}.log'}"
                    )
                if result.path is None:
                    raise LoopStageError(f"rollout (iteration {k}): no trajectory was stored")
                steps += result.steps
                statuses.update(result.status_counts())
                timings.update({key: float(v) for key, v in result.timings.items()})
        finally:
            if not self.config.on_miniwob:
                self._stop_server()  # a MiniWoB++ iteration's held-out evaluation uses it next
        path = storage.merge_ranks(number)
        seconds = _now() - started
        self.journal.finish(
            k,
            "rollout",
            seconds=seconds,
            steps=steps,
            repeats=repeats,
            statuses=dict(statuses),
            timings={key: round(v, 4) for key, v in timings.items()},
            file=self.rel(path),
        )
        who = "the scripted expert" if acting is None else self.rel(acting)
        times = f", {repeats} times" if repeats > 1 else ""
        self.report(
            f"iteration {k}: rolled out {len(tasks)} tasks{times} with {who} in {seconds:.1f} s "
            f"({steps} steps)"
        )

    @staticmethod
    def _merged(storage: Any, number: int) -> bool:
        """Iteration ``number`` has its merged file (rank files a killed merge left are removed)."""
        group = [f for f in storage.files() if f.iteration == number]
        if not any(f.rank is None for f in group):
            return False
        for f in group:
            if f.rank is not None:
                f.path.unlink(missing_ok=True)
        return True

    def _import_demonstrations(self, k: int, source: Path) -> None:
        """Iteration 0's trajectories copied from an existing storage (one iteration file)."""
        assert self.journal is not None
        from replaystore.trajectories.storage import TrajectoryStorage

        started = _now()
        if not source.is_dir():
            raise ConfigError(f"bootstrap.source: {source} is not a trajectory storage directory")
        trajectories = TrajectoryStorage(source).load_all()
        if not trajectories:
            raise ConfigError(f"bootstrap.source: {source} holds no trajectories")
        path = self._storage().save_iteration(
            k + 1, trajectories, metadata={"source": str(source), "policy": "demonstrations"}
        )
        self.journal.finish(
            k, "rollout", seconds=_now() - started, imported=str(source), file=self.rel(path)
        )
        self.report(f"iteration {k}: {len(trajectories)} demonstrations imported from {source}")

    def _training_preview(self) -> dict[str, Any]:
        """The training arguments every iteration shares (template, ``train.finetuning_type``
        and ``train.lora``, the overrides): what is trained, full or LoRA, of which rank."""
        cfg = self.config
        t = cfg["train"]
        template = template_text(cfg.train_template(), cfg["observation"])
        return training_arguments(
            template,
            model="",
            dataset_dir=self.out,
            dataset=DATASET_NAME,
            output_dir=self.out,
            overrides=t["overrides"],
            settings=cfg.training_settings(),
        )

    def _lora_rank(self) -> int | None:
        """The adapters' rank when the loop trains LoRA adapters and vLLM serves them
        unmerged (None otherwise): the server is then started with ``--enable-lora``."""
        preview = self._training_preview()
        if preview.get("finetuning_type") != "lora" or self.config["serve"]["merge"]:
            return None
        return int(preview.get("lora_rank") or 8)  # LLaMA-Factory's default rank

    def _serve(self, k: int, model: Path | str, *, stage: str) -> str:
        """Serve ``model`` (a directory, or a hub id vLLM downloads); the base URL. Records
        the ``serve`` stage of iteration ``k``.

        A LoRA adapter (``train.finetuning_type: lora``) is loaded into the running server
        on top of the base model (no restart), or with ``serve.merge`` merged into the base
        first (``checkpoints/NNN-merged``) and served as a whole model."""
        assert self.journal is not None and self.tools is not None
        cfg = self.config
        s = cfg["serve"]
        if isinstance(model, Path) and not checkpoint_weights(model):
            raise LoopStageError(f"{stage}: {model} holds no model weights")
        if self.server is None:
            if s["base_url"] is not None:
                self.server = ExternalServer(
                    s["base_url"],
                    s["reload_command"],
                    startup_timeout_s=s["startup_timeout_s"],
                    marker=self.marker,
                )
            else:
                assert self.tools.vllm_python is not None
                self.server = VllmServer(
                    self.tools.vllm_python,
                    host=s["host"],
                    port=s["port"],
                    max_model_len=s["max_model_len"],
                    dtype=s["dtype"],
                    extra_args=s["extra_args"],
                    env=s["env"],
                    startup_timeout_s=s["startup_timeout_s"],
                    marker=self.marker,
                    lora_rank=self._lora_rank(),
                )
        if self.serving == model and self.server.base_url is not None:
            return self.server.base_url  # served already (the rollout's, for the held-out set)
        log = self.out / "logs" / f"serve-{k:03d}.log"
        name = cfg["model"]["name"]
        adapter = isinstance(model, Path) and is_adapter(model)
        merged: Path | None = None
        if adapter and s["merge"]:
            assert isinstance(model, Path)
            merged = model.with_name(model.name + "-merged")
            if not checkpoint_weights(merged):
                merge_seconds = merge_adapter(
                    self.tools.train_command,
                    base=self.initial_model,
                    adapter=model,
                    template=str(self._training_preview().get("template") or "qwen"),
                    out=merged,
                    yaml_path=model.with_name(model.name + "-merge.yaml"),
                    log_path=self.out / "logs" / f"merge-{k:03d}.log",
                    marker=self.marker,
                    stage=stage,
                )
                self.report(
                    f"iteration {k}: merged the adapter {self.rel(model)} into "
                    f"{self.rel(merged)} ({merge_seconds:.1f} s)"
                )
        started: dict[str, Any] = {}  # the server's log, when this stage started it
        if adapter and merged is None and isinstance(self.server, VllmServer):
            assert isinstance(model, Path)
            seconds = 0.0
            if self.server.base_url is None or self.serving_base != self.initial_model:
                seconds += self.server.start(self.initial_model, name, log_path=log, stage=stage)
                self.serving_base = self.initial_model
                started["server_log"] = self.rel(log)
            self.served_name = f"{name}-{model.name}"
            # The requests and vLLM's answers go to a log of their own: the server's log is
            # its child's output, written at the child's own offset.
            log = self.out / "logs" / f"lora-{k:03d}.log"
            seconds += self.server.load_adapter(model, self.served_name, log_path=log, stage=stage)
            how = f"the adapter on {self.rel(self.initial_model)} as {self.served_name!r}"
        else:
            served = merged if merged is not None else model
            seconds = self.server.start(served, name, log_path=log, stage=stage)
            self.serving_base = served
            self.served_name = name
            how = str(self.rel(served)) if merged is None else f"{self.rel(merged)} (merged)"
        self.serving = model
        self.journal.finish(
            k,
            "serve",
            seconds=seconds,
            checkpoint=self.rel(model),
            log=self.rel(log),
            served_as=self.served_name,
            **started,
            **({"merged": self.rel(merged)} if merged is not None else {}),
        )
        self.report(f"iteration {k}: serving {how} (ready in {seconds:.1f} s)")
        assert self.server.base_url is not None
        return self.server.base_url

    def _builder(self) -> Any:
        """The prompt builder of every rollout and of the buffer's rebuilds."""
        from replaystore.trajectories.context import ConversationBuilder

        p = self.config["prompt"]
        return ConversationBuilder(
            observation=self.config["observation"],
            history_window=p["history_window"],
            max_ac_tree_chars=p["max_ac_tree_chars"],
        )

    def _agent(self, base_url: str | None, rank: int = 0, *, greedy: bool = False) -> Any:
        from replaystore.rollouts.policy import OpenAIChatPolicy, WebAgent
        from replaystore.rollouts.scripted import ScriptedPolicy

        cfg = self.config
        builder = self._builder()
        if base_url is None and cfg.on_miniwob:
            from replaystore.rollouts.miniwob_experts import MiniWoBExpert

            expert = MiniWoBExpert()
            return WebAgent(expert, conversation_builder=builder, image_urls="file")
        if base_url is None:
            b = cfg["bootstrap"]
            policy: Any = ScriptedPolicy(
                seed=cfg["seed"] + rank,
                mistake_rate=b["mistake_rate"],
                wrong_answer_rate=b["wrong_answer_rate"],
                improvement=0.0,
            )
            return WebAgent(policy, conversation_builder=builder, image_urls="file")
        p = cfg["policy"]
        policy = OpenAIChatPolicy(
            base_url,
            self.served_name,
            temperature=0.0 if greedy else p["temperature"],
            max_tokens=p["max_tokens"],
            timeout_s=p["timeout_s"],
            max_retries=p["max_retries"],
            max_concurrency=cfg["rollout"]["workers"],
        )
        return WebAgent(policy, conversation_builder=builder, image_urls="data")

    def _roll_out(
        self,
        tasks: list[Any],
        storage: Any,
        number: int,
        *,
        rank: int = 0,
        base_url: str | None,
        screenshot_root: Path,
        metadata: dict[str, Any],
        greedy: bool = False,
    ) -> Any:
        cfg = self.config
        r = cfg["rollout"]

        async def go() -> Any:
            from replaystore.pipeline.blocklist import Blocklist
            from replaystore.rollouts.browser import BrowserPool
            from replaystore.rollouts.collector import RolloutCollector
            from replaystore.rollouts.evaluator import Evaluator

            agent = self._agent(base_url, rank, greedy=greedy)
            try:
                async with BrowserPool(
                    r["workers"], viewport=tuple(r["viewport"]), cdp_urls=r["cdp"] or None
                ) as pool:
                    collector = RolloutCollector(
                        agent,
                        Evaluator(),
                        storage,
                        pool=pool,
                        num_workers=r["workers"],
                        max_steps_by_difficulty=r["max_steps"],
                        step_timeout_s=r["step_timeout_s"],
                        task_timeout_s=r["task_timeout_s"],
                        settle_s=r["settle_s"],
                        blocklist=Blocklist(self.out / "blocklist.jsonl"),
                        logger=self.experiment,
                        screenshot_root=screenshot_root,
                        progress=self.progress,
                        handle_sigint=False,
                        trajectory_metadata=metadata,
                    )
                    return await collector.run_iteration(tasks, number, rank=rank)
            finally:
                await agent.aclose()

        return asyncio.run(go())

    def _stage_evaluate(self, k: int) -> None:
        assert self.journal is not None
        if self.journal.done(k, "evaluate"):
            return
        started = _now()
        storage = self._storage()
        file = next(f for f in storage.files() if f.iteration == k + 1)
        trajectories = storage.read_file(file)
        facts = _success(trajectories)
        self.journal.finish(k, "evaluate", seconds=_now() - started, **facts)
        self.report(
            f"iteration {k}: success {facts['successful']}/{facts['num_tasks']} = "
            f"{facts['success_rate']:.0%} ({self.journal.iteration(k)['policy']})"
        )

    def _greedy_rollout(
        self,
        storage: Any,
        number: int,
        tasks: list[Any],
        acting: Path | str | None,
        *,
        stage: str,
        k: int,
        metadata: dict[str, Any],
    ) -> list[Any]:
        """``acting`` (None: the experts) rolled out greedily on ``tasks`` into iteration
        ``number`` of ``storage``, a measurement kept apart from training; its trajectories.

        An iteration already stored (the loop was killed after writing it) is read back,
        not rolled out again. The server stays up for the stage that follows.
        """
        if number not in storage.iterations():
            folder = storage.root / "screenshots" / f"iteration_{number:06d}"
            shutil.rmtree(folder, ignore_errors=True)  # an interrupted try's leftovers
            base_url = None if acting is None else self._serve(k, acting, stage=stage)
            result = self._roll_out(
                tasks,
                storage,
                number,
                base_url=base_url,
                screenshot_root=storage.root / "screenshots",
                metadata={
                    "policy": "demonstrations" if acting is None else "model",
                    "checkpoint": self.rel(acting),
                    **metadata,
                },
                greedy=True,
            )
            error = getattr(result, "model_server_error", None)
            if error:
                raise LoopStageError(f"{stage}: the model server failed: {error}")
        file = next(f for f in storage.files() if f.iteration == number)
        return storage.read_file(file)

    def _stage_heldout(self, k: int, acting: Path | str | None) -> None:
        """Iteration ``k``'s acting policy on the held-out MiniWoB++ set, greedy; stored in
        ``heldout/storage`` (never trained on), success per task in the journal."""
        assert self.journal is not None
        if self.journal.done(k, "heldout"):
            return
        from replaystore.trajectories.storage import TrajectoryStorage

        storage = TrajectoryStorage(self.out / "heldout" / "storage")
        started = _now()
        trajectories = self._greedy_rollout(
            storage,
            k + 1,
            self.heldout_tasks(),
            acting,
            stage=f"held-out evaluation (iteration {k})",
            k=k,
            metadata={"loop_iteration": k, "heldout": True},
        )
        facts = _per_task(trajectories)
        facts["seeds"] = str(self.config["evaluation"]["seeds"])
        self.journal.finish(k, "heldout", seconds=_now() - started, **facts)
        self.report(
            f"iteration {k}: held-out success {facts['mean']:.0%} over {len(facts['tasks'])} "
            f"tasks x seeds {facts['seeds']} ({_rates(facts)})"
        )

    def _stage_export(self, k: int) -> bool:
        """Buffer and export; False when there is nothing to train on."""
        assert self.journal is not None
        done = self.journal.done(k, "export")
        if done:
            return bool(done.get("num_train"))
        from replaystore.trajectories import TrajectoryBuffer

        cfg = self.config
        b = cfg["buffer"]
        if cfg.train_stage(k) != "sft":
            return self._stage_export_preference(k)
        started = _now()
        buffer = TrajectoryBuffer.from_storage(
            self.storage_root,
            # Steps stored without a prompt (an anti-bot page ends the task before the
            # model is asked) are rebuilt with the builder the rollouts used.
            agent=self._builder(),
            last_n_iterations=b["last_n_iterations"],
            filter_successful_only=b["filter_successful_only"],
            filter_same_screenshot=b["filter_same_screenshot"],
            seed=cfg["seed"],
        )
        samples = buffer.get_training_samples(
            b["train_samples"], recency_bias_power=b["recency_bias_power"], seed=cfg["seed"] + k
        )
        buffer_seconds = _now() - started
        self.journal.finish(
            k,
            "buffer",
            seconds=buffer_seconds,
            steps=int(buffer.stats.as_dict()["samples"]),
            eligible=int(buffer.num_eligible),
            drawn=len(samples),
        )
        report = self._write_dataset(k, samples, "sft")
        if report is not None:
            self.report(
                f"iteration {k}: buffer {len(samples)} training steps drawn; exported "
                f"{report.num_train} records to {self.rel(self.iteration_dir(k) / 'dataset')}"
            )
        return report is not None and report.num_train > 0

    def _stage_export_preference(self, k: int) -> bool:
        """``train.stage: kto|dpo``: the preference records of the buffer's iterations
        (``buffer.last_n_iterations``), successes and failures; False when there is
        nothing to train on (no step, or no DPO pair: the counts go to the journal)."""
        assert self.journal is not None
        from replaystore.trajectories import TrajectoryStorage
        from replaystore.trajectories.preference import (
            dpo_pairs,
            kto_samples,
            preference_steps,
            storage_trajectories,
        )

        cfg = self.config
        b = cfg["buffer"]
        kind = cfg.train_stage(k)
        started = _now()
        trajectories = storage_trajectories(
            TrajectoryStorage(self.storage_root), b["last_n_iterations"]
        )
        steps = preference_steps(trajectories)
        desirable = sum(step.success for step in steps)
        facts: dict[str, Any] = {"steps": len(steps), "desirable": desirable}
        if kind == "kto":
            samples = kto_samples(steps)
        else:
            samples, pairs = dpo_pairs(steps)
            facts["pairs"] = pairs.as_dict()
        self.journal.finish(k, "buffer", seconds=_now() - started, **facts)
        report = self._write_dataset(k, samples, kind)
        if report is None:
            return False
        made = (
            f"{len(steps)} steps ({desirable} desirable)"
            if kind == "kto"
            else f"{len(samples)} pairs from {len(steps)} steps"
        )
        self.report(
            f"iteration {k}: {kind.upper()} records from {made}; exported "
            f"{report.num_train} records to {self.rel(self.iteration_dir(k) / 'dataset')}"
        )
        return report.num_train > 0

    def _write_dataset(self, k: int, samples: Sequence[Any], kind: str) -> Any:
        """Iteration ``k``'s dataset directory from ``samples`` (``kind``: sft, kto, dpo),
        written as ``dataset.partial`` and renamed into place; its export report, or None
        (and an empty ``export`` stage) when there is no sample."""
        assert self.journal is not None
        from replaystore.trajectories.export import export_llamafactory

        cfg = self.config
        target = self.iteration_dir(k) / "dataset"
        if not samples:
            self.journal.finish(k, "export", seconds=0.0, num_train=0, dataset=None, kind=kind)
            return None
        partial = target.with_name("dataset.partial")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.rmtree(target, ignore_errors=True)
        started = _now()
        screenshots = cfg["observation"] == "screenshot"
        report = export_llamafactory(
            samples,
            partial,
            dataset_name=DATASET_NAME,
            kind=cast("Kind", kind),
            val_ratio=cfg["buffer"]["val_ratio"],
            seed=cfg["seed"] + k,
            copy_images=screenshots,
            image_root=self.out if screenshots else None,
        )
        os.replace(partial, target)
        self.journal.finish(
            k,
            "export",
            seconds=_now() - started,
            num_train=report.num_train,
            num_val=report.num_val,
            images=report.num_image_refs,
            dataset=self.rel(target),
            kind=kind,
        )
        return report

    def _stage_model(self, k: int, corpus: list[Path]) -> None:
        assert self.journal is not None and self.tools is not None
        if self.journal.done(k, "model") and checkpoint_weights(self.out / "model"):
            return
        tiny = self.config["model"]["tiny"]
        target = self.out / "model"
        partial = self.out / "model.partial"
        shutil.rmtree(partial, ignore_errors=True)
        shutil.rmtree(target, ignore_errors=True)
        started = _now()
        settings = make_tiny_model(
            self.tools.train_python,
            partial,
            corpus=corpus,
            layers=tiny["layers"],
            hidden=tiny["hidden"],
            heads=tiny["heads"],
            vocab=tiny["vocab"],
            seed=tiny["seed"],
            pretrain_steps=tiny["pretrain_steps"],
            log_path=self.out / "logs" / "model.log",
            marker=self.marker,
        )
        os.replace(partial, target)
        self.journal.finish(k, "model", seconds=_now() - started, settings=settings, path="model")
        self.report(
            f"tiny model: Qwen2, {settings['layers']} layers, hidden {settings['hidden']}, "
            f"{settings['vocab_size']}-token BPE trained on "
            f"{'iteration 0 data' if corpus else 'the built-in text'}, "
            f"{int(settings['parameters']):,} parameters (model/)"
        )

    def _stage_baseline(self, tasks: list[Any]) -> None:
        """Roll out the untrained model (stored apart, never trained on): on the held-out
        set for MiniWoB++ tasks, else on iteration 0's tasks not on the blocklist (the
        tasks the model's iterations are measured on)."""
        assert self.journal is not None
        if self.journal.data.get("baseline"):
            return
        from replaystore.trajectories.storage import TrajectoryStorage

        model = self.initial_model
        root = self.out / "baseline"
        storage = TrajectoryStorage(root / "storage")
        if self.config.on_miniwob:
            tasks = self.heldout_tasks()  # measured where every checkpoint is measured
        else:
            # The tasks the model's iterations draw from: iteration 0's, less the sites
            # its rollout put on the blocklist, so that the rates are over the same tasks.
            from replaystore.pipeline.blocklist import Blocklist

            blocklist = Blocklist(self.out / "blocklist.jsonl")
            tasks = [t for t in tasks if not blocklist.is_website_blocked(t.website)]
        started = _now()
        try:
            trajectories = self._greedy_rollout(
                storage,
                1,
                tasks,
                model,
                stage="baseline (untrained model)",
                k=0,
                metadata={"baseline": True},
            )
        finally:
            self._stop_server()
        seconds = _now() - started
        facts = _success(trajectories)
        if self.config.on_miniwob:
            facts["eval"] = {
                **_per_task(trajectories),
                "seeds": str(self.config["evaluation"]["seeds"]),
            }
        self.journal.data["baseline"] = {
            "policy": "model",
            "checkpoint": self.rel(model),
            "seconds": {"rollout": round(seconds, 3)},
            **facts,
        }
        self.journal.finish(0, "baseline", seconds=seconds, **facts)
        where = "the held-out set" if self.config.on_miniwob else "the tasks not blocklisted"
        self.report(
            f"untrained model: success {facts['successful']}/{facts['num_tasks']} = "
            f"{facts['success_rate']:.0%} on {where} (baseline/, not trained on)"
        )

    def _stage_train(self, k: int) -> None:
        assert self.journal is not None and self.tools is not None
        if self.journal.done(k, "train"):
            return
        cfg = self.config
        t = cfg["train"]
        output = self.checkpoint_dir(k)
        if checkpoint_weights(output):
            # Trained and renamed before the loop died: the journal was not written yet.
            losses = read_losses(output / "trainer_log.jsonl")
            self.journal.finish(
                k,
                "train",
                seconds=0.0,
                recovered=True,
                kind=cfg.train_stage(k),
                steps=len(losses),
                loss_first=losses[0] if losses else None,
                loss_last=losses[-1] if losses else None,
                checkpoint=self.rel(output),
            )
            self.report(f"iteration {k}: checkpoint {self.rel(output)} already trained; not redone")
            return
        partial = output.with_name(output.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        start_from = self.acting_checkpoint(k) if t["init"] == "previous" else self.initial_model
        dataset = self.iteration_dir(k) / "dataset"
        info = json.loads((dataset / "dataset_info.json").read_text(encoding="utf-8"))
        template = template_text(cfg.train_template(), cfg["observation"])
        lora = self._training_preview().get("finetuning_type") == "lora"
        # LoRA: every adapter is trained on the base model; train.init: previous goes on
        # training the adapter that acted (LLaMA-Factory resumes it, trainable).
        adapter = start_from if lora and is_adapter(start_from) else None
        if lora:
            start_from = adapter if adapter is not None else self.initial_model
        arguments = training_arguments(
            template,
            model=self.initial_model if lora else start_from,
            dataset_dir=dataset,
            dataset=DATASET_NAME,
            output_dir=partial,
            overrides=t["overrides"],
            has_images=cfg["observation"] == "screenshot",
            settings=cfg.training_settings(),
            adapter=adapter,
        )
        if f"{DATASET_NAME}_val" in info and "eval_dataset" not in arguments:
            arguments["eval_dataset"] = f"{DATASET_NAME}_val"
        kind = cfg.train_stage(k)
        if kind != "sft":
            arguments = preference_arguments(arguments, kind)
        log = self.out / "logs" / f"train-{k:03d}.log"
        stage = f"train (iteration {k})"
        self.report(
            f"iteration {k}: training ({cfg.train_stage(k)}) from {self.rel(start_from)} "
            f"(log {self.rel(log)})"
        )
        result = run_training(
            self.tools.train_command,
            arguments,
            yaml_path=self.iteration_dir(k) / "train.yaml",
            log_path=log,
            env={**{str(a): str(b) for a, b in t["env"].items()}},
            marker=self.marker,
            stage=stage,
            on_child=self.children.append,
        )
        self.children.clear()
        os.replace(partial, output)
        self.journal.finish(
            k,
            "train",
            seconds=result.seconds,
            steps=result.steps,
            loss_first=result.loss_first,
            loss_last=result.loss_last,
            checkpoint=self.rel(output),
            started_from=self.rel(start_from),
            log=self.rel(log),
            kind=kind,
        )
        loss = (
            f"loss {result.loss_first:.3f} -> {result.loss_last:.3f}"
            if result.loss_first is not None and result.loss_last is not None
            else "no loss logged"
        )
        self.report(
            f"iteration {k}: trained {self.rel(output)} in {result.seconds:.1f} s "
            f"({result.steps} steps, {loss})"
        )

    # ------------------------------------------------------------------ summary

    def summary(self) -> dict[str, Any]:
        """``{"iterations": [...], "untrained": {...}}`` from the journal (see docs/loop.md)."""
        assert self.journal is not None
        rows = []
        for record in self.journal.data["iterations"]:
            stages = record.get("stages", {})
            evaluate = stages.get("evaluate") or {}
            if not evaluate.get("done"):
                continue
            train = stages.get("train") or {}
            heldout = stages.get("heldout") or {}
            sample = stages.get("sample") or {}
            seconds = {
                name: round(float(stage.get("seconds", 0.0)), 3)
                for name, stage in stages.items()
                if isinstance(stage, dict) and stage.get("done")
            }
            rows.append(
                {
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
            )
        untrained = self.journal.data.get("baseline")
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
        if self.config.on_miniwob:
            out["evaluation"] = {
                "tasks": self.config.evaluation_tasks(),
                "seeds": str(self.config["evaluation"]["seeds"]),
                "train_seeds": str(self.config["train_seeds"]),
                "scored_by": "the pages' own reward (WOB_RAW_REWARD_GLOBAL > 0), greedy decoding",
            }
        return out

    def _write_summary(self) -> dict[str, Any]:
        summary = self.summary()
        atomic_write_json(self.out / "summary.json", summary)
        if self.config.on_miniwob and any(r["eval"] for r in summary["iterations"]):
            from .curve import write_learning_curve

            write_learning_curve(summary, self.out / "learning_curve.png")
        if self.experiment is not None and summary["iterations"]:
            self._log_metrics(summary["iterations"][-1])
        return summary

    def _log_metrics(self, row: dict[str, Any]) -> None:
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
        self.experiment.log_scalars(int(row["iteration"]) + 1, metrics)


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


def _status(trajectory: list[dict[str, Any]]) -> str | None:
    meta = trajectory[-1].get("trajectory_metadata") if trajectory else None
    return meta.get("status") if isinstance(meta, dict) else None


def _success(trajectories: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Success facts of stored trajectories, by the buffer's own rules: dummy trajectories
    (a website that did not load) are not attempts; success is a final reward >= 1."""
    from replaystore.trajectories.index import final_reward, is_dummy_trajectory, is_successful

    statuses = Counter(_status(t) or "unknown" for t in trajectories)
    attempts = [t for t in trajectories if not is_dummy_trajectory(t)]
    successful = sum(
        is_successful(final_reward(t, f"trajectory {i}"), 1.0) for i, t in enumerate(attempts)
    )
    n = len(attempts)
    return {
        "num_tasks": n,
        "successful": int(successful),
        "success_rate": successful / n if n else 0.0,
        "statuses": dict(statuses),
    }


def _per_task(trajectories: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Held-out success per MiniWoB++ task (``Task.subdomain``) and the mean over tasks."""
    from replaystore.trajectories.index import final_reward, is_successful

    by_task: dict[str, list[bool]] = {}
    for i, trajectory in enumerate(trajectories):
        task = trajectory[0]["observation"].task
        won = is_successful(final_reward(trajectory, f"trajectory {i}"), 1.0)
        by_task.setdefault(str(task.subdomain), []).append(bool(won))
    tasks = {
        name: {"success_rate": sum(wins) / len(wins), "episodes": len(wins)}
        for name, wins in sorted(by_task.items())
    }
    mean = sum(t["success_rate"] for t in tasks.values()) / len(tasks) if tasks else 0.0
    return {"tasks": tasks, "mean": mean, "episodes": len(trajectories)}


def _rates(facts: dict[str, Any]) -> str:
    return ", ".join(f"{n} {t['success_rate']:.0%}" for n, t in facts["tasks"].items())


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
