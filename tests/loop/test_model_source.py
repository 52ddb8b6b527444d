"""``model.path``: a local directory (relative to the config file) or a Hugging Face hub
id, which goes unchanged to LLaMA-Factory's YAML and vLLM's command line; a hub id that is
neither cached nor reachable stops the loop in one line before anything runs.

No network is used: the "cached" case lays out a hub cache (``HF_HUB_CACHE``) as
``huggingface_hub`` does, and the unreachable hub is a closed local port (``HF_ENDPOINT``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest
import yaml

from replaystore.errors import ConfigError
from replaystore.loop import LoopConfig
from replaystore.loop.config import model_source
from replaystore.loop.runner import LoopRunner
from replaystore.loop.tools import VllmServer, check_hub_model, training_arguments

from .fake_tools import loop_command, make_fake_model, make_fake_tools, read_calls
from .test_failures import demonstrations

HUB_ID = "Qwen/Qwen2.5-0.5B-Instruct"


def _cache_with(root: Path, model_id: str) -> Path:
    """A hub cache holding ``model_id`` (a snapshot with its config.json)."""
    snapshot = root / ("models--" + model_id.replace("/", "--")) / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}", encoding="utf-8")
    return root


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_hub_id_stays_as_written_and_a_relative_directory_resolves(tmp_path: Path) -> None:
    assert model_source(HUB_ID, tmp_path) == HUB_ID
    local = make_fake_model(tmp_path / "models" / "base")
    assert model_source("models/base", tmp_path) == local  # exists here: a directory
    (tmp_path / "Qwen" / "Qwen2.5-0.5B-Instruct").mkdir(parents=True)
    assert model_source(HUB_ID, tmp_path) == tmp_path / HUB_ID  # a local copy wins
    for value in ("./org/model", "a/b/c", "../up/model"):  # not shaped like a hub id
        assert isinstance(model_source(value, tmp_path), Path), value
    assert model_source(str(local), Path("/elsewhere")) == local
    config = LoopConfig.from_mapping(
        {"out": "run", "model": {"path": "org/name"}}, base_dir=tmp_path
    )
    assert config.model_source() == "org/name"
    assert config.resolved()["model"]["path"] == "org/name"  # the journal records the id


def test_the_id_reaches_the_trainer_yaml_and_the_vllm_command(tmp_path: Path) -> None:
    config = LoopConfig.from_mapping({"out": "run", "model": {"path": HUB_ID}}, base_dir=tmp_path)
    model = LoopRunner(config, progress=False).initial_model
    assert model == HUB_ID
    command = VllmServer(Path("/venv/bin/python")).command(model, "policy", 8000)
    assert command[command.index("--model") + 1] == HUB_ID
    arguments = training_arguments(
        "model_name_or_path: placeholder\n",
        model=model,
        dataset_dir=tmp_path,
        dataset="d",
        output_dir=tmp_path / "out",
    )
    assert arguments["model_name_or_path"] == HUB_ID


def _loop(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """One iteration: demonstrations imported (no browser), trained by the fake trainer."""
    config = {
        "out": "run",
        "iterations": 1,
        "tools_dir": str(make_fake_tools(tmp_path)),
        "bootstrap": {"source": str(demonstrations(tmp_path))},
        "model": {"path": HUB_ID, "evaluate_untrained": False},
        "train": {"final": True},
    }
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    return loop_command(tmp_path, config, env=env, base_env=clean, timeout=120)


def test_a_cached_hub_model_is_trained_from_its_id(tmp_path: Path) -> None:
    cache = _cache_with(tmp_path / "hub", HUB_ID)
    done = _loop(tmp_path, {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    (start, finish) = [c for c in read_calls(tmp_path) if c["tool"] == "train"]
    assert start["model"] == finish["model"] == HUB_ID
    written = yaml.safe_load((tmp_path / "run" / "iterations" / "000" / "train.yaml").read_text())
    assert written["model_name_or_path"] == HUB_ID
    journal = json.loads((tmp_path / "run" / "journal.json").read_text())
    assert journal["config"]["model"]["path"] == HUB_ID


def test_an_uncached_id_offline_is_one_line_before_anything_runs(tmp_path: Path) -> None:
    cache = tmp_path / "empty-hub"
    done = _loop(tmp_path, {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"})
    assert done.returncode != 0
    (line,) = done.stderr.strip().splitlines()
    assert HUB_ID in line and "HF_HUB_OFFLINE" in line and str(cache) in line, line
    assert read_calls(tmp_path) == []
    assert not (tmp_path / "run" / "storage").exists()


def test_an_unreachable_hub_names_the_id_and_the_cache(tmp_path: Path) -> None:
    env = {"HF_HUB_CACHE": str(tmp_path / "c"), "HF_ENDPOINT": f"http://127.0.0.1:{_closed_port()}"}
    with pytest.raises(ConfigError, match=r"Qwen/Qwen2\.5-0\.5B-Instruct.*cannot be reached"):
        check_hub_model(HUB_ID, env, timeout_s=2.0)
    assert check_hub_model(HUB_ID, {"HF_HUB_CACHE": str(_cache_with(tmp_path / "h", HUB_ID))}) == (
        "cached"
    )
