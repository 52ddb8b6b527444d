"""The ``serve`` stage and the model server handle: the policy's checkpoint served by vLLM
(in its own environment) or by the user's server after a reload command, ready when
``/v1/models`` lists it.

The rollout, held-out and baseline stages run :class:`ServeStage` for the model they
roll out; :class:`ModelServer` is the handle in the run context that remembers what is
served now, so that a model served already is not served again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..tools import (
    ExternalServer,
    LoopStageError,
    VllmServer,
    checkpoint_weights,
    is_adapter,
    merge_adapter,
)
from .base import Outcome, Stage

if TYPE_CHECKING:
    from .context import RunContext

__all__ = ["ModelServer", "ServeStage", "lora_rank"]


@dataclass
class ModelServer:
    """The run's model server (None until a model is served) and what it serves."""

    server: VllmServer | ExternalServer | None = None
    #: The model served now (None: nothing): a LoRA adapter's directory while the
    #: server serves it on top of the base model.
    serving: Path | str | None = None
    #: The name the acting policy asks the server for (``model.name``, or the
    #: adapter's: ``<model.name>-<iteration>``).
    served_name: str = ""
    #: The whole model the vLLM server was started with (adapters go on top of it).
    serving_base: Path | str | None = None

    def stop_after_rollouts(self) -> None:
        """Stop the server once its rollouts are done, so that the trainer has the machine
        to itself. A server of LoRA adapters stays up: the next adapter is loaded into it
        (on a GPU, leave the trainer room: ``--gpu-memory-utilization`` in
        ``serve.extra_args``). :meth:`stop` stops it at the end."""
        if isinstance(self.server, VllmServer) and self.server.lora_rank is not None:
            return
        if self.server is not None:
            self.server.stop()
        self.serving = None

    def stop(self) -> None:
        """Stop the server (at the end of the run, or on an interrupt)."""
        if self.server is not None:
            self.server.stop()


def lora_rank(ctx: RunContext) -> int | None:
    """The adapters' rank when the loop trains LoRA adapters and vLLM serves them
    unmerged (None otherwise): the server is then started with ``--enable-lora``."""
    preview = ctx.training_preview()
    if preview.get("finetuning_type") != "lora" or ctx.config["serve"]["merge"]:
        return None
    return int(preview.get("lora_rank") or 8)  # LLaMA-Factory's default rank


def _server(ctx: RunContext) -> VllmServer | ExternalServer:
    """The run's server, made on first use (not started)."""
    handle = ctx.server
    if handle.server is not None:
        return handle.server
    s = ctx.config["serve"]
    if s["base_url"] is not None:
        handle.server = ExternalServer(
            s["base_url"],
            s["reload_command"],
            startup_timeout_s=s["startup_timeout_s"],
            marker=ctx.marker,
        )
        return handle.server
    if ctx.tools.vllm_python is None:
        raise LoopStageError("serve: no vLLM environment was found")
    handle.server = VllmServer(
        ctx.tools.vllm_python,
        host=s["host"],
        port=s["port"],
        max_model_len=s["max_model_len"],
        dtype=s["dtype"],
        extra_args=s["extra_args"],
        env=s["env"],
        startup_timeout_s=s["startup_timeout_s"],
        marker=ctx.marker,
        lora_rank=lora_rank(ctx),
    )
    return handle.server


@dataclass
class ServeStage(Stage[str]):
    """Serve ``model`` (a directory, or a hub id vLLM downloads) for iteration ``k``; the
    base URL. ``label``: the stage named in errors.

    A LoRA adapter (``train.finetuning_type: lora``) is loaded into the running server
    on top of the base model (no restart), or with ``serve.merge`` merged into the base
    first (``checkpoints/NNN-merged``) and served as a whole model."""

    name = "serve"

    k: int
    model: Path | str
    label: str

    def finished(self, ctx: RunContext) -> dict[str, Any] | None:
        return None  # a server does not outlive the loop: served again on a resume

    def run(self, ctx: RunContext) -> Outcome[str]:
        model = self.model
        if isinstance(model, Path) and not checkpoint_weights(model):
            raise LoopStageError(f"{self.label}: {model} holds no model weights")
        server = _server(ctx)
        handle = ctx.server
        if handle.serving == model and server.base_url is not None:
            # served already (the rollout's, for the held-out set)
            return Outcome(server.base_url, record=False)
        adapter = model if isinstance(model, Path) and is_adapter(model) else None
        merge = adapter is not None and ctx.config["serve"]["merge"]
        merged = self._merge(ctx, adapter) if adapter is not None and merge else None
        facts: dict[str, Any] = {"checkpoint": ctx.paths.rel(model)}
        if adapter is not None and merged is None and isinstance(server, VllmServer):
            seconds, how = self._load_adapter(ctx, server, adapter, facts)
        else:
            seconds, how = self._start(ctx, server, merged if merged is not None else model, facts)
            if merged is not None:
                how = f"{ctx.paths.rel(merged)} (merged)"
        handle.serving = model
        if merged is not None:
            facts["merged"] = ctx.paths.rel(merged)
        if server.base_url is None:
            raise LoopStageError(f"{self.label}: the server is not listening")
        return Outcome(
            server.base_url,
            facts,
            report=f"iteration {self.k}: serving {how} (ready in {seconds:.1f} s)",
            seconds=seconds,
        )

    def _merge(self, ctx: RunContext, model: Path) -> Path:
        """``serve.merge``: the adapter merged into the base model (made unless it is)."""
        merged = model.with_name(model.name + "-merged")
        if checkpoint_weights(merged):
            return merged
        seconds = merge_adapter(
            ctx.tools.train_command,
            base=ctx.paths.initial_model,
            adapter=model,
            template=str(ctx.training_preview().get("template") or "qwen"),
            out=merged,
            yaml_path=model.with_name(model.name + "-merge.yaml"),
            log_path=ctx.paths.log(f"merge-{self.k:03d}.log"),
            marker=ctx.marker,
            stage=self.label,
        )
        ctx.report(
            f"iteration {self.k}: merged the adapter {ctx.paths.rel(model)} into "
            f"{ctx.paths.rel(merged)} ({seconds:.1f} s)"
        )
        return merged

    def _load_adapter(
        self, ctx: RunContext, server: VllmServer, model: Path, facts: dict[str, Any]
    ) -> tuple[float, str]:
        """Load the adapter ``model`` into the server (started on the base model first
        when it is not); its seconds and how it is served. Fills ``facts``."""
        handle = ctx.server
        base = ctx.paths.initial_model
        name = ctx.config["model"]["name"]
        seconds = 0.0
        log = ctx.paths.log(f"serve-{self.k:03d}.log")
        started: dict[str, Any] = {}  # the server's log, when this stage started it
        if server.base_url is None or handle.serving_base != base:
            seconds += server.start(base, name, log_path=log, stage=self.label)
            handle.serving_base = base
            started["server_log"] = ctx.paths.rel(log)
        handle.served_name = f"{name}-{model.name}"
        # The requests and vLLM's answers go to a log of their own: the server's log is
        # its child's output, written at the child's own offset.
        log = ctx.paths.log(f"lora-{self.k:03d}.log")
        seconds += server.load_adapter(model, handle.served_name, log_path=log, stage=self.label)
        facts.update(log=ctx.paths.rel(log), served_as=handle.served_name, **started)
        return seconds, f"the adapter on {ctx.paths.rel(base)} as {handle.served_name!r}"

    def _start(
        self,
        ctx: RunContext,
        server: VllmServer | ExternalServer,
        served: Path | str,
        facts: dict[str, Any],
    ) -> tuple[float, str]:
        """Start the server on the whole model ``served``; its seconds and how it is
        served. Fills ``facts``."""
        handle = ctx.server
        log = ctx.paths.log(f"serve-{self.k:03d}.log")
        name = ctx.config["model"]["name"]
        seconds = server.start(served, name, log_path=log, stage=self.label)
        handle.serving_base = served
        handle.served_name = name
        facts.update(log=ctx.paths.rel(log), served_as=name)
        return seconds, str(ctx.paths.rel(served))
