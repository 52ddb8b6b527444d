"""LoRA and KTO with the real tools (slow), in one loop run: ``replaystore loop`` with
``train.finetuning_type: lora`` and ``train.stage: [kto, sft]`` on the tiny model.

Iteration 0 imports a small storage of right and wrong answers and LLaMA-Factory trains a
LoRA adapter on it with KTO (every step, tagged by its outcome). vLLM (its CPU build)
serves the base model once with ``--enable-lora`` and loads that adapter while it runs;
the adapter acts on MiniWoB++'s click-test in iteration 1, and LLaMA-Factory goes on
training the same adapter with SFT; iteration 2 loads the second adapter into the running
server and it acts. The merged path (``serve.merge: true``, ``llamafactory-cli export``)
runs with the stand-in tools in tests/loop/test_lora.py; DPO trains for real in
tests/loop/test_preference_training.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from replaystore.loop.tools import read_losses
from replaystore.trajectories.storage import TrajectoryStorage

from .fake_tools import loop_command
from .test_preference_stage import _attempts

pytestmark = pytest.mark.slow
pytest.importorskip("miniwob", reason="the miniwob extra brings the MiniWoB++ pages")


@pytest.mark.timeout(560)
def test_a_kto_adapter_then_an_sft_one_trained_on_from_it_served_without_a_restart(
    tmp_path: Path, real_tools: Any, chromium: str | None
) -> None:
    config = {
        "out": "run",
        "iterations": 3,
        "tasks": "miniwob:click-test",
        "train_seeds": "0-99",
        "seeds_per_iteration": 1,
        "evaluation": {"seeds": "5000-5000"},
        "tools_dir": str(real_tools.tools_dir),
        "bootstrap": {"source": str(_attempts(tmp_path, with_failures=True))},
        "model": {
            "tiny": {"layers": 1, "hidden": 64, "heads": 1, "vocab": 400},
            "evaluate_untrained": False,
        },
        "rollout": {"workers": 1, "viewport": [400, 300], "max_steps": {"easy": 1}},
        "policy": {"max_tokens": 24},
        "train": {
            "final": False,
            "stage": ["kto", "sft"],
            "finetuning_type": "lora",
            "lora": {"rank": 8, "alpha": 16, "target": "all"},
            "overrides": {
                "num_train_epochs": 1,
                "per_device_train_batch_size": 2,
                "learning_rate": 1.0e-3,
            },
        },
    }
    done = loop_command(tmp_path, config, env={"OMP_NUM_THREADS": "1"}, timeout=540)
    run = tmp_path / "run"
    logs = "".join(p.read_text()[-2000:] for p in sorted((run / "logs").glob("*.log")))
    assert done.returncode == 0, done.stdout + done.stderr + logs
    # Training: a KTO adapter, then an SFT adapter trained on from it, each with its loss.
    first = yaml.safe_load((run / "iterations" / "000" / "train.yaml").read_text())
    second = yaml.safe_load((run / "iterations" / "001" / "train.yaml").read_text())
    assert first["stage"] == "kto" and first["finetuning_type"] == "lora"
    assert first["pref_beta"] == 0.1 and "mask_history" not in first
    assert second["stage"] == "sft" and second["finetuning_type"] == "lora"
    assert second["adapter_name_or_path"] == str(run / "checkpoints" / "000")
    assert first["model_name_or_path"] == second["model_name_or_path"] == str(run / "model")
    assert (
        "Loaded adapter(s): " + str(run / "checkpoints" / "000")
        in (run / "logs" / "train-001.log").read_text()
    )
    dataset = run / "iterations" / "000" / "dataset"
    info = json.loads((dataset / "dataset_info.json").read_text())
    records = json.loads((dataset / info["webagent"]["file_name"]).read_text())
    assert sorted(r["kto_tag"] for r in records) == [False, False, True, True]
    for k in (0, 1):
        checkpoint = run / "checkpoints" / f"{k:03d}"
        assert (checkpoint / "adapter_config.json").is_file()
        assert (checkpoint / "adapter_model.safetensors").stat().st_size > 0
        assert not (checkpoint / "model.safetensors").exists()  # an adapter, not a model
        assert read_losses(checkpoint / "trainer_log.jsonl")
    # Serving: one vLLM start, in iteration 1, with LoRA on; iteration 2 only loaded its
    # adapter into the running server (and unloaded the one before), in milliseconds.
    journal = json.loads((run / "journal.json").read_text())
    serve = [it["stages"].get("serve", {}) for it in journal["iterations"]]
    assert [s.get("served_as") for s in serve] == [None, "policy-000", "policy-001"]
    assert serve[2]["seconds"] < 5 < serve[1]["seconds"], serve
    started = (run / "logs" / "serve-001.log").read_text()
    assert "--enable-lora --max-lora-rank 8 --max-loras 1" in started
    # serve.env's default VLLM_ENABLE_V1_MULTIPROCESSING=0: the engine core runs the model
    # (and its LoRA adapters) itself; no third process importing vLLM again.
    assert "(EngineCore pid=" in started and "VllmWorker" not in started
    assert (
        "Success: LoRA adapter 'policy-000' added successfully"
        in (run / "logs" / "lora-001.log").read_text()
    )
    assert not (run / "logs" / "serve-002.log").exists()  # no second server
    loaded = (run / "logs" / "lora-002.log").read_text()
    assert "Success: LoRA adapter 'policy-001' added successfully" in loaded
    assert "Success: LoRA adapter 'policy-000' removed successfully" in loaded
    # The adapters acted: iterations 1 and 2 stored the model's replies.
    stored = TrajectoryStorage(run / "storage")
    files = stored.files()
    assert len(files) == 3
    for file in files[1:]:
        for trajectory in stored.read_file(file):
            assert trajectory[0]["response"].raw_response is not None
    summary = json.loads((run / "summary.json").read_text())
    assert [r["policy"] for r in summary["iterations"]] == ["demonstrations", "model", "model"]
    assert [r["train_stage"] for r in summary["iterations"][:2]] == ["kto", "sft"]
