"""KTO and DPO train for real (slow): ``replaystore loop`` with ``train.stage: kto`` builds
the tiny model and trains it with the real LLaMA-Factory on every step of a small storage
of right and wrong answers; then LLaMA-Factory trains that model with ``stage: dpo`` on the
DPO export of the same storage, with the arguments the loop writes for a DPO iteration.
No browser and no vLLM: iteration 0 imports the attempts, and one iteration only trains."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from replaystore.loop.tools import checkpoint_weights, read_losses
from replaystore.trajectories.export import export_llamafactory
from replaystore.trajectories.preference import dpo_pairs, preference_steps, storage_trajectories
from replaystore.trajectories.storage import TrajectoryStorage

from .test_preference_stage import _attempts

pytestmark = pytest.mark.slow

_SMALL = {"num_train_epochs": 1, "per_device_train_batch_size": 2, "learning_rate": 1.0e-4}


@pytest.mark.timeout(500)
def test_kto_in_the_loop_then_dpo_train_the_tiny_model(tmp_path: Path, real_tools: Any) -> None:
    attempts = _attempts(tmp_path, with_failures=True)
    config = {
        "out": "run",
        "iterations": 1,
        "tools_dir": str(real_tools.tools_dir),
        "bootstrap": {"source": str(attempts)},
        "model": {
            "tiny": {"layers": 1, "hidden": 64, "heads": 1, "vocab": 400},
            "evaluate_untrained": False,
        },
        "train": {"final": True, "stage": "kto", "overrides": _SMALL},
    }
    (tmp_path / "loop.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "replaystore.cli", "loop", "--config", "loop.yaml"],
        capture_output=True,
        text=True,
        timeout=400,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        cwd=tmp_path,
        check=False,
    )
    run = tmp_path / "run"
    log = run / "logs" / "train-000.log"
    assert done.returncode == 0, done.stderr + (log.read_text()[-3000:] if log.exists() else "")
    checkpoint = run / "checkpoints" / "000"
    assert checkpoint_weights(checkpoint)
    assert read_losses(checkpoint / "trainer_log.jsonl")  # KTO logged its loss
    arguments = yaml.safe_load((run / "iterations" / "000" / "train.yaml").read_text())
    assert arguments["stage"] == "kto"

    # DPO on the same attempts, from the tiny model the loop built, with the loop's
    # arguments for a DPO iteration (stage, beta, loss; mask_history left out).
    pairs, report = dpo_pairs(preference_steps(storage_trajectories(TrajectoryStorage(attempts))))
    assert report.pairs == 2
    export_llamafactory(pairs, tmp_path / "dpo", dataset_name="webagent", kind="dpo")
    dpo = {
        **{k: v for k, v in arguments.items() if k != "eval_dataset"},
        "stage": "dpo",
        "pref_loss": "sigmoid",
        "model_name_or_path": str(run / "model"),
        "dataset_dir": str(tmp_path / "dpo"),
        "output_dir": str(tmp_path / "dpo-out"),
    }
    (tmp_path / "dpo.yaml").write_text(yaml.safe_dump(dpo), encoding="utf-8")
    trained = subprocess.run(
        [*real_tools.train_command, "train", "dpo.yaml"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        cwd=tmp_path,
        check=False,
    )
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    assert checkpoint_weights(tmp_path / "dpo-out")
    losses = read_losses(tmp_path / "dpo-out" / "trainer_log.jsonl")
    # The reference model is the model DPO starts from, so its first loss is
    # -log sigmoid(0) = ln 2: chosen and rejected are equally likely under both.
    assert losses and abs(losses[0] - math.log(2)) < 1e-3, losses
