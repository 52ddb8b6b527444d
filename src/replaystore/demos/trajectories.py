"""Demo of ``replaystore.trajectories`` and ``replaystore.pipeline``: a web-agent RL loop, offline.

WebGym's pipeline (seed 002) is task sampler -> rollouts -> trajectory storage
-> replay buffer -> LLaMA-Factory. This part runs that loop for real on
generated data, with a scripted policy standing in for the model and the browser:

1. **Tasks and websites.** A JSONL task file over a few fake websites
   (``*.test`` domains) with difficulties 1-3, and Pillow-drawn screenshots:
   a few distinct pages per website, plus an anti-bot page for one website.
2. **Iterations.** Each iteration two rollout ranks draw their disjoint shares
   of the train sample with :class:`~replaystore.pipeline.task_sampler.TaskSampler`
   (website-uniform weights times attempt-level weights from
   :class:`~replaystore.pipeline.task_history.TaskHistory`; blocked websites
   excluded) and roll out a noisy scripted policy: each step looks at a page,
   thinks, clicks (sometimes on something that does not change the page, so
   the next screenshot repeats), and the last step submits an answer that is
   right with a probability that grows with the iteration (the policy
   "learns") and shrinks with difficulty. Now and then a page fails to load
   (WebGym's one-step "invalid URL" dummy trajectory). Rank 0 keeps each
   prompt in ``Response.raw_prompt`` (built with
   :class:`~replaystore.trajectories.context.ConversationBuilder`), rank 1
   does not, so the buffer rebuilds those with the agent's builder. Each rank
   writes its iteration file with :class:`~replaystore.trajectories.storage.TrajectoryStorage`,
   then the ranks are merged into one file per iteration.
3. **Blocklist.** One website shows an anti-bot page: its rollouts are
   recorded in the :class:`~replaystore.pipeline.blocklist.Blocklist` (with a
   simulated clock, so entries do not expire during the demo) and the next
   iterations' samples contain none of its tasks.
4. **Buffer and export.** :meth:`TrajectoryBuffer.from_storage` indexes every
   step (successful trajectories only, repeated screenshots filtered),
   ``get_training_samples(k, recency_bias_power=2.0)`` draws a recency-biased
   subset, and :func:`~replaystore.trajectories.export.export_llamafactory`
   writes a ShareGPT dataset (records, validation split, ``dataset_info.json``,
   copied screenshots) whose records are then re-read and validated.

Everything is seeded: the same mode gives the same files and the same summary.
"""

from __future__ import annotations

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
from PIL import Image, ImageDraw

from replaystore.atomic import atomic_write_bytes, atomic_write_text
from replaystore.pipeline.blocklist import Blocklist, normalize_domain
from replaystore.pipeline.task_history import TaskHistory
from replaystore.pipeline.task_sampler import TaskSampler
from replaystore.trajectories import TrajectoryBuffer, TrajectoryStorage
from replaystore.trajectories.components import Action, Observation, Reward, Task
from replaystore.trajectories.context import ConversationBuilder
from replaystore.trajectories.export import ExportReport, export_llamafactory, validate_record
from replaystore.trajectories.response_decomposer import ThinkActionParser, decompose_raw_response

__all__ = ["DemoConfig", "DemoResult", "run", "simulate"]

logger = logging.getLogger(__name__)

#: Simulated start time of the demo (2026-01-01T00:00:00Z): blocklist entries are
#: stamped with this clock, so the files are the same on every run.
SIM_EPOCH = 1_767_225_600.0
#: Simulated hours between two rollout iterations.
HOURS_PER_ITERATION = 2.0


@dataclass(frozen=True, slots=True)
class Website:
    """A fake website: its domain, task domain/subdomain, header colour and page names."""

    domain: str
    category: str
    subcategory: str
    colour: tuple[int, int, int]
    pages: tuple[str, ...]
    task_template: str
    blocks_agents: bool = False


WEBSITES: tuple[Website, ...] = (
    Website(
        "acme-shop.test",
        "Shopping",
        "Electronics",
        (34, 94, 168),
        ("Home", "Search results", "Product", "Cart"),
        "Find the price of the {item} on acme-shop",
    ),
    Website(
        "botwall-market.test",
        "Shopping",
        "Groceries",
        (160, 60, 40),
        ("Home", "Aisle", "Product"),
        "Check whether botwall-market has {item} in stock",
        blocks_agents=True,
    ),
    Website(
        "skyway-travel.test",
        "Travel",
        "Flights",
        (20, 140, 120),
        ("Home", "Flight search", "Results", "Fare details"),
        "Find the cheapest flight to {item} on skyway-travel",
    ),
    Website(
        "greenfork-recipes.test",
        "Food",
        "Recipes",
        (90, 140, 40),
        ("Home", "Recipe list", "Recipe"),
        "Find how long the {item} recipe takes on greenfork-recipes",
    ),
    Website(
        "citylib.test",
        "Education",
        "Library",
        (110, 70, 150),
        ("Home", "Catalogue", "Book record", "Availability"),
        "Find which branch of citylib holds {item}",
    ),
    Website(
        "metro-news.test",
        "News",
        "Local",
        (60, 60, 60),
        ("Front page", "Section", "Article"),
        "Find the headline of the latest {item} story on metro-news",
    ),
)

ITEMS = (
    "red kettle",
    "USB-C cable",
    "Lisbon",
    "oat cookies",
    "Dune",
    "weather",
    "desk lamp",
    "Oslo",
    "lentil soup",
    "Middlemarch",
    "transport",
    "headphones",
)


@dataclass(slots=True)
class DemoConfig:
    """Size of the simulated run (defaults: the full demo)."""

    seed: int = 7
    num_websites: int = 6
    tasks_per_website: int = 40
    iterations: int = 6
    rollouts_per_iteration: int = 64
    world_size: int = 2
    train_samples: int = 200
    recency_bias_power: float = 2.0
    val_ratio: float = 0.1
    failed_load_probability: float = 0.04
    history_window: int = 3

    @classmethod
    def quick(cls) -> DemoConfig:
        """A few seconds: 4 websites, 3 iterations of 16 rollouts."""
        return cls(
            num_websites=4,
            tasks_per_website=12,
            iterations=3,
            rollouts_per_iteration=16,
            train_samples=24,
            failed_load_probability=0.06,
        )

    def success_probability(self, iteration: int, difficulty: int, offset: float) -> float:
        """The scripted policy's chance to solve a task: grows with iteration, falls with
        difficulty; ``offset`` is the task's own small bias."""
        progress = (iteration - 1) / max(1, self.iterations - 1)
        p = 0.1 + 0.7 * progress - 0.1 * (difficulty - 1) + offset
        return float(min(0.95, max(0.02, p)))


@dataclass(slots=True)
class IterationSummary:
    """What one rollout iteration did."""

    iteration: int
    rollouts: int
    dummy: int
    successful: int
    blocked: int
    websites: Counter[str]
    blocked_domains_before: list[str]

    @property
    def success_rate(self) -> float:
        """Successful / non-dummy trajectories (blocked rollouts count as failures)."""
        valid = self.rollouts - self.dummy
        return self.successful / valid if valid else 0.0


@dataclass(slots=True)
class DemoResult:
    """Everything :func:`run` reports (paths are absolute)."""

    out: Path
    tasks_file: Path
    num_tasks: int
    websites: list[str]
    num_page_images: int
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


class ScriptedAgent:
    """The policy's prompt side, as WebGym's ``WebAgent`` exposes it to the buffer."""

    def __init__(self, history_window: int) -> None:
        self.conversation_builder = ConversationBuilder(history_window=history_window)


# --------------------------------------------------------------------------- generation


def _draw_page(site: Website, page: int, blocked: bool = False) -> bytes:
    """A 320x200 PNG of one page of ``site`` (distinct pixels per page)."""
    image = Image.new("RGB", (320, 200), (246, 246, 246))
    draw = ImageDraw.Draw(image)
    draw.rectangle((0, 0, 319, 28), fill=site.colour)
    draw.text((8, 8), site.domain, fill=(255, 255, 255))
    if blocked:
        draw.rectangle((60, 60, 260, 150), outline=(200, 0, 0), width=3)
        draw.text((80, 75), "Are you a robot?", fill=(200, 0, 0))
        draw.text((80, 100), "Complete the CAPTCHA", fill=(60, 60, 60))
        draw.rectangle((80, 120, 96, 136), outline=(60, 60, 60))
    else:
        draw.text((8, 38), site.pages[page], fill=(20, 20, 20))
        for row in range(page + 2):
            top = 60 + row * 28
            draw.rectangle((8, top, 200 - 20 * page, top + 18), fill=(215, 222, 232))
            draw.text((12, top + 3), f"{site.pages[page]} item {row + 1}", fill=(40, 40, 40))
        draw.rectangle((230, 60, 310, 60 + 30 * (page + 1)), fill=site.colour)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _write_screenshots(
    root: Path, websites: tuple[Website, ...]
) -> tuple[dict[str, list[Path]], dict[str, Path]]:
    """Page images per website and the anti-bot page of blocking websites."""
    pages: dict[str, list[Path]] = {}
    walls: dict[str, Path] = {}
    for site in websites:
        folder = root / site.domain
        folder.mkdir(parents=True, exist_ok=True)
        pages[site.domain] = []
        for k in range(len(site.pages)):
            path = folder / f"page_{k}.png"
            atomic_write_bytes(path, _draw_page(site, k))
            pages[site.domain].append(path)
        if site.blocks_agents:
            wall = folder / "captcha.png"
            atomic_write_bytes(wall, _draw_page(site, 0, blocked=True))
            walls[site.domain] = wall
    return pages, walls


def _make_tasks(cfg: DemoConfig, websites: tuple[Website, ...]) -> list[Task]:
    rng = np.random.default_rng([cfg.seed, 1])
    tasks = []
    for site in websites:
        short = site.domain.split(".")[0]
        for k in range(cfg.tasks_per_website):
            item = ITEMS[int(rng.integers(len(ITEMS)))]
            difficulty = 1 + k % 3
            answer = f"{item} answer {k}"
            tasks.append(
                Task(
                    task_name=site.task_template.format(item=item) + f" (#{k})",
                    domain=site.category,
                    subdomain=site.subcategory,
                    website=f"https://www.{site.domain}/",
                    difficulty=difficulty,
                    evaluator_reference=[
                        {"description": f"the answer names {item}", "facts": [answer]}
                    ],
                    reference_answer=answer,
                    task_id=f"{short}-{k:03d}",
                    max_steps=3 + 2 * difficulty,
                )
            )
    return tasks


def _write_tasks(path: Path, tasks: list[Task]) -> None:
    lines = [json.dumps(task.to_dict(), ensure_ascii=False) for task in tasks]
    atomic_write_text(path, "\n".join(lines) + "\n")


# --------------------------------------------------------------------------- rollouts


class _Rollout:
    """One scripted episode: a list of WebGym step mappings."""

    def __init__(
        self,
        site: Website,
        pages: list[Path],
        wall: Path | None,
        builder: ConversationBuilder | None,
        rng: np.random.Generator,
    ) -> None:
        self.site = site
        self.pages = pages
        self.wall = wall
        self.builder = builder
        self.rng = rng
        self.parser = ThinkActionParser()

    def _observation(self, task: Task, page: int, image: Path, title: str) -> Observation:
        tree = "\n".join(
            ["[1] link 'Home'", "[2] searchbox 'Search'"]
            + [f"[{i + 3}] link '{self.site.pages[page]} item {i + 1}'" for i in range(page + 2)]
        )
        metadata = {
            "url": f"https://{self.site.domain}/{self.site.pages[page].lower().replace(' ', '-')}",
            "title": title,
            "viewport": [1280, 800],  # stripped by the storage (title and url are kept)
            "load_ms": int(self.rng.integers(80, 400)),
        }
        return Observation(task, str(image), tree, metadata)

    def _step(
        self,
        task: Task,
        history: list[dict[str, Any]],
        observation: Observation,
        thought: str,
        action: dict[str, Any],
        action_string: str,
        reward: Reward,
    ) -> dict[str, Any]:
        raw = f"<think>{thought}</think>\nAction: {action_string}"
        prompt = ""
        if self.builder is not None:
            prompt = json.dumps(self.builder.build(task, history, observation), ensure_ascii=False)
        response = decompose_raw_response(raw, self.parser, raw_prompt=prompt)
        return {
            "observation": observation,
            "action": Action(action, action_string),
            "response": response,
            "reward": reward,
        }

    def blocked(self, task: Task) -> list[dict[str, Any]]:
        """The anti-bot page on the first load: one step, blocked, reward 0."""
        assert self.wall is not None
        observation = self._observation(task, 0, self.wall, "Access denied")
        observation.page_metadata["url"] = f"https://{self.site.domain}/captcha"
        reward = Reward(0.0, {"judge": "blocked by an anti-bot page"}, is_blocked=True)
        return [
            self._step(
                task,
                [],
                observation,
                "The site asks me to prove I am human; I cannot continue.",
                {"key": "stop", "reason": "blocked"},
                "stop [blocked]",
                reward,
            )
        ]

    def failed_load(self, task: Task) -> list[dict[str, Any]]:
        """WebGym's placeholder for a page that did not load: one dummy step."""
        observation = Observation(task, "", None, {"url": task.website, "title": ""})
        return [
            {
                "observation": observation,
                "action": Action({"key": "invalid_url"}, "Invalid URL"),
                "response": decompose_raw_response(
                    "<think>The page did not load.</think>\nAction: stop", self.parser
                ),
                "reward": Reward(0.0, {"judge": "page failed to load"}),
            }
        ]

    def episode(self, task: Task, p_success: float) -> tuple[list[dict[str, Any]], bool]:
        """Walk the site's pages (sometimes clicking without effect), then submit."""
        rng = self.rng
        n_steps = int(min(task.max_steps or 4, 1 + int(task.difficulty) + rng.integers(0, 3)))
        solved = bool(rng.random() < p_success)
        steps: list[dict[str, Any]] = []
        page = 0
        for s in range(n_steps):
            title = f"{self.site.domain} - {self.site.pages[page]}"
            observation = self._observation(task, page, self.pages[page], title)
            last = s == n_steps - 1
            if last:
                answer = task.reference_answer if solved else "not found"
                reward = Reward(
                    1.0 if solved else 0.0,
                    {"judge": "answer matches the reference" if solved else "wrong answer"},
                    submit=True,
                    submission_judgment="correct" if solved else "incorrect",
                )
                steps.append(
                    self._step(
                        task,
                        steps,
                        observation,
                        f"The {self.site.pages[page]} page should have what I need.",
                        {"key": "answer", "text": answer},
                        f"answer [{answer}]",
                        reward,
                    )
                )
                break
            moves = rng.random() < 0.7 and page + 1 < len(self.pages)
            element = 3 + int(rng.integers(0, page + 2)) if moves else 1 + int(rng.integers(0, 2))
            thought = f"I am on the {self.site.pages[page]} page; " + (
                "the next page looks closer to the goal." if moves else "let me try this."
            )
            steps.append(
                self._step(
                    task,
                    steps,
                    observation,
                    thought,
                    {"key": "click", "element": element},
                    f"click [{element}]",
                    Reward(0.0, None),
                )
            )
            if moves:
                page += 1
        return steps, solved


# --------------------------------------------------------------------------- the loop


def _task_offsets(cfg: DemoConfig, tasks: list[Task]) -> dict[str, float]:
    rng = np.random.default_rng([cfg.seed, 2])
    return {str(t.task_id): float(rng.uniform(-0.08, 0.08)) for t in tasks}


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
    ax.set_title("Scripted web agent: success rate per iteration")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())


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


@dataclass(slots=True)
class _World:
    """The generated environment: websites, their page images, the tasks."""

    websites: tuple[Website, ...]
    pages: dict[str, list[Path]]
    walls: dict[str, Path]
    tasks_file: Path
    tasks: list[Task]

    def site(self, task: Task) -> Website:
        return next(s for s in self.websites if normalize_domain(task.website) == s.domain)


def _build_world(out: Path, cfg: DemoConfig) -> _World:
    websites = WEBSITES[: cfg.num_websites]
    if not any(site.blocks_agents for site in websites):
        raise ValueError(
            f"num_websites={cfg.num_websites}: the demo needs at least 2 websites "
            "(the second one blocks agents)"
        )
    pages, walls = _write_screenshots(out / "screenshots", websites)
    tasks = _make_tasks(cfg, websites)
    tasks_file = out / "tasks.jsonl"
    _write_tasks(tasks_file, tasks)
    return _World(websites, pages, walls, tasks_file, tasks)


def _roll_out(
    cfg: DemoConfig,
    world: _World,
    sampler: TaskSampler,
    history: TaskHistory,
    blocklist: Blocklist,
    clock: list[float],
    storage: TrajectoryStorage,
    agent: ScriptedAgent,
) -> tuple[list[IterationSummary], list[int]]:
    """All rollout iterations; returns their summaries and non-dummy steps per iteration."""
    offsets = _task_offsets(cfg, world.tasks)
    summaries: list[IterationSummary] = []
    steps_per_iteration: list[int] = []
    for iteration in range(1, cfg.iterations + 1):
        clock[0] = SIM_EPOCH + (iteration - 1) * HOURS_PER_ITERATION * 3600.0
        blocked_before = sorted(blocklist.get_blocked_domains())
        summary = IterationSummary(iteration, 0, 0, 0, 0, Counter(), blocked_before)
        attempts: list[list[dict[str, Any]]] = []  # what the task history counts
        for rank in range(cfg.world_size):
            # Every rank draws the same sample and keeps its own disjoint share.
            share = sampler.sample_train(
                cfg.rollouts_per_iteration,
                rank=rank,
                world_size=cfg.world_size,
                seed=[cfg.seed, iteration],
            )
            rng = np.random.default_rng([cfg.seed, iteration, rank])
            # Rank 0 keeps its prompts; rank 1 saves space and leaves them to the buffer.
            builder = agent.conversation_builder if rank == 0 else None
            trajectories = []
            for task in share:
                site = world.site(task)
                rollout = _Rollout(
                    site, world.pages[site.domain], world.walls.get(site.domain), builder, rng
                )
                summary.rollouts += 1
                summary.websites[site.domain] += 1
                if site.blocks_agents:
                    trajectory = rollout.blocked(task)
                    observation = trajectory[0]["observation"]
                    blocklist.record_blocked_website(
                        observation.page_metadata["url"],
                        task_id=task.task_id,
                        screenshot_path=observation.image_path,
                    )
                    summary.blocked += 1
                    attempts.append(trajectory)
                elif rng.random() < cfg.failed_load_probability:
                    trajectory = rollout.failed_load(task)  # a dummy: not an attempt
                    summary.dummy += 1
                else:
                    p = cfg.success_probability(
                        iteration, int(task.difficulty), offsets[str(task.task_id)]
                    )
                    trajectory, solved = rollout.episode(task, p)
                    summary.successful += int(solved)
                    attempts.append(trajectory)
                trajectories.append(trajectory)
            storage.save_iteration(
                iteration,
                trajectories,
                rank=rank,
                metadata={
                    "policy": "scripted-demo",
                    "keeps_prompts": builder is not None,
                    "sampled_task_ids": [t.task_id for t in share],
                    "blocked_domains_at_sampling": blocked_before,
                },
            )
        storage.merge_ranks(iteration)
        history.update(attempts)
        summaries.append(summary)
        steps_per_iteration.append(sum(len(t) for t in attempts))
    return summaries, steps_per_iteration


def _check_stored_prompts(
    storage: TrajectoryStorage, builder: ConversationBuilder
) -> tuple[int, int, int]:
    """(steps with a stored prompt, of those identical to a rebuild from storage, steps without).

    A stored prompt equal to what the builder makes from the *stored* steps shows
    the storage keeps everything a prompt depends on.
    """
    stored = identical = missing = 0
    for trajectory in storage.load_all():
        for s, step in enumerate(trajectory):
            observation = step["observation"]
            if not observation.image_path:
                continue  # a dummy: never a sample
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


def simulate(out: Path, cfg: DemoConfig) -> DemoResult:
    """Run the whole loop under ``out`` (see the module docstring); returns what happened.

    Outputs of a previous run in ``out`` are replaced.

    Raises:
        ValueError: ``cfg.num_websites < 2``.
        RuntimeError: an exported record fails LLaMA-Factory's checks when re-read.
    """
    out = Path(out).absolute()
    out.mkdir(parents=True, exist_ok=True)
    _fresh(out)
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    world = _build_world(out, cfg)
    clock = [SIM_EPOCH]  # simulated time: entries stay blocked for the whole demo
    blocklist = Blocklist(
        out / "blocklist.jsonl", block_duration_hours=12.0, clock=lambda: clock[0]
    )
    history = TaskHistory()
    sampler = TaskSampler(world.tasks_file, history=history, blocklist=blocklist, seed=cfg.seed)
    storage = TrajectoryStorage(out / "storage")
    agent = ScriptedAgent(cfg.history_window)
    seconds["generate"] = time.perf_counter() - start

    start = time.perf_counter()
    summaries, steps_per_iteration = _roll_out(
        cfg, world, sampler, history, blocklist, clock, storage, agent
    )
    history.save(out / "task_history.json")
    seconds["rollouts"] = time.perf_counter() - start

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

    return DemoResult(
        out=out,
        tasks_file=world.tasks_file,
        num_tasks=len(world.tasks),
        websites=[w.domain for w in world.websites],
        num_page_images=sum(len(v) for v in world.pages.values()) + len(world.walls),
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


def _percent(x: float) -> str:
    return f"{100.0 * x:.0f}%"


def summary_lines(result: DemoResult) -> list[str]:
    """The lines ``replaystore demo`` prints for this part."""
    r = result
    rates = " -> ".join(_percent(it.success_rate) for it in r.iterations)
    lines = [
        f"tasks: {r.num_tasks} over {len(r.websites)} websites, difficulty 1-3 ({r.tasks_file}); "
        f"{r.num_page_images} Pillow-drawn page images",
    ]
    for it in r.iterations:
        valid = it.rollouts - it.dummy
        blocked = f", {it.blocked} hit an anti-bot page" if it.blocked else ""
        skipped = (
            f"; sampled without {', '.join(it.blocked_domains_before)}"
            if it.blocked_domains_before
            else ""
        )
        lines.append(
            f"iteration {it.iteration}: {it.rollouts} rollouts on {len(it.websites)} websites "
            f"({it.dummy} failed to load{blocked}{skipped}), success {it.successful}/{valid} = "
            f"{_percent(it.success_rate)}"
        )
    lines.append(f"success rate per iteration: {rates} (plot: {r.plot})")
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
        f"({r.storage_root})"
    )
    b = r.buffer_stats
    lines.append(
        f"buffer: {b['samples']} steps, {b['eligible_samples']} training-eligible, "
        f"same-screenshot share {_percent(b['same_screenshot_share'])}, "
        f"{b['dummy_trajectories']} dummy trajectories dropped"
    )
    lines.append(
        f"prompts: {r.prompts_stored} kept at rollout ({r.prompts_identical} identical to the "
        f"agent's rebuild), {r.prompts_built} built by the agent's ConversationBuilder on access"
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
        f"time: generate {t['generate']:.1f} s, rollouts {t['rollouts']:.1f} s, "
        f"buffer {t['buffer']:.1f} s, export {t['export']:.1f} s"
    )
    return lines


def run(out: Path, quick: bool) -> list[str]:
    """Run the web-agent loop (quick: a few seconds; full: well under a minute)."""
    cfg = DemoConfig.quick() if quick else DemoConfig()
    return summary_lines(simulate(out, cfg))
