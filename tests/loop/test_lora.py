"""LoRA in the loop (``train.finetuning_type: lora``), with the stand-in tools: each
iteration trains an adapter on the base model, ``train.init: previous`` goes on training
the adapter that acted, and vLLM serves the base once with ``--enable-lora`` and loads each
new adapter while it runs (the policy asks for the adapter by name), or, with
``serve.merge: true``, serves each adapter merged into the base by ``llamafactory-cli
export``. The real tools run the same loop in tests/loop/test_lora_training.py (slow)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from replaystore.errors import ConfigError
from replaystore.loop import LoopConfig
from replaystore.loop.tools import (
    TEMPLATES,
    template_text,
    training_arguments,
    vllm_lora_rank,
)
from replaystore.trajectories.storage import TrajectoryStorage

from .fake_tools import loop_command, make_fake_model, make_fake_tools, read_calls

pytest.importorskip("miniwob", reason="the miniwob extra brings the MiniWoB++ pages")


def _loop(tmp_path: Path, chromium: str | None, **more: Any) -> dict[str, Any]:
    config = {
        "out": "run",
        "iterations": 3,
        "tasks": "miniwob:click-test",
        "train_seeds": "0-99",
        "seeds_per_iteration": 1,
        "evaluation": {"seeds": "5000-5000"},
        "tools_dir": str(make_fake_tools(tmp_path)),
        "bootstrap": {"source": "scripted", "repeats": 1},
        "model": {"path": str(make_fake_model(tmp_path / "base")), "evaluate_untrained": False},
        "rollout": {"workers": 1, "viewport": [400, 300], "max_steps": {"easy": 1}},
        "serve": {"startup_timeout_s": 30.0},
        "policy": {"max_retries": 0},
        "train": {"final": False, "finetuning_type": "lora", "lora": {"rank": 12}},
    }
    for section, values in more.items():
        config[section] = {**config.get(section, {}), **values}
    done = loop_command(tmp_path, config, env={"OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    return {"out": done.stdout, "calls": read_calls(tmp_path), "run": tmp_path / "run"}


def _train_yaml(run: Path, k: int) -> dict[str, Any]:
    return yaml.safe_load((run / "iterations" / f"{k:03d}" / "train.yaml").read_text())


def test_adapters_go_on_training_and_are_loaded_into_one_running_server(
    tmp_path: Path, chromium: str | None
) -> None:
    result = _loop(tmp_path, chromium)
    run, calls = result["run"], result["calls"]
    base = str(tmp_path / "base")
    # Training: an adapter on the base each time; the second goes on with the first.
    first, second = _train_yaml(run, 0), _train_yaml(run, 1)
    assert first["finetuning_type"] == second["finetuning_type"] == "lora"
    assert first["lora_rank"] == 12 and first["model_name_or_path"] == base
    assert "adapter_name_or_path" not in first
    assert second["model_name_or_path"] == base
    assert second["adapter_name_or_path"] == str(run / "checkpoints" / "000")
    assert (run / "checkpoints" / "001" / "adapter_config.json").is_file()
    # Serving: one server start, on the base, with LoRA on (rank 12 -> vLLM's 16) ...
    starts = [c for c in calls if c["tool"] == "serve" and "event" not in c]
    assert len(starts) == 1 and starts[0]["model"] == base
    extra = starts[0]["extra"]
    assert extra[extra.index("--max-lora-rank") + 1] == "16" and "--enable-lora" in extra
    # ... each adapter loaded while it runs, the one before unloaded.
    events = [(c["event"], c["lora_name"]) for c in calls if c.get("event", "").endswith("adapter")]
    assert events == [
        ("load_lora_adapter", "policy-000"),
        ("load_lora_adapter", "policy-001"),
        ("unload_lora_adapter", "policy-000"),
    ]
    # The model that acted is the adapter, by name (the stand-in server answers only the
    # names it serves, so every rollout of iterations 1 and 2 went to it).
    journal = json.loads((run / "journal.json").read_text())
    served = [it["stages"].get("serve", {}).get("served_as") for it in journal["iterations"]]
    assert served == [None, "policy-000", "policy-001"]
    serve = [it["stages"].get("serve", {}) for it in journal["iterations"]]
    assert serve[1]["log"] == "logs/lora-001.log" and serve[1]["server_log"] == "logs/serve-001.log"
    assert serve[2]["log"] == "logs/lora-002.log" and "server_log" not in serve[2]
    summary = json.loads((run / "summary.json").read_text())
    assert [r["policy"] for r in summary["iterations"]] == ["demonstrations", "model", "model"]
    stored = TrajectoryStorage(run / "storage")
    for file in stored.files()[1:]:  # iterations 1 and 2: the model's rollouts
        for trajectory in stored.read_file(file):
            assert trajectory[0]["response"].raw_response.startswith("Action: answer(")
    assert "serving the adapter on" in result["out"] and "as 'policy-001'" in result["out"]


def test_merged_adapters_are_served_as_whole_models(tmp_path: Path, chromium: str | None) -> None:
    result = _loop(tmp_path, chromium, serve={"startup_timeout_s": 30.0, "merge": True})
    run, calls = result["run"], result["calls"]
    exports = [c for c in calls if c["tool"] == "export"]
    assert [(c["adapter"], c["export_dir"]) for c in exports] == [
        (str(run / "checkpoints" / "000"), str(run / "checkpoints" / "000-merged.partial")),
        (str(run / "checkpoints" / "001"), str(run / "checkpoints" / "001-merged.partial")),
    ]
    assert all(c["model"] == str(tmp_path / "base") for c in exports)
    starts = [c for c in calls if c["tool"] == "serve" and "event" not in c]
    assert [c["model"] for c in starts] == [
        str(run / "checkpoints" / "000-merged"),
        str(run / "checkpoints" / "001-merged"),
    ]
    assert all("--enable-lora" not in c["extra"] for c in starts)
    assert not [c for c in calls if c.get("event", "").endswith("adapter")]
    journal = json.loads((run / "journal.json").read_text())
    assert journal["iterations"][1]["stages"]["serve"]["merged"] == "checkpoints/000-merged"


def test_vllm_ranks_and_the_lora_keys_are_checked(tmp_path: Path) -> None:
    assert [vllm_lora_rank(r) for r in (1, 2, 8, 9, 64, 300, 512)] == [1, 8, 8, 16, 64, 320, 512]
    for bad in (0, 513, 8.0, True):
        with pytest.raises(ConfigError, match="LoRA rank"):
            vllm_lora_rank(bad)  # type: ignore[arg-type]
    cases = [
        ({"finetuning_type": "qlora"}, "train.finetuning_type must be one of full, lora"),
        ({"lora": {"rank": 0}}, "train.lora.rank must be an integer >= 1"),
        ({"lora": {"rank": 1024}}, "train.lora.rank must be at most 512"),
        ({"lora": {"dropout": 1.5}}, "train.lora.dropout must be in [0, 1)"),
        ({"lora": {"target": ["q_proj"]}}, "train.lora.target must be a comma-separated"),
        ({"lora": {"ranks": 8}}, "unknown key train.lora.'ranks' (did you mean 'rank'?)"),
    ]
    for train, message in cases:
        with pytest.raises(ConfigError) as caught:
            LoopConfig.from_mapping({"out": "run", "train": train}, base_dir=tmp_path)
        assert message in str(caught.value), (train, str(caught.value))
    with pytest.raises(ConfigError, match=r"serve\.merge must be true or false"):
        LoopConfig.from_mapping({"out": "run", "serve": {"merge": "yes"}}, base_dir=tmp_path)
    with pytest.raises(ConfigError, match="adapter_name_or_path is set by the loop"):
        training_arguments(
            "stage: sft\n",
            model="m",
            dataset_dir=tmp_path,
            dataset="d",
            output_dir=tmp_path,
            overrides={"adapter_name_or_path": "x"},
        )


def test_the_built_in_templates_by_name_and_the_lora_keys_over_them(tmp_path: Path) -> None:
    assert set(TEMPLATES) == {"text", "text_lora", "qwen2_vl", "qwen2_vl_lora"}
    config = LoopConfig.from_mapping(
        {"out": "run", "train": {"template": "text_lora", "lora": {"rank": 16}}},
        base_dir=tmp_path,
    )
    assert config.train_template() == "text_lora"  # a name, not a path under the config's
    assert config.resolved()["train"]["template"] == "text_lora"
    args = training_arguments(
        template_text(config.train_template()),
        model="Qwen/Qwen2.5-1.5B-Instruct",
        dataset_dir=tmp_path,
        dataset="webagent",
        output_dir=tmp_path / "out",
        overrides={"bf16": False},
        settings=config.training_settings(),
        adapter=tmp_path / "previous",
    )
    assert args["finetuning_type"] == "lora" and args["lora_rank"] == 16  # train.lora wins
    assert args["lora_alpha"] == 16 and args["lora_target"] == "all"  # the template's
    assert args["learning_rate"] == 1.0e-4 and args["bf16"] is False
    assert args["adapter_name_or_path"] == str(tmp_path / "previous")
    vl = yaml.safe_load(template_text("qwen2_vl_lora"))
    assert vl["finetuning_type"] == "lora" and vl["template"] == "qwen2_vl" and vl["bf16"]
    tiny = yaml.safe_load(template_text(None))
    assert tiny["finetuning_type"] == "full" and tiny["bf16"] is False
    file = tmp_path / "mine.yaml"
    file.write_text("stage: sft\n")
    config = LoopConfig.from_mapping(
        {"out": "run", "train": {"template": "mine.yaml"}}, base_dir=tmp_path
    )
    assert config.train_template() == file
