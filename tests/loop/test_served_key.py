"""The model server beyond localhost: bound there only when asked, then behind an API key
the loop generates, which every request carries and no output file, log or summary holds."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import replaystore.rollouts.sites
from replaystore.loop.tools import VllmServer, advertised_host, is_loopback

from .fake_tools import loop_command, make_fake_model, make_fake_tools, read_calls
from .test_failures import demonstrations

SUITE_TASKS = Path(replaystore.rollouts.sites.__file__).parent / "tasks.jsonl"


def _models(base_url: str, key: str | None = None) -> list[str]:
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    request = urllib.request.Request(f"{base_url}/models", headers=headers)
    with urllib.request.urlopen(request, timeout=5) as response:
        return [m["id"] for m in json.loads(response.read())["data"]]


def test_a_loopback_server_has_no_key() -> None:
    assert VllmServer(Path("python")).api_key is None
    assert VllmServer(Path("python"), host="localhost").api_key is None
    assert is_loopback("127.0.0.1") and is_loopback("::1") and not is_loopback("0.0.0.0")


def test_a_server_beyond_localhost_requires_the_key_it_was_given(tmp_path: Path) -> None:
    tools = make_fake_tools(tmp_path)
    server = VllmServer(tools / "vllm" / "bin" / "python", host="0.0.0.0", startup_timeout_s=30)
    key = server.api_key
    assert key is not None and len(key) >= 32
    assert VllmServer(Path("python"), host="0.0.0.0").api_key != key  # fresh per server
    log = tmp_path / "serve.log"
    try:
        server.start(make_fake_model(tmp_path / "model"), "policy", log_path=log, stage="t")
        assert server.base_url is not None
        assert server.base_url.startswith(f"http://{advertised_host('0.0.0.0')}:")
        with pytest.raises(urllib.error.HTTPError, match="401"):
            _models(server.base_url)
        with pytest.raises(urllib.error.HTTPError, match="401"):
            _models(server.base_url, "wrong")
        assert _models(server.base_url, key) == ["policy"]
    finally:
        server.stop()
    assert key not in log.read_text(encoding="utf-8")  # the command line holds no key
    (start,) = [c for c in read_calls(tmp_path) if c.get("api_key")]
    assert start["host"] == "0.0.0.0"


def test_the_loop_sends_the_key_and_writes_it_nowhere(tmp_path: Path, chromium: str | None) -> None:
    config = {
        "out": "run",
        "iterations": 2,
        "tasks_per_iteration": 2,
        "tools_dir": str(make_fake_tools(tmp_path)),
        "bootstrap": {"source": "demos"},
        "model": {"path": "base", "evaluate_untrained": False},
        "serve": {"host": "0.0.0.0", "startup_timeout_s": 30.0},
        "policy": {"max_retries": 0},
        "rollout": {"workers": 2},
        "train": {"final": False},
    }
    demonstrations(tmp_path)
    make_fake_model(tmp_path / "base")
    result = loop_command(tmp_path, config, env={"FAKE_TASKS": str(SUITE_TASKS)}, timeout=200)
    assert result.returncode == 0, result.stdout + result.stderr
    calls = read_calls(tmp_path)
    keys = {c["api_key"] for c in calls if c["tool"] == "serve" and "api_key" in c}
    assert len(keys) == 1 and None not in keys  # one key for the run, always sent
    (key,) = keys
    assert not [c for c in calls if c.get("event") == "unauthorized"]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert [row["policy"] for row in summary["iterations"]] == ["demonstrations", "model"]
    assert key not in result.stdout + result.stderr
    files = [p for p in (tmp_path / "run").rglob("*") if p.is_file()]
    assert any(p.name == "summary.json" for p in files)
    holding = [str(p) for p in files if key.encode() in p.read_bytes()]
    assert holding == []
