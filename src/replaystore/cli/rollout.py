"""``replaystore rollout``: one web-agent rollout iteration in a real browser."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from replaystore.cli._common import Parser, UsageError, int_at_least, positive_seconds

__all__ = ["DESCRIPTION", "add_arguments", "blocklist_skip_line", "run"]

DESCRIPTION = (
    "Roll out tasks in headless Chromium (system Chromium, REPLAYSTORE_CHROMIUM, "
    "or --cdp URLs of running browsers) with a policy, evaluate the answers, and store the "
    "trajectories under OUT/storage (one file per iteration and rank). Anti-bot sites go "
    "to OUT/blocklist.jsonl, attempts to OUT/task_history.json. Ctrl-C stops and keeps "
    "every finished trajectory. With --ray ADDRESS the tasks run on a Ray cluster's actors "
    "(each its own Chromium and local task server); this process stores what they send "
    "back. Needs the rollouts extra (and ray for --ray)."
)


def add_arguments(parser: Parser) -> None:
    """The options of ``replaystore rollout``."""
    parser.add_argument(
        "--tasks",
        default="suite",
        help="task file (JSONL/CSV/Parquet), 'suite' (default): the bundled local website "
        "suite, or MiniWoB++ tasks: miniwob:click-button,enter-text (miniwob:experts: the 18 "
        "with a scripted expert; needs the miniwob extra), each once per --seeds seed",
    )
    parser.add_argument(
        "--seeds",
        metavar="A-B",
        help="MiniWoB++ seeds: a range 1000-1049, a list 1,2,7, or both (1-5,9); "
        "required with --tasks miniwob:..., refused otherwise",
    )
    parser.add_argument("--policy", choices=("scripted", "openai"), default="scripted")
    parser.add_argument(
        "--base-url", help="OpenAI-compatible server, e.g. http://HOST:8000/v1 (vLLM)"
    )
    parser.add_argument("--model", help="model name the server serves")
    parser.add_argument("--api-key", help="API key for the server (vLLM: any value unless set)")
    parser.add_argument(
        "--observation",
        choices=("screenshot", "text"),
        default="screenshot",
        help="what the model is shown: 'screenshot' (default: screenshot, accessibility tree "
        "and URL) or 'text' (accessibility tree and URL; for a text-only model)",
    )
    parser.add_argument(
        "--workers", type=int_at_least(1), default=4, help="browser contexts at once (default 4)"
    )
    parser.add_argument("--iteration", type=int, help="iteration number (default: the next one)")
    parser.add_argument("--rank", type=int, default=0, help="this process's rank (default 0)")
    parser.add_argument(
        "--max-tasks",
        type=int_at_least(1),
        help="roll out only the first N tasks not on the blocklist",
    )
    parser.add_argument(
        "--step-timeout",
        type=positive_seconds,
        default=120.0,
        metavar="S",
        help="seconds one step (screenshot, model, action) may take (default 120); a cut "
        "step keeps its screenshot, prompt and the model's reply",
    )
    parser.add_argument(
        "--request-timeout",
        type=positive_seconds,
        metavar="S",
        help="seconds one request to the model server may take (default 30; --policy openai); "
        "must be shorter than --step-timeout so that a timed-out request is retried",
    )
    parser.add_argument(
        "--task-timeout",
        type=positive_seconds,
        default=1800.0,
        metavar="S",
        help="seconds one task may take (default 1800)",
    )
    parser.add_argument(
        "--max-concurrency",
        type=int_at_least(1),
        default=8,
        metavar="N",
        help="requests in flight to the model server at once (default 8; --policy openai)",
    )
    parser.add_argument("--cdp", action="append", metavar="URL", help="CDP endpoint (repeatable)")
    parser.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="run on a Ray cluster: auto, local (a Ray started here), HOST:PORT of the head "
        "or ray://HOST:10001; every node needs replaystore[rollouts] and Chromium",
    )
    parser.add_argument(
        "--actors",
        type=int_at_least(1),
        metavar="N",
        help="Ray rollout actors, spread over the nodes (default 2; needs --ray)",
    )
    parser.add_argument(
        "--browsers-per-actor",
        type=int_at_least(1),
        metavar="N",
        help="browser contexts (tasks at once) per Ray actor (default 2; needs --ray)",
    )
    parser.add_argument(
        "--placement",
        choices=("spread", "pack"),
        help="Ray actor placement: spread over nodes (default) or pack (needs --ray)",
    )
    parser.add_argument("--out", required=True, help="run directory")
    parser.add_argument("--logger", choices=("none", "wandb", "tensorboard"), default="none")


def run(args: argparse.Namespace) -> int:
    """Run one rollout iteration and print its outcome; returns the exit status (130: Ctrl-C)."""
    import asyncio

    from replaystore.rollouts.chat_client import DEFAULT_REQUEST_TIMEOUT_S
    from replaystore.rollouts.miniwob import is_miniwob_spec

    if is_miniwob_spec(args.tasks) and not args.seeds:
        raise UsageError("--tasks miniwob:... needs --seeds (e.g. --seeds 1000-1049)")
    if args.seeds and not is_miniwob_spec(args.tasks):
        raise UsageError("--seeds is for MiniWoB++ tasks (--tasks miniwob:NAME,...)")
    ray_only = ("--actors", args.actors), ("--browsers-per-actor", args.browsers_per_actor)
    for flag, value in (*ray_only, ("--placement", args.placement)):
        if value is not None and not args.ray:
            raise UsageError(f"{flag} needs --ray ADDRESS")
    if args.ray and args.cdp:
        raise UsageError("--cdp and --ray exclude each other (Ray actors launch their browsers)")
    request_timeout = args.request_timeout or DEFAULT_REQUEST_TIMEOUT_S
    if request_timeout >= args.step_timeout:
        raise UsageError(
            f"--request-timeout {request_timeout:g} must be shorter than --step-timeout "
            f"{args.step_timeout:g} (a timed-out request is retried inside its step)"
        )
    try:
        from replaystore.rollouts.browser import BrowserUnavailableError, require_playwright
        from replaystore.rollouts.runner import rollout

        require_playwright()
    except ImportError as exc:
        print(f"replaystore rollout: {exc}", file=sys.stderr)
        return 2
    if args.ray:
        return _run_on_ray(args, request_timeout)
    try:
        result = asyncio.run(
            rollout(
                args.tasks,
                args.out,
                workers=args.workers,
                cdp_urls=args.cdp or None,
                **_rollout_options(args, request_timeout),
            )
        )
    except (BrowserUnavailableError, ImportError) as exc:  # no browser, or no miniwob package
        print(f"replaystore rollout: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before the iteration started, or after its file was written
        print("interrupted (Ctrl-C)", file=sys.stderr)
        return 130
    return _report(result, args)


def _rollout_options(args: argparse.Namespace, request_timeout: float) -> dict[str, Any]:
    """The options an iteration takes the same way in process and on Ray."""
    return {
        "policy": args.policy,
        "base_url": args.base_url,
        "model": args.model,
        "api_key": args.api_key,
        "iteration": args.iteration,
        "rank": args.rank,
        "logger_backend": args.logger,
        "max_tasks": args.max_tasks,
        "seeds": args.seeds,
        "observation": args.observation,
        "request_timeout_s": request_timeout,
        "max_concurrency": args.max_concurrency,
        "step_timeout_s": args.step_timeout,
        "task_timeout_s": args.task_timeout,
    }


def _run_on_ray(args: argparse.Namespace, request_timeout: float) -> int:
    """``--ray``: the iteration on the cluster's actors; its exit status."""
    from replaystore.rollouts.ray_rollout import RayOptions
    from replaystore.rollouts.runner import rollout_on_ray

    options = RayOptions(
        address=args.ray,
        actors=args.actors or 2,
        browsers_per_actor=args.browsers_per_actor or 2,
        placement=args.placement or "spread",
    )
    try:
        result = rollout_on_ray(
            args.tasks, args.out, ray=options, **_rollout_options(args, request_timeout)
        )
    except ImportError as exc:  # no ray
        print(f"replaystore rollout: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before the actors started
        print("interrupted (Ctrl-C)", file=sys.stderr)
        return 130
    status = _report(result, args)
    r = result.ray
    lost = f", lost: {', '.join(r['lost_actors'])}" if r.get("lost_actors") else ""
    print(
        f"ray: {len(r.get('actors', {}))} actors on {r.get('nodes', 0)} node(s), "
        f"{r.get('reassigned', 0)} tasks reassigned, {r.get('duplicates', 0)} duplicates "
        f"dropped{lost}"
    )
    return status


def _report(result: Any, args: argparse.Namespace) -> int:
    """Print an iteration's outcome; its exit status."""
    if result.model_server_error is not None:
        return _rollout_server_failure(result)
    counts = ", ".join(f"{k} {v}" for k, v in sorted(result.status_counts().items()))
    print(
        f"iteration {result.iteration} rank {result.rank}: {len(result.outcomes)} tasks "
        f"({counts}), success {100 * result.success_rate:.0f}%, {result.steps} steps, "
        f"{result.steps_per_second:.2f} steps/s"
    )
    if result.blocklist_skipped:
        print(blocklist_skip_line(result.blocklist_skipped, Path(args.out)))
    if result.blocked_sites:
        print(f"blocked (added to the blocklist): {', '.join(result.blocked_sites)}")
    if result.path is not None:
        print(f"stored: {result.path}")
    if result.interrupted:
        print(_interrupted_line(result), file=sys.stderr)
        return 130
    return 0


def _interrupted_line(result: Any) -> str:
    """What an iteration stopped by Ctrl-C saved: the finished trajectories, or nothing."""
    if result.path is None:
        return "interrupted: no task had finished; nothing was saved"
    return (
        f"interrupted: {len(result.outcomes)} finished trajectories saved in {result.path}; "
        f"{len(result.skipped)} tasks cut or not started (its metadata's skipped_task_ids)"
    )


def blocklist_skip_line(skipped: dict[str, int], out: Path) -> str:
    """How many tasks the blocklist left out, of which sites, and how to clear an entry."""
    sites = ", ".join(f"{site} ({n})" for site, n in skipped.items())
    file = out / "blocklist.jsonl"
    return (
        f"skipped {sum(skipped.values())} tasks on the blocklist: {sites}; clear with: "
        f"replaystore blocklist remove SITE --file {file} (or: replaystore blocklist clear "
        f"--file {file})"
    )


def _rollout_server_failure(result: Any) -> int:
    """The one line of an iteration that failed on the model server; its exit status.

    2 (a usage error: the command needs another flag) for a text-only model sent
    screenshots, 1 (the run failed) when every task failed on the server.
    """
    message = " ".join(str(result.model_server_error).split())
    if result.text_only_model:
        print(
            "replaystore rollout: error: the model server serves a text-only model "
            f"({message}): run with --observation text",
            file=sys.stderr,
        )
        return 2
    stored = f"; trajectories stored in {result.path}" if result.path is not None else ""
    print(
        f"replaystore rollout: error: all {len(result.outcomes)} tasks failed on the model "
        f"server: {message}{stored}",
        file=sys.stderr,
    )
    return 1
