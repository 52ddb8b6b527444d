"""A reply cut at max_tokens is worth one warning per client, not one per step."""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest

from replaystore.rollouts.chat_client import ChatCompletionsClient


def test_cut_replies_warn_once_then_log_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        choice = {"message": {"role": "assistant", "content": "noise"}, "finish_reason": "length"}
        return httpx.Response(200, json={"choices": [choice]})

    async def go() -> list[str]:
        client = ChatCompletionsClient(
            "http://model.test/v1", "tiny", max_tokens=8, transport=httpx.MockTransport(answer)
        )
        try:
            return [await client.complete([{"role": "user", "content": "hi"}]) for _ in range(3)]
        finally:
            await client.aclose()

    with caplog.at_level(logging.DEBUG, logger="replaystore.rollouts.chat_client"):
        assert asyncio.run(go()) == ["noise"] * 3
    cut = [r for r in caplog.records if "cut at max_tokens=8" in r.getMessage()]
    assert [r.levelno for r in cut] == [logging.WARNING, logging.DEBUG, logging.DEBUG]
