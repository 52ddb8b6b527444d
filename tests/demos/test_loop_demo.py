"""The ``loop`` demo part: demonstrations, LLaMA-Factory training, vLLM serving, the model acts.

The quick run (module fixture, marked slow) is a smoke run of every stage with the real
tools (learning is measured on MiniWoB++ held-out seeds: benchmarks/miniwob_loop.py;
CI tests that protocol with stand-in tools in tests/loop/test_miniwob_loop.py); the skip
line without tool environments is a fast test. Its
iteration 1 is the real text-observation rollout against vLLM (the trained model acts,
its prompts are plain text). The checks on the served side run in the vLLM
environment without a second server start: vLLM's tokenizer gives the checkpoint the
trainer's token ids, and vLLM's refusal of images for a text-only model says what the
rollouts look for.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from cli_runner import run_cli
from replaystore.demos import OPT_IN_PARTS, PARTS
from replaystore.demos.loop import run
from replaystore.loop.tools import checkpoint_weights
from replaystore.rollouts.outcomes import TEXT_ONLY_MODEL
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
def test_quick_loop_trains_serves_and_lets_the_model_act_on_the_suite(
    loop_demo: tuple[Path, str],
) -> None:
    """A smoke run of every stage with the real tools. Learning is measured on MiniWoB++
    held-out seeds (benchmarks/miniwob_loop.py): on the suite training and
    evaluation share their 16 instances, so its success rate would be memorisation."""
    out, stdout = loop_demo
    summary = json.loads((out / "summary.json").read_text())
    rows = summary["iterations"]
    assert [r["policy"] for r in rows] == ["demonstrations", "model"]
    assert rows[0]["checkpoint"] is None and rows[1]["checkpoint"] == "checkpoints/000"
    loss = rows[0]["train_loss"]
    assert loss["last"] < loss["first"]
    # The demonstrations (the suite's expert, acting by element id on the page text)
    # solve what is not behind the anti-bot wall; the model's rollouts are all counted.
    assert rows[0]["successful"] >= 8, rows[0]
    assert rows[1]["num_tasks"] == rows[0]["num_tasks"] - 2  # the walled site, blocklisted
    assert 0.0 <= rows[1]["success_rate"] <= 1.0
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


def _run_in(python: Path, script: str, *args: str) -> str:
    """The last line ``script`` prints, run by a tool environment's Python."""
    done = subprocess.run(
        [str(python), "-c", script, *args], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


#: Tokenized by both environments (numbers: coordinates and a port).
_PROBE = "Task: 38043 @(151,189)\nURL: http://shop.localhost:41234/\nAction: click(72, 27)"


@pytest.fixture(scope="module")
def served_side(loop_demo: tuple[Path, str], real_tools: Any) -> dict[str, Any]:
    """What the vLLM environment says, in one process (importing vLLM takes 10-15 s): the
    token ids vLLM's server tokenizer gives the trained checkpoint for :data:`_PROBE`, and
    whether vLLM's refusal of images for a text model still says ``<model> is not a
    multimodal model``."""
    script = (
        "import inspect, json, sys; from vllm.tokenizers import get_tokenizer; "
        "import vllm.multimodal.registry as r; t = get_tokenizer(sys.argv[1]); "
        "print(json.dumps({'ids': t.encode(sys.argv[2], add_special_tokens=False), "
        "'refusal': sys.argv[3] + '\"' in inspect.getsource(r)}))"
    )
    model = loop_demo[0] / "checkpoints" / "000"
    return json.loads(_run_in(real_tools.vllm_python, script, str(model), _PROBE, TEXT_ONLY_MODEL))


@pytest.mark.slow
def test_tiny_model_chat_template_is_chatml(loop_demo: tuple[Path, str]) -> None:
    model = loop_demo[0] / "checkpoints" / "000"
    config = json.loads((model / "tokenizer_config.json").read_text())
    template = config.get("chat_template") or (model / "chat_template.jinja").read_text()
    assert "<|im_start|>" in template and "add_generation_prompt" in template


@pytest.mark.slow
def test_vllm_tokenizes_prompts_exactly_as_the_training_environment(
    loop_demo: tuple[Path, str], real_tools: Any, served_side: dict[str, Any]
) -> None:
    """The two environments run different transformers (5.6 and 5.19): the served model
    must see the token ids it was trained on, numbers (coordinates, ports) included.

    vLLM's server tokenizes with ``vllm.tokenizers.get_tokenizer``; it is called in the
    vLLM environment on the checkpoint the loop trained (and served in its iteration 1),
    without a second server start (a minute of CI's budget)."""
    model = loop_demo[0] / "checkpoints" / "000"
    assert checkpoint_weights(model)
    trainer_side = (
        "import json, sys; from transformers import AutoTokenizer; "
        "t = AutoTokenizer.from_pretrained(sys.argv[1]); "
        "print(json.dumps(t.encode(sys.argv[2], add_special_tokens=False)))"
    )
    trained = _run_in(real_tools.train_python, trainer_side, str(model), _PROBE)
    assert served_side["ids"] == json.loads(trained)
    assert len(served_side["ids"]) > 10


@pytest.mark.slow
def test_vllm_refuses_images_for_a_text_model_with_the_words_rollouts_look_for(
    served_side: dict[str, Any],
) -> None:
    """A screenshot rollout against a text-only model is one line and exit status 2
    (``tests/rollouts/test_collector_cli.py``, against a server that answers as vLLM
    does). That test's premise is checked here against the installed vLLM: its refusal
    still says ``<model> is not a multimodal model`` (the f-string vLLM raises:
    ``f"{model_name} is not a multimodal model"``)."""
    assert served_side["refusal"] is True
