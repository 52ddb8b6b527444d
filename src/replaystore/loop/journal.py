"""The loop's journal: which stage of which iteration has finished, written atomically.

``<run>/journal.json`` is rewritten (temporary file, fsync, rename) each time a
stage finishes, so a loop killed at any instant leaves either the journal before
that stage or the one after it. ``--resume`` reads it and skips finished stages;
a stage's own outputs are also written atomically (or into a ``.partial``
directory renamed at the end), so an unfinished stage leaves nothing that a
resumed run could mistake for finished work.

Layout::

    {"format": 1, "run_token": "...", "suite_port": 41234,
     "config": {...}, "config_paths": "absolute",
     "resumes": [{"at": "2026-11-27T16:05:00+00:00", "changed": {"iterations": [2, 3]}}],
     "baseline": {"success_rate": 0.0, "num_tasks": 14, ...} | null,
     "iterations": [
        {"iteration": 0, "policy": "demonstrations", "checkpoint": null,
         "stages": {"sample": {"seconds": 0.01, ...}, "rollout": {...}, ...}},
        ...]}
"""

from __future__ import annotations

import json
import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from replaystore.atomic import atomic_write_json
from replaystore.errors import ConfigError

from .config import LoopConfig, resume_changes

__all__ = ["FORMAT", "STAGES", "Journal"]

FORMAT = 1

#: The stages of one iteration, in order (``model`` and ``baseline`` only in iteration 0
#: when the loop builds its tiny model / measures the untrained model; ``heldout`` only
#: on MiniWoB++ tasks).
STAGES = (
    "sample",
    "serve",
    "rollout",
    "evaluate",
    "heldout",
    "buffer",
    "export",
    "model",
    "baseline",
    "train",
)


class Journal:
    """The journal of one run directory.

    Args:
        path: ``<run>/journal.json``.
        data: its content (use :meth:`open`).
    """

    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path = path
        self.data = data

    @classmethod
    def open(cls, run_dir: Path, *, resume: bool, config: LoopConfig) -> Journal:
        """The run's journal: read it with ``resume``, else start a new one.

        A resume checks ``config`` against the config the run recorded: a change to a
        key that changes what the finished stages did (anything outside
        :data:`~replaystore.loop.config.RESUMABLE_KEYS`) is refused; changes to the
        others are taken and recorded under ``"resumes"``.

        Raises:
            ConfigError: ``resume`` without a journal, a new run over an existing
                journal, a journal of an unknown format, or a resume whose config
                changes a key that is not resumable (every such key is named, with the
                run's value and the new one).
        """
        path = run_dir / "journal.json"
        resolved = config.resolved()
        if resume:
            if not path.exists():
                raise ConfigError(
                    f"--resume: {path} does not exist; start the run without --resume"
                )
            data = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(data, dict) or data.get("format") != FORMAT:
                raise ConfigError(f"{path}: not a loop journal of format {FORMAT}")
            # Journals written before paths were recorded absolute hold the config as
            # given: compare it with the config as given.
            current = resolved if data.get("config_paths") == "absolute" else config.data
            refused, accepted = resume_changes(data.get("config") or {}, current)
            if refused:
                changes = "; ".join(
                    f"{key}: {before!r} in the run, {after!r} now"
                    for key, (before, after) in refused.items()
                )
                raise ConfigError(
                    f"--resume: the config changes what {run_dir} already did ({changes}); "
                    "put the run's values back, or start a new run in another out directory"
                )
            journal = cls(path, data)
            if accepted:
                journal.data.setdefault("resumes", []).append(
                    {
                        "at": datetime.now(UTC).isoformat(timespec="seconds"),
                        "changed": {key: list(pair) for key, pair in accepted.items()},
                    }
                )
            journal.data["config"] = resolved
            journal.data["config_paths"] = "absolute"
            journal.save()
            return journal
        if path.exists():
            raise ConfigError(
                f"{run_dir} already holds a loop run ({path}); continue it with --resume or "
                "choose another out directory"
            )
        journal = cls(
            path,
            {
                "format": FORMAT,
                "run_token": secrets.token_hex(8),
                "suite_port": None,
                "config": resolved,
                "config_paths": "absolute",
                "resumes": [],
                "baseline": None,
                "iterations": [],
            },
        )
        journal.save()
        return journal

    def save(self) -> None:
        """Write the journal atomically."""
        atomic_write_json(self.path, self.data, indent=2)

    @property
    def token(self) -> str:
        return str(self.data["run_token"])

    def iteration(self, k: int) -> dict[str, Any]:
        """The record of iteration ``k`` (made when missing)."""
        iterations: list[dict[str, Any]] = self.data["iterations"]
        while len(iterations) <= k:
            iterations.append({"iteration": len(iterations), "stages": {}})
        return iterations[k]

    def done(self, k: int, stage: str) -> dict[str, Any] | None:
        """The record of a finished stage, or None."""
        record = self.iteration(k)["stages"].get(stage)
        return record if isinstance(record, dict) and record.get("done") else None

    def finish(self, k: int, stage: str, **facts: Any) -> dict[str, Any]:
        """Record ``stage`` of iteration ``k`` as finished with ``facts``; saved at once."""
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}")
        record = {"done": True, **facts}
        self.iteration(k)["stages"][stage] = record
        self.save()
        return record
