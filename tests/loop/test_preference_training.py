"""DPO trains for real (slow): LLaMA-Factory trains a freshly built tiny model with
``stage: dpo`` on the DPO export of a small storage of right and wrong answers, with the
arguments the loop writes for a DPO iteration (:func:`preference_arguments` over the
built-in template). No browser and no vLLM. KTO trains for real inside a loop run in
tests/loop/test_lora_training.py."""

from __future__ import annotations

import math
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from replaystore.loop.tools import (
    checkpoint_weights,
    make_tiny_model,
    preference_arguments,
    read_losses,
    template_text,
    training_arguments,
)
from replaystore.trajectories.export import export_llamafactory
from replaystore.trajectories.preference import dpo_pairs, preference_steps, storage_trajectories
from replaystore.trajectories.storage import TrajectoryStorage

from .test_preference_stage import _attempts

pytestmark = pytest.mark.slow


@pytest.mark.timeout(400)
def test_dpo_trains_the_tiny_model_with_the_loops_arguments(
    tmp_path: Path, real_tools: Any
) -> None:
    attempts = _attempts(tmp_path, with_failures=True)
    pairs, report = dpo_pairs(preference_steps(storage_trajectories(TrajectoryStorage(attempts))))
    assert report.pairs == 2
    export_llamafactory(pairs, tmp_path / "dpo", dataset_name="webagent", kind="dpo")
    model = tmp_path / "model"
    make_tiny_model(
        real_tools.train_python,
        model,
        corpus=[tmp_path / "dpo" / "webagent.json"],
        layers=1,
        hidden=64,
        heads=1,
        vocab=400,
        log_path=tmp_path / "model.log",
    )
    arguments = preference_arguments(
        training_arguments(
            template_text("text"),
            model=model,
            dataset_dir=tmp_path / "dpo",
            dataset="webagent",
            output_dir=tmp_path / "dpo-out",
            overrides={
                "num_train_epochs": 1,
                "per_device_train_batch_size": 2,
                "learning_rate": 1.0e-4,
            },
        ),
        "dpo",
    )
    assert arguments["pref_loss"] == "sigmoid" and "mask_history" not in arguments
    (tmp_path / "dpo.yaml").write_text(yaml.safe_dump(arguments), encoding="utf-8")
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
