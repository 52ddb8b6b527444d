"""Per-iteration rollout metrics to Weights & Biases, TensorBoard, or nowhere (seed 002's logger).

:class:`ExperimentLogger` computes, from one iteration's trajectories, the numbers a
WebGym run is watched by, and writes them with one backend:

=================================  ====================================================
metric (scalar)                    meaning
=================================  ====================================================
``trajectories``                   trajectories in the iteration
``success_rate``                   share whose final reward >= ``success_threshold``
``success_rate/website/<site>``    the same per website (host of ``task.website``)
``success_rate/difficulty/<d>``    per difficulty: 1/2/3 (or easy/medium/hard) -> easy,
                                   medium, hard; anything else by its own name
``answer_rate``                    share whose final reward says an answer was submitted
``steps/mean``, ``/min``, ``/max`` steps per trajectory
``reward/mean``, ``/min``, ``/max`` final rewards (``None`` counts as 0)
``blocked/trajectory_rate``        share with a blocked step (``Reward.is_blocked``)
``blocked/sites``                  ``len(blocked_sites)``
``throughput/<key>``               every entry of ``throughput`` (steps_per_s, ...)
=================================  ====================================================

Besides scalars: the blocked sites as text (TensorBoard ``blocked_sites``) or a table
(W&B), and up to ``sample_screenshots`` final screenshots of trajectories spread
over the iteration, captioned with task id and reward (``screenshots/<i>``).

Backends (``pip install 'replaystore[wandb]'`` / ``'replaystore[tensorboard]'``):

* ``"wandb"``: a run under ``log_dir/wandb``. Offline (files only, ``wandb sync``
  uploads them later) unless configured: ``wandb_mode=``, the ``WANDB_MODE``
  environment variable, or ``WANDB_API_KEY`` set (then online).
* ``"tensorboard"``: event files under ``log_dir/<run_name>``
  (``tensorboard --logdir log_dir``).
* ``"none"``: metrics are computed, returned and logged at INFO, nothing is written.

In a distributed run give each process its ``rank``: only rank 0 writes to the
backend; every rank gets the metrics back.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from replaystore.errors import ConfigError
from replaystore.pipeline.blocklist import normalize_domain
from replaystore.redaction import redact_data

if TYPE_CHECKING:
    from .outcomes import IterationResult

__all__ = ["BACKENDS", "ExperimentLogger", "iteration_metrics", "log_result"]

logger = logging.getLogger("replaystore.rollouts.experiment_logger")

#: The accepted ``backend`` names.
BACKENDS: tuple[str, ...] = ("none", "tensorboard", "wandb")

_DIFFICULTY_NAMES = {1: "easy", 2: "medium", 3: "hard"}
_TAG_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]+")
_MAX_SCREENSHOT_SIDE = 640


def _get(obj: Any, name: str, default: Any = None) -> Any:
    """Field ``name`` of a component object or of its dict form."""
    if obj is None:
        return default
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _site_name(website: Any) -> str:
    if not isinstance(website, str) or not website.strip():
        return "unknown"
    try:
        return normalize_domain(website)
    except ValueError:
        return _TAG_UNSAFE.sub("_", website.strip()).strip("_") or "unknown"


def _difficulty_name(difficulty: Any) -> str:
    is_number = isinstance(difficulty, (int, float)) and not isinstance(difficulty, bool)
    if is_number and difficulty in _DIFFICULTY_NAMES:
        return _DIFFICULTY_NAMES[int(difficulty)]
    text = str(difficulty).strip().lower()
    if text.isdigit() and int(text) in _DIFFICULTY_NAMES:
        return _DIFFICULTY_NAMES[int(text)]
    return _TAG_UNSAFE.sub("_", text).strip("_") or "unknown"


def _final_reward(trajectory: Sequence[Any]) -> tuple[float, bool]:
    reward = _get(trajectory[-1], "reward")
    value = _get(reward, "reward")
    value = float(value) if isinstance(value, (int, float)) and math.isfinite(value) else 0.0
    return value, bool(_get(reward, "submit", False))


def iteration_metrics(
    trajectories: Sequence[Sequence[Any]],
    *,
    blocked_sites: Iterable[str] = (),
    throughput: Mapping[str, float] | None = None,
    success_threshold: float = 1.0,
) -> dict[str, float]:
    """The scalar metrics of one iteration (names in the module docstring).

    ``trajectories``: lists of steps (mappings whose ``observation``/``reward`` are
    components or their dicts). Empty trajectories are skipped. Cost: O(total steps).

    Raises:
        ConfigError: a throughput value that is not a finite number.
    """
    trajectories = [t for t in trajectories if len(t)]
    n = len(trajectories)
    metrics: dict[str, float] = {"trajectories": float(n)}
    if n:
        rewards = np.empty(n)
        submitted = np.zeros(n, dtype=bool)
        lengths = np.empty(n)
        blocked = np.zeros(n, dtype=bool)
        by_site: dict[str, list[int]] = defaultdict(list)
        by_difficulty: dict[str, list[int]] = defaultdict(list)
        for i, trajectory in enumerate(trajectories):
            rewards[i], submitted[i] = _final_reward(trajectory)
            lengths[i] = len(trajectory)
            blocked[i] = any(bool(_get(_get(s, "reward"), "is_blocked")) for s in trajectory)
            task = _get(_get(trajectory[0], "observation"), "task")
            by_site[_site_name(_get(task, "website"))].append(i)
            by_difficulty[_difficulty_name(_get(task, "difficulty"))].append(i)
        success = rewards >= success_threshold
        metrics["success_rate"] = float(success.mean())
        for site, rows in sorted(by_site.items()):
            metrics[f"success_rate/website/{site}"] = float(success[rows].mean())
        for name, rows in sorted(by_difficulty.items()):
            metrics[f"success_rate/difficulty/{name}"] = float(success[rows].mean())
        metrics["answer_rate"] = float(submitted.mean())
        metrics["steps/mean"] = float(lengths.mean())
        metrics["steps/min"] = float(lengths.min())
        metrics["steps/max"] = float(lengths.max())
        metrics["reward/mean"] = float(rewards.mean())
        metrics["reward/min"] = float(rewards.min())
        metrics["reward/max"] = float(rewards.max())
        metrics["blocked/trajectory_rate"] = float(blocked.mean())
    metrics["blocked/sites"] = float(len(set(blocked_sites)))
    for key, value in (throughput or {}).items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"throughput[{key!r}] must be a number, got {value!r}")
        if not math.isfinite(value):
            raise ConfigError(f"throughput[{key!r}] must be finite, got {value!r}")
        metrics[f"throughput/{key}"] = float(value)
    return metrics


def _pick_screenshots(trajectories: Sequence[Sequence[Any]], count: int) -> list[tuple[str, str]]:
    """``(image_path, caption)`` of final screenshots of up to ``count`` trajectories, spread."""
    candidates = []
    for trajectory in trajectories:
        if not len(trajectory):
            continue
        observation = _get(trajectory[-1], "observation")
        path = _get(observation, "image_path")
        if isinstance(path, str) and path and Path(path).is_file():
            task = _get(observation, "task")
            reward, _ = _final_reward(trajectory)
            name = _get(task, "task_id") or str(_get(task, "task_name", ""))[:40]
            candidates.append((path, f"{name}: reward {reward:g}, {len(trajectory)} steps"))
    if count <= 0 or not candidates:
        return []
    if len(candidates) <= count:
        return candidates
    picks = np.unique(np.linspace(0, len(candidates) - 1, count).round().astype(int))
    return [candidates[i] for i in picks]


def _load_rgb(path: str) -> np.ndarray:
    """An HxWx3 uint8 array of the image, longest side at most 640 px."""
    from PIL import Image

    with Image.open(path) as image:
        rgb = image.convert("RGB")
        rgb.thumbnail((_MAX_SCREENSHOT_SIDE, _MAX_SCREENSHOT_SIDE))
        return np.asarray(rgb, dtype=np.uint8)


class ExperimentLogger:
    """Writes per-iteration rollout metrics to one backend (see the module docstring).

    Args:
        backend: ``"wandb"``, ``"tensorboard"`` or ``"none"``.
        log_dir: where the backend's files go (created if missing).
        project: the W&B project.
        run_name: the run's name (default: ``rollouts-<UTC time>``); the TensorBoard
            subdirectory and the W&B run name.
        config: JSON-compatible settings of the run (model, workers...), recorded once,
            with the password of any URL in it masked (``***``).
        rank: this process's rank; only rank 0 writes to the backend.
        success_threshold: a final reward at or above it counts as a success.
        wandb_mode: ``"offline"``, ``"online"`` or ``"disabled"``; default: see module.
        wandb_settings: more ``wandb.Settings`` fields (e.g. ``{"disable_git": True}``);
            ours are ``console="off"``, ``silent=True``, ``x_disable_stats=True`` (no
            system-metrics sampling thread).

    Raises:
        ConfigError: an unknown backend (the accepted names are listed).
        ImportError: the backend's package is not installed (one line naming the extra).
    """

    def __init__(
        self,
        backend: str = "none",
        *,
        log_dir: str | os.PathLike[str],
        project: str = "replaystore",
        run_name: str | None = None,
        config: Mapping[str, Any] | None = None,
        rank: int = 0,
        success_threshold: float = 1.0,
        wandb_mode: str | None = None,
        wandb_settings: Mapping[str, Any] | None = None,
    ) -> None:
        if backend not in BACKENDS:
            raise ConfigError(f"unknown logger backend {backend!r}; choose one of {BACKENDS}")
        self.backend = backend
        self.log_dir = Path(log_dir).absolute()
        self.project = project
        self.run_name = run_name or time.strftime("rollouts-%Y%m%d-%H%M%S", time.gmtime())
        self.config = redact_data(dict(config or {}))  # a store URL: no password
        self.rank = rank
        self.success_threshold = float(success_threshold)
        self._writer: Any = None
        self._run: Any = None
        self._wandb: Any = None
        self._closed = False
        if rank != 0 or backend == "none":
            return
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if backend == "tensorboard":
            self._open_tensorboard()
        else:
            self._open_wandb(wandb_mode, dict(wandb_settings or {}))

    def _open_tensorboard(self) -> None:
        try:
            import tensorboard  # noqa: F401  (torch's writer needs it; say so in our words)
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ImportError(
                "the tensorboard logger backend needs tensorboard, which is not installed: "
                "pip install 'replaystore[tensorboard]'"
            ) from None
        self._writer = SummaryWriter(log_dir=str(self.log_dir / self.run_name))
        if self.config:
            text = json.dumps(self.config, indent=2, sort_keys=True, default=str)
            self._writer.add_text("config", f"```\n{text}\n```", 0)
            self._writer.flush()

    def _open_wandb(self, mode: str | None, extra_settings: dict[str, Any]) -> None:
        try:
            import wandb
        except ImportError:
            raise ImportError(
                "the wandb logger backend needs wandb, which is not installed: "
                "pip install 'replaystore[wandb]'"
            ) from None
        if mode is None:
            mode = os.environ.get("WANDB_MODE") or (
                "online" if os.environ.get("WANDB_API_KEY") else "offline"
            )
        if mode not in ("online", "offline", "disabled"):
            raise ConfigError(f"wandb_mode must be online, offline or disabled, got {mode!r}")
        self._wandb = wandb
        self._run = wandb.init(
            project=self.project,
            name=self.run_name,
            config=self.config,
            dir=str(self.log_dir),
            mode=mode,  # type: ignore[arg-type]  # checked against the literal names above
            reinit="create_new",
            settings=wandb.Settings(
                **{"console": "off", "silent": True, "x_disable_stats": True, **extra_settings}
            ),
        )
        logger.info("wandb run %s (%s) in %s", self.run_name, mode, self.log_dir)

    @property
    def run_dir(self) -> Path | None:
        """Where this run's files are: the TensorBoard event directory or the W&B run
        directory (``None`` for ``"none"`` and ranks other than 0)."""
        if self._writer is not None:
            return Path(self._writer.log_dir)
        if self._run is not None:
            return Path(self._run.dir).parent
        return None

    def log_iteration(
        self,
        iteration: int,
        trajectories: list[list[dict[str, Any]]],
        *,
        blocked_sites: Sequence[str] = (),
        throughput: dict[str, float] | None = None,
        sample_screenshots: int = 4,
    ) -> dict[str, float]:
        """Compute and write the metrics of rollout ``iteration``; returns the scalars written.

        Args:
            iteration: the rollout iteration, used as the step (W&B needs it increasing).
            trajectories: the iteration's trajectories (lists of step mappings).
            blocked_sites: domains blocked during (or before) the iteration.
            throughput: rates to log as ``throughput/<key>`` (e.g. ``steps_per_s``).
            sample_screenshots: how many final screenshots to attach (0: none).

        Cost: O(total steps) plus decoding ``sample_screenshots`` images.

        Raises:
            ConfigError: the logger is closed, or a throughput value is not a finite number.
        """
        if self._closed:
            raise ConfigError("this ExperimentLogger is closed")
        metrics = iteration_metrics(
            trajectories,
            blocked_sites=blocked_sites,
            throughput=throughput,
            success_threshold=self.success_threshold,
        )
        sites = sorted(set(blocked_sites))
        if self.rank == 0:
            logger.info(
                "iteration %d: %d trajectories, success %.1f%%, %.1f steps each, %d blocked sites",
                iteration,
                int(metrics["trajectories"]),
                100 * metrics.get("success_rate", 0.0),
                metrics.get("steps/mean", 0.0),
                len(sites),
            )
        shots = _pick_screenshots(trajectories, sample_screenshots) if self.rank == 0 else []
        if self._writer is not None:
            for name, value in metrics.items():
                self._writer.add_scalar(name, value, iteration)
            listing = "\n".join(f"- {site}" for site in sites) or "(none)"
            self._writer.add_text("blocked_sites", listing, iteration)
            for i, (path, caption) in enumerate(shots):
                self._writer.add_image(
                    f"screenshots/{i}", _load_rgb(path), iteration, dataformats="HWC"
                )
                self._writer.add_text(f"screenshots/{i}/caption", caption, iteration)
            self._writer.flush()
        elif self._run is not None:
            wandb = self._wandb
            payload: dict[str, Any] = dict(metrics)
            payload["blocked_sites"] = wandb.Table(columns=["site"], data=[[s] for s in sites])
            if shots:
                payload["screenshots"] = [
                    wandb.Image(_load_rgb(path), caption=caption) for path, caption in shots
                ]
            self._run.log(payload, step=iteration)
        return metrics

    def log_scalars(self, step: int, values: Mapping[str, float]) -> dict[str, float]:
        """Write named numbers at ``step`` (the loop's success rate, losses, stage seconds).

        Only rank 0 writes. Returns the values written.

        Raises:
            ConfigError: the logger is closed, or a value is not a finite number.
        """
        if self._closed:
            raise ConfigError("this ExperimentLogger is closed")
        scalars: dict[str, float] = {}
        for name, value in values.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"scalar {name!r} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise ConfigError(f"scalar {name!r} must be finite, got {value!r}")
            scalars[str(name)] = float(value)
        if self.rank != 0:
            return scalars
        if self._writer is not None:
            for name, value in scalars.items():
                self._writer.add_scalar(name, value, step)
            self._writer.flush()
        elif self._run is not None:
            self._run.log(dict(scalars), step=step)
        return scalars

    def close(self) -> None:
        """Flush and close the backend (idempotent).

        Returns once the files are complete: for W&B, ``run.finish()`` can return
        before its service has written the run file (seen in offline mode on the
        first run of a process: a 7-byte ``.wandb`` file), so when no other W&B
        run is active the service is shut down too (``wandb.teardown()``, which
        waits for it); the next run starts a new one (about a second).
        """
        if self._closed:
            return
        self._closed = True
        if self._writer is not None:
            self._writer.close()
        if self._run is not None:
            self._run.finish()
            if self._wandb is not None and getattr(self._wandb, "run", None) is None:
                self._wandb.teardown()

    def __enter__(self) -> ExperimentLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def log_result(logger: Any, result: IterationResult) -> dict[str, float] | None:
    """``logger.log_iteration`` (an :class:`ExperimentLogger`, or any object with that
    method) of a finished rollout iteration, in process or on Ray: its stored
    trajectories, the sites blocked during it and its throughput (steps per second,
    seconds, and the collector's overhead per step where it was timed). None, and nothing
    logged, when it stored no trajectory (a text-only model's refusal)."""
    trajectories = [] if result.text_only_model else result.trajectories
    if not trajectories:
        return None
    throughput = {"steps_per_second": result.steps_per_second, "seconds": result.seconds}
    if "overhead" in result.timings:
        overhead = result.timings["overhead"]
        throughput["overhead_ms_per_step"] = 1000 * overhead / max(1, result.steps)
    return logger.log_iteration(
        result.iteration,
        trajectories,
        blocked_sites=result.blocked_sites,
        throughput=throughput,
    )
