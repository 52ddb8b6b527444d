"""Real browser data all the way to fine-tuning records: rollout iteration -> storage
-> TrajectoryBuffer.from_storage -> get_training_samples -> LLaMA-Factory export."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from replaystore.rollouts.collector import RolloutCollector
from replaystore.rollouts.evaluator import Evaluator
from replaystore.rollouts.policy import WebAgent
from replaystore.rollouts.scripted import ScriptedPolicy
from replaystore.rollouts.sites import LocalSuite
from replaystore.trajectories import TrajectoryBuffer
from replaystore.trajectories.export import export_llamafactory, validate_record
from replaystore.trajectories.storage import TrajectoryStorage

from .conftest import TEST_MAX_STEPS, pool, run


def test_rollouts_become_llamafactory_records(
    browser: Any, suite: LocalSuite, tmp_path: Path
) -> None:
    by_id = {t.task_id: t for t in suite.tasks()}
    tasks = [by_id[i] for i in ("news-001", "recipes-001", "library-002")]
    # A policy that makes no mistakes: every trajectory is training data.
    agent = WebAgent(
        ScriptedPolicy(mistake_rate=0.0, wrong_answer_rate=0.0, improvement=1.0),
        image_urls="file",
    )

    async def go() -> None:
        async with pool(browser, 2) as contexts:
            collector = RolloutCollector(
                agent,
                Evaluator(),
                TrajectoryStorage(tmp_path / "storage"),
                pool=contexts,
                num_workers=2,
                max_steps_by_difficulty=TEST_MAX_STEPS,
                progress=False,
            )
            result = await collector.run_iteration(tasks, 1)
            assert result.success_rate == 1.0, result.status_counts()

    run(go())

    buffer = TrajectoryBuffer.from_storage(
        tmp_path / "storage", agent=agent, filter_successful_only=True, seed=0
    )
    steps = sum(len(t) for t in TrajectoryStorage(tmp_path / "storage").load_all())
    assert len(buffer) == steps  # every step of every solved task is eligible
    samples = buffer.get_training_samples(None)
    assert len(samples) == steps
    first = samples[0]
    # The stored prompt is exactly what the model saw (file:// image of the step's screenshot).
    assert first["message"][0]["role"] == "system"
    assert "Action:" in first["action"]

    report = export_llamafactory(samples, tmp_path / "lf", dataset_name="web", copy_images=True)
    info = json.loads(report.dataset_info_file.read_text(encoding="utf-8"))
    records = json.loads((report.out_dir / info["web"]["file_name"]).read_text(encoding="utf-8"))
    assert len(records) == steps
    for record in records:
        assert validate_record(record, "sharegpt", report.out_dir) == []
        assert record["images"], "each record carries the step's screenshot"
        assert record["conversations"][-1]["value"].startswith("<think>")
    assert report.images_written >= steps
