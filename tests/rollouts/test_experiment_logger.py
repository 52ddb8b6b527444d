"""ExperimentLogger: the metrics it computes, read back from real TensorBoard event files and
from a real W&B offline run file (WANDB_MODE=offline: nothing leaves the machine)."""

from __future__ import annotations

import json
import struct
import sys

import pytest
from PIL import Image

from replaystore.errors import ConfigError
from replaystore.rollouts.experiment_logger import ExperimentLogger, iteration_metrics
from replaystore.trajectories.components import Action, Observation, Response, Reward, Task


def trajectory(tmp_path, task_id, website, difficulty, n_steps, reward, *, blocked=False):
    task = Task(f"task {task_id}", "Misc.", "News", website, difficulty, [], "x", task_id=task_id)
    steps = []
    for i in range(n_steps):
        image = tmp_path / f"{task_id}-{i}.png"
        Image.new("RGB", (40, 30), (10 * i, 100, 200 if reward else 0)).save(image)
        last = i == n_steps - 1
        steps.append(
            {
                "observation": Observation(task, str(image), "", {"url": website, "title": "t"}),
                "action": Action({"key": "click"}, "click(1, 2)"),
                "response": Response("<think>.</think>\nAction: click(1, 2)", {}),
                "reward": Reward(
                    reward if last else 0.0, None, is_blocked=blocked, submit=last and not blocked
                ),
            }
        )
    return steps


@pytest.fixture
def iteration(tmp_path):
    return [
        trajectory(tmp_path, "shop-1", "http://shop.localhost/", 1, 2, 1.0),
        trajectory(tmp_path, "shop-2", "http://shop.localhost/", 2, 4, 0.0),
        trajectory(tmp_path, "news-1", "http://news.localhost/", 1, 3, 1.0),
        trajectory(tmp_path, "wall-1", "http://wall.localhost/", "hard", 1, 0.0, blocked=True),
    ]


def test_metrics_overall_by_website_and_by_difficulty(iteration):
    metrics = iteration_metrics(
        iteration, blocked_sites=["wall.localhost"], throughput={"steps_per_s": 2.5}
    )
    assert metrics["trajectories"] == 4
    assert metrics["success_rate"] == 0.5
    assert metrics["success_rate/website/shop.localhost"] == 0.5
    assert metrics["success_rate/website/news.localhost"] == 1.0
    assert metrics["success_rate/website/wall.localhost"] == 0.0
    assert metrics["success_rate/difficulty/easy"] == 1.0  # difficulty 1 -> easy
    assert metrics["success_rate/difficulty/medium"] == 0.0
    assert metrics["success_rate/difficulty/hard"] == 0.0  # "hard" as given
    assert (metrics["steps/mean"], metrics["steps/min"], metrics["steps/max"]) == (2.5, 1, 4)
    assert (metrics["reward/mean"], metrics["reward/max"]) == (0.5, 1.0)
    assert metrics["answer_rate"] == 0.75
    assert metrics["blocked/trajectory_rate"] == 0.25
    assert metrics["blocked/sites"] == 1
    assert metrics["throughput/steps_per_s"] == 2.5


def test_metrics_accept_steps_as_json_dicts(iteration):
    as_dicts = [[{k: v.to_dict() for k, v in step.items()} for step in traj] for traj in iteration]
    assert iteration_metrics(as_dicts) == iteration_metrics(iteration)


def test_empty_iteration_has_only_counts():
    assert iteration_metrics([]) == {"trajectories": 0.0, "blocked/sites": 0.0}


def test_none_backend_writes_nothing_and_returns_the_metrics(tmp_path, iteration):
    out = tmp_path / "logs"
    with ExperimentLogger("none", log_dir=out) as log:
        metrics = log.log_iteration(1, iteration)
    assert metrics["success_rate"] == 0.5
    assert not out.exists()


def test_tensorboard_event_files_hold_scalars_text_and_screenshots(tmp_path, iteration):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = ExperimentLogger(
        "tensorboard", log_dir=tmp_path / "tb", run_name="run1", config={"workers": 2}
    )
    first = log.log_iteration(
        1, iteration, blocked_sites=["wall.localhost"], throughput={"steps_per_s": 3.0}
    )
    log.log_iteration(2, iteration[:2], sample_screenshots=1)
    log.close()
    assert log.run_dir == tmp_path / "tb" / "run1"

    events = EventAccumulator(
        str(log.run_dir), size_guidance={"scalars": 0, "images": 0, "tensors": 0}
    )
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    assert set(first) <= scalars
    success = [(e.step, e.value) for e in events.Scalars("success_rate")]
    assert success == [(1, 0.5), (2, 0.5)]
    assert [e.value for e in events.Scalars("success_rate/website/news.localhost")] == [1.0]
    assert [e.value for e in events.Scalars("throughput/steps_per_s")] == [3.0]
    images = [tag for tag in events.Tags()["images"] if tag.startswith("screenshots/")]
    assert sorted(images) == [f"screenshots/{i}" for i in range(4)]
    (shot,) = events.Images("screenshots/0")[:1]
    assert (shot.width, shot.height) == (40, 30)
    texts = {t: events.Tensors(t) for t in events.Tags()["tensors"]}
    blocked = [t for t in texts if t.startswith("blocked_sites")]
    assert blocked and b"wall.localhost" in texts[blocked[0]][0].tensor_proto.string_val[0]
    assert any(t.startswith("config") for t in texts)


def _wandb_records(run_file):
    """Records of a W&B ``.wandb`` file: a LevelDB-style log (32 KiB blocks, 7-byte record
    headers: crc32, length, type FULL/FIRST/MIDDLE/LAST) after a 7-byte ``:W&B`` header."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, chunks, out = 7, 32768, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        payload, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 2):
            chunks = payload
        else:
            chunks += payload
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunks)
            out.append(record)
    return out


def test_wandb_offline_run_records_the_metrics(tmp_path, iteration, monkeypatch):
    for name in ("WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    log = ExperimentLogger(
        "wandb",
        log_dir=tmp_path / "wb",
        project="p",
        run_name="r",
        config={"workers": 2},
        wandb_settings={"x_disable_meta": True, "disable_git": True},  # fast in a git checkout
    )
    log.log_iteration(1, iteration, blocked_sites=["wall.localhost"], sample_screenshots=2)
    log.log_iteration(2, iteration[:1])
    log.close()
    assert log.run_dir.name.startswith("offline-run-")
    (run_file,) = log.run_dir.glob("run-*.wandb")

    history = []
    for record in _wandb_records(run_file):
        if record.WhichOneof("record_type") == "history":
            history.append(
                {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
    assert [row["_step"] for row in history] == [1, 2]
    assert history[0]["success_rate"] == 0.5 and history[1]["success_rate"] == 1.0
    assert history[0]["success_rate/difficulty/easy"] == 1.0
    assert history[0]["blocked_sites/_type"] == "table-file"
    table = json.loads((log.run_dir / "files" / history[0]["blocked_sites/path"]).read_text())
    assert table["data"] == [["wall.localhost"]]
    assert history[0]["screenshots/count"] == 2
    shots = [log.run_dir / "files" / name for name in history[0]["screenshots/filenames"]]
    assert [Image.open(shot).size for shot in shots] == [(40, 30), (40, 30)]


def test_unknown_backend_lists_the_choices(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown logger backend 'mlflow'.*tensorboard"):
        ExperimentLogger("mlflow", log_dir=tmp_path)


@pytest.mark.parametrize(
    ("backend", "module"), [("wandb", "wandb"), ("tensorboard", "tensorboard")]
)
def test_missing_backend_package_is_one_line_naming_the_extra(
    tmp_path, monkeypatch, backend, module
):
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(ImportError, match=rf"pip install 'replaystore\[{backend}\]'") as err:
        ExperimentLogger(backend, log_dir=tmp_path)
    assert "\n" not in str(err.value)


def test_only_rank_zero_writes(tmp_path, iteration):
    log = ExperimentLogger("tensorboard", log_dir=tmp_path / "tb", rank=1)
    assert log.log_iteration(1, iteration)["success_rate"] == 0.5
    log.close()
    assert not (tmp_path / "tb").exists() and log.run_dir is None


def test_closed_logger_refuses_and_bad_throughput_is_named(tmp_path, iteration):
    log = ExperimentLogger("none", log_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"throughput\['steps_per_s'\] must be finite"):
        log.log_iteration(1, iteration, throughput={"steps_per_s": float("nan")})
    log.close()
    with pytest.raises(ConfigError, match="closed"):
        log.log_iteration(2, iteration)
