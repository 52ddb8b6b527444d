"""The loop's tool layer: training arguments, checkpoints, the vLLM command, child processes."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

import pytest
from PIL import Image

from replaystore.errors import ConfigError
from replaystore.loop.processes import MARKER_VAR, ChildProcess, kill_strays
from replaystore.loop.tools import (
    INSTALL_COMMAND,
    ToolsMissingError,
    VllmServer,
    checkpoint_weights,
    find_tools,
    read_losses,
    template_text,
    training_arguments,
)
from replaystore.trajectories.export import export_llamafactory
from waiting import wait_until

from .fake_tools import make_fake_tools


def arguments(tmp_path: Path, template: str, **kwargs) -> dict:
    return training_arguments(
        template,
        model=tmp_path / "model",
        dataset_dir=tmp_path / "dataset",
        dataset="webagent",
        output_dir=tmp_path / "out",
        **kwargs,
    )


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


# ------------------------------------------------------------------ training arguments


def test_text_template_sets_the_model_dataset_and_output_over_overrides(tmp_path):
    template = template_text(None, "text") + "output_dir: /from/the/template\n"
    args = arguments(tmp_path, template, overrides={"learning_rate": 0.5, "num_train_epochs": 2})
    assert args["template"] == "qwen"
    assert args["finetuning_type"] == "full"
    assert args["model_name_or_path"] == str(tmp_path / "model")
    assert args["dataset_dir"] == str(tmp_path / "dataset")
    assert args["dataset"] == "webagent"
    assert args["output_dir"] == str(tmp_path / "out")
    assert args["learning_rate"] == 0.5
    assert args["num_train_epochs"] == 2
    assert "media_dir" not in args


def test_an_override_of_a_key_the_loop_sets_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"train\.overrides\.output_dir is set by the loop"):
        arguments(tmp_path, template_text("text"), overrides={"output_dir": "/elsewhere"})


def test_a_template_that_is_not_a_mapping_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="must be a YAML mapping"):
        arguments(tmp_path, "- stage: sft\n")


def test_qwen2_vl_template_trains_the_whole_model_with_images_from_the_dataset_dir(tmp_path):
    args = arguments(tmp_path, template_text(None, "screenshot"), has_images=True)
    assert args["template"] == "qwen2_vl"
    assert args["finetuning_type"] == "full"
    assert args["freeze_vision_tower"] is True
    assert args["image_max_pixels"] > 0
    assert args["media_dir"] == str(tmp_path / "dataset")


def test_screenshot_export_image_paths_resolve_against_media_dir(tmp_path):
    shot = tmp_path / "screenshots" / "step.png"
    shot.parent.mkdir()
    Image.new("RGB", (32, 24), (200, 30, 30)).save(shot)
    sample = {
        "message": [
            {"role": "system", "content": "You are a web agent."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Task: find the price\nCurrent step: 1"},
                    {"type": "image_url", "image_url": {"url": shot.as_uri()}},
                ],
            },
        ],
        "action": 'Action: answer("$39.99")',
    }
    dataset = tmp_path / "dataset"
    report = export_llamafactory([sample], dataset, dataset_name="webagent", copy_images=True)
    args = arguments(tmp_path, template_text(None, "screenshot"), has_images=True)
    (record,) = json.loads(report.train_file.read_text())
    assert len(record["images"]) == 1
    for image in record["images"]:
        assert not Path(image).is_absolute()
        assert (Path(args["media_dir"]) / image).is_file()


# ------------------------------------------------------------------ trainer outputs


def test_read_losses_skips_bad_lines_and_non_finite_values(tmp_path):
    log = tmp_path / "trainer_log.jsonl"
    log.write_text(
        '{"current_steps": 1, "loss": 2.5}\n'
        "not json\n"
        '{"current_steps": 2}\n'
        '{"current_steps": 3, "loss": NaN}\n'
        '{"current_steps": 4, "loss": 1.25}\n'
    )
    assert read_losses(log) == [2.5, 1.25]
    assert read_losses(tmp_path / "missing.jsonl") == []


def test_checkpoint_weights_finds_a_single_weight_file(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    assert checkpoint_weights(tmp_path) == [tmp_path / "model.safetensors"]


def test_checkpoint_weights_ignores_an_empty_weight_file(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert checkpoint_weights(tmp_path) == []


def test_checkpoint_weights_needs_every_shard_of_an_index(tmp_path):
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    index = {"weight_map": {"a": shards[0], "b": shards[1]}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    (tmp_path / shards[0]).write_bytes(b"half")
    assert checkpoint_weights(tmp_path) == []
    (tmp_path / shards[1]).write_bytes(b"other half")
    assert checkpoint_weights(tmp_path) == [tmp_path / s for s in shards]


# ------------------------------------------------------------------ tools


def test_vllm_server_command_names_model_name_port_and_options(tmp_path):
    server = VllmServer(
        tmp_path / "python",
        host="0.0.0.0",
        max_model_len=1024,
        dtype="bfloat16",
        extra_args=["--gpu-memory-utilization", "0.5"],
    )
    assert server.command(tmp_path / "ckpt", "policy", 8123) == [
        str(tmp_path / "python"),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(tmp_path / "ckpt"),
        "--served-model-name",
        "policy",
        "--host",
        "0.0.0.0",
        "--port",
        "8123",
        "--max-model-len",
        "1024",
        "--dtype",
        "bfloat16",
        "--gpu-memory-utilization",
        "0.5",
    ]


def test_missing_tools_name_the_install_command(tmp_path):
    with pytest.raises(ToolsMissingError) as info:
        find_tools(tmp_path / "nowhere")
    message = str(info.value)
    assert ".ci/install-loop-tools" in message
    assert INSTALL_COMMAND in message
    assert str(tmp_path / "nowhere" / "vllm" / "bin" / "python") in message


def test_find_tools_finds_a_tools_dir_laid_out_like_the_installers(tmp_path):
    tools = make_fake_tools(tmp_path)
    paths = find_tools(tools)
    assert paths.train_command == [str(tools / "llamafactory" / "bin" / "llamafactory-cli")]
    assert paths.vllm_python == tools / "vllm" / "bin" / "python"


# ------------------------------------------------------------------ child processes


def test_kill_strays_kills_processes_of_another_loop_of_the_run_only(tmp_path):
    token = secrets.token_hex(8)
    stray = ChildProcess(
        "stray", ["sleep", "60"], log_path=tmp_path / "stray.log", marker=f"{token}:1"
    ).start()
    own = ChildProcess(
        "own", ["sleep", "60"], log_path=tmp_path / "own.log", marker=f"{token}:2"
    ).start()
    other_run = ChildProcess(
        "other run", ["sleep", "60"], log_path=tmp_path / "o.log", marker=f"x{token}:1"
    ).start()
    unmarked = ChildProcess("unmarked", ["sleep", "60"], log_path=tmp_path / "u.log").start()
    try:
        assert MARKER_VAR not in os.environ
        killed = kill_strays(token, own_marker=f"{token}:2")
        assert killed == [stray.pid]
        assert stray.wait(5) == -9
        assert own.poll() is None
        assert other_run.poll() is None
        assert unmarked.poll() is None
    finally:
        for child in (stray, own, other_run, unmarked):
            child.stop(grace_s=1)


def test_stop_kills_the_whole_process_group(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    child = ChildProcess(
        "parent",
        ["sh", "-c", f"sleep 60 & echo $! > {pidfile}; wait"],
        log_path=tmp_path / "logs" / "child.log",
    ).start()
    assert wait_until(lambda: pidfile.exists() and pidfile.read_text().strip())
    grandchild = int(pidfile.read_text())
    assert alive(grandchild)
    child.stop(grace_s=2)
    assert child.poll() is not None
    assert wait_until(lambda: not alive(grandchild)), "the grandchild outlived stop()"


def test_stop_kills_a_grandchild_left_behind_by_an_exited_leader(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    child = ChildProcess(
        "leader", ["sh", "-c", f"sleep 60 & echo $! > {pidfile}"], log_path=tmp_path / "c.log"
    ).start()
    assert child.wait(5) == 0
    grandchild = int(pidfile.read_text())
    assert alive(grandchild)
    child.stop(grace_s=1)
    assert wait_until(lambda: not alive(grandchild)), "the orphaned grandchild outlived stop()"


def test_child_output_goes_to_its_log_with_a_header(tmp_path):
    log = tmp_path / "logs" / "echo.log"
    child = ChildProcess("echo", ["sh", "-c", "echo hello; echo oops >&2"], log_path=log).start()
    assert child.wait(5) == 0
    child.stop()
    text = log.read_text()
    assert "==== " in text and "hello" in text and "oops" in text


def test_external_server_runs_the_reload_command_then_waits_for_the_model(
    tmp_path: Path,
) -> None:
    """``serve.base_url`` + ``reload_command``: the user's server, told to load a checkpoint."""
    from replaystore.loop.tools import ExternalServer, LoopStageError, free_port

    tools = make_fake_tools(tmp_path)
    port = free_port()
    server = ChildProcess(
        "user's server",
        [str(tools / "vllm" / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server",
         "--model", "m", "--served-model-name", "ckpt-7", "--host", "127.0.0.1",
         "--port", str(port)],
        log_path=tmp_path / "server.log",
    ).start()  # fmt: skip
    try:
        told = tmp_path / "told.txt"
        external = ExternalServer(
            f"http://127.0.0.1:{port}/v1",
            f"echo {{checkpoint}} {{model}} > {told}",
            startup_timeout_s=30,
        )
        checkpoint = tmp_path / "checkpoints" / "007 with space"
        external.start(checkpoint, "ckpt-7", log_path=tmp_path / "reload.log", stage="serve")
        assert told.read_text().split() == [*str(checkpoint).split(), "ckpt-7"]
        with pytest.raises(LoopStageError, match=r"serve: the model server .* 'other'"):
            ExternalServer(f"http://127.0.0.1:{port}/v1", None, startup_timeout_s=1).start(
                checkpoint, "other", log_path=tmp_path / "r2.log", stage="serve"
            )
        with pytest.raises(LoopStageError, match="reload command exited with status 3"):
            ExternalServer(f"http://127.0.0.1:{port}/v1", "exit 3").start(
                checkpoint, "ckpt-7", log_path=tmp_path / "r3.log", stage="serve"
            )
    finally:
        server.stop()
