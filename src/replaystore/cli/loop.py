"""``replaystore loop``: WebGym's loop (roll out, train, serve with vLLM, repeat), resumable."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from replaystore.cli._common import Parser, UsageError, int_at_least, one_line

__all__ = ["DESCRIPTION", "add_arguments", "run"]

DESCRIPTION = (
    "Run iterations of sample -> serve -> roll out (headless Chromium) -> "
    "evaluate -> store -> buffer -> export -> train (llamafactory-cli), each serving the "
    "checkpoint the previous one trained (vLLM). LLaMA-Factory and vLLM run from their own "
    "environments (bash .ci/install-loop-tools). Every finished stage is journaled: "
    "--resume continues after a crash or Ctrl-C. Writes OUT/summary.json. Guide: "
    "docs/loop.md."
)


def add_arguments(parser: Parser) -> None:
    """The options of ``replaystore loop``."""
    parser.add_argument("--config", metavar="YAML", help="the loop config (docs/loop.md)")
    parser.add_argument(
        "--iterations", type=int_at_least(1), help="iterations to run (default: the config's)"
    )
    parser.add_argument("--resume", action="store_true", help="continue the run in its directory")
    parser.add_argument("--out", metavar="DIR", help="run directory (overrides the config's out)")
    parser.add_argument(
        "--tools-dir",
        metavar="DIR",
        help="where the LLaMA-Factory and vLLM environments are (default: "
        "$REPLAYSTORE_LOOP_TOOLS or ~/.cache/replaystore/loop-tools)",
    )
    parser.add_argument(
        "--make-tiny-model",
        metavar="DIR",
        help="only build a tiny Qwen2 chat model in DIR (no download) and exit",
    )
    parser.add_argument(
        "--corpus",
        action="append",
        metavar="FILE",
        help="with --make-tiny-model: text or LLaMA-Factory JSON the tokenizer learns from "
        "(repeatable)",
    )


def run(args: argparse.Namespace) -> int:
    """Run (or resume) the loop, or only build the tiny model; returns the exit status."""
    from replaystore.loop import (
        LoopInterrupted,
        LoopStageError,
        ToolsMissingError,
        default_tools_dir,
        find_tools,
        load_config,
        make_tiny_model,
        run_loop,
    )

    if args.make_tiny_model is not None:
        tools = find_tools(
            Path(args.tools_dir) if args.tools_dir else default_tools_dir(), need_vllm=False
        )
        target = Path(args.make_tiny_model)
        if target.exists() and any(target.iterdir()):
            raise UsageError(f"--make-tiny-model {target} exists and is not empty")
        settings = make_tiny_model(
            tools.train_python, target, corpus=[Path(c) for c in args.corpus or []]
        )
        print(
            f"tiny Qwen2 in {target}: {settings['layers']} layers, hidden {settings['hidden']}, "
            f"{settings['vocab_size']}-token BPE, {int(settings['parameters']):,} parameters"
        )
        return 0
    if args.config is None and not args.resume:
        raise UsageError("give --config loop.yaml (or --make-tiny-model DIR); see docs/loop.md")
    overrides: dict[str, Any] = {"out": args.out, "tools_dir": args.tools_dir}
    if args.config is None:
        # --resume --out DIR: the run's own copy of its effective config.
        if args.out is None:
            raise UsageError("--resume without --config needs --out RUN_DIR")
        config_path: Path | None = Path(args.out) / "loop.yaml"
        overrides["out"] = str(Path(args.out).absolute())
    else:
        config_path = Path(args.config)
    config = load_config(config_path, overrides)
    if args.config is None:
        resume = f"replaystore loop --resume --out {shlex.quote(str(args.out))}"
    else:
        out = f" --out {shlex.quote(str(args.out))}" if args.out else ""
        resume = f"replaystore loop --config {shlex.quote(str(args.config))}{out} --resume"
    print(f"replaystore loop: run directory {config.out}", flush=True)
    try:
        summary = run_loop(
            config,
            resume=args.resume,
            iterations=args.iterations,
            report=lambda line: print(f"  {line}", flush=True),
        )
    except ToolsMissingError as exc:
        print(f"replaystore loop: error: {exc}", file=sys.stderr)
        return 2
    except LoopStageError as exc:
        print(f"replaystore loop: failed: {one_line(exc)}", file=sys.stderr)
        print(f"resume after fixing it: {resume}", file=sys.stderr)
        return 1
    except LoopInterrupted as exc:
        print(
            f"replaystore loop: {exc}; finished stages are kept: continue with {resume}",
            file=sys.stderr,
        )
        return 130
    rates = " -> ".join(
        f"{row['success_rate']:.0%} ({row['policy']})" for row in summary["iterations"]
    )
    untrained = summary.get("untrained")
    if untrained:
        rates = f"untrained {untrained['success_rate']:.0%}; " + rates
    print(f"success rate per iteration: {rates}")
    print(f"summary: {config.out / 'summary.json'}")
    return 0
