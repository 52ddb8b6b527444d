"""Which tasks the next rollout runs: seeded train draws, fixed test slices, shared across ranks.

API of WebGym's ``RolloutSampler`` (``webgym/utils/rollout_sampler.py``), with
the task set loaded once from JSONL, CSV or Parquet files (or given as
:class:`~replaystore.trajectories.components.Task` objects).

Train split, exactly (``TaskSampler.sample_train(n, strategy=..., seed=...)``):

1. **Eligible tasks.** Drop tasks whose website is blocked: the website's site
   (scheme, host, port) falls under an entry of the blocklist (a
   :class:`Blocklist`, read at each call, or a fixed collection of sites and
   domains; see :meth:`Blocklist.is_website_blocked
   <replaystore.pipeline.blocklist.Blocklist.is_website_blocked>`).
2. **Weights.** Each eligible task gets ``(1 / m_site) * L[level]``: the websites
   of the pool being drawn from each get the same total mass, split equally
   among their ``m_site`` eligible tasks ("uniform over websites"), and that
   share is multiplied by the weight ``L`` of the task's attempt level (from the
   attached :class:`TaskHistory`, else the task's own ``attempt_level``;
   defaults 0:100, 1:10, 2:1, 3:0.1, 4:0.01, 5:0.001, overridable per level).
   With ``weighted=False`` every eligible task weighs 1 (WebGym's "vanilla").
   A task of weight 0 is never drawn.
3. **Draw.**

   * ``strategy="uniform"``: ``n`` distinct tasks from the whole eligible pool by
     successive weighted sampling without replacement
     (:func:`replaystore.sampling.weighted_sample_without_replacement`), in draw order.
   * ``strategy="ratio"`` with ``difficulty_ratio``: tasks fall into difficulty
     groups, one per entry of the mapping, in mapping order. An entry is either
     ``difficulty_value: share`` (tasks whose ``difficulty == value``) or
     WebGym's ``name: {"range": [lo, hi], "weight": share}`` (numeric difficulty in
     ``[lo, hi]``, inclusive). A task in several groups belongs to the first;
     tasks in no group, and groups of share 0, are not drawn. Targets are
     ``n * share / sum(shares)`` rounded by largest remainder (ties to the earlier
     group). A group with fewer drawable tasks than its target gives all it has;
     the shortfall is spread over the groups that still have tasks, again by
     share and largest remainder, repeated until ``n`` is reached or every group
     is exhausted. Each shortfall is logged (warning). Each group is then drawn
     as in "uniform" with weights computed within the group (its websites share
     equal mass), and the groups' draws are concatenated and shuffled.

   If fewer than ``n`` tasks can be drawn, all of them are returned and a
   warning is logged.
4. **Ranks.** Every rank computes the same full sample from the same seed and
   keeps positions ``rank, rank + world_size, rank + 2 * world_size, ...``: the
   shares are disjoint and together are exactly the sample. ``n`` is the total
   over all ranks (WebGym divides it per rank and lets ranks overlap).
   ``world_size > 1`` requires a seed.

Test split (``sample_test(n)``): the first ``n`` tasks in file order (all when
``n`` is ``None`` or ``<= 0``), blocklist ignored (the test set never changes),
no randomness; ranks take the same strided shares.

Returned tasks are the sampler's tasks, copied with ``attempt_level`` set to the
current level when a :class:`TaskHistory` is attached. Summaries are logged at
INFO by rank 0 only.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from replaystore.errors import ArgumentError, SchemaError
from replaystore.pipeline.blocklist import (
    Blocklist,
    SiteRule,
    blocked_site_rules,
    normalize_domain,
    site_is_blocked,
)
from replaystore.pipeline.task_history import (
    MAX_ATTEMPT_LEVEL,
    TaskHistory,
    level_weight_table,
    task_key,
)
from replaystore.sampling import SeedLike, as_generator, weighted_sample_without_replacement
from replaystore.trajectories.components import Task

__all__ = ["TaskSampler", "load_tasks"]

logger = logging.getLogger("replaystore.pipeline.task_sampler")

_TASK_FIELDS = tuple(f.name for f in dataclasses.fields(Task))
_REQUIRED: tuple[str, ...] = ("task_name", "domain", "subdomain", "website", "difficulty")
_REQUIRED += ("evaluator_reference", "reference_answer")
_NONEMPTY_TEXT = ("task_name", "website")
_TEXT = ("domain", "subdomain")
_INT_RE = re.compile(r"[+-]?\d+")

# -- loading --------------------------------------------------------------------------


def _parse_scalar(cell: str) -> Any:
    """A CSV cell as int, float, or the text itself."""
    text = cell.strip()
    if _INT_RE.fullmatch(text):
        return int(text)
    try:
        value = float(text)
    except ValueError:
        return cell
    return value if math.isfinite(value) else cell


def _as_int(value: Any, name: str, where: str, low: int, high: int | None = None) -> int:
    if isinstance(value, str) and _INT_RE.fullmatch(value.strip()):
        value = int(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise SchemaError(f"{where}: {name!r} must be an integer, got {value!r}")
    value = int(value)
    if value < low or (high is not None and value > high):
        bound = f"{low}..{high}" if high is not None else f">= {low}"
        raise SchemaError(f"{where}: {name!r} must be {bound}, got {value}")
    return value


def _row_to_task(
    row: Mapping[str, Any], where: str, *, from_text: bool, ignore_unknown: bool
) -> Task:
    """One file row as a Task; every problem raises SchemaError naming ``where``."""
    unknown = [k for k in row if k not in _TASK_FIELDS]
    if unknown and not ignore_unknown:
        raise SchemaError(
            f"{where}: unknown column {unknown[0]!r} (Task fields: {', '.join(_TASK_FIELDS)}; "
            "pass ignore_unknown_columns=True to skip extra columns)"
        )
    missing = [k for k in _REQUIRED if k not in row]
    if missing:
        raise SchemaError(f"{where}: missing column {missing[0]!r}")
    values: dict[str, Any] = {}
    for name in _TASK_FIELDS:
        if name not in row:
            continue
        value = row[name]
        if from_text and isinstance(value, str) and value.strip() == "" and name not in _TEXT:
            value = None
        values[name] = value
    for name in _NONEMPTY_TEXT:
        if not isinstance(values[name], str) or not values[name].strip():
            raise SchemaError(f"{where}: {name!r} must be a non-empty string, got {values[name]!r}")
    for name in _TEXT:
        if not isinstance(values[name], str):
            raise SchemaError(f"{where}: {name!r} must be a string, got {values[name]!r}")
    if from_text and isinstance(values["difficulty"], str):
        values["difficulty"] = _parse_scalar(values["difficulty"])
    level = values.get("attempt_level")
    values["attempt_level"] = (
        0 if level is None else _as_int(level, "attempt_level", where, 0, MAX_ATTEMPT_LEVEL)
    )
    if values.get("max_steps") is not None:
        values["max_steps"] = _as_int(values["max_steps"], "max_steps", where, 1)
    if values.get("trajectory_index") is not None:
        values["trajectory_index"] = _as_int(
            values["trajectory_index"], "trajectory_index", where, 0
        )
    task_id = values.get("task_id")
    if task_id is not None:
        if isinstance(task_id, bool) or not isinstance(task_id, str | int):
            raise SchemaError(f"{where}: 'task_id' must be a string or integer, got {task_id!r}")
        values["task_id"] = str(task_id)
    return Task(**values)


Located = list[tuple[Task, str]]  # each task with "file line N" for error messages


def _load_jsonl(path: Path, ignore_unknown: bool) -> Located:
    tasks = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path} line {number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise SchemaError(f"{where}: not valid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise SchemaError(f"{where}: expected a JSON object, got {type(row).__name__}")
            task = _row_to_task(row, where, from_text=False, ignore_unknown=ignore_unknown)
            tasks.append((task, where))
    return tasks


def _load_csv(path: Path, ignore_unknown: bool) -> Located:
    tasks = []
    with open(path, encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle)
        for row in reader:
            where = f"{path} line {reader.line_num}"
            if None in row:
                raise SchemaError(f"{where}: more fields than the header has columns")
            if any(value is None for value in row.values()):
                raise SchemaError(f"{where}: fewer fields than the header has columns")
            task = _row_to_task(row, where, from_text=True, ignore_unknown=ignore_unknown)
            tasks.append((task, where))
    return tasks


def _load_parquet(path: Path, ignore_unknown: bool) -> Located:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError(
            f"reading the Parquet task file {path} needs pyarrow, which is not installed: "
            "pip install pyarrow (or convert the file to JSONL or CSV)"
        ) from None
    tasks = []
    for i, row in enumerate(pq.read_table(path).to_pylist()):
        where = f"{path} row {i + 1}"
        tasks.append(
            (_row_to_task(row, where, from_text=False, ignore_unknown=ignore_unknown), where)
        )
    return tasks


_LOADERS = {
    ".jsonl": _load_jsonl,
    ".ndjson": _load_jsonl,
    ".csv": _load_csv,
    ".parquet": _load_parquet,
    ".pq": _load_parquet,
}


def _load_located(path: str | os.PathLike[str], ignore_unknown: bool) -> Located:
    source = Path(path)
    loader = _LOADERS.get(source.suffix.lower())
    if loader is None:
        raise ValueError(
            f"cannot tell the format of task file {source}: use a .jsonl, .csv or .parquet suffix"
        )
    return loader(source, ignore_unknown)


def load_tasks(path: str | os.PathLike[str], *, ignore_unknown_columns: bool = False) -> list[Task]:
    """Tasks from a JSONL (``.jsonl``/``.ndjson``), CSV (``.csv``) or Parquet file, in file order.

    Columns are :class:`Task` fields. Required: ``task_name`` and ``website``
    (non-empty), ``domain``, ``subdomain``, ``difficulty``, ``evaluator_reference``,
    ``reference_answer``. Optional: ``attempt_level`` (0-5, default 0),
    ``task_id`` (string or integer, stored as a string), ``max_steps`` (>= 1),
    ``trajectory_index`` (>= 0). In CSV files an empty cell is ``None`` (``""``
    for ``domain``/``subdomain``), integer fields are parsed, ``difficulty`` is
    parsed as an int or float when it looks like one, other cells stay strings.
    Parquet needs ``pyarrow``.

    Args:
        path: the file; its suffix selects the format.
        ignore_unknown_columns: skip columns that are not Task fields (an error otherwise).

    Raises:
        SchemaError: a bad row, naming the file and line (row for Parquet): invalid
            JSON, a missing or unknown column, a wrong type or range.
        ValueError: unknown file suffix.
        ImportError: a Parquet file without pyarrow installed.
        FileNotFoundError: no such file.

    Cost: O(file size); the whole task list is held in memory.
    """
    return [task for task, _ in _load_located(path, ignore_unknown_columns)]


# -- sampling helpers -------------------------------------------------------------------


def _largest_remainder(n: int, shares: NDArray[np.float64]) -> NDArray[np.int64]:
    """Split integer ``n`` in proportion to ``shares`` (sum > 0); ties go to lower indices."""
    quota = n * shares / shares.sum()
    base = np.floor(quota).astype(np.int64)
    left = n - int(base.sum())
    if left > 0:
        order = np.argsort(-(quota - base), kind="stable")
        base[order[:left]] += 1
    return base


def _allocate(
    n: int, shares: NDArray[np.float64], available: NDArray[np.int64]
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Targets per group and the final allocation after refilling shortfalls (see module doc)."""
    targets = _largest_remainder(n, shares)
    alloc = np.minimum(targets, available)
    remaining = n - int(alloc.sum())
    while remaining > 0:
        spare = available - alloc
        active = (spare > 0) & (shares > 0)
        if not active.any():
            break
        extra = np.minimum(_largest_remainder(remaining, np.where(active, shares, 0.0)), spare)
        alloc += extra
        remaining -= int(extra.sum())
    return targets, alloc


def _check_rank(rank: int, world_size: int) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ArgumentError(f"world_size must be an integer >= 1, got {world_size!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ArgumentError(f"rank must be an integer in [0, {world_size}), got {rank!r}")


def _parse_ratio(difficulty_ratio: Mapping[Any, Any]) -> list[tuple[str, Any, float]]:
    """``[(label, matcher, share)]``; matcher is ``("eq", value)`` or ``("range", lo, hi)``."""
    if not isinstance(difficulty_ratio, Mapping) or not difficulty_ratio:
        raise ValueError("strategy='ratio' needs a non-empty difficulty_ratio mapping")
    groups = []
    for key, spec in difficulty_ratio.items():
        if isinstance(spec, Mapping):
            bounds, share = spec.get("range"), spec.get("weight", 0)
            if (
                not isinstance(bounds, Sequence)
                or len(bounds) != 2
                or not all(isinstance(b, int | float) and not isinstance(b, bool) for b in bounds)
            ):
                raise ValueError(
                    f"difficulty_ratio[{key!r}]['range'] must be [low, high] numbers, "
                    f"got {bounds!r}"
                )
            matcher: Any = ("range", float(bounds[0]), float(bounds[1]))
            label = f"{key} [{bounds[0]}-{bounds[1]}]"
        else:
            share, matcher, label = spec, ("eq", key), f"difficulty {key!r}"
        try:
            value = float(share)
        except (TypeError, ValueError):
            raise ValueError(
                f"difficulty_ratio[{key!r}] share must be a number, got {share!r}"
            ) from None
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(
                f"difficulty_ratio[{key!r}] share must be finite and >= 0, got {share!r}"
            )
        groups.append((label, matcher, value))
    if sum(g[2] for g in groups) <= 0:
        raise ValueError("difficulty_ratio shares sum to 0")
    return groups


def _matches(matcher: Any, difficulty: Any) -> bool:
    if matcher[0] == "eq":
        try:
            return bool(difficulty == matcher[1])
        except Exception:
            return False
    if isinstance(difficulty, bool) or not isinstance(difficulty, int | float | np.number):
        return False
    return matcher[1] <= float(difficulty) <= matcher[2]


# -- the sampler ------------------------------------------------------------------------


TaskSource = (
    str | os.PathLike[str] | Sequence[Task | Mapping[str, Any]] | Sequence[str | os.PathLike[str]]
)


class TaskSampler:
    """Draws rollout tasks: weighted, seeded train samples and fixed test slices (see module doc).

    Args:
        tasks: a task file (JSONL, CSV, Parquet), a list of files (concatenated
            in order), or a list of :class:`Task` objects (or mappings of Task fields).
        history: attempt levels for the level weights; ``None`` uses each task's
            ``attempt_level``. The history is read at every draw, so updating it
            between draws changes the weights.
        blocklist: websites never drawn for train: a :class:`Blocklist` (its
            unexpired entries, read at every draw) or sites/domains/URLs (a bare
            domain blocks its host on every port and its subdomains).
        level_weights: overrides of the default weight per attempt level.
        seed: seeds the sampler's own generator, used by draws that pass no seed
            (successive draws then differ, reproducibly).
        ignore_unknown_columns: passed to :func:`load_tasks`.

    Raises:
        SchemaError: a bad task (file and line for files, list position otherwise),
            or two tasks with the same identity (``task_id``, else ``task_name`` +
            ``website``): the history could not tell them apart; or a task file
            that holds no task (empty, blank lines only, or a CSV header only).
        ValueError: bad ``level_weights``.

    Memory: the task list plus a few integer arrays of its length.
    """

    def __init__(
        self,
        tasks: TaskSource,
        *,
        history: TaskHistory | None = None,
        blocklist: Blocklist | Iterable[str] | None = None,
        level_weights: Mapping[int, float] | None = None,
        seed: SeedLike = None,
        ignore_unknown_columns: bool = False,
    ) -> None:
        loaded, origins = self._collect(tasks, ignore_unknown_columns)
        self.tasks: tuple[Task, ...] = tuple(loaded)
        self.history = history
        self._blocklist = blocklist if isinstance(blocklist, Blocklist) else None
        self._fixed_blocked: tuple[SiteRule, ...] | None = (
            None if self._blocklist is not None else blocked_site_rules(blocklist)
        )
        self._level_table = level_weight_table(level_weights)
        self._seeded = seed is not None
        self._rng = as_generator(seed)

        self._keys = []
        seen: dict[Any, int] = {}
        sites = []
        domain_of: dict[str, str] = {}  # websites repeat: normalise each string once
        for i, (task, origin) in enumerate(zip(self.tasks, origins, strict=True)):
            try:
                key = task_key(task)
                site = domain_of.get(task.website)
                if site is None:
                    site = domain_of[task.website] = normalize_domain(task.website)
                sites.append(site)
            except ValueError as exc:
                raise SchemaError(f"{origin}: {exc}") from None
            if key is not None and key in seen:
                raise SchemaError(
                    f"{origin}: task {key[1:]!r} appears twice (first at {origins[seen[key]]}); "
                    "give each task a unique task_id"
                )
            if key is not None:
                seen[key] = i
            self._keys.append(key)
        names, site_index = np.unique(np.array(sites, dtype=object), return_inverse=True)
        #: Distinct normalised website domains, sorted; tasks refer to them by position.
        self.websites: list[str] = names.tolist()
        self._site = site_index.astype(np.int64).reshape(-1)
        self._own_levels = np.array([t.attempt_level for t in self.tasks], dtype=np.int64)
        # Difficulty codes: group membership is decided once per distinct difficulty.
        codes: dict[Any, int] = {}
        self._difficulty_values: list[Any] = []
        diff_code = np.empty(len(self.tasks), dtype=np.int64)
        for i, task in enumerate(self.tasks):
            marker = (type(task.difficulty).__name__, repr(task.difficulty))
            if marker not in codes:
                codes[marker] = len(self._difficulty_values)
                self._difficulty_values.append(task.difficulty)
            diff_code[i] = codes[marker]
        self._difficulty_code = diff_code

    @staticmethod
    def _collect(tasks: TaskSource, ignore_unknown: bool) -> tuple[list[Task], list[str]]:
        if isinstance(tasks, str | os.PathLike):
            tasks = [tasks]
        loaded: list[Task] = []
        origins: list[str] = []
        for i, item in enumerate(tasks):
            if isinstance(item, str | os.PathLike):
                located = _load_located(item, ignore_unknown)
                if not located:
                    raise SchemaError(
                        f"task file {item} holds no tasks (empty, or only blank lines / a "
                        "header row): a sampler needs at least one task"
                    )
                for task, where in located:
                    loaded.append(task)
                    origins.append(where)
                continue
            where = f"task {i}"
            if isinstance(item, Task):
                task = item
                _as_int(task.attempt_level, "attempt_level", where, 0, MAX_ATTEMPT_LEVEL)
            elif isinstance(item, Mapping):
                task = _row_to_task(item, where, from_text=False, ignore_unknown=ignore_unknown)
            else:
                raise SchemaError(f"{where} must be a Task or a mapping, got {type(item).__name__}")
            loaded.append(task)
            origins.append(where)
        return loaded, origins

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], **kwargs: Any) -> TaskSampler:
        """``TaskSampler(path, **kwargs)``, spelled out."""
        return cls(path, **kwargs)

    def __len__(self) -> int:
        return len(self.tasks)

    def __repr__(self) -> str:
        return f"TaskSampler({len(self.tasks)} tasks, {len(self.websites)} websites)"

    # -- weights ------------------------------------------------------------------------

    def levels(self) -> NDArray[np.int64]:
        """Current attempt level of every task, shape (len(tasks),)."""
        if self.history is None:
            return self._own_levels.copy()
        return self.history.levels_by_key(self._keys)

    def blocked_mask(self) -> NDArray[np.bool_]:
        """True for tasks whose website is blocked now, shape (len(tasks),).

        Cost: one blocklist read plus O(websites) set look-ups.
        """
        rules = (
            blocked_site_rules(self._blocklist)
            if self._blocklist is not None
            else self._fixed_blocked
        )
        if not rules:
            return np.zeros(len(self.tasks), dtype=bool)
        # Ports matter (one site per port), so match each distinct website string.
        urls, which = np.unique(
            np.array([t.website for t in self.tasks], dtype=object), return_inverse=True
        )
        blocked = np.array([site_is_blocked(u, rules) for u in urls.tolist()], dtype=bool)
        return blocked[which.reshape(-1)]

    def _pool_weights(
        self, pool: NDArray[np.int64], level_w: NDArray[np.float64], weighted: bool
    ) -> NDArray[np.float64]:
        """Weights of the tasks at positions ``pool``: website-uniform times level weight."""
        if not weighted:
            return np.ones(pool.size)
        per_site = np.bincount(self._site[pool], minlength=len(self.websites))
        return level_w[pool] / per_site[self._site[pool]]

    def train_weights(self, *, weighted: bool = True) -> NDArray[np.float64]:
        """The "uniform" strategy's weight of every task (0 when blocked), shape (len(tasks),).

        Within the eligible tasks each website's weights sum to the same value
        before the level factor (see the module doc, step 2).
        """
        eligible = np.flatnonzero(~self.blocked_mask())
        out = np.zeros(len(self.tasks))
        out[eligible] = self._pool_weights(eligible, self._level_table[self.levels()], weighted)
        return out

    # -- drawing ------------------------------------------------------------------------

    def _draw(
        self, pool: NDArray[np.int64], w: NDArray[np.float64], k: int, gen: np.random.Generator
    ) -> NDArray[np.int64]:
        k = min(k, int(np.count_nonzero(w)))
        return pool[weighted_sample_without_replacement(w, k, gen)]

    def _generator(self, seed: SeedLike, world_size: int) -> np.random.Generator:
        if seed is None:
            if world_size > 1 and not self._seeded:
                raise ValueError(
                    "world_size > 1 needs a seed (here or in TaskSampler(seed=...)): every rank "
                    "must draw the same sample to take a disjoint share of it"
                )
            return self._rng
        return as_generator(seed)

    def sample_train_indices(
        self,
        n: int,
        *,
        strategy: Literal["uniform", "ratio"] = "uniform",
        difficulty_ratio: Mapping[Any, Any] | None = None,
        weighted: bool = True,
        rank: int = 0,
        world_size: int = 1,
        seed: SeedLike = None,
    ) -> NDArray[np.int64]:
        """Positions in :attr:`tasks` of this rank's share of the train sample (see module doc).

        Raises:
            ValueError: ``n < 0``, unknown strategy, bad ``difficulty_ratio``, bad
                rank/world_size, or ``world_size > 1`` without any seed.

        Cost: O(len(tasks)) NumPy work plus the draw (O(n log len(tasks)) when n is small).
        """
        if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
            raise ArgumentError(f"n must be an integer >= 0, got {n!r}")
        _check_rank(rank, world_size)
        gen = self._generator(seed, world_size)
        level_w = self._level_table[self.levels()]
        eligible = ~self.blocked_mask()
        verbose = rank == 0
        if strategy == "uniform":
            if difficulty_ratio is not None:
                raise ValueError("difficulty_ratio is used only by strategy='ratio'")
            pool = np.flatnonzero(eligible)
            chosen = self._draw(pool, self._pool_weights(pool, level_w, weighted), int(n), gen)
        elif strategy == "ratio":
            chosen = self._draw_ratio(
                int(n), difficulty_ratio, eligible, level_w, weighted, gen, verbose
            )
            if verbose:
                self._log_ratio_result(chosen)
        else:
            raise ArgumentError(f"unknown strategy {strategy!r}; use 'uniform' or 'ratio'")
        if chosen.size < n and verbose:
            logger.warning(
                "train sampling: %d tasks requested but only %d can be drawn "
                "(%d tasks, %d blocked); returning %d",
                n,
                chosen.size,
                len(self.tasks),
                int((~eligible).sum()),
                chosen.size,
            )
        if verbose:
            logger.info(
                "train sampling (%s): %d tasks from %d websites, split over %d rank(s)",
                strategy,
                chosen.size,
                np.unique(self._site[chosen]).size,
                world_size,
            )
        return chosen[rank::world_size]

    def _draw_ratio(
        self,
        n: int,
        difficulty_ratio: Mapping[Any, Any] | None,
        eligible: NDArray[np.bool_],
        level_w: NDArray[np.float64],
        weighted: bool,
        gen: np.random.Generator,
        verbose: bool,
    ) -> NDArray[np.int64]:
        groups = _parse_ratio(difficulty_ratio or {})
        # Group of each distinct difficulty (first matching entry), then of each task.
        code_group = np.full(len(self._difficulty_values), -1, dtype=np.int64)
        for code, value in enumerate(self._difficulty_values):
            for g, (_, matcher, share) in enumerate(groups):
                if _matches(matcher, value):
                    code_group[code] = g if share > 0 else -1
                    break
        task_group = code_group[self._difficulty_code]
        shares = np.array([g[2] for g in groups])
        pools, weights = [], []
        for g in range(len(groups)):
            pool = np.flatnonzero(eligible & (task_group == g))
            w = self._pool_weights(pool, level_w, weighted)
            pools.append(pool)
            weights.append(w)
        available = np.array([np.count_nonzero(w) for w in weights], dtype=np.int64)
        targets, alloc = _allocate(n, shares, available)
        short = np.flatnonzero(targets > available)
        if short.size and verbose:
            filled = int(alloc.sum() - np.minimum(targets, available).sum())
            for g in short.tolist():
                logger.warning(
                    "ratio sampling: %s has %d drawable tasks for a target of %d (short by %d)",
                    groups[g][0],
                    available[g],
                    targets[g],
                    targets[g] - available[g],
                )
            logger.warning(
                "ratio sampling: %d of %d missing tasks filled from other difficulties",
                filled,
                int((targets - np.minimum(targets, available)).sum()),
            )
        parts = [
            self._draw(pools[g], weights[g], int(alloc[g]), gen)
            for g in range(len(groups))
            if alloc[g] > 0
        ]
        chosen = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
        return chosen[gen.permutation(chosen.size)]

    def _log_ratio_result(self, chosen: NDArray[np.int64]) -> None:
        if chosen.size == 0:
            return
        codes, counts = np.unique(self._difficulty_code[chosen], return_counts=True)
        summary = ", ".join(
            f"{self._difficulty_values[c]!r}: {k}" for c, k in zip(codes, counts, strict=True)
        )
        logger.info("ratio sampling: drawn per difficulty: %s", summary)

    def _out(self, indices: NDArray[np.int64]) -> list[Task]:
        if self.history is None:
            return [self.tasks[i] for i in indices.tolist()]
        return self.history.with_levels(self.tasks[i] for i in indices.tolist())

    def sample_train(
        self,
        n: int,
        *,
        strategy: Literal["uniform", "ratio"] = "uniform",
        difficulty_ratio: Mapping[Any, Any] | None = None,
        weighted: bool = True,
        rank: int = 0,
        world_size: int = 1,
        seed: SeedLike = None,
    ) -> list[Task]:
        """This rank's share of a train sample of ``n`` distinct tasks (all ranks together).

        Args:
            n: total tasks over all ranks.
            strategy: ``"uniform"`` (one weighted draw from all eligible tasks) or
                ``"ratio"`` (per difficulty group, see the module doc).
            difficulty_ratio: for ``"ratio"``: ``{difficulty: share}`` or WebGym's
                ``{name: {"range": [lo, hi], "weight": share}}``.
            weighted: website-uniform times level weights (True) or equal weights.
            rank: this process's index in ``0..world_size-1``.
            world_size: how many processes share the sample.
            seed: int or Generator for this draw; ``None`` uses the sampler's generator.

        Returns:
            Tasks in draw order (shuffled across groups for "ratio").

        Raises:
            ValueError: see :meth:`sample_train_indices`.
        """
        return self._out(
            self.sample_train_indices(
                n,
                strategy=strategy,
                difficulty_ratio=difficulty_ratio,
                weighted=weighted,
                rank=rank,
                world_size=world_size,
                seed=seed,
            )
        )

    def sample_test_indices(
        self, n: int | None = None, *, rank: int = 0, world_size: int = 1
    ) -> NDArray[np.int64]:
        """Positions of this rank's share of the first ``n`` tasks (all if n is None or <= 0)."""
        _check_rank(rank, world_size)
        if n is not None and (isinstance(n, bool) or not isinstance(n, int | np.integer)):
            raise ValueError(f"n must be an integer or None, got {n!r}")
        size = len(self.tasks) if n is None or n <= 0 else min(int(n), len(self.tasks))
        if n is not None and n > len(self.tasks) and rank == 0:
            logger.warning("test split: %d tasks requested, the file has %d", n, len(self.tasks))
        return np.arange(rank, size, world_size, dtype=np.int64)

    def sample_test(
        self, n: int | None = None, *, rank: int = 0, world_size: int = 1
    ) -> list[Task]:
        """This rank's share of the first ``n`` tasks in file order; no randomness, no blocklist."""
        return self._out(self.sample_test_indices(n, rank=rank, world_size=world_size))

    def sample_tasks(
        self, split: Literal["train", "test"], n: int | None, **kwargs: Any
    ) -> list[Task]:
        """WebGym's entry point: :meth:`sample_train` or :meth:`sample_test` by ``split``.

        Raises:
            ValueError: another split name.
        """
        if split == "train":
            if n is None:
                raise ValueError("the train split needs a sample size n")
            return self.sample_train(n, **kwargs)
        if split == "test":
            return self.sample_test(n, **kwargs)
        raise ValueError(f"unknown split {split!r}; use 'train' or 'test'")
