"""``train.cpu_bf16``: the tiny model trains on a CPU in bf16 mixed precision when the CPU
computes bf16 natively and no GPU is visible; an explicit choice in the template or the
overrides wins; the setting is checked when the config is read. No child process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest

from replaystore.errors import ConfigError
from replaystore.loop import LoopConfig, tools
from replaystore.loop.journal import Journal
from replaystore.loop.stages import RunContext, RunPaths
from replaystore.loop.stages.train import TrainStage
from replaystore.loop.tools import cpu_bf16_arguments, cpu_computes_bf16

_FLAGS = "fpu vme sse2 avx2 avx512f avx512bw"
_ON = {"bf16": True, "use_cpu": True}


def _machine(tmp_path: Path, flags: str, gpu: bool = False) -> dict[str, Path]:
    """A /proc/cpuinfo with ``flags`` and a /dev with or without an NVIDIA device node."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        f"processor\t: 0\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: {flags}\n"
    )
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "null").touch()
    if gpu:
        (dev / "nvidia0").touch()
        (dev / "nvidiactl").touch()
    return {"cpuinfo": cpuinfo, "dev": dev}


@pytest.mark.parametrize(
    ("flags", "native"),
    [
        (_FLAGS + " avx512_bf16 avx512_vnni", True),  # AMD Zen 4, Intel Cooper Lake
        (_FLAGS + " amx_bf16 amx_tile", True),  # Intel Sapphire Rapids
        (_FLAGS, False),
    ],
)
def test_the_cpu_flags_say_whether_bf16_is_native(tmp_path: Path, flags: str, native: bool) -> None:
    assert cpu_computes_bf16(_machine(tmp_path, flags)["cpuinfo"]) is native


def test_arm_features_and_an_unreadable_cpuinfo(tmp_path: Path) -> None:
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n")
    assert cpu_computes_bf16(arm) is True
    assert cpu_computes_bf16(tmp_path / "missing") is False


def test_auto_turns_bf16_on_for_a_float32_template_on_a_native_cpu_without_a_gpu(
    tmp_path: Path,
) -> None:
    float32 = {"bf16": False, "fp16": False, "learning_rate": 2e-3}
    native = _machine(tmp_path / "a", _FLAGS + " avx512_bf16")
    assert cpu_bf16_arguments(float32, "auto", **native) == _ON
    # Without native bf16 the CPU would emulate it: left in float32, unless asked for.
    plain = _machine(tmp_path / "b", _FLAGS)
    assert cpu_bf16_arguments(float32, "auto", **plain) == {}
    assert cpu_bf16_arguments(float32, True, **plain) == _ON
    assert cpu_bf16_arguments(float32, False, **native) == {}


def test_a_visible_gpu_or_an_explicit_choice_leaves_the_arguments_alone(tmp_path: Path) -> None:
    float32 = {"bf16": False, "fp16": False}
    gpu = _machine(tmp_path / "gpu", _FLAGS + " avx512_bf16", gpu=True)
    assert cpu_bf16_arguments(float32, "auto", **gpu) == {}
    assert cpu_bf16_arguments(float32, True, **gpu) == {}
    # ... unless the trainer's environment hides the GPUs.
    hidden = {"CUDA_VISIBLE_DEVICES": ""}
    assert cpu_bf16_arguments(float32, "auto", env=hidden, **gpu) == _ON
    native = _machine(tmp_path / "cpu", _FLAGS + " avx512_bf16")
    for overrides in ({"bf16": False}, {"fp16": True}, {"use_cpu": True}):
        assert cpu_bf16_arguments(float32, "auto", overrides=overrides, **native) == {}
        assert cpu_bf16_arguments(float32, True, overrides=overrides, **native) == {}
    # A template that trains in half precision already (a GPU template) is not changed.
    assert cpu_bf16_arguments({"bf16": True}, "auto", **native) == {}
    assert cpu_bf16_arguments({"fp16": True}, "auto", **native) == {}


@pytest.mark.parametrize("value", ["yes", 1, 0, None, "true"])
def test_the_setting_is_checked_when_the_config_is_read(value: Any) -> None:
    with pytest.raises(ConfigError, match=r'train\.cpu_bf16 must be "auto", true or false'):
        LoopConfig.from_mapping({"train": {"cpu_bf16": value}})


@pytest.mark.parametrize(("native", "expected"), [(True, _ON), (False, {})])
def test_the_train_stage_writes_the_precision_it_chose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: bool, expected: dict[str, bool]
) -> None:
    monkeypatch.setattr(tools, "cpu_computes_bf16", lambda cpuinfo=None: native)
    monkeypatch.setattr(tools, "_nvidia_gpu_visible", lambda env, dev=None: False)
    config = LoopConfig.from_mapping({"out": "run"}, base_dir=tmp_path)
    config.out.mkdir(parents=True)
    ctx = RunContext(
        config=config,
        paths=RunPaths(config.out, config),
        journal=Journal.open(config.out, resume=False, config=config),
        tools=cast(Any, None),
        report=lambda line: None,
    )
    dataset = ctx.paths.iteration_dir(0) / "dataset"
    dataset.mkdir(parents=True)
    (dataset / "dataset_info.json").write_text(json.dumps({"webagent": {}}))
    arguments = TrainStage(0).arguments(ctx, tmp_path / "partial")
    assert {k: arguments[k] for k in ("bf16", "use_cpu") if k in arguments} == (
        expected or {"bf16": False}
    )
