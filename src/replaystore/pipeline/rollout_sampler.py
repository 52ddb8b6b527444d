"""WebGym's ``webgym/utils/rollout_sampler.py``: :class:`RolloutSampler` over :class:`TaskSampler`.

``RolloutSampler(config, save_path).sample_tasks(tasks, split, ...)`` takes and
returns pandas DataFrames (one row per task, the task file's columns), as in
WebGym; pandas is the optional extra ``replaystore[pandas]``. The draw itself
is :class:`~replaystore.pipeline.task_sampler.TaskSampler`'s (``weighted=False``:
WebGym's uniform and ratio strategies weigh every task equally).

Config: any attribute-style object (a Hydra/OmegaConf config, a
``types.SimpleNamespace``) with ``config.env_config`` holding WebGym's settings:

=============================== ========================================================
``train_tasks_sampler``         ``"uniform"`` (default) or ``"ratio"``
``train_tasks_rollout_size``    tasks per train rollout, over all ranks (train: required)
``difficulty_ratio``            ratio: ``{name: {"range": [lo, hi], "weight": w}}``
                                (or ``{difficulty: share}``); empty: uniform, as WebGym
``deduplicate_across_iterations`` uniform train: skip task names already in
                                ``{save_path}/train_trajectories`` (default False)
``test_tasks_rollout_size``     first N test tasks; ``<= 0``: all (test: required)
``test_tasks_repeat_times``     repeat each test task this many times (default 0: once)
``test_rank``, ``test_total_workers`` this rank's share of the test slice
``rank_load_weight``, ``total_load_weight``, ``all_rank_weights`` proportional shares
                                (``all_rank_weights``: ``"2,1,1"``, one weight per rank)
``seed`` (or ``config.seed``)   seed of the train draw; shared by all ranks
=============================== ========================================================

Multi-node: ranks' shares are disjoint and together are exactly one sample of
``train_tasks_rollout_size`` tasks, because every rank draws the same sample from
the shared seed and keeps its positions (strided, or proportional blocks of
``all_rank_weights`` consecutive positions per round, WebGym's test layout).
WebGym's ranks draw independently and can pick the same task twice; so more
than one rank needs a seed (``env_config.seed``, ``config.seed`` or ``seed=``).
Rank 0 still writes ``{save_path}/multinode_flags/train_sampling_complete_rank_0``
for WebGym's shell scripts.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from replaystore.atomic import atomic_write_bytes
from replaystore.errors import ConfigError
from replaystore.pipeline._frames import check_frame, frame_records
from replaystore.pipeline.task_sampler import TaskSampler
from replaystore.sampling import SeedLike

__all__ = ["RolloutSampler"]

logger = logging.getLogger("replaystore.pipeline.rollout_sampler")

_MISSING = object()


def _plain(value: Any) -> Any:
    """OmegaConf containers (or any mapping/sequence) as dicts and lists."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [_plain(v) for v in value]
    return value


def _share(n: int, rank: int, weights: Sequence[int]) -> NDArray[np.int64]:
    """Positions of ``range(n)`` for ``rank``: rounds of ``sum(weights)`` consecutive
    positions, each rank taking ``weights[rank]`` of them after the lower ranks'."""
    total = int(sum(weights))
    offset = int(sum(weights[:rank]))
    where = np.arange(n, dtype=np.int64) % total
    return np.flatnonzero((where >= offset) & (where < offset + int(weights[rank])))


def _int_setting(value: Any, name: str, low: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    if low is not None and value < low:
        raise ConfigError(f"{name} must be >= {low}, got {value!r}")
    return int(value)


class RolloutSampler:
    """WebGym's ``RolloutSampler``: which tasks the next rollout runs.

    Args:
        config: attribute-style config with ``env_config`` (see the module doc).
        save_path: the run directory (trajectories for deduplication, flag files).

    Raises:
        ConfigError: ``config`` has no ``env_config``.
    """

    def __init__(self, config: Any, save_path: str | os.PathLike[str]) -> None:
        env_config = getattr(config, "env_config", None)
        if env_config is None:
            raise ConfigError("RolloutSampler needs config.env_config (WebGym's env settings)")
        self.config = config
        self.save_path = save_path
        self.env_config = env_config
        self.deduplicate_across_iterations = bool(
            getattr(env_config, "deduplicate_across_iterations", False)
        )
        from replaystore.pipeline.task_history_manager import TaskHistoryManager

        self.task_history_manager = TaskHistoryManager(save_path)

    def _setting(self, name: str, default: Any = _MISSING) -> Any:
        value = getattr(self.env_config, name, default)
        if value is _MISSING:
            raise ConfigError(f"config.env_config.{name} is not set")
        return value

    def _seed(self, seed: SeedLike) -> SeedLike:
        if seed is not None:
            return seed
        value = getattr(self.env_config, "seed", None)
        return getattr(self.config, "seed", None) if value is None else value

    def _rank_weights(self, world_size: int) -> list[int] | None:
        """``all_rank_weights`` when proportional shares are configured, else None."""
        if getattr(self.env_config, "rank_load_weight", None) is None:
            return None
        text = getattr(self.env_config, "all_rank_weights", None)
        if text is None:
            raise ConfigError(
                "config.env_config.rank_load_weight is set but all_rank_weights is not: "
                "disjoint proportional shares need every rank's weight ('2,1,1')"
            )
        try:
            weights = [int(w) for w in str(text).strip("'\" ").split(",")]
        except ValueError:
            raise ConfigError(
                f"config.env_config.all_rank_weights must be comma-separated integers, got {text!r}"
            ) from None
        if len(weights) != world_size or min(weights) < 1:
            raise ConfigError(
                f"config.env_config.all_rank_weights {text!r} must hold {world_size} "
                "integers >= 1 (one per rank)"
            )
        return weights

    def sample_tasks(
        self,
        tasks: Any,
        split: str,
        cumulative_distribution: Mapping[int, int] | None = None,
        total_trajectories: int = 0,
        multinode_rank: int | None = None,
        multinode_total_workers: int | None = None,
        *,
        seed: SeedLike = None,
    ) -> Any:
        """This rank's tasks for the next rollout of ``split`` (WebGym's signature).

        Args:
            tasks: pandas DataFrame of tasks (blocked websites already removed by
                the caller for train, as WebGym's rollout script does).
            split: ``"train"`` (random draw, see the module doc) or anything else
                (test: the first ``test_tasks_rollout_size`` tasks, in order, no randomness).
            cumulative_distribution: accepted and logged only, as in WebGym (its
                samplers do not use it).
            total_trajectories: accepted and logged only, as in WebGym.
            multinode_rank: this rank (with ``multinode_total_workers``: this rank's
                share of the train sample).
            multinode_total_workers: the number of ranks sharing the train sample.
            seed: seed of the train draw (default: ``env_config.seed``, then
                ``config.seed``, else fresh entropy for a single rank).

        Returns:
            A DataFrame of rows of ``tasks``: uniform train and test keep ``tasks``'
            index labels; ratio train has a fresh index (WebGym's shapes). Test rows
            repeated ``test_tasks_repeat_times`` times have a fresh index.

        Raises:
            TypeError: ``tasks`` is not a DataFrame.
            ConfigError: a required setting is missing or malformed.
            ValueError: unknown ``train_tasks_sampler``; bad ``difficulty_ratio``;
                several ranks without a seed.
            SchemaError: a task row lacks a task field or repeats a task (names the row).

        Cost: O(len(tasks)) to validate rows, plus the draw.
        """
        pd = check_frame(tasks)
        if cumulative_distribution is not None:
            logger.info(
                "cumulative trajectories per attempt level: %s (total %d)",
                dict(cumulative_distribution),
                int(total_trajectories),
            )
        if split == "train":
            return self._sample_train(tasks, multinode_rank, multinode_total_workers, seed)
        return self._sample_test(tasks, pd)

    def _sampler(self, tasks: Any) -> TaskSampler:
        return TaskSampler(frame_records(tasks), ignore_unknown_columns=True)

    def _sample_train(
        self,
        tasks: Any,
        rank: int | None,
        world_size: int | None,
        seed: SeedLike,
    ) -> Any:
        n = _int_setting(
            self._setting("train_tasks_rollout_size"),
            "config.env_config.train_tasks_rollout_size",
            0,
        )
        strategy = getattr(self.env_config, "train_tasks_sampler", "uniform")
        if strategy not in ("uniform", "ratio"):
            raise ValueError(
                f"Unknown train_tasks_sampler: {strategy!r}. Must be 'uniform' or 'ratio'."
            )
        ratio = _plain(getattr(self.env_config, "difficulty_ratio", None))
        if strategy == "ratio" and not ratio:
            logger.warning("no difficulty_ratio in config.env_config: uniform sampling instead")
            strategy = "uniform"
        multinode = rank is not None and world_size is not None and world_size > 1
        r = _int_setting(rank, "multinode_rank", 0) if multinode else 0
        w = _int_setting(world_size, "multinode_total_workers", 1) if multinode else 1
        if r >= w:
            raise ConfigError(f"multinode_rank {r} must be < multinode_total_workers {w}")
        pool = tasks
        if strategy == "uniform" and self.deduplicate_across_iterations:
            seen = self._previously_sampled_task_names("train")
            if seen and "task_name" in tasks.columns:
                pool = tasks[~tasks["task_name"].isin(seen)]
                logger.info(
                    "deduplication: %d previously sampled tasks left out (%d -> %d)",
                    len(tasks) - len(pool),
                    len(tasks),
                    len(pool),
                )
        sampler = self._sampler(pool)
        draw_seed = self._seed(seed)
        if w > 1 and draw_seed is None:
            raise ValueError(
                "several ranks need one shared seed to draw disjoint shares: set "
                "config.env_config.seed (same on every rank) or pass seed="
            )
        weights = self._rank_weights(w) if multinode else None
        kwargs: dict[str, Any] = {
            "strategy": strategy,
            "difficulty_ratio": ratio if strategy == "ratio" else None,
            "weighted": False,
            "seed": draw_seed,
        }
        if weights is None:
            chosen = sampler.sample_train_indices(n, rank=r, world_size=w, **kwargs)
        else:
            full = sampler.sample_train_indices(n, **kwargs)
            chosen = full[_share(full.size, r, weights)]
        out = pool.iloc[chosen]
        if strategy == "ratio":
            out = out.reset_index(drop=True)
        logger.info("train sampling (%s): %d tasks for rank %d of %d", strategy, len(out), r, w)
        if multinode and r == 0:
            flag = Path(self.save_path) / "multinode_flags" / "train_sampling_complete_rank_0"
            flag.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(flag, b"")
        return out

    def _sample_test(self, tasks: Any, pd: Any) -> Any:
        size = _int_setting(
            self._setting("test_tasks_rollout_size"), "config.env_config.test_tasks_rollout_size"
        )
        repeat = _int_setting(
            getattr(self.env_config, "test_tasks_repeat_times", 0) or 0,
            "config.env_config.test_tasks_repeat_times",
            0,
        )
        rank = getattr(self.env_config, "test_rank", None)
        world = getattr(self.env_config, "test_total_workers", None)
        sampler = self._sampler(tasks)
        if rank is not None and world is not None and world > 1:
            r = _int_setting(rank, "config.env_config.test_rank", 0)
            w = _int_setting(world, "config.env_config.test_total_workers", 1)
            if r >= w:
                raise ConfigError(f"test_rank {r} must be < test_total_workers {w}")
            weights = self._rank_weights(w)
            if weights is None:
                chosen = sampler.sample_test_indices(size, rank=r, world_size=w)
            else:
                first = sampler.sample_test_indices(size)
                chosen = first[_share(first.size, r, weights)]
        else:
            chosen = sampler.sample_test_indices(size)
        out = tasks.iloc[chosen]
        if repeat > 0:
            out = pd.concat([out] * repeat, ignore_index=True)
        logger.info("test sampling: %d tasks (first %s, repeated %d)", len(out), size, repeat)
        return out

    def _previously_sampled_task_names(self, split: str) -> set[str]:
        """Task names of every stored trajectory of ``split`` (empty when none are stored)."""
        from replaystore.pipeline.trajectory_storage import iteration_sources

        names: set[str] = set()
        for source in iteration_sources(self.save_path, split):
            for trajectory in source.load():
                task = getattr(trajectory[0].get("observation"), "task", None)
                name = getattr(task, "task_name", None)
                if isinstance(name, str):
                    names.add(name)
        return names
