"""The ``miniwob`` demo part: its configurations and its skip line (fast), and the quick
run with the real tools (slow): CI's one learning test.

The quick run (module fixture, marked slow) is ``replaystore demo --quick --part
miniwob``: the experts' demonstrations on training seeds, LLaMA-Factory trains the tiny
model, vLLM serves it, and the model acts alone on held-out seeds it never trained on,
scored by the pages' own reward. The same protocol with stand-in tools is a fast test
(tests/loop/test_miniwob_loop.py). The checks on the served side run in the vLLM
environment on this run's checkpoint, without a second server start.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from cli_runner import run_cli
from replaystore.demos import OPT_IN_PARTS, PARTS
from replaystore.demos.miniwob import full_config, quick_config, run, summary_lines
from replaystore.loop import LoopConfig
from replaystore.loop.tools import checkpoint_weights
from replaystore.rollouts.miniwob import EXPERT_TASKS, QUICK_TASKS, parse_task_names
from replaystore.rollouts.outcomes import TEXT_ONLY_MODEL
from replaystore.trajectories.storage import TrajectoryStorage

pytest.importorskip("miniwob", reason="the miniwob extra brings the MiniWoB++ pages")


def test_part_is_opt_in() -> None:
    assert "miniwob" in OPT_IN_PARTS and "miniwob" not in PARTS


@pytest.mark.parametrize("make", [quick_config, full_config])
def test_configurations_check_and_keep_training_and_held_out_seeds_apart(make) -> None:
    config = LoopConfig.from_mapping(make())
    assert config.on_miniwob
    held = set(range(100000, 100050))
    drawn = {s for k in range(config["iterations"]) for s in config.train_seeds(k)}
    assert drawn and not drawn & held
    names = parse_task_names(config["tasks"])
    assert names == list(QUICK_TASKS if make is quick_config else EXPERT_TASKS)


def test_without_tool_environments_one_skipped_line_names_the_setup_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REPLAYSTORE_LOOP_TOOLS", str(tmp_path / "no-tools"))
    lines = run(tmp_path / "miniwob", quick=True)
    assert len(lines) == 1
    assert lines[0].startswith("SKIPPED") and "bash .ci/install-loop-tools" in lines[0]
    assert not (tmp_path / "miniwob").exists()


def test_summary_lines_say_what_acted_and_where_it_was_measured(tmp_path: Path) -> None:
    summary = {
        "evaluation": {"tasks": "miniwob:quick", "seeds": "100000-100009", "train_seeds": "0-9"},
        "untrained": {"eval": {"mean": 0.0}},
        "iterations": [
            {
                "iteration": 0,
                "policy": "demonstrations",
                "checkpoint": None,
                "eval": {"tasks": {"click-button": 1.0}, "mean": 1.0},
                "successful": 4,
                "num_tasks": 4,
                "seconds": {"rollout": 3.0},
            },
            {
                "iteration": 1,
                "policy": "model",
                "checkpoint": "checkpoints/000",
                "eval": {"tasks": {"click-button": 0.5}, "mean": 0.5},
                "successful": 1,
                "num_tasks": 4,
                "seconds": {"rollout": 2.0},
            },
        ],
    }
    lines = summary_lines(summary, tmp_path)
    assert "held-out seeds 100000-100009" in lines[0]
    assert "untrained model: held-out 0%" in lines
    assert lines[3].startswith("iteration 0: experts (demonstrations): held-out 100%")
    assert lines[4].startswith("iteration 1: model checkpoints/000: held-out 50%")
    assert lines[-1] == f"measured: {tmp_path / 'summary.json'}"


@pytest.fixture(scope="module")
def quick_run(
    tmp_path_factory: pytest.TempPathFactory, real_tools: Any, chromium: str | None
) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("demo")
    # CI runs this beside the other xdist worker's tests on 2 cores: one OpenMP thread per
    # child process keeps the trainer near its single-core speed (with one thread per core
    # its threads wait on each other while the other core is busy).
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")
        result = run_cli("demo", "--quick", "--part", "miniwob", "--out", out)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SKIPPED" not in result.stdout, result.stdout  # the tools and a browser were found
    return out / "miniwob", result.stdout


def _episodes(root: Path) -> list[tuple[str, int, float, dict[str, Any]]]:
    """``(task, seed, reward, evaluation)`` of every trajectory stored under ``root``."""
    storage = TrajectoryStorage(root)
    rows = []
    for file in storage.files():
        for trajectory in storage.read_file(file):
            reference = trajectory[0]["observation"].task.evaluator_reference
            reward = trajectory[-1]["reward"]
            rows.append(
                (reference["miniwob"], reference["seed"], reward.reward, reward.evaluation or {})
            )
    return rows


@pytest.mark.slow
@pytest.mark.timeout(720)
def test_the_trained_model_succeeds_on_held_out_seeds(quick_run: tuple[Path, str]) -> None:
    """Issue 37's CI goal: the model trained on the experts' demonstrations reaches a
    held-out mean of at least 0.6 (measured 1.00 in bf16 and 0.80 in float32, 2026-11-29; the
    untrained model 0; a policy that always clicks the first element is under 0.5:
    tests/rollouts/test_miniwob.py), every figure from the pages' own reward."""
    out, stdout = quick_run
    summary = json.loads((out / "summary.json").read_text())
    rows = summary["iterations"]
    assert [r["policy"] for r in rows] == ["demonstrations", "model"]
    assert rows[1]["checkpoint"] == "checkpoints/000"
    experts, model = rows[0]["eval"], rows[1]["eval"]
    untrained = summary["untrained"]["eval"]
    for held in (experts, model, untrained):
        assert held["seeds"] == "100000-100009" and held["episodes"] == 40
        assert sorted(held["tasks"]) == sorted(QUICK_TASKS)
    assert experts["mean"] >= 0.95, experts
    assert model["mean"] >= 0.6, (model, untrained)
    assert untrained["mean"] < model["mean"]
    assert rows[0]["train_loss"]["last"] < rows[0]["train_loss"]["first"]
    # Scored by the pages: every held-out episode's reward says so.
    for _, _, reward, evaluation in _episodes(out / "heldout" / "storage"):
        assert evaluation["source"] == "miniwob" and "raw_reward" in evaluation
        assert reward == (1.0 if evaluation["raw_reward"] > 0 else 0.0)
    assert (out / "learning_curve.png").stat().st_size > 0
    assert f"untrained model: held-out {untrained['mean']:.0%}" in stdout
    assert f"model checkpoints/000: held-out {model['mean']:.0%}" in stdout


@pytest.mark.slow
@pytest.mark.timeout(720)
def test_training_and_held_out_seeds_never_overlap(quick_run: tuple[Path, str]) -> None:
    out, _ = quick_run
    trained = _episodes(out / "storage")
    held = _episodes(out / "heldout" / "storage") + _episodes(out / "baseline" / "storage")
    assert len(trained) == 4 * (5 * 6 + 5)  # demonstrations, then the model's iteration 1
    assert len(held) == 3 * 40  # experts, model, untrained: 4 tasks x 10 seeds each
    train_seeds = {seed for _, seed, _, _ in trained}
    held_seeds = {seed for _, seed, _, _ in held}
    assert held_seeds == set(range(100000, 100010))
    assert train_seeds and not train_seeds & held_seeds
    assert max(train_seeds) < 100000


@pytest.mark.slow
@pytest.mark.timeout(720)
def test_each_trajectory_records_the_policy_and_checkpoint_that_produced_it(
    quick_run: tuple[Path, str],
) -> None:
    out, _ = quick_run
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
    # Text observations: every message's content is a string (no image parts).
    assert prompts and all(isinstance(m["content"], str) for p in prompts for m in p)


def _run_both(*calls: tuple[Path, str, tuple[str, ...]]) -> list[str]:
    """The last line each ``(python, script, args)`` prints, the scripts run at once (each
    imports its environment's stack for 10-15 s, and at the end of CI's slow step the
    other worker's core is free)."""
    started = [
        subprocess.Popen(
            [str(python), "-c", script, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for python, script, args in calls
    ]
    lines = []
    try:
        for child in started:
            out, err = child.communicate(timeout=300)
            assert child.returncode == 0, err[-2000:]
            lines.append(out.strip().splitlines()[-1])
    finally:
        for child in started:  # the other one, when one failed or ran out of time
            if child.poll() is None:
                child.kill()
                child.communicate()
    return lines


#: Tokenized by both environments (numbers: ids, coordinates and a port).
_PROBE = 'Task: 38043 @(151,189)\nURL: http://shop.localhost:41234/\nAction: click("72")'


@pytest.fixture(scope="module")
def both_sides(quick_run: tuple[Path, str], real_tools: Any) -> dict[str, Any]:
    """What each tool environment says about the trained checkpoint, in one process each,
    run at once. The vLLM side: the token ids vLLM's server tokenizer gives
    :data:`_PROBE`, and whether vLLM's refusal of images for a text model still says
    ``<model> is not a multimodal model``. The training side: the token ids the
    LLaMA-Factory environment's transformers gives it."""
    served = (
        "import inspect, json, sys; from vllm.tokenizers import get_tokenizer; "
        "import vllm.multimodal.registry as r; t = get_tokenizer(sys.argv[1]); "
        "print(json.dumps({'ids': t.encode(sys.argv[2], add_special_tokens=False), "
        "'refusal': sys.argv[3] + '\"' in inspect.getsource(r)}))"
    )
    trainer = (
        "import json, sys; from transformers import AutoTokenizer; "
        "t = AutoTokenizer.from_pretrained(sys.argv[1]); "
        "print(json.dumps(t.encode(sys.argv[2], add_special_tokens=False)))"
    )
    model = str(quick_run[0] / "checkpoints" / "000")
    served_line, trained_line = _run_both(
        (real_tools.vllm_python, served, (model, _PROBE, TEXT_ONLY_MODEL)),
        (real_tools.train_python, trainer, (model, _PROBE)),
    )
    return {**json.loads(served_line), "trained_ids": json.loads(trained_line)}


@pytest.mark.slow
@pytest.mark.timeout(720)
def test_tiny_model_chat_template_is_chatml(quick_run: tuple[Path, str]) -> None:
    model = quick_run[0] / "checkpoints" / "000"
    config = json.loads((model / "tokenizer_config.json").read_text())
    template = config.get("chat_template") or (model / "chat_template.jinja").read_text()
    assert "<|im_start|>" in template and "add_generation_prompt" in template


@pytest.mark.slow
@pytest.mark.timeout(720)
def test_vllm_tokenizes_prompts_exactly_as_the_training_environment(
    quick_run: tuple[Path, str], both_sides: dict[str, Any]
) -> None:
    """The two environments run different transformers (5.6 and 5.19): the served model
    must see the token ids it was trained on, numbers (ids, ports) included.

    vLLM's server tokenizes with ``vllm.tokenizers.get_tokenizer``; it is called in the
    vLLM environment on the checkpoint the loop trained (and served in its iteration 1),
    without a second server start (a minute of CI's budget)."""
    assert checkpoint_weights(quick_run[0] / "checkpoints" / "000")
    assert both_sides["ids"] == both_sides["trained_ids"]
    assert len(both_sides["ids"]) > 10


@pytest.mark.slow
@pytest.mark.timeout(720)
def test_vllm_refuses_images_for_a_text_model_with_the_words_rollouts_look_for(
    both_sides: dict[str, Any],
) -> None:
    """A screenshot rollout against a text-only model is one line and exit status 2
    (``tests/rollouts/test_collector_cli.py``, against a server that answers as vLLM
    does). That test's premise is checked here against the installed vLLM: its refusal
    still says ``<model> is not a multimodal model`` (the f-string vLLM raises:
    ``f"{model_name} is not a multimodal model"``)."""
    assert both_sides["refusal"] is True
