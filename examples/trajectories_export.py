"""Web-agent rollouts -> trajectory storage -> replay buffer -> LLaMA-Factory dataset.

    python examples/trajectories_export.py                    # writes runs/trajectories-export/
    python examples/trajectories_export.py --out /tmp/webrl   # anywhere else

What a WebGym-style RL loop does after each rollout round, top to bottom: save
the round's trajectories (screenshots as files, steps in one JSONL file per
iteration), open the storage as a replay buffer that keeps the successful steps
whose screen changed, draw a recency-biased training set, and write it as a
LLaMA-Factory ShareGPT dataset. The "agent" is scripted and the screenshots are
drawn with Pillow, so it runs offline in a few seconds. Running it again with the
same --out adds iterations after the stored ones.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from PIL import Image, ImageDraw

from replaystore.trajectories import (
    Action,
    ConversationBuilder,
    Observation,
    Response,
    Reward,
    Task,
    TrajectoryBuffer,
    TrajectoryStorage,
    export_llamafactory,
)

parser = argparse.ArgumentParser()
parser.add_argument("--out", default="runs/trajectories-export")
parser.add_argument("--iterations", type=int, default=3)
parser.add_argument("--attempts-per-task", type=int, default=3)
parser.add_argument("--train-samples", type=int, default=20)
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()

out = Path(args.out).absolute()
rng = random.Random(args.seed)
builder = ConversationBuilder(history_window=2)  # the policy's prompt: task, 2 past steps, page


def task(number: int, item: str, answer: str) -> Task:
    return Task(
        task_name=f"Find the price of the {item} on shop.example.test",
        domain="Shopping",
        subdomain="Prices",
        website="https://shop.example.test/",
        difficulty=1 + number % 3,
        evaluator_reference=[{"description": "the price is stated", "facts": [answer]}],
        reference_answer=answer,
        task_id=f"price-{number}",
    )


TASKS = [task(1, "red kettle", "$24"), task(2, "desk lamp", "$31"), task(3, "wool socks", "$9")]


def screenshot(path: Path, title: str, highlight: int) -> str:
    """A 160x100 PNG standing in for a browser screenshot: a title bar and four links."""
    image = Image.new("RGB", (160, 100), (245, 245, 245))
    draw = ImageDraw.Draw(image)
    draw.rectangle((0, 0, 159, 14), fill=(40, 90, 170))
    draw.text((4, 2), title[:24], fill=(255, 255, 255))
    for link in range(4):
        color = (220, 120, 0) if link == highlight else (60, 60, 60)
        draw.rectangle((8, 22 + 18 * link, 90, 34 + 18 * link), outline=color, width=2)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)
    return str(path)


def rollout(task: Task, iteration: int, attempt: int) -> list[dict]:
    """One scripted attempt: a few clicks (some do nothing), then an answer.

    The answer is right more often in later iterations, as a policy that learns.
    Each step keeps the exact prompt the policy saw (``raw_prompt``), as WebGym does.
    """
    shots = out / "screenshots" / f"iteration{iteration}" / f"{task.task_id}-{attempt}"
    steps: list[dict] = []
    page = 0
    clicks = rng.randint(1, 3)
    for s in range(clicks + 1):
        title = f"{task.subdomain} page {page}"
        image = screenshot(shots / f"step{s}.png", title, highlight=page % 4)
        url = f"{task.website}p/{page}"
        observation = Observation(
            task, image, f"[1] link 'Next'\n[2] text '{title}'", {"url": url, "title": title}
        )
        prompt = builder.build(task, steps, observation)
        last = s == clicks
        if last:
            right = rng.random() < min(0.9, 0.25 + 0.25 * iteration)
            answer = task.reference_answer if right else "not listed"
            action, reward = f"answer [{answer}]", float(right)
        else:
            action, reward = "click [1]", 0.0
            page += rng.random() < 0.8  # a click that does nothing leaves the same screen
        steps.append(
            {
                "observation": observation,
                "action": Action({"key": action.split()[0]}, action),
                "response": Response(
                    f"<think>I am on {title}.</think>\nAction: {action}",
                    {"action": action},
                    json.dumps(prompt),
                ),
                "reward": Reward(reward, {"judge": "exact match"}, submit=last),
            }
        )
    return steps


# 1. Rollout rounds: one immutable iteration file per round (written atomically).
storage = TrajectoryStorage(out / "storage")
for _ in range(args.iterations):
    iteration = storage.next_iteration()
    trajectories = [rollout(t, iteration, a) for t in TASKS for a in range(args.attempts_per_task)]
    written = storage.save_iteration(iteration, trajectories, metadata={"policy": "scripted"})
    solved = sum(t[-1]["reward"].reward == 1.0 for t in trajectories)
    print(f"iteration {iteration}: {len(trajectories)} trajectories, {solved} solved -> {written}")
stats = storage.stats()
print(f"storage: {stats['total_iterations']} iterations, {stats['total_steps']} steps")

# 2. The replay buffer: an index of rewards and flags in memory; prompts are read from
#    the files when a sample is accessed. filter_successful_only: training-eligible steps
#    only (final reward 1, and a screenshot different from the next step's).
buffer = TrajectoryBuffer.from_storage(storage.root, filter_successful_only=True, seed=args.seed)
s = buffer.stats
print(
    f"buffer: {s.samples} steps of {s.trajectories} trajectories, success rate "
    f"{s.success_rate:.0%}, {s.same_screenshot_steps} same-screenshot steps, "
    f"{s.eligible_samples} training-eligible"
)

# 3. The training set: without replacement, newer steps more likely (weight (rank+1)**2).
samples = buffer.get_training_samples(args.train_samples, recency_bias_power=2.0, seed=args.seed)
first = samples[0]
print(f"sampled {len(samples)}; each has {sorted(first)}")
print(f"  a sample's prompt: {len(first['message'])} messages; its target: {first['action']!r}")

# 4. The LLaMA-Factory dataset: records, a validation split, dataset_info.json; the
#    screenshots are copied in so the directory can be moved to the training machine.
report = export_llamafactory(
    samples,
    out / "llamafactory",
    dataset_name="webagent",
    val_ratio=0.1,
    seed=args.seed,
    copy_images=True,
)
print(
    f"dataset: {report.num_train} train + {report.num_val} validation records, "
    f"{report.num_image_refs} image references, in {report.out_dir}"
)
print("LLaMA-Factory config:")
print(f"  dataset_dir: {report.out_dir}")
print(f"  dataset: {report.dataset_name}")
if report.val_file is not None:
    print(f"  eval_dataset: {report.dataset_name}_val")
