"""WebAgent + OpenAIChatPolicy against a real local HTTP server speaking the chat-completions
protocol (tests/rollouts/fake_openai.py): what goes over the wire, retries, backoff,
timeouts, the concurrency limit and the errors a user sees."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import sys
from pathlib import Path

import pytest
from PIL import Image

from replaystore.errors import ConfigError, ModelServerError
from replaystore.pipeline.images import messages_to_data_urls
from replaystore.rollouts.chat_client import ChatCompletionsClient
from replaystore.rollouts.policy import OpenAIChatPolicy, PolicyRequest, WebAgent
from replaystore.trajectories.components import Action, Observation, Response, Reward, Task
from replaystore.trajectories.context import ConversationBuilder

from .fake_openai import FakeOpenAIServer

REPLY = "<think>The search box is at the top.</think>\nAction: click(120, 40)"


def make_task() -> Task:
    return Task(
        task_name="Find the price of the red kettle",
        domain="Lifestyle & Leisure",
        subdomain="Shopping",
        website="http://127.0.0.1/shop/",
        difficulty=1,
        evaluator_reference=[{"description": "the price is stated", "facts": ["$24"]}],
        reference_answer="$24",
        task_id="shop-1",
    )


def screenshot(path: Path, color: tuple[int, int, int]) -> str:
    Image.new("RGB", (32, 24), color).save(path)
    return str(path)


def observation(tmp_path: Path, name: str, color: tuple[int, int, int]) -> Observation:
    return Observation(
        make_task(),
        screenshot(tmp_path / f"{name}.png", color),
        "[0] textbox 'Search' @(120,40)\n[1] link 'Kettles' @(60,90)",
        {"url": f"http://127.0.0.1/shop/{name}", "title": f"Shop {name}"},
    )


def past_step(obs: Observation, raw: str) -> dict:
    return {
        "observation": obs,
        "action": Action({"key": "click", "x": 60, "y": 90}, "click(60, 90)"),
        "response": Response(raw, {"action": "click(60, 90)"}),
        "reward": Reward(0.0, None),
    }


@pytest.fixture
def server():
    with FakeOpenAIServer(reply=REPLY) as srv:
        yield srv


def run(coro):
    return asyncio.run(coro)


def test_request_carries_model_prompt_and_screenshot_as_image_data_url(server, tmp_path):
    obs = observation(tmp_path, "home", (200, 30, 30))

    async def go():
        async with OpenAIChatPolicy(
            server.base_url, "qwen-vl", api_key="sk-test", temperature=0.3, max_tokens=77
        ) as policy:
            return await WebAgent(policy).act(make_task(), obs, [], step=0, iteration=1)

    run(go())
    (body,) = server.requests
    assert body["model"] == "qwen-vl"
    assert body["temperature"] == 0.3 and body["max_tokens"] == 77
    assert server.headers[0]["authorization"] == "Bearer sk-test"
    system, user = body["messages"]
    assert system["role"] == "system" and "web agent" in system["content"]
    text = "\n".join(p["text"] for p in user["content"] if p["type"] == "text")
    assert "Task: Find the price of the red kettle" in text
    assert "[0] textbox 'Search' @(120,40)" in text
    assert "URL: http://127.0.0.1/shop/home" in text
    (image,) = [p for p in user["content"] if p["type"] == "image_url"]
    url = image["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    assert base64.b64decode(url.split(",", 1)[1]) == Path(obs.image_path).read_bytes()


def test_reply_is_decomposed_and_stored_prompt_is_the_sent_prompt_with_file_urls(server, tmp_path):
    first = observation(tmp_path, "home", (10, 10, 10))
    now = observation(tmp_path, "kettles", (90, 90, 90))
    history = [past_step(first, "<think>kettles link</think>\nAction: click(60, 90)")]

    async def go():
        async with OpenAIChatPolicy(server.base_url, "m") as policy:
            return await WebAgent(policy).act(make_task(), now, history, step=1, iteration=0)

    response = run(go())
    assert response.raw_response == REPLY
    assert response.answering_tokens == {
        "thought": "The search box is at the top.",
        "action": "click(120, 40)",
    }
    stored = json.loads(response.raw_prompt)
    urls = [
        p["image_url"]["url"]
        for m in stored
        if isinstance(m["content"], list)
        for p in m["content"]
        if p["type"] == "image_url"
    ]
    assert urls == [Path(first.image_path).as_uri(), Path(now.image_path).as_uri()]
    assert messages_to_data_urls(stored) == server.requests[0]["messages"]


def test_image_urls_file_sends_the_stored_prompt_unchanged(server, tmp_path):
    obs = observation(tmp_path, "home", (1, 2, 3))

    async def go():
        async with OpenAIChatPolicy(server.base_url, "m") as policy:
            agent = WebAgent(policy, image_urls="file")
            return await agent.act(make_task(), obs, [], step=0, iteration=0)

    response = run(go())
    assert server.requests[0]["messages"] == json.loads(response.raw_prompt)


def test_unparseable_reply_is_kept_with_an_empty_action_not_raised(server, tmp_path):
    server.reply = "I am not sure what to do here."
    obs = observation(tmp_path, "home", (5, 5, 5))

    async def go():
        async with OpenAIChatPolicy(server.base_url, "m") as policy:
            return await WebAgent(policy).act(make_task(), obs, [], step=0, iteration=0)

    response = run(go())
    assert response.raw_response == "I am not sure what to do here."
    assert response.answering_tokens["action"] == ""
    assert "Action:" in response.answering_tokens["parse_error"]
    assert response.raw_prompt


def test_policy_request_gives_the_policy_task_step_iteration_and_messages(tmp_path):
    seen: list[PolicyRequest] = []

    class Recording:
        async def respond(self, request: PolicyRequest) -> str:
            seen.append(request)
            return "<think>x</think>\nAction: back()"

        async def aclose(self) -> None:
            pass

    obs = observation(tmp_path, "home", (7, 7, 7))
    run(WebAgent(Recording()).act(make_task(), obs, [], step=3, iteration=2))
    (request,) = seen
    assert (request.step, request.iteration, request.task.task_id) == (3, 2, "shop-1")
    assert request.observation is obs and request.history == []
    assert request.messages[-1]["content"][-1]["image_url"]["url"].startswith("data:image/png")


def test_text_mode_sends_exactly_the_stored_text_prompt_and_a_text_only_model_answers(
    server, tmp_path
):
    server.text_only = True  # images would get HTTP 400 "... is not a multimodal model"
    first = observation(tmp_path, "home", (10, 10, 10))
    now = observation(tmp_path, "kettles", (90, 90, 90))
    history = [past_step(first, "<think>kettles link</think>\nAction: click(60, 90)")]

    async def go():
        async with OpenAIChatPolicy(server.base_url, "tiny") as policy:
            agent = WebAgent(policy, conversation_builder=ConversationBuilder(observation="text"))
            assert agent.observation == "text"
            return await agent.act(make_task(), now, history, step=1, iteration=1)

    response = run(go())
    assert response.answering_tokens["action"] == "click(120, 40)"
    (body,) = server.requests
    assert body["messages"] == json.loads(response.raw_prompt)
    assert all(isinstance(m["content"], str) for m in body["messages"])
    assert "screenshot" not in body["messages"][0]["content"].lower()
    final = body["messages"][-1]["content"]
    assert "URL: http://127.0.0.1/shop/kettles" in final
    assert "[0] textbox 'Search' @(120,40)" in final
    assert "file://" not in response.raw_prompt and "data:image" not in response.raw_prompt


def test_screenshot_prompt_to_a_text_only_model_is_a_400_naming_the_server_message(
    server, tmp_path
):
    server.text_only = True
    obs = observation(tmp_path, "home", (1, 2, 3))

    async def go():
        async with OpenAIChatPolicy(server.base_url, "tiny") as policy:
            return await WebAgent(policy).act(make_task(), obs, [], step=0, iteration=0)

    with pytest.raises(ModelServerError, match="HTTP 400: tiny is not a multimodal model") as info:
        run(go())
    assert info.value.status == 400


def test_retries_429_and_500_with_exponential_backoff_and_jitter(server):
    server.fail_next(429, 500)

    async def go():
        async with ChatCompletionsClient(
            server.base_url, "m", backoff_base_s=0.08, seed=1
        ) as client:
            return await client.complete([{"role": "user", "content": "hi"}]), client

    text, client = run(go())
    assert text == REPLY
    assert len(server.requests) == 3
    first, second = client.backoff_history
    assert 0.04 <= first <= 0.08 and 0.08 <= second <= 0.16  # base * 2**k * [0.5, 1]
    gaps = [b - a for a, b in zip(server.arrival_times, server.arrival_times[1:], strict=False)]
    assert gaps[0] >= first * 0.9 and gaps[1] >= second * 0.9


def test_retry_after_header_raises_the_wait(server):
    server.fail_next(503, retry_after="0.3")

    async def go():
        async with ChatCompletionsClient(server.base_url, "m", backoff_base_s=0.01) as client:
            await client.complete([{"role": "user", "content": "hi"}])

    run(go())
    assert server.arrival_times[1] - server.arrival_times[0] >= 0.29


def test_gives_up_after_max_retries_naming_status_and_message(server):
    server.fail_next(500, 500, 500, message="CUDA out of memory")

    async def go():
        async with ChatCompletionsClient(
            server.base_url, "m", max_retries=2, backoff_base_s=0.01
        ) as client:
            await client.complete([{"role": "user", "content": "hi"}])

    with pytest.raises(ModelServerError, match=r"3 attempts.*HTTP 500: CUDA out of memory") as err:
        run(go())
    assert err.value.status == 500
    assert len(server.requests) == 3


def test_client_error_fails_at_once_naming_status_and_server_message(server):
    server.fail_next(400, message="image exceeds the model's limit")

    async def go():
        async with ChatCompletionsClient(server.base_url, "m", backoff_base_s=0.01) as client:
            await client.complete([{"role": "user", "content": "hi"}])

    with pytest.raises(ModelServerError, match="HTTP 400: image exceeds the model's limit"):
        run(go())
    assert len(server.requests) == 1


def test_404_without_v1_suggests_the_vllm_base_url(server):
    async def go():
        base = server.base_url.removesuffix("/v1")
        async with ChatCompletionsClient(base, "m") as client:
            await client.complete([{"role": "user", "content": "hi"}])

    with pytest.raises(ModelServerError, match=r"HTTP 404.*end in /v1"):
        run(go())


def test_timeout_is_retried(server):
    server.stall_next(1.0)

    async def go():
        async with ChatCompletionsClient(
            server.base_url, "m", timeout_s=0.25, backoff_base_s=0.01
        ) as client:
            return await client.complete([{"role": "user", "content": "hi"}])

    assert run(go()) == REPLY
    assert len(server.requests) == 2


def test_timeouts_exhausted_name_the_timeout(server):
    server.stall_next(0.6, 0.6)

    async def go():
        async with ChatCompletionsClient(
            server.base_url, "m", timeout_s=0.15, max_retries=1, backoff_base_s=0.01
        ) as client:
            await client.complete([{"role": "user", "content": "hi"}])

    with pytest.raises(ModelServerError, match=r"2 attempts; last: timed out after 0.15 s") as err:
        run(go())
    assert err.value.status is None


def test_connection_refused_is_retried_then_named():
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    async def go():
        async with ChatCompletionsClient(
            f"http://127.0.0.1:{port}/v1", "m", max_retries=1, backoff_base_s=0.01
        ) as client:
            await client.complete([{"role": "user", "content": "hi"}])

    with pytest.raises(ModelServerError, match="connection failed"):
        run(go())


def test_concurrency_limit_holds_at_the_server(server):
    server.delay_s = 0.15

    async def go():
        async with ChatCompletionsClient(server.base_url, "m", max_concurrency=3) as client:
            messages = [{"role": "user", "content": "hi"}]
            return await asyncio.gather(*(client.complete(messages) for _ in range(9)))

    assert run(go()) == [REPLY] * 9
    assert server.max_in_flight == 3


def test_reply_without_content_is_an_error_naming_the_field(server):
    server.reply = lambda body: None  # serialised as "content": null

    async def go():
        async with ChatCompletionsClient(server.base_url, "m") as client:
            await client.complete([{"role": "user", "content": "hi"}])

    with pytest.raises(ModelServerError, match=r"choices\[0\]\.message\.content"):
        run(go())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"base_url": "localhost:8000/v1"}, "base_url must be an http"),
        ({"model": ""}, "model must be"),
        ({"max_concurrency": 0}, "max_concurrency must be an int >= 1"),
        ({"max_retries": -1}, "max_retries must be an int >= 0"),
        ({"temperature": -0.1}, "temperature must be a number >= 0"),
        ({"timeout_s": 0}, "timeout_s must be a number > 0"),
    ],
)
def test_bad_client_settings_are_named(kwargs, match):
    args = {"base_url": "http://127.0.0.1:1/v1", "model": "m", **kwargs}
    with pytest.raises(ConfigError, match=match):
        ChatCompletionsClient(args.pop("base_url"), args.pop("model"), **args)


def test_web_agent_refuses_a_base64_builder_and_bad_image_urls():
    class Quiet:
        async def respond(self, request):
            return ""

        async def aclose(self):
            pass

    with pytest.raises(ConfigError, match="image_format='file'"):
        WebAgent(Quiet(), conversation_builder=ConversationBuilder(image_format="base64"))
    with pytest.raises(ConfigError, match="image_urls must be"):
        WebAgent(Quiet(), image_urls="http")
    with pytest.raises(ConfigError, match="respond"):
        WebAgent(object())


def test_missing_httpx_is_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "httpx", None)
    with pytest.raises(ImportError, match=r"pip install 'replaystore\[rollouts\]'"):
        ChatCompletionsClient("http://127.0.0.1:1/v1", "m")
