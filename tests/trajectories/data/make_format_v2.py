"""Wrote tests/trajectories/data/format_v2 with the format-version-2 writer.

Run at commit 70a8c30 (before format 3 existed) with an absolute target directory,
``PYTHONPATH=<that commit's src> python make_format_v2.py /tmp/fx``, and the three
files copied here. Kept to show what the fixture holds; running it now would write
format 3. Covers: prompts written by json.dumps with ensure_ascii False and True,
compact and indented (the last cannot be split into messages), screenshots and prompt
URLs under the storage root (stored relative), a dummy trajectory, rank files.
"""

import json
import sys
from pathlib import Path

from replaystore.trajectories.components import Action, Observation, Response, Reward, Task
from replaystore.trajectories.storage import TrajectoryStorage

root = Path(sys.argv[1])


def traj(name, n, reward, *, prompt_mode="list", image_under_root=False):
    task = Task(name, "shopping", "stores", "https://shop.example", 1, None, None, task_id=name)
    steps = []
    history = []
    for s in range(n):
        image = (
            str(root / "shots" / f"{name}_{s}.png")
            if image_under_root
            else f"/data/shots/{name}_{s}.png"
        )
        messages = [{"role": "system", "content": "You are a web agent. Réponds en une action."}]
        for h in history:
            messages.append(
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": f"Step {h} observation"},
                        {
                            "type": "image_url",
                            "image_url": {
                                "url": "file://" + image.replace(f"_{s}.png", f"_{h}.png")
                            },
                        },
                    ],
                }
            )
            messages.append(
                {"role": "assistant", "content": f"<think>step {h} ✓</think>\nAction: click [{h}]"}
            )
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": f"Task: {name}\nCurrent step: {s + 1}"},
                    {"type": "image_url", "image_url": {"url": "file://" + image}},
                ],
            }
        )
        if prompt_mode == "list":
            prompt = json.dumps(messages, ensure_ascii=False)
        elif prompt_mode == "ascii":
            prompt = json.dumps(messages)
        elif prompt_mode == "compact":
            prompt = json.dumps(messages, separators=(",", ":"))
        elif prompt_mode == "indent":
            prompt = json.dumps(messages, indent=1)
        else:
            prompt = ""
        last = s == n - 1
        steps.append(
            {
                "observation": Observation(
                    task,
                    image,
                    f"[{s}] button 'Next' ✓",
                    {"title": "Shop", "url": f"https://shop.example/{s}", "jsonld": "dropped"},
                ),
                "action": Action({"key": "click", "element": s}, f"click [{s}]"),
                "response": Response(
                    f"<think>step {s} ✓</think>\nAction: click [{s}]",
                    {"action": f"click [{s}]"},
                    prompt,
                ),
                "reward": Reward(reward if last else 0.0, "ok" if last else None, submit=last),
                "same_as_next_screenshot": (s % 2 == 1) and not last,
            }
        )
        history.append(s)
    return steps


dummy = [
    {
        "observation": Observation(Task("bad", "", "", "nope://", 1, None, None), "", None),
        "action": Action({"key": "invalid_url"}, "Invalid URL"),
        "response": Response("", None, ""),
        "reward": Reward(0.0, None),
    }
]
storage = TrajectoryStorage(root)
storage.save_iteration(
    1,
    [
        traj("alpha", 3, 1.0),
        traj("bravo", 4, 0.0, prompt_mode="ascii", image_under_root=True),
        dummy,
        traj("charlie", 2, 1.0, prompt_mode="indent"),
    ],
    rank=None,
    metadata={"model": "fixture"},
)
storage.save_iteration(
    2,
    [traj("delta", 3, 1.0, prompt_mode="compact"), traj("echo", 1, 0.0, prompt_mode="compact")],
    rank=0,
)
storage.save_iteration(2, [traj("foxtrot", 5, 1.0, image_under_root=True)], rank=1)
