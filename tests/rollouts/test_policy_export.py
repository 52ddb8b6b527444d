"""What is trained on is what the model saw: WebAgent's requests to a chat-completions server,
stored through TrajectoryStorage, read back by TrajectoryBuffer.from_storage and exported
to LLaMA-Factory, are the same conversation (only the image URL form differs)."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path

from PIL import Image

from replaystore.pipeline.images import messages_to_data_urls
from replaystore.rollouts.evaluator import Evaluator
from replaystore.rollouts.policy import OpenAIChatPolicy, WebAgent
from replaystore.trajectories import TrajectoryBuffer, TrajectoryStorage, export_llamafactory
from replaystore.trajectories.components import Action, Observation, Reward, Task
from replaystore.trajectories.context import ConversationBuilder

from .fake_openai import FakeOpenAIServer

TASK = Task(
    task_name="What is the price of the Red Kettle?",
    domain="Lifestyle & Leisure",
    subdomain="Shopping",
    website="http://shop.localhost/",
    difficulty=1,
    evaluator_reference=[{"description": "the price is stated", "facts": ["$24"]}],
    reference_answer="$24",
    task_id="shop-1",
)
ACTIONS = ["click(60, 90)", "scroll(down)", "click(200, 40)", 'answer("$24")']


def reply(body: dict) -> str:
    """Step k of the trajectory (read from the prompt) gets ACTIONS[k - 1]."""
    text = [p["text"] for p in body["messages"][-1]["content"] if p["type"] == "text"][-1]
    step = int(text.split("Current step: ")[1].split("\n")[0])
    return f"<think>On step {step} I do the next thing.</think>\nAction: {ACTIONS[step - 1]}"


async def rollout(server: FakeOpenAIServer, shots: Path) -> list[dict]:
    # history_window=2: the first request rounds drop out of the window, so the summary
    # text path is exercised too.
    builder = ConversationBuilder(history_window=2)
    steps: list[dict] = []
    async with OpenAIChatPolicy(server.base_url, "qwen-vl") as policy:
        agent = WebAgent(policy, conversation_builder=builder)
        for k in range(len(ACTIONS)):
            image = shots / f"step{k}.png"
            Image.new("RGB", (64, 48), (60 * k, 255 - 60 * k, 90)).save(image)
            obs = Observation(
                TASK,
                str(image),
                f"[0] link 'Kettles' @(60,90)\n[1] button 'Page {k}' @(200,40)",
                {"url": f"http://shop.localhost/p{k}", "title": f"Acme Shop {k}"},
            )
            response = await agent.act(TASK, obs, steps, step=k, iteration=1)
            action = response.answering_tokens["action"]
            steps.append(
                {
                    "observation": obs,
                    "action": Action({"key": action.split("(")[0]}, action),
                    "response": response,
                    "reward": Reward(0.0, None),
                }
            )
    steps[-1]["reward"] = await Evaluator().evaluate(TASK, "$24", steps)
    return steps


def test_exported_conversations_equal_the_requests_the_model_got(tmp_path):
    shots = tmp_path / "shots"
    shots.mkdir()
    with FakeOpenAIServer(reply=reply) as server:
        steps = asyncio.run(rollout(server, shots))
    sent = [body["messages"] for body in server.requests]
    assert len(sent) == len(ACTIONS)
    assert steps[-1]["reward"].reward == 1.0

    storage = TrajectoryStorage(tmp_path / "storage")
    storage.save_iteration(1, [steps])
    buffer = TrajectoryBuffer.from_storage(storage.root, filter_same_screenshot=False)
    samples = [buffer[i] for i in range(len(buffer))]
    assert len(samples) == len(ACTIONS)
    for k, sample in enumerate(samples):
        assert messages_to_data_urls(sample["message"]) == sent[k]  # only URL form differs
        assert sample["action"] == steps[k]["response"].raw_response

    out = tmp_path / "dataset"
    export_llamafactory(samples, out, shuffle=False)
    records = json.loads((out / "replaystore.json").read_text())
    for k, record in enumerate(records):
        system, *turns = sent[k]
        assert record["system"] == system["content"]
        expected, images = [], []
        for message in turns:
            content = message["content"]
            if isinstance(content, list):
                value = []
                for part in content:
                    if part["type"] == "image_url":
                        value.append("<image>")
                        images.append(part["image_url"]["url"])
                    else:
                        value.append(part["text"])
                content = "\n".join(value)
            expected.append(
                {"from": "human" if message["role"] == "user" else "gpt", "value": content}
            )
        expected.append({"from": "gpt", "value": steps[k]["response"].raw_response})
        assert record["conversations"] == expected
        exported = [Path(p).read_bytes() for p in record["images"]]
        assert exported == [base64.b64decode(url.split(",", 1)[1]) for url in images]
