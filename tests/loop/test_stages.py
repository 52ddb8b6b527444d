"""The loop's stages on a fake run context: the driver (:func:`run_stage`) skips a stage
the journal marks done and times, journals and reports one it runs; the ``.partial``
helper keeps a finished output and redoes an empty one; the train stage's recovery
keeps a checkpoint whose ``.partial`` holds weights. No browser, no child process."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from replaystore.loop import LoopConfig, LoopStageError
from replaystore.loop.journal import Journal
from replaystore.loop.stages import Outcome, RunContext, RunPaths, Stage, base, run_stage
from replaystore.loop.stages.partial import build_directory, keep_finished, partial_path
from replaystore.loop.stages.train import TrainStage


def _context(tmp_path: Path) -> tuple[RunContext, list[str]]:
    """A run context over a fresh journal; no tools (a stage that calls one fails)."""
    config = LoopConfig.from_mapping({"out": "run"}, base_dir=tmp_path)
    config.out.mkdir(parents=True)
    lines: list[str] = []
    ctx = RunContext(
        config=config,
        paths=RunPaths(config.out, config),
        journal=Journal.open(config.out, resume=False, config=config),
        tools=cast(Any, None),
        report=lines.append,
    )
    return ctx, lines


@dataclass
class _Counting(Stage[int]):
    """A stage that counts its runs and hands on ``value``."""

    name = "evaluate"

    k: int
    value: int = 7
    runs: list[int] = field(default_factory=list)

    def resume(self, ctx: RunContext, record: dict[str, Any]) -> int:
        return int(record["value"])

    def run(self, ctx: RunContext) -> Outcome[int]:
        self.runs.append(self.k)
        return Outcome(self.value, {"value": self.value}, report=f"ran {self.k}")


def test_the_driver_skips_a_done_stage_and_times_journals_and_reports_one_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx, lines = _context(tmp_path)
    clock = iter([10.0, 12.5])
    monkeypatch.setattr(base, "now", lambda: next(clock))
    stage = _Counting(0)

    assert run_stage(ctx, stage) == 7
    assert stage.runs == [0]
    assert lines == ["ran 0"]
    record = ctx.journal.done(0, "evaluate")
    assert record == {"done": True, "seconds": 2.5, "value": 7}
    saved = json.loads(ctx.journal.path.read_text(encoding="utf-8"))
    assert saved["iterations"][0]["stages"]["evaluate"] == record

    again = _Counting(0, value=99)
    assert run_stage(ctx, again) == 7  # the journal's value, not a new run
    assert again.runs == []
    assert lines == ["ran 0"]
    assert ctx.journal.done(0, "evaluate") == record


def test_the_partial_helper_keeps_a_finished_partial_and_redoes_an_empty_one(
    tmp_path: Path,
) -> None:
    def complete(directory: Path) -> bool:
        return (directory / "weights").is_file()

    def make(directory: Path) -> str:
        directory.mkdir()
        (directory / "weights").write_text("new", encoding="utf-8")
        return "made"

    finished = tmp_path / "finished"
    partial_path(finished).mkdir()
    (partial_path(finished) / "weights").write_text("old", encoding="utf-8")
    assert keep_finished(finished, complete)
    assert (finished / "weights").read_text(encoding="utf-8") == "old"
    assert not partial_path(finished).exists()
    assert keep_finished(finished, complete)  # in place already

    empty = tmp_path / "empty"
    partial_path(empty).mkdir()  # a try killed before it wrote anything
    assert not keep_finished(empty, complete)
    assert build_directory(empty, make) == "made"
    assert (empty / "weights").read_text(encoding="utf-8") == "new"
    assert not partial_path(empty).exists()


def test_a_failed_build_renames_nothing(tmp_path: Path) -> None:
    target = tmp_path / "dataset"

    def fail(directory: Path) -> None:
        directory.mkdir()
        raise RuntimeError("export failed")

    with pytest.raises(RuntimeError, match="export failed"):
        build_directory(target, fail)
    assert not target.exists()
    assert partial_path(target).is_dir()


def test_train_keeps_a_renamed_checkpoint_and_redoes_one_left_in_its_partial(
    tmp_path: Path,
) -> None:
    ctx, lines = _context(tmp_path)
    losses = [{"current_steps": i, "loss": loss} for i, loss in enumerate([2.0, 1.0], 1)]

    def trained(directory: Path) -> None:
        directory.mkdir(parents=True)
        (directory / "model.safetensors").write_bytes(b"weights")
        (directory / "trainer_log.jsonl").write_text(
            "".join(json.dumps(line) + "\n" for line in losses), encoding="utf-8"
        )

    # Weights in the .partial: the trainer may have been killed while writing them.
    trained(partial_path(ctx.paths.checkpoint_dir(0)))
    with pytest.raises(AttributeError):  # started again: the context has no trainer
        run_stage(ctx, TrainStage(0))
    assert ctx.journal.done(0, "train") is None
    assert not ctx.paths.checkpoint_dir(0).exists()

    # Renamed into place (the trainer returned) before the journal was written: kept.
    trained(ctx.paths.checkpoint_dir(1))
    run_stage(ctx, TrainStage(1))
    record = ctx.journal.done(1, "train")
    assert record is not None
    assert record["recovered"] is True
    assert record["seconds"] == 0.0
    assert record["checkpoint"] == "checkpoints/001"
    assert record["steps"] == 2
    assert lines[0].startswith("iteration 0: training (sft, ")  # 0 was started again
    assert lines[-1] == "iteration 1: checkpoint checkpoints/001 already trained; not redone"


def test_train_without_data_fails_saying_why(tmp_path: Path) -> None:
    ctx, _ = _context(tmp_path)
    ctx.journal.finish(0, "evaluate", seconds=0.0, success_rate=0.0)
    with pytest.raises(LoopStageError, match="no successful trajectory to train on yet"):
        run_stage(ctx, TrainStage(0, has_data=False))
    assert ctx.journal.done(0, "train") is None


def test_the_model_stage_adds_the_page_vocabulary_to_the_tokenizer_corpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On MiniWoB++ the tiny model's tokenizer also trains on the pages' words (each one a
    line, REPEATS times, in ``model/vocabulary.txt``), so a name is one token."""
    from replaystore.loop.stages import model

    ctx, lines = _context(tmp_path)
    ctx.tools = cast(Any, type("Tools", (), {"train_python": Path("/nowhere/python")}))
    seen: dict[str, Any] = {}

    def fake_make(python: Path, out: Path, *, corpus: list[Path], **kwargs: Any) -> dict[str, Any]:
        seen["corpus"] = list(corpus)
        seen["text"] = {p.name: p.read_text(encoding="utf-8") for p in corpus}
        out.mkdir(parents=True, exist_ok=True)
        (out / "model.safetensors").write_bytes(b"weights")
        return {"layers": 2, "hidden": 64, "vocab_size": 512, "parameters": 1}

    monkeypatch.setattr(model, "make_tiny_model", fake_make)
    monkeypatch.setattr(model, "checkpoint_weights", lambda path: True)
    dataset = tmp_path / "webagent.json"
    dataset.write_text("[]", encoding="utf-8")
    run_stage(ctx, model.ModelStage(0, corpus=[dataset], vocabulary=["Agustina", "ipsum"]))

    assert [p.name for p in seen["corpus"]] == ["webagent.json", "vocabulary.txt"]
    words = seen["text"]["vocabulary.txt"].splitlines()
    assert words == ["Agustina"] * model.ModelStage.REPEATS + ["ipsum"] * model.ModelStage.REPEATS
    assert (ctx.paths.out / "model" / "vocabulary.txt").is_file()  # renamed with the model
    assert "and 2 page words" in lines[-1]

    seen.clear()
    ctx2, _ = _context(tmp_path / "plain")
    ctx2.tools = ctx.tools
    run_stage(ctx2, model.ModelStage(0, corpus=[dataset]))
    assert [p.name for p in seen["corpus"]] == ["webagent.json"]  # no vocabulary: none added
