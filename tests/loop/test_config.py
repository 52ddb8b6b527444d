"""The loop config: every key checked, errors that name the key, paths from the YAML's directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from replaystore.errors import ConfigError
from replaystore.loop.config import DEFAULTS, LoopConfig, load_config


def write_yaml(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_load_and_check():
    config = load_config(None)
    assert config.data == DEFAULTS
    assert config["iterations"] == 3
    assert config["model"]["tiny"]["hidden"] == 64 * config["model"]["tiny"]["heads"]


def test_unknown_top_level_key_is_named_with_a_close_match():
    with pytest.raises(ConfigError, match=r"unknown key 'iteratons'.*did you mean 'iterations'"):
        LoopConfig.from_mapping({"iteratons": 2})


def test_unknown_nested_key_is_named_with_its_section():
    with pytest.raises(ConfigError, match=r"unknown key rollout\.'worker'.*'workers'"):
        LoopConfig.from_mapping({"rollout": {"worker": 2}})


def test_unknown_tiny_model_key_is_refused():
    with pytest.raises(ConfigError, match=r"model\.tiny\.'depth'"):
        LoopConfig.from_mapping({"model": {"tiny": {"depth": 2}}})


def test_tiny_hidden_must_be_64_times_heads():
    with pytest.raises(ConfigError, match=r"model\.tiny\.hidden must be 64 x heads"):
        LoopConfig.from_mapping({"model": {"tiny": {"hidden": 200, "heads": 4}}})


def test_tiny_settings_merge_over_the_defaults():
    config = LoopConfig.from_mapping({"model": {"tiny": {"hidden": 128, "heads": 2}}})
    assert config["model"]["tiny"] == {**DEFAULTS["model"]["tiny"], "hidden": 128, "heads": 2}


def test_relative_paths_resolve_against_the_yaml_directory(tmp_path, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    path = write_yaml(conf_dir / "loop.yaml", "out: runs/a\ntools_dir: tools\n")
    config = load_config(path)
    assert config.out == conf_dir / "runs" / "a"
    assert config.tools_dir == conf_dir / "tools"
    assert config.path("/abs/model") == Path("/abs/model")


def test_screenshot_observation_needs_a_model_path():
    with pytest.raises(ConfigError, match=r"model\.path is required with observation: screenshot"):
        LoopConfig.from_mapping({"observation": "screenshot"})
    config = LoopConfig.from_mapping(
        {"observation": "screenshot", "model": {"path": "Qwen/Qwen2-VL-2B-Instruct"}}
    )
    assert config["observation"] == "screenshot"


def test_overrides_win_over_the_file_and_none_overrides_are_ignored(tmp_path):
    path = write_yaml(tmp_path / "loop.yaml", "out: from-file\niterations: 5\n")
    config = load_config(path, {"out": "/tmp/from-cli", "iterations": None})
    assert config.out == Path("/tmp/from-cli")
    assert config["iterations"] == 5


def test_an_override_is_checked_like_the_file():
    with pytest.raises(ConfigError, match=r"iterations must be an integer >= 1"):
        load_config(None, {"iterations": 0})


def test_a_yaml_that_is_not_a_mapping_is_refused(tmp_path):
    path = write_yaml(tmp_path / "loop.yaml", "- a\n- b\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(path)
