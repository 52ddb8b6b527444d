"""Against the real tools: vLLM's CPU build serving the tiny model this package builds.

A text-only model served by vLLM is what a new user points ``replaystore rollout``
at first: with ``--observation text`` the rollout runs; with screenshots the server's
"not a multimodal model" answer is one line and exit status 2. Slow (a vLLM start
takes about 30-50 s on 2 cores); needs the tool environments and Chromium.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cli_runner import run_cli_subprocess
from replaystore.loop.tools import VllmServer, checkpoint_weights, make_tiny_model

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def served(real_tools: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The tiny model (no corpus: the built-in text) served by vLLM as ``tiny``."""
    root = tmp_path_factory.mktemp("vllm")
    model = root / "model"
    settings = make_tiny_model(real_tools.train_python, model, layers=2, hidden=128, heads=2)
    assert settings["head_dim"] == 64 and checkpoint_weights(model)
    # 4096: an untrained model's replies (512 tokens of noise each) fill the history.
    server = VllmServer(
        real_tools.vllm_python,
        max_model_len=4096,
        extra_args=["--enforce-eager"],
        env={"VLLM_CPU_KVCACHE_SPACE": "1"},
    )
    server.start(model, "tiny", log_path=root / "serve.log", stage="test serve")
    try:
        assert server.base_url is not None
        yield server.base_url, root
    finally:
        server.stop()
    assert server.child is None


def test_tiny_model_chat_template_is_chatml(served: tuple[str, Path]) -> None:
    config = json.loads((served[1] / "model" / "tokenizer_config.json").read_text())
    template = (
        config.get("chat_template") or (served[1] / "model" / "chat_template.jinja").read_text()
    )
    assert "<|im_start|>" in template and "add_generation_prompt" in template


def test_text_observation_rollout_runs_against_vllm(
    served: tuple[str, Path], chromium: str | None, tmp_path: Path
) -> None:
    base_url, _ = served
    result = run_cli_subprocess(
        "rollout", "--tasks", "suite", "--policy", "openai", "--base-url", base_url,
        "--model", "tiny", "--observation", "text", "--max-tasks", "2", "--workers", "2",
        "--out", tmp_path / "run", timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    from replaystore.trajectories.storage import TrajectoryStorage

    trajectories = TrajectoryStorage(tmp_path / "run" / "storage").load_all()
    assert len(trajectories) == 2
    # The untrained model answered (noise, or nothing when its first token is the end of
    # the turn, but the model's own text).
    replies = [s["response"].raw_response for t in trajectories for s in t]
    assert all(isinstance(r, str) for r in replies) and any(replies)
    prompt = json.loads(trajectories[0][0]["response"].raw_prompt)
    assert all(isinstance(m["content"], str) for m in prompt)  # no image parts


def test_screenshot_rollout_against_a_text_model_is_one_line_and_exit_2(
    served: tuple[str, Path], chromium: str | None, tmp_path: Path
) -> None:
    base_url, _ = served
    result = run_cli_subprocess(
        "rollout", "--tasks", "suite", "--policy", "openai", "--base-url", base_url,
        "--model", "tiny", "--observation", "screenshot", "--max-tasks", "2",
        "--out", tmp_path / "run", timeout=300,
    )  # fmt: skip
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "not a multimodal model" in lines[0] and "--observation text" in lines[0]
    assert "Traceback" not in result.stdout + result.stderr


def test_vllm_tokenizes_prompts_exactly_as_the_training_environment(
    served: tuple[str, Path], real_tools: Any
) -> None:
    """The two environments run different transformers (5.6 and 5.19): the served model
    must see the token ids it was trained on, numbers (coordinates, ports) included."""
    import subprocess
    import urllib.request

    base_url, root = served
    text = "Task: 38043 @(151,189)\nURL: http://shop.localhost:41234/\nAction: click(72, 27)"
    request = urllib.request.Request(
        base_url.removesuffix("/v1") + "/tokenize",
        data=json.dumps({"model": "tiny", "prompt": text, "add_special_tokens": False}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        served_ids = json.loads(response.read())["tokens"]
    script = (
        "import json, sys; from transformers import AutoTokenizer; "
        "t = AutoTokenizer.from_pretrained(sys.argv[1]); "
        "print(json.dumps(t(sys.argv[2], add_special_tokens=False)['input_ids']))"
    )
    trained = subprocess.run(
        [str(real_tools.train_python), "-c", script, str(root / "model"), text],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(trained.stdout.strip().splitlines()[-1]) == served_ids
