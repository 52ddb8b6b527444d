"""Score a checkpoint's actions on held-out MiniWoB++ prompts, offline (no server, no
browser): how much training a model needs, in seconds instead of a loop run.

Two steps, each in the environment that has what it needs:

    # 1. the library's environment: the experts' held-out prompts and actions of a loop run
    python benchmarks/miniwob_action_probe.py extract RUN/heldout/storage prompts.json
    # 2. the LLaMA-Factory environment (it has transformers): greedy replies, scored
    <llamafactory-env>/bin/python benchmarks/miniwob_action_probe.py score CHECKPOINT \\
        prompts.json [--tasks click-tab,focus-text-2]

``extract`` keeps the steps of the experts' held-out episodes that the page scored as
solved (iteration 1 of ``RUN/heldout/storage``: the experts act first), each as the
messages the policy was sent and the action the expert took. ``score`` asks the checkpoint
for a greedy reply (at most 64 new tokens, the prompt rendered by the checkpoint's chat
template as vLLM renders it) and counts a reply right when the action after ``Action:``
is the expert's, character for character. Every step of a solved episode is a prompt (a
later step's prompt holds the expert's history, not the model's), so a one-step task
counts its first action, enter-text its fill and its click. It prints one line per task
and the mean over tasks. A page may accept another action than the expert's (rarely, on
these tasks), and a model's own mistakes do not compound here: the loop's held-out figure
is the measurement, this is a probe for choosing settings (``docs/loop.md``, "MiniWoB++").
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any


def extract(storage_dir: Path, out: Path) -> int:
    """Write the experts' solved held-out steps as ``[{task, seed, messages, action}]``."""
    from replaystore.trajectories.storage import TrajectoryStorage

    storage = TrajectoryStorage(storage_dir)
    files = [f for f in storage.files() if f.iteration == 1]
    if not files:
        raise SystemExit(f"{storage_dir}: no iteration 1 (the experts' held-out episodes)")
    rows: list[dict[str, Any]] = []
    for file in files:
        for trajectory in storage.read_file(file):
            reward = trajectory[-1]["reward"]
            if reward.reward <= 0:
                continue
            reference = trajectory[0]["observation"].task.evaluator_reference
            for step in trajectory:
                rows.append(
                    {
                        "task": reference["miniwob"],
                        "seed": reference["seed"],
                        "messages": json.loads(step["response"].raw_prompt),
                        "action": step["action"].action_string,
                    }
                )
    out.write_text(json.dumps(rows))
    print(f"{len(rows)} steps of {len({(r['task'], r['seed']) for r in rows})} episodes -> {out}")
    return 0


def score(
    checkpoint: Path, prompts: Path, tasks: set[str] | None, wrong: Path | None = None
) -> int:
    """Greedy replies of ``checkpoint`` to ``prompts``; the share of exact actions per task.

    ``wrong``: also write the replies that missed, as ``[{task, seed, step, action,
    reply}]`` (``step``: the prompt's ``Current step``), to read what went wrong.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    rows = [r for r in json.loads(prompts.read_text()) if not tasks or r["task"] in tasks]
    if not rows:
        raise SystemExit(f"{prompts}: no prompts for tasks {sorted(tasks or [])}")
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    texts = [
        tokenizer.apply_chat_template(r["messages"], tokenize=False, add_generation_prompt=True)
        for r in rows
    ]
    replies: list[str] = []
    with torch.no_grad():
        for at in range(0, len(texts), 32):
            batch = tokenizer(
                texts[at : at + 32], return_tensors="pt", padding=True, add_special_tokens=False
            )
            out = model.generate(
                **batch,
                max_new_tokens=64,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=end,
            )
            new = out[:, batch["input_ids"].shape[1] :]
            replies += tokenizer.batch_decode(new, skip_special_tokens=True)
    right: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    missed: list[dict[str, Any]] = []
    for row, reply in zip(rows, replies, strict=True):
        action = reply.split("Action:")[-1].strip().splitlines()[0] if "Action:" in reply else ""
        right[row["task"]][0] += action == row["action"]
        right[row["task"]][1] += 1
        if action != row["action"]:
            step = re.search(r"Current step: (\d+)", str(row["messages"][-1]["content"]))
            missed.append({k: row[k] for k in ("task", "seed", "action")})
            missed[-1]["step"] = int(step.group(1)) if step else None
            missed[-1]["reply"] = reply
    if wrong is not None:
        wrong.write_text(json.dumps(missed, indent=1, ensure_ascii=False), encoding="utf-8")
    rates = {task: hit / n for task, (hit, n) in sorted(right.items())}
    for task, rate in rates.items():
        print(f"{task:20s} {rate:.2f} of {right[task][1]}")
    print(f"mean over tasks      {sum(rates.values()) / len(rates):.3f}  ({checkpoint})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("extract", help="a run's held-out expert steps -> JSON")
    ex.add_argument("storage", type=Path, help="RUN/heldout/storage")
    ex.add_argument("out", type=Path)
    sc = sub.add_parser("score", help="a checkpoint's greedy actions, scored")
    sc.add_argument("checkpoint", type=Path)
    sc.add_argument("prompts", type=Path)
    sc.add_argument("--tasks", default="", help="comma-separated task names (default: all)")
    sc.add_argument("--wrong", type=Path, help="write the replies that missed to this JSON file")
    args = parser.parse_args(argv)
    if args.command == "extract":
        return extract(args.storage, args.out)
    wanted = {t for t in args.tasks.split(",") if t} or None
    return score(args.checkpoint, args.prompts, wanted, args.wrong)


if __name__ == "__main__":
    sys.exit(main())
