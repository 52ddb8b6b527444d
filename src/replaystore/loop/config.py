"""The loop's configuration: one YAML file, every key checked, defaults that run on a CPU.

``replaystore loop --config loop.yaml`` reads it with :func:`load_config`. Every
section and key is listed in :data:`DEFAULTS` (and in ``docs/loop.md``); an
unknown key is an error naming it, never silently ignored. Relative paths are
relative to the config file's directory.
"""

from __future__ import annotations

import copy
import difflib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replaystore.errors import ConfigError

from .tools import TEMPLATES

__all__ = [
    "DEFAULTS",
    "PATH_KEYS",
    "RESUMABLE_KEYS",
    "TOOLS_ENV_VAR",
    "TRAIN_STAGES",
    "LoopConfig",
    "default_tools_dir",
    "load_config",
    "model_source",
    "resume_changes",
]

#: Environment variable naming the directory of the tool environments.
TOOLS_ENV_VAR = "REPLAYSTORE_LOOP_TOOLS"

#: Every key the config may hold, with its default (``None``: chosen at run time).
DEFAULTS: dict[str, Any] = {
    # Run directory (journal, storage, datasets, checkpoints, logs, summary.json).
    "out": "loop-run",
    # Iterations, counting iteration 0 (demonstrations when bootstrap.source is set).
    "iterations": 3,
    "seed": 0,
    # "suite" (the bundled local websites), a JSONL/CSV/Parquet task file, or MiniWoB++
    # tasks: "miniwob:click-button,enter-text" ("miniwob:experts": the 18 with an expert).
    "tasks": "suite",
    # Tasks per iteration (null: every task not on the blocklist). Not for MiniWoB++,
    # whose iterations take seeds_per_iteration seeds of every task.
    "tasks_per_iteration": None,
    # MiniWoB++ only: the seeds training rollouts draw from; each rollout iteration takes
    # the next seeds_per_iteration of them for every task (iteration 0's demonstrations
    # bootstrap.repeats times as many), so no seed is rolled out twice.
    "train_seeds": "0-99999",
    "seeds_per_iteration": 10,
    # MiniWoB++ only: the held-out set every iteration's policy is measured on, with
    # greedy decoding (the experts, the untrained model, each checkpoint). Its seeds
    # must not meet train_seeds (checked). tasks: null means the training tasks.
    "evaluation": {"tasks": None, "seeds": "100000-100049"},
    # "text" (accessibility tree and URL) or "screenshot" (a vision-language model).
    "observation": "text",
    # Where the tool environments are (null: $REPLAYSTORE_LOOP_TOOLS, else
    # ~/.cache/replaystore/loop-tools, as .ci/install-loop-tools makes them).
    "tools_dir": None,
    # ExperimentLogger backend: none, tensorboard or wandb.
    "logger": "none",
    "rollout": {
        "workers": 4,
        "viewport": [800, 560],
        "max_steps": {"easy": 8, "medium": 10, "hard": 12},
        "step_timeout_s": 60.0,
        "task_timeout_s": 600.0,
        # How long after a click or key press a page load may still start (MiniWoB++
        # pages never navigate: 0.05 s is enough there).
        "settle_s": 0.25,
        # Remote browsers over CDP (empty: launch local headless Chromium).
        "cdp": [],
        # Port of the local website suite (0: a free port, then kept for the whole run,
        # so prompts, which show URLs, stay the same from one iteration to the next).
        "suite_port": 0,
        # Roll out on Ray actors (address null: in this process). Each actor runs its
        # own Chromium and serves the suite or the MiniWoB++ pages itself (its own port
        # shows in its trajectories' URLs); the loop stores what they send back. Every
        # node needs replaystore[rollouts] and Chromium. See docs/rollouts.md.
        "ray": {
            # "auto", "local", HOST:PORT of the head, or ray://HOST:10001.
            "address": None,
            "actors": 2,
            "browsers_per_actor": 2,
            # "spread" over the nodes or "pack"; resources: custom Ray resources each
            # actor needs ({"browser_node": 1}).
            "placement": "spread",
            "resources": {},
        },
    },
    "bootstrap": {
        # Iteration 0's data: "scripted" (the suite's scripted expert), a path to an
        # existing trajectory storage, or null (iteration 0 rolls out the model).
        "source": "scripted",
        # The scripted expert's skill, and how many times it rolls out the tasks
        # (each repeat seeded differently: its few mistakes vary, and so do histories).
        "mistake_rate": 0.0,
        "wrong_answer_rate": 0.0,
        "repeats": 1,
    },
    # The prompt (the same builder makes the rollouts' prompts and the buffer's rebuilds).
    "prompt": {"history_window": 4, "max_ac_tree_chars": 4000},
    "model": {
        # The model iteration 0 trains (a Hugging Face model directory). null: build
        # a tiny Qwen2 in the run directory, its tokenizer trained on iteration 0's data.
        "path": None,
        # The name the server serves the model under (the policy asks for it).
        "name": "policy",
        "tiny": {
            "layers": 4,
            "hidden": 256,
            "heads": 4,
            "vocab": 2048,
            "seed": 0,
            # steps of synthetic find-and-copy text before the loop trains it (tiny_model.py)
            "pretrain_steps": 0,
        },
        # Roll out the untrained model once before training, for the learning curve.
        "evaluate_untrained": True,
    },
    "buffer": {
        "filter_successful_only": True,
        "filter_same_screenshot": True,
        "recency_bias_power": 1.0,
        # Steps drawn for training (null: every eligible step).
        "train_samples": None,
        # Train on the last N iterations' data (null: all of them).
        "last_n_iterations": None,
        "val_ratio": 0.0,
    },
    "train": {
        # The trainer command (null: <tools_dir>/llamafactory/bin/llamafactory-cli).
        "command": None,
        # A YAML template of LLaMA-Factory's training arguments: a file, or a built-in
        # name (text: full SFT of the tiny CPU model; text_lora: LoRA on a pretrained text
        # model; qwen2_vl, qwen2_vl_lora: Qwen2-VL on a GPU); null: text, or qwen2_vl with
        # observation: screenshot. See replaystore/loop/templates/.
        "template": None,
        # "full" or "lora" (null: the template's). With lora each iteration trains an
        # adapter on model.path (train.init: previous goes on training the last one) and
        # vLLM serves it on top of model.path, loaded while it runs (serve.merge: false).
        "finetuning_type": None,
        # The adapter's shape (null: the template's, else LLaMA-Factory's: rank 8,
        # alpha 2 x rank, dropout 0, target all linear layers).
        "lora": {"rank": None, "alpha": None, "dropout": None, "target": None},
        # Keys written over the template (learning rate, epochs, batch size...).
        "overrides": {},
        # "previous": each iteration fine-tunes the checkpoint that acted;
        # "base": each iteration trains model.path afresh on the buffer.
        "init": "previous",
        # What each iteration trains: "sft" (the buffer's successful steps), "kto" (every
        # step, tagged by its trajectory's success) or "dpo" (pairs at shared states); a
        # list gives iteration k the k-th entry (the last one from then on), e.g.
        # [sft, kto]: SFT on the demonstrations, then KTO on the rollouts.
        "stage": "sft",
        # Train after the last iteration's rollouts too (false: the last iteration
        # only measures the model it served).
        "final": True,
        # SFT records only: this many copies of each record whose goal quotes a name, the
        # name swapped everywhere in the record for words of the pages' lexicon
        # (MiniWoB++'s word lists; replaystore.loop.augment): copying the goal's name then
        # fits the data, remembering it does not. 0: off.
        "name_swaps": 0,
        # Training on a CPU in bf16 mixed precision (LLaMA-Factory's bf16 with use_cpu):
        # "auto" turns it on when no NVIDIA GPU is visible, the CPU computes bf16 natively
        # (AVX512-BF16 or AMX) and neither the template nor train.overrides says bf16,
        # fp16 or use_cpu (the tiny model's `text` template is float32); true: on
        # whenever no NVIDIA GPU is visible; false: never. The quick MiniWoB++ run
        # trained in 111 s instead of 171 s on 2 cores of an AMD EPYC with AVX512-BF16.
        "cpu_bf16": "auto",
        "env": {},
    },
    "serve": {
        # Python of the vLLM environment (null: <tools_dir>/vllm/bin/python).
        "python": None,
        # An external OpenAI-compatible server instead (then vLLM is not started here).
        "base_url": None,
        # With base_url: command run to load a checkpoint ({checkpoint}, {model}
        # are replaced); the loop then waits for /v1/models to list the model.
        "reload_command": None,
        # LoRA: true merges each adapter into model.path (llamafactory-cli export) and
        # serves the merged model (a server start per iteration); false serves the base
        # with --enable-lora and loads each new adapter at runtime (no restart).
        "merge": False,
        "host": "127.0.0.1",
        "port": 0,
        "max_model_len": 4096,
        "dtype": "float32",
        "startup_timeout_s": 600.0,
        # --enforce-eager: no graph capture at start (22 s instead of 44 s for the tiny model
        # on 2 CPU cores, same reply latency); on a GPU, drop it for CUDA graphs.
        "extra_args": ["--enforce-eager"],
        # VLLM_ENABLE_V1_MULTIPROCESSING=0: the engine core runs its model itself instead of
        # in a third Python process that imports vLLM once more: the tiny model served in
        # 19.5 s instead of 30.3 s on 2 idle CPU cores, the same greedy replies, 40 replies
        # of 64 tokens 2.1 s instead of 1.7 s (2026-11-28). On a GPU, set it to "1".
        "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
    },
    "policy": {"temperature": 0.0, "max_tokens": 96, "timeout_s": 30.0, "max_retries": 2},
}


#: What an iteration can train (``train.stage``): supervised fine-tuning on successful
#: steps, or a preference stage on successes and failures (LLaMA-Factory's ``kto``, ``dpo``).
TRAIN_STAGES = ("sft", "kto", "dpo")


#: Keys whose value is a path, relative to the config file's directory, with the words
#: that are not paths (``tasks: suite``, ``bootstrap.source: scripted``).
PATH_KEYS: dict[str, tuple[str, ...]] = {
    "out": (),
    "tools_dir": (),
    "tasks": ("suite", "miniwob:"),
    "model.path": (),
    "bootstrap.source": ("scripted",),
    "train.template": tuple(TEMPLATES),
}

#: Keys that ``--resume`` may change (a key listed here covers the keys under it): how
#: far the run goes, where and how its processes run, how long it waits, how it logs.
#: A change to any other key (the model, the tasks, the observation, the prompt, the
#: bootstrap, the buffer, the training template and its overrides, the seeds, what the
#: server and the policy generate with) would make the finished stages part of another
#: experiment than the rest, so :func:`resume_changes` reports it and the resume is
#: refused.
RESUMABLE_KEYS = frozenset(
    {
        "iterations",
        "out",
        "tools_dir",
        "logger",
        "rollout.workers",
        "rollout.cdp",
        "rollout.step_timeout_s",
        "rollout.task_timeout_s",
        "rollout.settle_s",
        "rollout.ray",
        "train.final",
        "train.command",
        "train.env",
        "serve.python",
        "serve.host",
        "serve.port",
        "serve.startup_timeout_s",
        "serve.env",
        "policy.timeout_s",
        "policy.max_retries",
    }
)


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` as ``{"a.b": 1}`` (lists are values; an empty mapping adds nothing,
    so ``env: {}`` and ``env: {X: "1"}`` differ in ``env.X`` alone)."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def _resumable(key: str) -> bool:
    parts = key.split(".")
    return any(".".join(parts[:i]) in RESUMABLE_KEYS for i in range(1, len(parts) + 1))


def resume_changes(
    previous: Mapping[str, Any], current: Mapping[str, Any]
) -> tuple[dict[str, tuple[Any, Any]], dict[str, tuple[Any, Any]]]:
    """The keys that differ between a run's config and the one it resumes with.

    Both are configs as :meth:`LoopConfig.resolved` gives them (paths absolute), so
    the same file named from another directory is no change.

    Returns:
        ``(refused, accepted)``: dotted key -> ``(previous value, current value)``, a
        key that is missing on one side shown as ``None``. ``accepted`` holds the
        :data:`RESUMABLE_KEYS`; ``refused`` every other change.
    """
    old, new = _flatten(previous), _flatten(current)
    refused: dict[str, tuple[Any, Any]] = {}
    accepted: dict[str, tuple[Any, Any]] = {}
    for key in sorted(set(old) | set(new)):
        before, after = old.get(key), new.get(key)
        if before == after:
            continue
        (accepted if _resumable(key) else refused)[key] = (before, after)
    return refused, accepted


def default_tools_dir() -> Path:
    """``$REPLAYSTORE_LOOP_TOOLS``, else ``~/.cache/replaystore/loop-tools``."""
    value = os.environ.get(TOOLS_ENV_VAR)
    if value:
        return Path(value).expanduser()
    return Path.home() / ".cache" / "replaystore" / "loop-tools"


def _merge(defaults: Mapping[str, Any], given: Mapping[str, Any], where: str) -> dict[str, Any]:
    out = copy.deepcopy(dict(defaults))
    for key, value in given.items():
        if key not in defaults:
            close = difflib.get_close_matches(str(key), list(defaults), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"unknown key {where}{key!r}{hint}; see docs/loop.md")
        default = defaults[key]
        free_form = key in ("overrides", "env", "max_steps", "tiny", "resources")
        if isinstance(default, dict) and not free_form:
            if not isinstance(value, Mapping):
                raise ConfigError(f"{where}{key} must be a mapping, got {value!r}")
            out[key] = _merge(default, value, f"{where}{key}.")
        elif isinstance(default, dict):
            if not isinstance(value, Mapping):
                raise ConfigError(f"{where}{key} must be a mapping, got {value!r}")
            merged = dict(default) if key in ("max_steps", "tiny", "env") else {}
            merged.update(value)
            out[key] = merged
        else:
            out[key] = value
    return out


#: A Hugging Face hub id: ``owner/name`` (letters, digits, ``-``, ``_``, ``.``).
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")


def model_source(value: str, base_dir: Path) -> Path | str:
    """``model.path``: a local directory, else a Hugging Face hub id.

    An absolute path (``~`` expanded) is a directory. A relative one is a directory
    relative to ``base_dir`` (the config file's) when something exists there; otherwise a
    value shaped like a hub id (``Qwen/Qwen2.5-0.5B-Instruct``: one ``/``, no leading
    ``.``) is a hub id, returned unchanged for LLaMA-Factory and vLLM to download, and any
    other value is the directory it would be (whose absence the loop reports).
    """
    path = Path(value).expanduser()
    if path.is_absolute():
        return path
    local = base_dir / path
    if local.exists() or not _HUB_ID.fullmatch(value):
        return local
    return value


@dataclass(slots=True)
class LoopConfig:
    """A checked loop configuration (``data`` holds every key of :data:`DEFAULTS`).

    Attributes:
        data: the merged settings (defaults, then the file, then command-line overrides).
        base_dir: directory that relative paths are relative to.
    """

    data: dict[str, Any]
    base_dir: Path

    @classmethod
    def from_mapping(
        cls, given: Mapping[str, Any] | None, base_dir: str | os.PathLike[str] = "."
    ) -> LoopConfig:
        """Merge ``given`` over :data:`DEFAULTS` and check every value.

        Raises:
            ConfigError: an unknown key (named, with a close match), a wrong type or
                an out-of-range value (named).
        """
        if given is not None and not isinstance(given, Mapping):
            raise ConfigError(f"the loop config must be a mapping, got {type(given).__name__}")
        config = cls(_merge(DEFAULTS, given or {}, ""), Path(base_dir).absolute())
        config.check()
        return config

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def path(self, value: str | os.PathLike[str]) -> Path:
        """``value`` as an absolute path (relative ones from :attr:`base_dir`; ``~`` expanded)."""
        path = Path(value).expanduser()
        return path if path.is_absolute() else self.base_dir / path

    def train_stage(self, k: int) -> str:
        """What iteration ``k`` trains (``train.stage``: one value, or the k-th entry of a
        list, its last entry from then on)."""
        stage = self.data["train"]["stage"]
        return stage if isinstance(stage, str) else str(stage[min(k, len(stage) - 1)])

    def train_template(self) -> str | Path | None:
        """``train.template``: None (the default for the observation mode), a built-in
        template's name (:data:`~replaystore.loop.tools.TEMPLATES`), or a file (absolute;
        a relative one from :attr:`base_dir`)."""
        value = self.data["train"]["template"]
        if value is None or str(value) in TEMPLATES:
            return value
        return self.path(value)

    def training_settings(self) -> dict[str, Any]:
        """The LLaMA-Factory keys ``train.finetuning_type`` and ``train.lora`` set (a null
        value leaves the template's): ``finetuning_type``, ``lora_rank``, ``lora_alpha``,
        ``lora_dropout``, ``lora_target``."""
        t = self.data["train"]
        settings: dict[str, Any] = {"finetuning_type": t["finetuning_type"]}
        for key, value in t["lora"].items():
            settings[f"lora_{key}"] = value
        return settings

    def model_source(self) -> Path | str | None:
        """``model.path`` as the loop uses it: a local directory (absolute; a relative one
        from :attr:`base_dir`), a Hugging Face hub id passed on unchanged, or None (the
        tiny model). See :func:`model_source`."""
        value = self.data["model"]["path"]
        return None if value is None else model_source(value, self.base_dir)

    def resolved(self) -> dict[str, Any]:
        """A copy of :attr:`data` with the :data:`PATH_KEYS` made absolute.

        What the run directory's ``loop.yaml`` and journal record, so that
        ``--resume --out RUN`` (which reads that ``loop.yaml``, from another directory)
        finds the same files.
        """
        data = copy.deepcopy(self.data)
        for dotted, words in PATH_KEYS.items():
            *parents, key = dotted.split(".")
            section = data
            for name in parents:
                section = section[name]
            value = section[key]
            if dotted == "model.path" and isinstance(value, str):
                source = model_source(value, self.base_dir)
                section[key] = source if isinstance(source, str) else os.path.normpath(source)
            elif isinstance(value, str) and not any(
                value == w or (w.endswith(":") and value.startswith(w)) for w in words
            ):
                section[key] = os.path.normpath(self.path(value))
        return data

    @property
    def out(self) -> Path:
        """The run directory."""
        return self.path(self.data["out"])

    @property
    def tools_dir(self) -> Path:
        """Where the LLaMA-Factory and vLLM environments are."""
        value = self.data["tools_dir"]
        return default_tools_dir() if value is None else self.path(value)

    @property
    def on_miniwob(self) -> bool:
        """The tasks are MiniWoB++ tasks (seeded, scored by the pages, held-out evaluation)."""
        return str(self.data["tasks"]).startswith("miniwob:")

    def evaluation_tasks(self) -> str:
        """The held-out evaluation's ``miniwob:`` tasks (the training tasks when not named)."""
        return self.data["evaluation"]["tasks"] or self.data["tasks"]

    @property
    def uses_demonstrations(self) -> bool:
        """Iteration 0 takes its data from demonstrations, not from the model."""
        return self.data["bootstrap"]["source"] is not None

    def check(self) -> None:
        """Raise :class:`ConfigError` naming the first bad value."""
        d = self.data
        _int(d, "iterations", 1)
        _int(d, "seed", 0)
        if d["tasks_per_iteration"] is not None:
            _int(d, "tasks_per_iteration", 1)
        _choice(d, "observation", ("text", "screenshot"))
        _choice(d, "logger", ("none", "tensorboard", "wandb"))
        if not isinstance(d["tasks"], str) or not d["tasks"]:
            raise ConfigError(
                f"tasks must be 'suite', a task file path or 'miniwob:NAME,...', got {d['tasks']!r}"
            )
        self._check_miniwob()
        self._check_rollout()
        self._check_bootstrap()
        self._check_model()
        self._check_buffer()
        self._check_train()
        buf = d["buffer"]
        for key in ("filter_successful_only", "filter_same_screenshot"):
            if not isinstance(buf[key], bool):
                raise ConfigError(f"buffer.{key} must be true or false, got {buf[key]!r}")
        self._check_serve()
        for section, key in (("train", "env"), ("serve", "env")):
            env = d[section][key]
            if not all(isinstance(k, str) for k in env):
                raise ConfigError(f"{section}.{key} must map names to values, got {env!r}")

    def _check_rollout(self) -> None:
        """The ``rollout`` keys."""
        d = self.data
        r = d["rollout"]
        _int(r, "workers", 1, "rollout.")
        _int(r, "suite_port", 0, "rollout.")
        _number(r, "step_timeout_s", "rollout.")
        _number(r, "settle_s", "rollout.", strict=False)
        _number(r, "task_timeout_s", "rollout.")
        viewport = r["viewport"]
        if not (
            isinstance(viewport, list | tuple)
            and len(viewport) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in viewport)
        ):
            raise ConfigError(f"rollout.viewport must be [width, height], got {viewport!r}")
        if not isinstance(r["cdp"], list) or not all(isinstance(u, str) for u in r["cdp"]):
            raise ConfigError(f"rollout.cdp must be a list of URLs, got {r['cdp']!r}")
        if r["ray"]["address"] is not None:
            from replaystore.rollouts.ray_rollout import RayOptions

            if not isinstance(r["ray"]["address"], str):
                raise ConfigError(
                    f"rollout.ray.address must be a string, got {r['ray']['address']!r}"
                )
            if r["cdp"]:
                raise ConfigError("rollout.cdp and rollout.ray exclude each other")
            RayOptions.from_mapping(r["ray"])

    def _check_bootstrap(self) -> None:
        """The ``bootstrap`` and ``prompt`` keys."""
        d = self.data
        b = d["bootstrap"]
        if b["source"] is not None and not isinstance(b["source"], str):
            raise ConfigError(
                f"bootstrap.source must be 'scripted', a path or null: {b['source']!r}"
            )
        _int(b, "repeats", 1, "bootstrap.")
        _int(d["prompt"], "history_window", 0, "prompt.")
        _int(d["prompt"], "max_ac_tree_chars", 0, "prompt.")
        for key in ("mistake_rate", "wrong_answer_rate"):
            value = b[key]
            if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value <= 1:
                raise ConfigError(f"bootstrap.{key} must be in [0, 1], got {value!r}")

    def _check_model(self) -> None:
        """The ``model`` keys (the tiny model's shape included)."""
        d = self.data
        m = d["model"]
        if m["path"] is None and d["observation"] == "screenshot":
            raise ConfigError(
                "model.path is required with observation: screenshot (the tiny model is "
                "text-only; give a vision-language model such as Qwen/Qwen2-VL-2B-Instruct)"
            )
        if not isinstance(m["name"], str) or not m["name"].strip():
            raise ConfigError(f"model.name must be a non-empty name, got {m['name']!r}")
        tiny = m["tiny"]
        unknown = set(tiny) - set(DEFAULTS["model"]["tiny"])
        if unknown:
            raise ConfigError(f"unknown key model.tiny.{sorted(unknown)[0]!r}")
        for key in ("layers", "hidden", "heads", "vocab"):
            _int(tiny, key, 1, "model.tiny.")
        _int(tiny, "pretrain_steps", 0, "model.tiny.")
        if tiny["hidden"] != 64 * tiny["heads"]:
            raise ConfigError(
                f"model.tiny.hidden must be 64 x heads (vLLM's CPU attention needs head_dim 64), "
                f"got hidden {tiny['hidden']} with {tiny['heads']} heads"
            )

    def _check_buffer(self) -> None:
        """The ``buffer`` draw's keys."""
        d = self.data
        buf = d["buffer"]
        _number(buf, "recency_bias_power", "buffer.", minimum=0.0, strict=False)
        if buf["train_samples"] is not None:
            _int(buf, "train_samples", 1, "buffer.")
        if buf["last_n_iterations"] is not None:
            _int(buf, "last_n_iterations", 1, "buffer.")
        ratio = buf["val_ratio"]
        if not isinstance(ratio, int | float) or isinstance(ratio, bool) or not 0 <= ratio < 1:
            raise ConfigError(f"buffer.val_ratio must be in [0, 1), got {ratio!r}")

    def _check_train(self) -> None:
        """The ``train`` keys (``train.lora`` included)."""
        d = self.data
        t = d["train"]
        _choice(t, "init", ("previous", "base"), "train.")
        stages = t["stage"] if isinstance(t["stage"], list) else [t["stage"]]
        if not stages or any(v not in TRAIN_STAGES for v in stages):
            raise ConfigError(
                "train.stage must be one of sft, kto, dpo or a non-empty list of them, "
                f"got {t['stage']!r}"
            )
        if not isinstance(t["final"], bool):
            raise ConfigError(f"train.final must be true or false, got {t['final']!r}")
        _int(t, "name_swaps", 0, "train.")
        if not (t["cpu_bf16"] == "auto" or isinstance(t["cpu_bf16"], bool)):
            raise ConfigError(
                f'train.cpu_bf16 must be "auto", true or false, got {t["cpu_bf16"]!r}'
            )
        if t["name_swaps"] and not self.on_miniwob:
            raise ConfigError(
                "train.name_swaps draws words from MiniWoB++'s lexicon: it needs MiniWoB++ "
                f"tasks (tasks: miniwob:...), got tasks {d['tasks']!r}"
            )
        if t["finetuning_type"] is not None:
            _choice(t, "finetuning_type", ("full", "lora"), "train.")
        lora = t["lora"]
        if lora["rank"] is not None:
            _int(lora, "rank", 1, "train.lora.")
            if lora["rank"] > 512:
                raise ConfigError(f"train.lora.rank must be at most 512, got {lora['rank']}")
        if lora["alpha"] is not None:
            _number(lora, "alpha", "train.lora.")
        dropout = lora["dropout"]
        number = isinstance(dropout, int | float) and not isinstance(dropout, bool)
        if dropout is not None and not (number and 0 <= dropout < 1):
            raise ConfigError(f"train.lora.dropout must be in [0, 1), got {dropout!r}")
        if lora["target"] is not None and not isinstance(lora["target"], str):
            raise ConfigError(
                "train.lora.target must be a comma-separated string of module names "
                f"(or all), got {lora['target']!r}"
            )

    def _check_serve(self) -> None:
        """The ``serve`` and ``policy`` keys."""
        d = self.data
        s = d["serve"]
        if s["base_url"] is not None and not str(s["base_url"]).startswith(("http://", "https://")):
            raise ConfigError(f"serve.base_url must be an http(s) URL, got {s['base_url']!r}")
        if not isinstance(s["merge"], bool):
            raise ConfigError(f"serve.merge must be true or false, got {s['merge']!r}")
        _int(s, "port", 0, "serve.")
        _int(s, "max_model_len", 16, "serve.")
        _number(s, "startup_timeout_s", "serve.")
        if not isinstance(s["extra_args"], list):
            raise ConfigError(f"serve.extra_args must be a list, got {s['extra_args']!r}")
        p = d["policy"]
        _number(p, "temperature", "policy.", minimum=0.0, strict=False)
        _int(p, "max_tokens", 1, "policy.")
        _number(p, "timeout_s", "policy.")
        _int(p, "max_retries", 0, "policy.")

    def _check_miniwob(self) -> None:
        """The MiniWoB++ keys: task names, seeds, and no seed both trained on and held out."""
        d = self.data
        evaluation = d["evaluation"]
        _int(d, "seeds_per_iteration", 1)
        if not self.on_miniwob:
            if evaluation["tasks"] is not None:
                raise ConfigError(
                    "evaluation.tasks is for MiniWoB++ runs (tasks: miniwob:NAME,...); the "
                    f"tasks here are {d['tasks']!r}"
                )
            return
        from replaystore.rollouts import miniwob

        if d["tasks_per_iteration"] is not None:
            raise ConfigError(
                "tasks_per_iteration is not for MiniWoB++ tasks: each iteration rolls out "
                "seeds_per_iteration seeds of every task"
            )
        miniwob.parse_task_names(d["tasks"])
        held_out = self.evaluation_tasks()
        if not isinstance(held_out, str) or not miniwob.is_miniwob_spec(held_out):
            raise ConfigError(f"evaluation.tasks must be 'miniwob:NAME,...', got {held_out!r}")
        miniwob.parse_task_names(held_out)
        try:
            train = miniwob.parse_seeds(d["train_seeds"])
        except ConfigError as exc:
            raise ConfigError(f"train_seeds: {exc}") from None
        try:
            held = miniwob.parse_seeds(evaluation["seeds"])
        except ConfigError as exc:
            raise ConfigError(f"evaluation.seeds: {exc}") from None
        overlap = sorted(set(train) & set(held))
        if overlap:
            shown = ", ".join(map(str, overlap[:10])) + (" ..." if len(overlap) > 10 else "")
            raise ConfigError(
                f"train_seeds {d['train_seeds']!r} and evaluation.seeds {evaluation['seeds']!r} "
                f"share {len(overlap)} seed(s): {shown}; held-out seeds must never be trained on"
            )
        needed = d["seeds_per_iteration"] * (d["iterations"] + d["bootstrap"]["repeats"])
        if needed > len(train):
            raise ConfigError(
                f"train_seeds {d['train_seeds']!r} holds {len(train)} seeds; {d['iterations']} "
                f"iterations of seeds_per_iteration {d['seeds_per_iteration']} need up to {needed}"
            )

    def train_seeds(self, k: int) -> list[int]:
        """Iteration ``k``'s fresh training seeds (MiniWoB++): the next ones of
        ``train_seeds``, ``seeds_per_iteration`` per iteration and ``bootstrap.repeats``
        times as many for iteration 0's demonstrations."""
        from replaystore.rollouts import miniwob

        pool = miniwob.parse_seeds(self.data["train_seeds"])
        per = self.data["seeds_per_iteration"]
        first = per * self.data["bootstrap"]["repeats"] if self.uses_demonstrations else per
        start = 0 if k == 0 else first + per * (k - 1)
        count = first if k == 0 else per
        return pool[start : start + count]


def load_config(
    path: str | os.PathLike[str] | None, overrides: Mapping[str, Any] | None = None
) -> LoopConfig:
    """Read a YAML config (``None``: the defaults), apply ``overrides`` (top-level keys).

    Raises:
        ConfigError: unreadable YAML, an unknown key or a bad value (named).
        FileNotFoundError: ``path`` does not exist.
    """
    import yaml

    given: dict[str, Any] = {}
    base = Path.cwd()
    if path is not None:
        file = Path(path)
        text = file.read_text(encoding="utf-8")
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{file}: not valid YAML: {exc}") from None
        if loaded is not None and not isinstance(loaded, Mapping):
            raise ConfigError(f"{file}: the loop config must be a mapping of keys")
        given = dict(loaded or {})
        base = file.absolute().parent
    for key, value in (overrides or {}).items():
        if value is not None:
            given[key] = value
    return LoopConfig.from_mapping(given, base)


def _int(section: Mapping[str, Any], key: str, minimum: int, where: str = "") -> None:
    value = section[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{where}{key} must be an integer >= {minimum}, got {value!r}")


def _number(
    section: Mapping[str, Any],
    key: str,
    where: str = "",
    *,
    minimum: float = 0.0,
    strict: bool = True,
) -> None:
    value = section[key]
    ok = isinstance(value, int | float) and not isinstance(value, bool) and value == value
    if ok:
        ok = value > minimum if strict else value >= minimum
    if not ok:
        relation = ">" if strict else ">="
        raise ConfigError(f"{where}{key} must be a number {relation} {minimum:g}, got {value!r}")


def _choice(
    section: Mapping[str, Any], key: str, choices: tuple[str, ...], where: str = ""
) -> None:
    if section[key] not in choices:
        raise ConfigError(f"{where}{key} must be one of {', '.join(choices)}, got {section[key]!r}")
