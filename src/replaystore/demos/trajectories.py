"""Demo of ``replaystore.rollouts``, ``trajectories`` and ``pipeline``: the web-agent RL loop
in a real browser, from a task file to a LLaMA-Factory dataset.

WebGym's pipeline (seed 002) is task sampler -> rollouts (a browser per task,
the policy's model) -> trajectory storage -> replay buffer -> LLaMA-Factory.
This part runs that loop for real, on the local website suite shipped with
the package, with headless Chromium and the scripted policy standing in for
the model:

1. **Tasks and websites.** :class:`~replaystore.rollouts.sites.LocalSuite`
   serves six small sites on 127.0.0.1 (shop, travel, recipes, library, news,
   and ``botwall``, an anti-bot wall that answers HTTP 403 with a CAPTCHA); its
   tasks (difficulty 1-3, checkable answers) are written to ``tasks.jsonl``.
2. **Iterations.** Each iteration two rollout ranks draw their disjoint shares
   of the train sample with :class:`~replaystore.pipeline.task_sampler.TaskSampler`
   (website-uniform weights times attempt-level weights from
   :class:`~replaystore.pipeline.task_history.TaskHistory`; blocked websites
   excluded) and each runs a :class:`~replaystore.rollouts.collector.RolloutCollector`
   over one shared :class:`~replaystore.rollouts.browser.BrowserPool`: every
   step is a real screenshot (PNG) and accessibility tree, a prompt built with
   the agent's :class:`~replaystore.trajectories.context.ConversationBuilder`,
   a reply from :class:`~replaystore.rollouts.scripted.ScriptedPolicy`
   (``<think>...</think>`` then ``Action: ...``, decomposed like a model's), and
   the action executed in the page. No model is trained here: the scripted
   policy's wasted clicks (the next screenshot is the same) and wrong answers
   get rarer on a fixed schedule per iteration (``improvement``), so the rising
   success rate is that schedule, and the output's first line says so
   (``replaystore demo --part loop`` trains and serves a real model). The
   :class:`~replaystore.rollouts.evaluator.Evaluator` matches answers against the
   task's reference. Each rank writes its iteration file with
   :class:`~replaystore.trajectories.storage.TrajectoryStorage`, then the ranks
   are merged into one file per iteration.
3. **Blocklist.** The anti-bot site ends its rollouts at the first screenshot:
   it is recorded in the :class:`~replaystore.pipeline.blocklist.Blocklist`
   and the next iterations' samples contain none of its tasks.
4. **Buffer and export.** Every stored prompt is checked against a rebuild from
   the stored steps (what is trained on is what the model saw);
   :meth:`TrajectoryBuffer.from_storage` indexes every step (successful
   trajectories only, repeated screenshots filtered),
   ``get_training_samples(k, recency_bias_power=2.0)`` draws a recency-biased
   subset, and :func:`~replaystore.trajectories.export.export_llamafactory`
   writes a ShareGPT dataset (records, validation split, ``dataset_info.json``,
   copied screenshots) whose records are then re-read and validated.

Needs Chromium and Playwright (``pip install 'replaystore[rollouts]'``, Debian's
``chromium`` package or ``REPLAYSTORE_CHROMIUM``). Without them :func:`run`
returns one line saying the part was skipped and how to get a browser.
The policy and the sampler are seeded; the browser's timing can still move a
step now and then, so two runs agree on the shape of the results, not byte for byte.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import math
import shutil
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from replaystore.atomic import atomic_write_bytes
from replaystore.pipeline.blocklist import Blocklist, normalize_domain
from replaystore.pipeline.task_history import TaskHistory
from replaystore.pipeline.task_sampler import TaskSampler
from replaystore.trajectories import TrajectoryBuffer, TrajectoryStorage
from replaystore.trajectories.context import ConversationBuilder
from replaystore.trajectories.export import ExportReport, export_llamafactory, validate_record

__all__ = [
    "POLICY_LINE",
    "DemoConfig",
    "DemoResult",
    "IterationSummary",
    "run",
    "run_loop",
    "summary_lines",
]

logger = logging.getLogger("replaystore.demos.trajectories")

#: The suite's anti-bot site (its tasks end blocked at the first screenshot).
BLOCKING_SITE = "botwall.localhost"


@dataclass(slots=True)
class DemoConfig:
    """Size of the run (defaults: the full demo, about a minute on 2 cores).

    Attributes:
        seed: seeds the sampler and the scripted policy's mistakes.
        iterations: rollout iterations.
        tasks_per_iteration: tasks drawn per iteration over all ranks (None:
            every task not on the blocklist).
        world_size: rollout ranks (each runs its own collector on the shared pool).
        workers: browser contexts at once (the ranks share them).
        viewport: screenshot size in CSS pixels.
        max_steps: step budget per difficulty (WebGym's easy/medium/hard).
        mistake_rate, wrong_answer_rate, improvement: the scripted policy's
            skill (see :class:`~replaystore.rollouts.scripted.ScriptedPolicy`).
        train_samples: steps drawn from the buffer for the export.
        recency_bias_power: the draw's recency bias.
        val_ratio: share of exported records in the validation split.
    """

    seed: int = 7
    iterations: int = 4
    tasks_per_iteration: int | None = None
    world_size: int = 2
    workers: int = 4
    viewport: tuple[int, int] = (800, 560)
    max_steps: dict[str, int] = field(default_factory=lambda: {"easy": 8, "medium": 10, "hard": 12})
    mistake_rate: float = 0.3
    wrong_answer_rate: float = 0.6
    improvement: float = 0.18
    train_samples: int = 64
    recency_bias_power: float = 2.0
    val_ratio: float = 0.1

    @classmethod
    def quick(cls) -> DemoConfig:
        """Seconds, not a minute: 3 iterations of 6 tasks, small pages, a faster learner."""
        return cls(
            iterations=3,
            tasks_per_iteration=6,
            viewport=(640, 420),
            max_steps={"easy": 6, "medium": 8, "hard": 10},
            wrong_answer_rate=0.7,
            improvement=0.35,
            train_samples=24,
        )


@dataclass(slots=True)
class IterationSummary:
    """What one rollout iteration did (both ranks together).

    ``rollouts`` counts started tasks; ``dummy`` those whose website did not
    load (WebGym's one-step invalid-URL trajectory, not an attempt).
    """

    iteration: int
    rollouts: int
    dummy: int
    successful: int
    blocked: int
    websites: Counter[str]
    blocked_domains_before: list[str]
    steps: int
    seconds: float
    statuses: Counter[str]
    overhead_s: float

    @property
    def success_rate(self) -> float:
        """Successful / non-dummy trajectories (blocked rollouts count as failures)."""
        valid = self.rollouts - self.dummy
        return self.successful / valid if valid else 0.0

    @property
    def steps_per_second(self) -> float:
        """Browser steps over the iteration's wall time."""
        return self.steps / self.seconds if self.seconds > 0 else 0.0


@dataclass(slots=True)
class DemoResult:
    """Everything :func:`run_loop` reports (paths are absolute)."""

    out: Path
    tasks_file: Path
    num_tasks: int
    websites: list[str]
    browser: str
    iterations: list[IterationSummary]
    blocked_domains: list[str]
    blocked_tasks: int
    history_levels: dict[int, int]
    storage_root: Path
    storage_stats: dict[str, Any]
    buffer_stats: dict[str, Any]
    prompts_stored: int
    prompts_built: int
    prompts_identical: int
    sampled: int
    recency_bias_power: float
    sampled_mean_iteration: float
    eligible_mean_iteration: float
    export: ExportReport
    records_validated: int
    plot: Path
    seconds: dict[str, float] = field(default_factory=dict)


# --------------------------------------------------------------------------- the loop


def _fresh(out: Path) -> None:
    """Remove the outputs of a previous run (iteration files are immutable)."""
    for name in ("storage", "screenshots", "llamafactory"):
        shutil.rmtree(out / name, ignore_errors=True)
    for name in (
        "tasks.jsonl",
        "blocklist.jsonl",
        "blocklist.jsonl.lock",
        "task_history.json",
        "success_rate.png",
    ):
        (out / name).unlink(missing_ok=True)


async def _iteration(
    iteration: int,
    cfg: DemoConfig,
    sampler: TaskSampler,
    make_collector: Any,
    storage: TrajectoryStorage,
    blocklist: Blocklist,
) -> IterationSummary:
    """Sample, roll out every rank's share at once, merge the rank files."""
    blocked_before = sorted(blocklist.get_blocked_domains())
    eligible = int((~sampler.blocked_mask()).sum())
    n = eligible if cfg.tasks_per_iteration is None else min(cfg.tasks_per_iteration, eligible)
    shares = [
        # Every rank draws the same sample (same seed) and keeps its own disjoint share.
        sampler.sample_train(
            n,
            rank=rank,
            world_size=cfg.world_size,
            seed=np.random.default_rng([cfg.seed, iteration]),
        )
        for rank in range(cfg.world_size)
    ]
    started = time.perf_counter()
    results = await asyncio.gather(
        *(
            make_collector(rank).run_iteration(share, iteration, rank=rank)
            for rank, share in enumerate(shares)
            if share
        )
    )
    seconds = time.perf_counter() - started
    storage.merge_ranks(iteration)
    outcomes = [o for result in results for o in result.outcomes]
    summary = IterationSummary(
        iteration=iteration,
        rollouts=len(outcomes),
        dummy=sum(o.status == "navigation_error" for o in outcomes),
        successful=sum(o.reward >= 1.0 for o in outcomes),
        blocked=sum(o.status == "blocked" for o in outcomes),
        websites=Counter(normalize_domain(o.task.website) for o in outcomes),
        blocked_domains_before=blocked_before,
        steps=sum(result.steps for result in results),
        seconds=seconds,
        statuses=Counter(o.status for o in outcomes),
        overhead_s=sum(result.timings.get("overhead", 0.0) for result in results),
    )
    logger.info(
        "iteration %d: %d rollouts, success %.0f%%, %.1f steps/s",
        iteration,
        summary.rollouts,
        100 * summary.success_rate,
        summary.steps_per_second,
    )
    return summary


async def run_loop(out: Path, cfg: DemoConfig) -> DemoResult:
    """Run the whole loop under ``out`` (see the module docstring); returns what happened.

    Outputs of a previous run in ``out`` are replaced (only once a browser is running).

    Raises:
        BrowserUnavailableError: no Chromium to launch (its message says how to get one).
        ImportError: Playwright is not installed (the message names the extra).
        RuntimeError: an exported record fails LLaMA-Factory's checks when re-read.
    """
    from replaystore.rollouts.browser import BrowserPool
    from replaystore.rollouts.collector import RolloutCollector
    from replaystore.rollouts.evaluator import Evaluator
    from replaystore.rollouts.policy import WebAgent
    from replaystore.rollouts.scripted import ScriptedPolicy
    from replaystore.rollouts.sites import LocalSuite

    out = Path(out).absolute()
    out.mkdir(parents=True, exist_ok=True)
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    async with BrowserPool(cfg.workers, viewport=cfg.viewport) as pool:
        seconds["browser"] = time.perf_counter() - start
        _fresh(out)
        with LocalSuite() as suite:
            start = time.perf_counter()
            tasks_file = suite.write_tasks(out / "tasks.jsonl")
            blocklist = Blocklist(out / "blocklist.jsonl")
            history = TaskHistory()
            sampler = TaskSampler(tasks_file, history=history, blocklist=blocklist, seed=cfg.seed)
            storage = TrajectoryStorage(out / "storage")
            policy = ScriptedPolicy(
                seed=cfg.seed,
                mistake_rate=cfg.mistake_rate,
                wrong_answer_rate=cfg.wrong_answer_rate,
                improvement=cfg.improvement,
            )
            agent = WebAgent(policy, image_urls="file")
            evaluator = Evaluator()

            def make_collector(rank: int) -> RolloutCollector:
                return RolloutCollector(
                    agent,
                    evaluator,
                    storage,
                    pool=pool,
                    # Every rank may use every context: the pool bounds them all together,
                    # so a rank whose share finishes first leaves its contexts to the other.
                    num_workers=cfg.workers,
                    max_steps_by_difficulty=cfg.max_steps,
                    blocklist=blocklist,
                    task_history=history,
                    screenshot_root=out / "screenshots",
                    progress=False,
                    handle_sigint=False,  # two collectors share the loop: Ctrl-C ends the demo
                )

            summaries = [
                await _iteration(it, cfg, sampler, make_collector, storage, blocklist)
                for it in range(1, cfg.iterations + 1)
            ]
            history.save(out / "task_history.json")
            seconds["rollouts"] = time.perf_counter() - start
            websites = sorted({normalize_domain(t.website) for t in sampler.tasks})
            num_tasks = len(sampler.tasks)
            browser = pool.browser_version
    start = time.perf_counter()
    prompts_stored, identical, prompts_built = _check_stored_prompts(
        storage, agent.conversation_builder
    )
    buffer = TrajectoryBuffer.from_storage(
        storage.root,
        agent=agent,
        filter_successful_only=True,
        filter_same_screenshot=True,
        seed=cfg.seed,
    )
    eligible = buffer.training_positions(None)
    samples = buffer.get_training_samples(
        cfg.train_samples, recency_bias_power=cfg.recency_bias_power, seed=cfg.seed
    )
    seconds["buffer"] = time.perf_counter() - start

    start = time.perf_counter()
    report, validated = _export_and_validate(samples, out / "llamafactory", cfg)
    plot = out / "success_rate.png"
    _plot(summaries, plot)
    seconds["export"] = time.perf_counter() - start
    stored = {r["iteration"]: int(r["steps"]) for r in storage.stats()["iterations"]}
    steps_per_iteration = [stored.get(s.iteration, 0) for s in summaries]
    return DemoResult(
        out=out,
        tasks_file=tasks_file,
        num_tasks=num_tasks,
        websites=websites,
        browser=browser,
        iterations=summaries,
        blocked_domains=sorted(blocklist.get_blocked_domains()),
        blocked_tasks=int(sampler.blocked_mask().sum()),
        history_levels=history.level_distribution(sampler.tasks),
        storage_root=storage.root,
        storage_stats=storage.stats(),
        buffer_stats=buffer.stats.as_dict(),
        prompts_stored=prompts_stored,
        prompts_built=prompts_built,
        prompts_identical=identical,
        sampled=len(samples),
        recency_bias_power=cfg.recency_bias_power,
        sampled_mean_iteration=_mean_iteration(samples.positions, steps_per_iteration),
        eligible_mean_iteration=_mean_iteration(eligible, steps_per_iteration),
        export=report,
        records_validated=validated,
        plot=plot,
        seconds=seconds,
    )


def _check_stored_prompts(
    storage: TrajectoryStorage, builder: ConversationBuilder
) -> tuple[int, int, int]:
    """(steps with a stored prompt, of those identical to a rebuild from storage, steps
    where the model was asked but no prompt was stored).

    A stored prompt equal to what the builder makes from the *stored* steps shows
    the storage keeps everything a prompt depends on: what is trained on is what
    the model saw. Steps the model was never asked about (an anti-bot page ends
    the task before the policy is called: empty reply) are not counted.
    """
    stored = identical = missing = 0
    for trajectory in storage.load_all():
        for s, step in enumerate(trajectory):
            observation = step["observation"]
            if not observation.image_path or not step["response"].raw_response:
                continue  # a dummy or a blocked page: no model call, never a sample
            if not step["response"].raw_prompt:
                missing += 1
                continue
            stored += 1
            rebuilt = builder.build(observation.task, trajectory[:s], observation)
            identical += int(rebuilt == json.loads(step["response"].raw_prompt))
    return stored, identical, missing


def _export_and_validate(
    samples: Sequence[dict[str, Any]], out: Path, cfg: DemoConfig
) -> tuple[ExportReport, int]:
    """Export a ShareGPT dataset, then re-read every record file and validate each record.

    Raises:
        RuntimeError: a record read back fails LLaMA-Factory's checks.
    """
    report = export_llamafactory(
        samples,
        out,
        dataset_name="webagent_demo",
        format="sharegpt",
        val_ratio=cfg.val_ratio,
        seed=cfg.seed,
        copy_images=True,
    )
    problems: list[str] = []
    validated = 0
    info = json.loads(report.dataset_info_file.read_text(encoding="utf-8"))
    for name in (report.dataset_name, f"{report.dataset_name}_val"):
        if name not in info:
            continue
        records = json.loads((report.out_dir / info[name]["file_name"]).read_text("utf-8"))
        for i, record in enumerate(records):
            for problem in validate_record(record, "sharegpt", report.out_dir):
                problems.append(f"{name}[{i}]: {problem}")
            validated += 1
    if problems:
        raise RuntimeError(f"exported records fail LLaMA-Factory's checks: {problems[:5]}")
    return report, validated


def _mean_iteration(positions: NDArray[np.int64], steps_per_iteration: list[int]) -> float:
    """Mean rollout iteration of buffer positions (the buffer keeps collection order)."""
    if positions.size == 0:
        return math.nan
    bounds = np.cumsum(steps_per_iteration)
    return float((np.searchsorted(bounds, positions, side="right") + 1).mean())


def _plot(iterations: list[IterationSummary], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [it.iteration for it in iterations]
    y = [100.0 * it.success_rate for it in iterations]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(x, y, marker="o", color="C0")
    ax.set_xticks(x)
    ax.set_ylim(0, 100)
    ax.set_xlabel("rollout iteration")
    ax.set_ylabel("success rate (%)")
    ax.set_title("Scripted policy (fixed schedule, no model trained): success rate")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())


def _percent(x: float) -> str:
    return f"{100.0 * x:.0f}%"


#: The first line of this part's output: where its success rates come from.
POLICY_LINE = (
    "policy: scripted (ScriptedPolicy; its mistakes get rarer on a fixed schedule per "
    "iteration: no model is trained here; see 'replaystore demo --part loop' for a trained model)"
)


def summary_lines(result: DemoResult) -> list[str]:
    """The lines ``replaystore demo`` prints for this part (the first: :data:`POLICY_LINE`)."""
    r = result
    rates = " -> ".join(_percent(it.success_rate) for it in r.iterations)
    lines = [
        POLICY_LINE,
        f"local website suite: {r.num_tasks} tasks over {len(r.websites)} websites, "
        f"difficulty 1-3 ({r.tasks_file}); headless Chromium {r.browser}",
    ]
    for it in r.iterations:
        valid = it.rollouts - it.dummy
        blocked = f", {it.blocked} hit an anti-bot page" if it.blocked else ""
        dummy = f", {it.dummy} failed to load" if it.dummy else ""
        skipped = (
            f"; sampled without {', '.join(it.blocked_domains_before)}"
            if it.blocked_domains_before
            else ""
        )
        lines.append(
            f"iteration {it.iteration}: {it.rollouts} browser rollouts on {len(it.websites)} "
            f"websites ({it.steps} steps, {it.steps_per_second:.1f} steps/s{blocked}{dummy}"
            f"{skipped}), success {it.successful}/{valid} = {_percent(it.success_rate)}"
        )
    lines.append(
        f"success rate per iteration: {rates} (the scripted schedule, not training; plot: {r.plot})"
    )
    blocked_in = [it.iteration for it in r.iterations if it.blocked]
    if blocked_in:
        after = [it for it in r.iterations if it.iteration > blocked_in[0]]
        leaked = sum(it.websites[d] for it in after for d in r.blocked_domains)
        lines.append(
            f"blocklist: {', '.join(r.blocked_domains)} recorded in iteration {blocked_in[0]} "
            f"({r.blocked_tasks} tasks excluded from later samples; rollouts there since: "
            f"{leaked})"
        )
    else:
        lines.append("blocklist: no website blocked the agent")
    levels = ", ".join(f"{k}: {v}" for k, v in r.history_levels.items())
    lines.append(f"task history attempt levels: {{{levels}}}")
    st = r.storage_stats
    lines.append(
        f"storage: {st['total_iterations']} iteration files, {st['total_trajectories']} "
        f"trajectories, {st['total_steps']} steps, {st['total_size_bytes'] / 1024:.0f} KiB "
        f"({r.storage_root}); screenshots in {r.out / 'screenshots'}"
    )
    b = r.buffer_stats
    lines.append(
        f"buffer: {b['samples']} steps, {b['eligible_samples']} training-eligible, "
        f"same-screenshot share {_percent(b['same_screenshot_share'])}, "
        f"{b['dummy_trajectories']} dummy trajectories dropped"
    )
    lines.append(
        f"prompts: {r.prompts_stored} stored at rollout, {r.prompts_identical} identical to the "
        f"agent's rebuild from the stored steps"
        + (f", {r.prompts_built} left to the buffer to build" if r.prompts_built else "")
    )
    lines.append(
        f"recency-biased sample (power {r.recency_bias_power:g}): {r.sampled} of "
        f"{b['eligible_samples']} eligible, "
        f"mean iteration {r.sampled_mean_iteration:.2f} (all eligible: "
        f"{r.eligible_mean_iteration:.2f})"
    )
    e = r.export
    val = f", {e.val_file} ({e.num_val} records)" if e.val_file is not None else ""
    lines.append(
        f"LLaMA-Factory ShareGPT export: {e.train_file} ({e.num_train} records){val}, "
        f"{e.dataset_info_file}, {e.images_written} images in {e.out_dir / 'images'}"
    )
    lines.append(
        f"re-read all {r.records_validated} records: every one passes LLaMA-Factory's "
        "ShareGPT checks (roles, <image> count, image files)"
    )
    t = r.seconds
    lines.append(
        f"time: browser start {t['browser']:.1f} s, rollouts {t['rollouts']:.1f} s, "
        f"buffer {t['buffer']:.1f} s, export {t['export']:.1f} s"
    )
    return lines


def run(out: Path, quick: bool) -> list[str]:
    """Run the web-agent loop in a real browser (quick: about 20 s on 2 cores; full: a minute).

    Without a browser (no Chromium, or Playwright not installed) nothing is
    written and the returned lines say the part was skipped and how to get one;
    the other demo parts still run.
    """
    from replaystore.rollouts.browser import BrowserUnavailableError

    cfg = DemoConfig.quick() if quick else DemoConfig()
    try:
        return summary_lines(asyncio.run(run_loop(out, cfg)))
    except BrowserUnavailableError as exc:
        why = str(exc)
    except ImportError as exc:
        if "replaystore[rollouts]" not in str(exc):
            raise
        why = str(exc)
    logger.warning("trajectories demo skipped: %s", why)
    return [
        f"SKIPPED (no browser): {why}",
        "the trajectories part needs a browser for its rollouts; the other parts still run",
    ]
