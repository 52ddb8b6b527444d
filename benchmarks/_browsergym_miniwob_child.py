"""BrowserGym's own MiniWoB++ environment playing scripted episodes (a child process).

Runs in the ``browsergym-miniwob`` 0.14.3 virtual environment that
``benchmarks/miniwob_speed.py`` makes (it pins playwright 1.44), never in
replaystore's. Reads BrowserGym's own observations (its AXTree text, and its DOM text
where the AXTree gives a clickable text no id) and acts with BrowserGym's own action
strings; the decisions are the ones replaystore's MiniWoB++ experts make on these tasks
(click the named button or link, fill the goal's text then Submit, focus the n-th
textbox). Prints one JSON object: per task, episodes, successes, steps, and the seconds
spent in ``env.reset`` and in ``env.step`` (observation extraction included).

``python _browsergym_miniwob_child.py TASKS SEEDS CHROMIUM`` with ``MINIWOB_URL`` set.
"""

from __future__ import annotations

import json
import re
import sys
import time

import browsergym.miniwob  # noqa: F401  (registers the tasks)
import gymnasium as gym
from browsergym.utils.obs import flatten_axtree_to_str, flatten_dom_to_str

ORDINALS = {"1st": 1, "2nd": 2, "3rd": 3, "4th": 4, "5th": 5}
LINE = re.compile(r"^\s*\[(\w+)\] (\S+) '(.*)'")


def elements(obs: dict) -> list[tuple[str, str, str]]:
    """(bid, role, name) of every AXTree node with a bid."""
    text = flatten_axtree_to_str(obs["axtree_object"], filter_visible_only=False)
    return [m.groups() for m in map(LINE.match, text.splitlines()) if m]  # type: ignore[misc]


def quoted(goal: str) -> str:
    return re.findall(r'"([^"]*)"', goal)[0]


def decide(task: str, obs: dict, step: int) -> str:
    goal = obs["goal"]
    found = elements(obs)
    if task == "click-button":
        name = quoted(goal)
        return next(f'click("{b}")' for b, r, n in found if r == "button" and n == name)
    if task == "click-link":
        name = quoted(goal)
        dom = flatten_dom_to_str(obs["dom_object"])
        spans = re.findall(r'<span bid="(\w+)"[^>]*>\s*([^<]*?)\s*</span>', dom)
        return next(f'click("{b}")' for b, text in spans if text == name)
    if task == "enter-text":
        if step == 0:
            box = next(b for b, r, _ in found if r == "textbox")
            return f'fill("{box}", "{quoted(goal)}")'
        return next(f'click("{b}")' for b, r, n in found if r == "button" and n == "Submit")
    if task == "focus-text-2":
        number = ORDINALS[re.search(r"the (\w+) input", goal).group(1)]  # type: ignore[union-attr]
        boxes = [b for b, r, _ in found if r == "textbox"]
        return f'focus("{boxes[number - 1]}")'
    raise SystemExit(f"no scripted decision for {task}")


def main() -> None:
    tasks, seeds, chromium = sys.argv[1].split(","), sys.argv[2], sys.argv[3]
    low, high = (int(x) for x in seeds.split("-"))
    out = {}
    for task in tasks:
        env = gym.make(
            f"browsergym/miniwob.{task}", pw_chromium_kwargs={"executable_path": chromium}
        )
        row = {"episodes": 0, "successes": 0, "steps": 0, "reset_s": 0.0, "step_s": 0.0}
        for seed in range(low, high + 1):
            started = time.perf_counter()
            obs, _ = env.reset(seed=seed)
            row["reset_s"] += time.perf_counter() - started
            reward, done = 0.0, False
            for step in range(4):
                action = decide(task, obs, step)
                started = time.perf_counter()
                obs, reward, done, truncated, _ = env.step(action)
                row["step_s"] += time.perf_counter() - started
                row["steps"] += 1
                if done or truncated:
                    break
            row["episodes"] += 1
            row["successes"] += int(reward > 0)
        env.close()
        out[task] = row
    print(json.dumps(out))


if __name__ == "__main__":
    main()
