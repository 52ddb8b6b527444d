"""The ``loop`` demo part: demonstrations, LLaMA-Factory training, vLLM serving, the model acts.

The quick run (module fixture, about 3.5 min on 2 idle cores: marked slow) is what CI
runs with the real tools; the skip line without tool environments is a fast test. Its
iteration 1 is the real text-observation rollout against vLLM (the trained model acts,
its prompts are plain text). The checks that need a vLLM server of their own run
against one started on the checkpoint the run trained (one more server start, not a
second model and a second loop): the served model's tokens are the trainer's, and a
screenshot rollout against this text-only model is one line and exit status 2.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cli_runner import run_cli, run_cli_subprocess
from replaystore.demos import OPT_IN_PARTS, PARTS
from replaystore.demos.loop import run
from replaystore.loop.tools import VllmServer, checkpoint_weights
from replaystore.trajectories.storage import TrajectoryStorage


def test_part_is_opt_in_so_plain_demo_keeps_its_time() -> None:
    assert "loop" in OPT_IN_PARTS and "loop" not in PARTS


def test_without_tool_environments_one_skipped_line_names_the_setup_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REPLAYSTORE_LOOP_TOOLS", str(tmp_path / "no-tools"))
    lines = run(tmp_path / "loop", quick=True)
    assert len(lines) == 1
    assert lines[0].startswith("SKIPPED") and "bash .ci/install-loop-tools" in lines[0]
    assert not (tmp_path / "loop").exists()


@pytest.fixture(scope="module")
def loop_demo(
    tmp_path_factory: pytest.TempPathFactory, real_tools: Any, chromium: str | None
) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("demo")
    # CI runs this beside the other xdist worker's tests on 2 cores. The trainer's torch
    # starts one OpenMP thread per core, and with the other core busy its threads wait on
    # each other: iteration 0's training took 339 s there against 96 s alone
    # (2026-11-27). One thread per child keeps it near its single-core speed.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")
        result = run_cli("demo", "--quick", "--part", "loop", "--out", out)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SKIPPED" not in result.stdout, (
        result.stdout
    )  # the fixtures found the tools and a browser
    return out / "loop", result.stdout


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_quick_loop_trains_a_model_that_solves_a_quarter_of_the_suite(
    loop_demo: tuple[Path, str],
) -> None:
    out, stdout = loop_demo
    summary = json.loads((out / "summary.json").read_text())
    rows = summary["iterations"]
    assert [r["policy"] for r in rows] == ["demonstrations", "model"]
    assert rows[0]["checkpoint"] is None and rows[1]["checkpoint"] == "checkpoints/000"
    loss = rows[0]["train_loss"]
    assert loss["last"] < loss["first"]
    assert rows[-1]["success_rate"] >= 0.25, rows
    assert "no scripted policy" in stdout and "measured" in stdout


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_quick_loop_records_which_policy_and_checkpoint_produced_each_trajectory(
    loop_demo: tuple[Path, str],
) -> None:
    out, _ = loop_demo
    trajectories = TrajectoryStorage(out / "storage").load_all()
    policies = {
        (t[-1]["trajectory_metadata"]["policy"], t[-1]["trajectory_metadata"]["checkpoint"])
        for t in trajectories
    }
    assert policies == {("demonstrations", None), ("model", "checkpoints/000")}
    prompts = [
        json.loads(s["response"].raw_prompt)
        for t in trajectories
        for s in t
        if s["response"].raw_prompt
    ]
    assert prompts and all(isinstance(m["content"], str) for p in prompts for m in p)


@pytest.fixture(scope="module")
def served(loop_demo: tuple[Path, str], real_tools: Any) -> Iterator[tuple[str, Path]]:
    """The checkpoint the quick loop trained, served by vLLM as ``tiny``: (base URL, dir)."""
    out, _ = loop_demo
    checkpoint = out / "checkpoints" / "000"
    assert checkpoint_weights(checkpoint)
    server = VllmServer(
        real_tools.vllm_python,
        max_model_len=4096,
        extra_args=["--enforce-eager"],
        env={"VLLM_CPU_KVCACHE_SPACE": "1"},
    )
    server.start(checkpoint, "tiny", log_path=out / "logs" / "test-serve.log", stage="test serve")
    try:
        assert server.base_url is not None
        yield server.base_url, checkpoint
    finally:
        server.stop()
    assert server.child is None


@pytest.mark.slow
def test_tiny_model_chat_template_is_chatml(served: tuple[str, Path]) -> None:
    model = served[1]
    config = json.loads((model / "tokenizer_config.json").read_text())
    template = config.get("chat_template") or (model / "chat_template.jinja").read_text()
    assert "<|im_start|>" in template and "add_generation_prompt" in template


@pytest.mark.slow
def test_screenshot_rollout_against_a_text_model_is_one_line_and_exit_2(
    served: tuple[str, Path], tmp_path: Path
) -> None:
    base_url, _ = served
    result = run_cli_subprocess(
        "rollout", "--tasks", "suite", "--policy", "openai", "--base-url", base_url,
        "--model", "tiny", "--observation", "screenshot", "--max-tasks", "1",
        "--out", tmp_path / "run", timeout=300,
    )  # fmt: skip
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "not a multimodal model" in lines[0] and "--observation text" in lines[0]
    assert "Traceback" not in result.stdout + result.stderr


@pytest.mark.slow
def test_vllm_tokenizes_prompts_exactly_as_the_training_environment(
    served: tuple[str, Path], real_tools: Any
) -> None:
    """The two environments run different transformers (5.6 and 5.19): the served model
    must see the token ids it was trained on, numbers (coordinates, ports) included."""
    base_url, model = served
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
        [str(real_tools.train_python), "-c", script, str(model), text],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(trained.stdout.strip().splitlines()[-1]) == served_ids
