"""The loop's tools, run as child processes: vLLM serves, LLaMA-Factory trains.

LLaMA-Factory and vLLM pin different versions of transformers, so each lives in
its own virtual environment (made by ``.ci/install-loop-tools``, by default under
``~/.cache/replaystore/loop-tools``: ``llamafactory/`` and ``vllm/``). Nothing
here imports them: the loop writes their inputs (a training YAML, a dataset
directory), runs their commands, streams their output to log files in the run
directory and reads their outputs back (``trainer_log.jsonl``, ``/v1/models``).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import math
import os
import secrets
import shlex
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from replaystore.atomic import atomic_write_text
from replaystore.errors import ConfigError, ReplayStoreError

from .partial import build_directory
from .processes import ChildProcess, describe_exit, tail

__all__ = [
    "INSTALL_COMMAND",
    "ExternalServer",
    "LoopStageError",
    "ToolPaths",
    "ToolsMissingError",
    "TrainResult",
    "VllmServer",
    "advertised_host",
    "check_hub_model",
    "checkpoint_weights",
    "cpu_bf16_arguments",
    "cpu_computes_bf16",
    "find_tools",
    "free_port",
    "hf_hub_cache",
    "is_adapter",
    "is_loopback",
    "make_tiny_model",
    "merge_adapter",
    "preference_arguments",
    "read_losses",
    "run_training",
    "template_text",
    "training_arguments",
    "vllm_lora_rank",
]

logger = logging.getLogger("replaystore.loop.tools")

#: The command that makes the tool environments (from a clone of the repository).
INSTALL_COMMAND = "bash .ci/install-loop-tools"

#: Files that hold a model's weights (one of them, or a shard index, must exist).
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "adapter_model.safetensors")
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


class LoopStageError(ReplayStoreError, RuntimeError):
    """A stage of the loop failed; the message names the stage, the iteration and the log."""


class ToolsMissingError(ReplayStoreError, FileNotFoundError):
    """The LLaMA-Factory or vLLM environment is missing; the message says how to make it."""


@dataclass(slots=True, frozen=True)
class ToolPaths:
    """Executables of the two tool environments."""

    tools_dir: Path
    train_command: list[str]
    train_python: Path
    vllm_python: Path | None


def find_tools(
    tools_dir: Path,
    *,
    train_command: str | Sequence[str] | None = None,
    vllm_python: str | Path | None = None,
    need_vllm: bool = True,
) -> ToolPaths:
    """Locate ``llamafactory-cli`` and vLLM's Python (config values win over ``tools_dir``).

    Raises:
        ToolsMissingError: an executable is missing; the message gives :data:`INSTALL_COMMAND`.
    """
    missing = []
    train_python = tools_dir / "llamafactory" / "bin" / "python"
    if train_command is None:
        cli = tools_dir / "llamafactory" / "bin" / "llamafactory-cli"
        if not cli.exists():
            missing.append(str(cli))
        command = [str(cli)]
    else:
        command = (
            shlex.split(train_command) if isinstance(train_command, str) else list(train_command)
        )
        if not command:
            raise ConfigError("train.command is empty")
        train_python = Path(command[0]).parent / "python"
    if not train_python.exists():
        missing.append(str(train_python))
    vllm: Path | None = None
    if need_vllm:
        vllm = Path(vllm_python) if vllm_python else tools_dir / "vllm" / "bin" / "python"
        if not vllm.exists():
            missing.append(str(vllm))
    if missing:
        raise ToolsMissingError(
            f"the loop's tool environments are missing ({', '.join(missing)}): make them with "
            f"`{INSTALL_COMMAND}` (LLaMA-Factory and vLLM, each in its own virtual environment "
            f"under {tools_dir}; set REPLAYSTORE_LOOP_TOOLS or tools_dir for another place)"
        )
    return ToolPaths(tools_dir, command, train_python, vllm)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


# ---------------------------------------------------------------------- serving


def _auth(api_key: str | None) -> dict[str, str]:
    """The request header that carries ``api_key`` (none without one)."""
    return {} if api_key is None else {"Authorization": f"Bearer {api_key}"}


def _served_models(
    base_url: str, timeout_s: float = 2.0, api_key: str | None = None
) -> list[str] | None:
    """Model ids ``GET {base_url}/models`` lists, or None when the server does not answer."""
    request = urllib.request.Request(f"{base_url}/models", headers=_auth(api_key))
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body = json.loads(response.read().decode("utf-8"))
    except (urllib.error.URLError, OSError, ValueError):
        return None
    data = body.get("data") if isinstance(body, Mapping) else None
    if not isinstance(data, list):
        return None
    return [str(m.get("id")) for m in data if isinstance(m, Mapping)]


def _wait_ready(
    base_url: str,
    name: str,
    timeout_s: float,
    *,
    child: ChildProcess | None,
    stage: str,
    log: Path | None,
    api_key: str | None = None,
) -> float:
    """Poll ``/v1/models`` until it lists ``name``; seconds waited.

    Raises:
        LoopStageError: the child exited, or ``timeout_s`` passed (the log is named).
    """
    start = time.perf_counter()
    where = f"; see {log}" if log is not None else ""
    while True:
        models = _served_models(base_url, api_key=api_key)
        if models is not None and name in models:
            return time.perf_counter() - start
        if child is not None and child.poll() is not None:
            last = tail(log) if log is not None else ""
            raise LoopStageError(
                f"{stage}: the vLLM server {describe_exit(child.poll())} before it was ready"
                f"{where}" + (f"\n{last}" if last else "")
            )
        if time.perf_counter() - start > timeout_s:
            seen = "no answer" if models is None else f"models {models}"
            raise LoopStageError(
                f"{stage}: the model server at {base_url} was not ready with model {name!r} "
                f"after {timeout_s:g} s ({seen}){where}"
            )
        time.sleep(0.5)


class VllmServer:
    """``python -m vllm.entrypoints.openai.api_server`` in the vLLM environment.

    Args:
        python: the vLLM environment's Python.
        host, port: where it listens (port 0: a free port at each start).
        max_model_len, dtype: passed as ``--max-model-len`` and ``--dtype``.
        extra_args: more arguments for the server (``--gpu-memory-utilization 0.8`` ...).
        env: variables for the server (``VLLM_CPU_KVCACHE_SPACE`` on a CPU).
        startup_timeout_s: how long :meth:`start` waits for ``/v1/models``.
        marker: the run marker its processes carry (see :mod:`.processes`).
        lora_rank: serve LoRA adapters of at most this rank on top of the model
            (``--enable-lora``, ``--max-lora-rank``: vLLM's next allowed rank, one adapter
            at a time) and allow loading them while it runs
            (``VLLM_ALLOW_RUNTIME_LORA_UPDATING``): :meth:`load_adapter`. None: no LoRA.

    A ``host`` beyond loopback (``0.0.0.0``, a routable address: asked for so that
    rollout actors on other machines reach the model) gets an API key: :attr:`api_key`,
    generated here (``secrets.token_urlsafe``), handed to vLLM in its environment
    (``VLLM_API_KEY``, not its command line, which is logged), sent by the loop's own
    requests; give it to the policy clients. It is never logged.
    """

    def __init__(
        self,
        python: Path,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_model_len: int = 2048,
        dtype: str = "float32",
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        startup_timeout_s: float = 600.0,
        marker: str | None = None,
        lora_rank: int | None = None,
    ) -> None:
        self.python = Path(python)
        self.host = host
        self.port = int(port)
        self.max_model_len = int(max_model_len)
        self.dtype = dtype
        self.extra_args = [str(a) for a in extra_args]
        self.env = {str(k): str(v) for k, v in (env or {}).items()}
        self.startup_timeout_s = float(startup_timeout_s)
        self.marker = marker
        self.lora_rank = None if lora_rank is None else vllm_lora_rank(lora_rank)
        if self.lora_rank is not None:
            self.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        #: The key every request needs (None: loopback only, no key).
        self.api_key = None if is_loopback(host) else secrets.token_urlsafe(32)
        self.child: ChildProcess | None = None
        self.base_url: str | None = None
        self.model_name: str | None = None
        #: The adapter loaded now, by the name it is served under (None: none).
        self.adapter: str | None = None

    def command(self, model: str | Path, name: str, port: int) -> list[str]:
        """The server's command line for ``model`` served as ``name`` on ``port``."""
        return [
            str(self.python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model),
            "--served-model-name",
            name,
            "--host",
            self.host,
            "--port",
            str(port),
            "--max-model-len",
            str(self.max_model_len),
            "--dtype",
            self.dtype,
            *(
                []
                if self.lora_rank is None
                else ["--enable-lora", "--max-lora-rank", str(self.lora_rank), "--max-loras", "1"]
            ),
            *self.extra_args,
        ]

    def start(self, model: str | Path, name: str, *, log_path: Path, stage: str) -> float:
        """Serve ``model`` (stopping what was served before); seconds until it answered.

        Raises:
            LoopStageError: the server exited or was not ready in time (the log is named).
        """
        self.stop()
        port = self.port or free_port(self.host)
        env = dict(self.env)
        if self.api_key is not None:
            env["VLLM_API_KEY"] = self.api_key
        self.child = ChildProcess(
            "vLLM server",
            self.command(model, name, port),
            log_path=log_path,
            env=env,
            marker=self.marker,
        ).start()
        self.base_url = f"http://{advertised_host(self.host)}:{port}/v1"
        self.model_name = name
        self.adapter = None
        try:
            return _wait_ready(
                self.base_url,
                name,
                self.startup_timeout_s,
                child=self.child,
                stage=stage,
                log=log_path,
                api_key=self.api_key,
            )
        except BaseException:
            self.stop()
            raise

    def load_adapter(self, adapter: Path, name: str, *, log_path: Path, stage: str) -> float:
        """Load the LoRA adapter in ``adapter`` into the running server as ``name`` (vLLM's
        ``POST /v1/load_lora_adapter``), then unload the one loaded before; seconds until
        ``/v1/models`` lists it. The server keeps running: no restart between iterations.

        Raises:
            LoopStageError: the server was not started with ``lora_rank``, or refused the
                adapter. Each request and the server's answer are added to ``log_path``
                (a log of its own: the server writes its log at its own offset).
        """
        if self.lora_rank is None or self.base_url is None:
            raise LoopStageError(f"{stage}: the vLLM server was not started for LoRA adapters")
        started = time.perf_counter()
        previous = self.adapter
        if previous == name:
            return 0.0
        _post_json(
            f"{self.base_url.removesuffix('/v1')}/v1/load_lora_adapter",
            {"lora_name": name, "lora_path": str(adapter)},
            log_path=log_path,
            stage=stage,
            what=f"loading the adapter {adapter}",
            api_key=self.api_key,
        )
        self.adapter = name
        if previous is not None:
            _post_json(
                f"{self.base_url.removesuffix('/v1')}/v1/unload_lora_adapter",
                {"lora_name": previous},
                log_path=log_path,
                stage=stage,
                what=f"unloading the adapter {previous!r}",
                api_key=self.api_key,
            )
        _wait_ready(
            self.base_url,
            name,
            30.0,
            child=self.child,
            stage=stage,
            log=log_path,
            api_key=self.api_key,
        )
        return time.perf_counter() - started

    def stop(self) -> None:
        """Stop the server (idempotent)."""
        if self.child is not None:
            self.child.stop()
            self.child = None
        self.base_url = None
        self.adapter = None


#: The ranks vLLM accepts for ``--max-lora-rank`` (vLLM 0.32's ``MaxLoRARanks``).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def vllm_lora_rank(rank: int) -> int:
    """The smallest ``--max-lora-rank`` vLLM accepts that serves adapters of ``rank``.

    Raises:
        ConfigError: ``rank`` is not an int in 1..512.
    """
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= VLLM_LORA_RANKS[-1]:
        raise ConfigError(f"a LoRA rank must be an int in 1..{VLLM_LORA_RANKS[-1]}, got {rank!r}")
    return next(r for r in VLLM_LORA_RANKS if r >= rank)


def _post_json(
    url: str,
    body: Mapping[str, Any],
    *,
    log_path: Path,
    stage: str,
    what: str,
    api_key: str | None = None,
) -> None:
    """POST ``body`` to ``url``; the exchange is appended to ``log_path``.

    Raises:
        LoopStageError: no answer, or an error status (the server's words are quoted).
    """
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode("utf-8"),
        headers={"Content-Type": "application/json", **_auth(api_key)},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            answer = response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        answer = exc.read().decode("utf-8", "replace")
        _append(log_path, f"POST {url} {json.dumps(body)} -> {exc.code} {answer}\n")
        raise LoopStageError(
            f"{stage}: the vLLM server refused {what} ({exc.code}: {answer.strip()[:300]}); "
            f"see {log_path}"
        ) from None
    except (urllib.error.URLError, OSError) as exc:
        raise LoopStageError(f"{stage}: no answer from the vLLM server {what}: {exc}") from None
    _append(log_path, f"POST {url} {json.dumps(body)} -> {answer.strip()}\n")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) is this machine's loopback only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def advertised_host(host: str) -> str:
    """The address others reach a server bound to ``host`` at: this machine's address for
    a wildcard bind (``0.0.0.0``, ``::``), else ``host``."""
    if host not in ("0.0.0.0", "::", ""):
        return host
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _append(path: Path, text: str) -> None:
    """Add ``text`` to a log file for people to read."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(text)


class ExternalServer:
    """A server the user runs (``serve.base_url``); ``reload_command`` loads a checkpoint.

    The command is run through the shell with ``{checkpoint}`` and ``{model}``
    replaced (quoted); the loop then waits for ``/v1/models`` to list the model.
    """

    def __init__(
        self,
        base_url: str,
        reload_command: str | None,
        *,
        startup_timeout_s: float = 600.0,
        marker: str | None = None,
    ) -> None:
        self.base_url: str | None = base_url.rstrip("/")
        self.reload_command = reload_command
        self.startup_timeout_s = float(startup_timeout_s)
        self.marker = marker

    def start(self, model: str | Path, name: str, *, log_path: Path, stage: str) -> float:
        """Run the reload command (if any) and wait for ``name``; seconds taken.

        Raises:
            LoopStageError: the command failed or the model never appeared.
        """
        started = time.perf_counter()
        assert self.base_url is not None
        if self.reload_command:
            command = self.reload_command.format(
                checkpoint=shlex.quote(str(model)), model=shlex.quote(name)
            )
            child = ChildProcess(
                "reload command", ["/bin/sh", "-c", command], log_path=log_path, marker=self.marker
            ).start()
            code = child.wait()
            child.stop()
            if code != 0:
                raise LoopStageError(
                    f"{stage}: the reload command {describe_exit(code)}; see {log_path}"
                )
        _wait_ready(
            self.base_url, name, self.startup_timeout_s, child=None, stage=stage, log=log_path
        )
        return time.perf_counter() - started

    def stop(self) -> None:
        """Nothing to stop: the server is the user's."""


# ---------------------------------------------------------------------- training

#: Built-in training templates (package data in ``replaystore/loop/templates``).
TEMPLATES = {
    "text": "llamafactory_sft_text.yaml",
    "text_lora": "llamafactory_lora_text.yaml",
    "qwen2_vl": "llamafactory_sft_qwen2vl.yaml",
    "qwen2_vl_lora": "llamafactory_lora_qwen2vl.yaml",
}


def template_text(name_or_path: str | Path | None, observation: str = "text") -> str:
    """The YAML text of a training template: a file, or a built-in name (:data:`TEMPLATES`:
    ``text``, full SFT of the tiny CPU model; ``text_lora``, LoRA on a pretrained text model;
    ``qwen2_vl`` and ``qwen2_vl_lora``, Qwen2-VL on a GPU), or the default for
    ``observation`` (``text``, or ``qwen2_vl`` for ``screenshot``)."""
    if name_or_path is None:
        name_or_path = "text" if observation == "text" else "qwen2_vl"
    if str(name_or_path) in TEMPLATES:
        package = resources.files("replaystore.loop") / "templates"
        return (package / TEMPLATES[str(name_or_path)]).read_text(encoding="utf-8")
    return Path(name_or_path).read_text(encoding="utf-8")


def training_arguments(
    template: str,
    *,
    model: str | Path,
    dataset_dir: Path,
    dataset: str,
    output_dir: Path,
    overrides: Mapping[str, Any] | None = None,
    has_images: bool = False,
    settings: Mapping[str, Any] | None = None,
    adapter: str | Path | None = None,
) -> dict[str, Any]:
    """LLaMA-Factory's training arguments: the template, the loop's own ``settings``
    (``finetuning_type`` and the ``lora_`` keys of ``train``), the overrides, then this
    iteration's model, dataset and output directory (which always win).

    ``adapter``: a LoRA adapter to go on training (``adapter_name_or_path``; the model is
    then the base it was trained on).

    With ``has_images``, ``media_dir`` is the dataset directory (the exporter writes
    image paths relative to it) unless the template sets it.

    Raises:
        ConfigError: the template is not a YAML mapping, or an override names a key the
            loop sets itself.
    """
    import yaml

    try:
        args = yaml.safe_load(template)
    except yaml.YAMLError as exc:
        raise ConfigError(f"the training template is not valid YAML: {exc}") from None
    if not isinstance(args, dict):
        raise ConfigError("the training template must be a YAML mapping of LLaMA-Factory keys")
    owned = {
        "model_name_or_path": str(model),
        "dataset_dir": str(dataset_dir),
        "dataset": dataset,
        "output_dir": str(output_dir),
    }
    if adapter is not None:
        owned["adapter_name_or_path"] = str(adapter)
    for key in overrides or {}:
        if key in owned or key == "adapter_name_or_path":
            raise ConfigError(f"train.overrides.{key} is set by the loop each iteration; remove it")
    args.update({k: v for k, v in (settings or {}).items() if v is not None})
    args.update(dict(overrides or {}))
    args.update(owned)
    if has_images:
        args.setdefault("media_dir", str(dataset_dir))
    args.setdefault("overwrite_output_dir", True)
    args.setdefault("report_to", "none")
    args.setdefault("logging_steps", 1)
    return args


#: The /proc/cpuinfo flags of a CPU that computes bfloat16 natively (x86: AVX512-BF16,
#: AMX; Arm: BF16).
_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def cpu_computes_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this machine's CPU computes bfloat16 natively (``avx512_bf16``,
    ``amx_bf16`` or Arm's ``bf16`` among ``cpuinfo``'s flags). False where the file cannot
    be read (not Linux): bf16 there is left to ``train.cpu_bf16: true``."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features") and _BF16_FLAGS & set(value.split()):
            return True
    return False


def _nvidia_gpu_visible(env: Mapping[str, str], dev: Path = Path("/dev")) -> bool:
    """Whether a child process started with ``env`` would see an NVIDIA GPU: a device
    node ``/dev/nvidia0`` (or later) exists and ``CUDA_VISIBLE_DEVICES`` does not hide
    them all (empty or ``-1``)."""
    visible = env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
    if visible is not None and visible.strip() in ("", "-1"):
        return False
    return any(dev.glob("nvidia[0-9]*"))


def cpu_bf16_arguments(
    arguments: Mapping[str, Any],
    setting: str | bool,
    *,
    overrides: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    cpuinfo: Path = Path("/proc/cpuinfo"),
    dev: Path = Path("/dev"),
) -> dict[str, Any]:
    """The keys ``train.cpu_bf16`` adds to the training ``arguments``: ``{"bf16": True,
    "use_cpu": True}`` (LLaMA-Factory then trains on the CPU under bf16 autocast, the
    weights and optimizer state in float32), or nothing.

    ``setting`` ``"auto"``: when no NVIDIA GPU is visible to the trainer (``env`` is its
    environment's additions), the CPU computes bf16 natively (:func:`cpu_computes_bf16`)
    and neither ``arguments`` nor ``overrides`` sets ``bf16``, ``fp16`` or ``use_cpu``
    (an explicit choice wins). ``True``: whenever no NVIDIA GPU is visible and the
    overrides do not choose. ``False``: never.
    """
    if setting is False:
        return {}
    chosen = overrides or {}
    if any(key in chosen for key in ("bf16", "fp16", "use_cpu")):
        return {}
    if arguments.get("bf16") or arguments.get("fp16") or arguments.get("use_cpu"):
        return {}
    if _nvidia_gpu_visible(env or {}, dev):
        return {}
    if setting == "auto" and not cpu_computes_bf16(cpuinfo):
        return {}
    return {"bf16": True, "use_cpu": True}


def preference_arguments(arguments: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """``arguments`` for LLaMA-Factory's preference stage ``kind`` (``kto`` or ``dpo``).

    The reference model is the one training starts from (LLaMA-Factory's default: a frozen
    copy, or the base with the adapter off under LoRA); ``pref_beta`` 0.1 is TRL's and
    LLaMA-Factory's example value, and DPO's loss ``sigmoid``, unless ``arguments`` set
    them (``train.overrides``). ``mask_history`` is SFT's (LLaMA-Factory refuses it for
    other stages): a preference record's response is its final reply already.
    """
    out = {**arguments, "stage": kind}
    out.pop("mask_history", None)
    out.setdefault("pref_beta", 0.1)
    if kind == "dpo":
        out.setdefault("pref_loss", "sigmoid")
    return out


@dataclass(slots=True)
class TrainResult:
    """What one training run reported."""

    checkpoint: Path
    steps: int
    loss_first: float | None
    loss_last: float | None
    seconds: float

    def facts(self) -> dict[str, Any]:
        """What the journal records of the run: ``steps``, ``loss_first``, ``loss_last``."""
        return {"steps": self.steps, "loss_first": self.loss_first, "loss_last": self.loss_last}


def read_losses(trainer_log: Path) -> list[float]:
    """The ``loss`` values of LLaMA-Factory's ``trainer_log.jsonl`` (bad lines skipped)."""
    losses = []
    try:
        lines = trainer_log.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        loss = record.get("loss") if isinstance(record, Mapping) else None
        if isinstance(loss, int | float) and math.isfinite(loss):
            losses.append(float(loss))
    return losses


def hf_hub_cache(env: Mapping[str, str] | None = None) -> Path:
    """Where LLaMA-Factory and vLLM (through ``huggingface_hub``) keep downloaded models:
    ``HF_HUB_CACHE``, else ``HF_HOME/hub``, else ``~/.cache/huggingface/hub``."""
    env = os.environ if env is None else env
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def check_hub_model(
    model_id: str,
    env: Mapping[str, str] | None = None,
    *,
    endpoint: str = "https://huggingface.co",
    timeout_s: float = 5.0,
) -> str:
    """Check that the tools can get the hub model ``model_id``; how (``"cached"`` or
    ``"hub"``).

    Cached: a snapshot with a ``config.json`` in :func:`hf_hub_cache`. Otherwise the hub
    must answer for it (``HF_ENDPOINT`` or ``endpoint``; one request), unless
    ``HF_HUB_OFFLINE`` is set.

    Raises:
        ConfigError: not cached and offline (``HF_HUB_OFFLINE``), the hub unreachable, or
            the hub not knowing the id; one line naming the id and the cache.
    """
    env = os.environ if env is None else env
    cache = hf_hub_cache(env)
    snapshots = cache / ("models--" + model_id.replace("/", "--")) / "snapshots"
    if snapshots.is_dir() and any(p.is_file() for p in snapshots.glob("*/config.json")):
        return "cached"
    where = f"model.path {model_id!r} is a Hugging Face hub id that is not in the cache ({cache})"
    if env.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        raise ConfigError(
            f"{where} and HF_HUB_OFFLINE is set: download it once with network, or point "
            "model.path at a local directory"
        )
    url = f"{env.get('HF_ENDPOINT') or endpoint}/api/models/{model_id}"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s):
            return "hub"
    except urllib.error.HTTPError as exc:
        raise ConfigError(
            f"{where}, and the hub answers HTTP {exc.code} for it: check the id (and a "
            "token, HF_TOKEN, for a gated model)"
        ) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ConfigError(
            f"{where}, and the hub cannot be reached ({reason}): run with network once, "
            "set HF_HUB_CACHE to a cache that holds it, or point model.path at a local "
            "directory (HF_HUB_OFFLINE=1 says so without trying the network)"
        ) from None


def checkpoint_weights(directory: Path) -> list[Path]:
    """The weight files of a saved model directory (empty: no weights)."""
    found = [directory / n for n in WEIGHT_FILES if (directory / n).is_file()]
    for index in WEIGHT_INDEXES:
        path = directory / index
        if path.is_file():
            try:
                shards = set(json.loads(path.read_text("utf-8"))["weight_map"].values())
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue
            if shards and all((directory / s).is_file() for s in shards):
                found.extend(directory / s for s in sorted(shards))
    return [p for p in found if p.stat().st_size > 0]


def is_adapter(directory: Path | str) -> bool:
    """Whether ``directory`` holds a LoRA adapter (PEFT's ``adapter_config.json``), not a
    whole model."""
    return isinstance(directory, Path) and (directory / "adapter_config.json").is_file()


def merge_adapter(
    command: Sequence[str],
    *,
    base: Path | str,
    adapter: Path,
    template: str,
    out: Path,
    yaml_path: Path,
    log_path: Path,
    marker: str | None,
    stage: str,
) -> float:
    """Merge a LoRA ``adapter`` into its ``base`` model with ``llamafactory-cli export``
    (its arguments written to ``yaml_path``), into ``out`` (written through its
    ``.partial``, :func:`~replaystore.loop.partial.build_directory`, and renamed into
    place once it holds weights); seconds taken. LLaMA-Factory's ``template`` is the
    one the adapter was trained with.

    Raises:
        LoopStageError: the export failed, or wrote no weights (the log is named).
    """
    import yaml

    def export(partial: Path) -> float:
        arguments = {
            "model_name_or_path": str(base),
            "adapter_name_or_path": str(adapter),
            "template": template,
            "finetuning_type": "lora",
            "export_dir": str(partial),
            "export_device": "cpu",
            "export_legacy_format": False,
        }
        atomic_write_text(yaml_path, yaml.safe_dump(arguments, sort_keys=True))
        started = time.perf_counter()
        child = ChildProcess(
            "adapter merge", [*command, "export", str(yaml_path)], log_path=log_path, marker=marker
        ).start()
        try:
            code = child.wait()
        finally:
            child.stop()
        if code != 0 or not checkpoint_weights(partial):
            last = tail(log_path)
            what = describe_exit(code) if code != 0 else f"exited 0 but {partial} holds no weights"
            raise LoopStageError(
                f"{stage}: merging the adapter (llamafactory-cli export) {what}; see {log_path}"
                + (f"\n{last}" if last else "")
            )
        return time.perf_counter() - started

    return build_directory(out, export)


def run_training(
    command: Sequence[str],
    arguments: Mapping[str, Any],
    *,
    yaml_path: Path,
    log_path: Path,
    env: Mapping[str, str] | None,
    marker: str | None,
    stage: str,
    on_child: Any = None,
) -> TrainResult:
    """Write ``arguments`` to ``yaml_path`` and run ``command train yaml_path``.

    Args:
        on_child: called with the :class:`ChildProcess` once it runs (the loop keeps
            it to stop it on Ctrl-C).

    Raises:
        LoopStageError: the trainer exited non-zero, or wrote no weights (log named).
    """
    import yaml

    atomic_write_text(yaml_path, yaml.safe_dump(dict(arguments), sort_keys=True))
    output = Path(arguments["output_dir"])
    started = time.perf_counter()
    child = ChildProcess(
        "trainer", [*command, "train", str(yaml_path)], log_path=log_path, env=env, marker=marker
    )
    child.start()
    if on_child is not None:
        on_child(child)
    try:
        code = child.wait()
    finally:
        child.stop()
    seconds = time.perf_counter() - started
    if code != 0:
        last = tail(log_path)
        raise LoopStageError(
            f"{stage}: the trainer (llamafactory-cli) {describe_exit(code)}; see {log_path}"
            + (f"\n{last}" if last else "")
        )
    if not checkpoint_weights(output):
        raise LoopStageError(
            f"{stage}: the trainer exited 0 but {output} holds no weights "
            f"({', '.join(WEIGHT_FILES)}); see {log_path}"
        )
    losses = read_losses(output / "trainer_log.jsonl")
    return TrainResult(
        checkpoint=output,
        steps=len(losses),
        loss_first=losses[0] if losses else None,
        loss_last=losses[-1] if losses else None,
        seconds=seconds,
    )


# ---------------------------------------------------------------------- tiny model


def make_tiny_model(
    python: Path,
    out: Path,
    *,
    corpus: Sequence[Path] = (),
    layers: int = 4,
    hidden: int = 256,
    heads: int = 4,
    vocab: int = 2048,
    seed: int = 0,
    pretrain_steps: int = 0,
    log_path: Path | None = None,
    marker: str | None = None,
) -> dict[str, Any]:
    """Build a tiny Qwen2 chat model in ``out`` with ``python`` (the LLaMA-Factory
    environment's, which has transformers and tokenizers); its settings.

    ``pretrain_steps`` > 0 trains it that many steps on synthetic find-and-copy text
    first (``tiny_model.pretrain``; about 1 s a step for 2 layers on 2 cores).

    Runs ``replaystore/loop/tiny_model.py`` there as a script (see that module).

    Raises:
        LoopStageError: the script failed (its output or log is named).
    """
    script = resources.files("replaystore.loop") / "tiny_model.py"
    argv = [
        str(python),
        str(script),
        "--out",
        str(out),
        "--layers",
        str(layers),
        "--hidden",
        str(hidden),
        "--heads",
        str(heads),
        "--vocab",
        str(vocab),
        "--seed",
        str(seed),
        "--pretrain-steps",
        str(pretrain_steps),
    ]
    for path in corpus:
        argv += ["--corpus", str(path)]
    log = log_path or out.parent / f"{out.name}.log"
    child = ChildProcess("tiny model builder", argv, log_path=log, marker=marker).start()
    try:
        code = child.wait()
    finally:
        child.stop()
    if code != 0:
        raise LoopStageError(
            f"model: building the tiny model {describe_exit(code)}; see {log}\n{tail(log)}"
        )
    try:
        settings: dict[str, Any] = json.loads((out / "tiny_model.json").read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise LoopStageError(
            f"model: the tiny model in {out} has no tiny_model.json: {exc}"
        ) from None
    return settings
