"""Stand-ins for the loop's tool environments: a fake ``llamafactory-cli`` and a fake vLLM.

:func:`make_fake_tools` lays out a tools directory like ``.ci/install-loop-tools``
makes one (``llamafactory/bin/llamafactory-cli``, ``llamafactory/bin/python``,
``vllm/bin/python``), each an executable Python script run by the test
environment's interpreter. They do what the loop relies on, in milliseconds:

* ``llamafactory-cli train YAML`` writes a checkpoint (``config.json``,
  ``model.safetensors``, a 3-line ``trainer_log.jsonl`` with decreasing loss) into
  the YAML's ``output_dir``; with ``finetuning_type: lora`` an adapter instead
  (``adapter_config.json``, ``adapter_model.safetensors``);
* ``llamafactory-cli export YAML`` writes a merged model into ``export_dir``;
* ``vllm/bin/python -m vllm.entrypoints.openai.api_server ...`` serves
  ``GET /v1/models`` and ``POST /v1/chat/completions``, answering each task with
  its reference answer (tasks from the JSONL file named by ``FAKE_TASKS``), and, when
  started with ``--enable-lora`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` as vLLM
  requires, ``POST /v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` (a loaded
  adapter is listed by ``/v1/models`` and answers chat requests under its name). With
  ``VLLM_API_KEY`` in its environment (as vLLM) every request must carry
  ``Authorization: Bearer KEY`` (else 401, recorded as ``"event": "unauthorized"``);
  the key is recorded with the server's start, for tests that look for it.

Every call appends JSON lines to ``<root>/calls.jsonl``: ``{"tool": "train",
"event": "start", ...}`` when a training starts and ``{"tool": "train", "event":
"done", ...}`` when it wrote its checkpoint (a training killed in between has only
the first), ``{"tool": "serve", ...}`` when a server starts.

Environment knobs (read by the fake tools at each call): ``FAKE_TRAIN_SLEEP``,
``FAKE_TRAIN_EXIT``, ``FAKE_TRAIN_NO_WEIGHTS``, ``FAKE_SERVE_SLEEP``,
``FAKE_SERVE_EXIT``, ``FAKE_TASKS``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

_COMMON = """
import json, os, sys, time
from pathlib import Path

CALLS = Path({calls!r})


def record(**line):
    with open(CALLS, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(dict(line, pid=os.getpid(), time=time.time())) + "\\n")
"""

_TRAIN = """
import yaml


def export(args):
    output = Path(args["export_dir"])
    record(tool="export", model=args["model_name_or_path"],
           adapter=args.get("adapter_name_or_path"), export_dir=str(output))
    output.mkdir(parents=True, exist_ok=True)
    (output / "config.json").write_text(json.dumps({{"model_type": "fake"}}))
    (output / "model.safetensors").write_bytes(b"fake merged weights")
    return 0


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("train", "export"):
        print("usage: llamafactory-cli train|export YAML", file=sys.stderr)
        return 2
    args = yaml.safe_load(Path(sys.argv[2]).read_text(encoding="utf-8"))
    if sys.argv[1] == "export":
        return export(args)
    output = Path(args["output_dir"])
    model = args["model_name_or_path"]
    record(tool="train", event="start", output_dir=str(output), model=model,
           adapter=args.get("adapter_name_or_path"),
           finetuning_type=args.get("finetuning_type"))
    print(f"fake llamafactory-cli: training {{model}} into {{output}}", flush=True)
    time.sleep(float(os.environ.get("FAKE_TRAIN_SLEEP") or 0))
    code = int(os.environ.get("FAKE_TRAIN_EXIT") or 0)
    if code:
        print(f"fake llamafactory-cli: failing with status {{code}} as asked", flush=True)
        return code
    output.mkdir(parents=True, exist_ok=True)
    if os.environ.get("FAKE_TRAIN_NO_WEIGHTS") != "1" and args.get("finetuning_type") == "lora":
        (output / "adapter_config.json").write_text(json.dumps({{"r": args.get("lora_rank", 8)}}))
        (output / "adapter_model.safetensors").write_bytes(b"fake adapter")
    elif os.environ.get("FAKE_TRAIN_NO_WEIGHTS") != "1":
        (output / "config.json").write_text(json.dumps({{"model_type": "fake"}}))
        (output / "model.safetensors").write_bytes(b"fake weights")
    if os.environ.get("FAKE_TRAIN_NO_WEIGHTS") != "1":
        with open(output / "trainer_log.jsonl", "w", encoding="utf-8") as log:
            for step, loss in enumerate((2.0, 1.5, 1.0), start=1):
                log.write(json.dumps({{"current_steps": step, "loss": loss}}) + "\\n")
    record(tool="train", event="done", output_dir=str(output), model=model)
    return 0


sys.exit(main())
"""

_SERVE = """
import argparse
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def reference_answers():
    path = os.environ.get("FAKE_TASKS")
    if not path:
        return {{}}
    answers = {{}}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            task = json.loads(line)
            answers[task["task_name"]] = task.get("reference_answer") or "unknown"
    return answers


def text_of(content):
    if isinstance(content, str):
        return content
    return "\\n".join(p.get("text", "") for p in content if isinstance(p, dict))


def answer_for(messages, answers):
    users = [m for m in messages if m.get("role") == "user"]
    text = text_of(users[-1].get("content", "")) if users else ""
    for line in text.splitlines():
        if line.startswith("Task: "):
            name = line[len("Task: "):].strip()
            if name in answers:
                return answers[name]
    return "unknown"


def main():
    if sys.argv[1:3] != ["-m", "vllm.entrypoints.openai.api_server"]:
        print("fake vLLM python: only -m vllm.entrypoints.openai.api_server", file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--served-model-name", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args, rest = parser.parse_known_args(sys.argv[3:])
    key = os.environ.get("VLLM_API_KEY")  # as vLLM: every /v1 request must carry it
    record(tool="serve", model=args.model, name=args.served_model_name, port=args.port,
           host=args.host, extra=rest, api_key=key)
    print(f"fake vLLM: serving {{args.model}} as {{args.served_model_name}}", flush=True)
    if os.environ.get("FAKE_SERVE_EXIT"):
        print("fake vLLM: exiting with status 3 as asked", flush=True)
        return 3
    time.sleep(float(os.environ.get("FAKE_SERVE_SLEEP") or 0))
    answers = reference_answers()
    name = args.served_model_name
    runtime_lora = ("--enable-lora" in rest
                    and os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING") == "True")
    adapters = {{}}

    class Handler(BaseHTTPRequestHandler):
        def refused(self):
            if key is None or self.headers.get("Authorization") == "Bearer " + key:
                return False
            record(tool="serve", event="unauthorized", path=self.path)
            self.send_error(401, "invalid API key")
            return True

        def reply(self, body):
            data = json.dumps(body).encode("utf-8")
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.refused():
                return
            if self.path.rstrip("/") == "/v1/models":
                data = [{{"id": i, "object": "model"}} for i in [name, *adapters]]
                self.reply({{"object": "list", "data": data}})
            else:
                self.send_error(404)

        def do_POST(self):
            if self.refused():
                return
            length = int(self.headers.get("Content-Length") or 0)
            request = json.loads(self.rfile.read(length) or b"{{}}")
            path = self.path.rstrip("/")
            if path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
                if not runtime_lora:
                    self.send_error(404)
                    return
                record(tool="serve", event=path.rsplit("/", 1)[1], **request)
                if path.endswith("/load_lora_adapter"):
                    adapters[request["lora_name"]] = request["lora_path"]
                else:
                    adapters.pop(request["lora_name"], None)
                self.reply({{"status": "ok"}})
                return
            if path != "/v1/chat/completions":
                self.send_error(404)
                return
            if request.get("model") not in (name, *adapters):
                self.send_error(404, "no such model")
                return
            content = 'Action: answer("%s")' % answer_for(request.get("messages", []), answers)
            self.reply({{
                "id": "fake", "object": "chat.completion", "model": name,
                "choices": [{{"index": 0, "finish_reason": "stop",
                             "message": {{"role": "assistant", "content": content}}}}],
            }})

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    server.serve_forever()
    return 0


sys.exit(main())
"""


def _script(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{sys.executable}\n{body}", encoding="utf-8")
    path.chmod(0o755)


def make_fake_tools(root: Path) -> Path:
    """A fake tools directory under ``root`` (returned); calls go to ``root/calls.jsonl``."""
    root = Path(root)
    tools = root / "tools"
    common = _COMMON.format(calls=str(root / "calls.jsonl"))
    _script(tools / "llamafactory" / "bin" / "llamafactory-cli", common + _TRAIN.format())
    _script(tools / "llamafactory" / "bin" / "python", "import sys\nsys.exit(0)\n")
    _script(tools / "vllm" / "bin" / "python", common + _SERVE.format())
    return tools


def read_calls(root: Path) -> list[dict[str, Any]]:
    """The lines of ``root/calls.jsonl`` (empty before the first call)."""
    path = Path(root) / "calls.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def make_fake_model(directory: Path) -> Path:
    """A directory the loop accepts as a model: ``config.json`` and nonempty weights."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({"model_type": "fake"}))
    (directory / "model.safetensors").write_bytes(b"fake base weights")
    return directory


def loop_command(
    cwd: Path,
    config: dict[str, Any] | None = None,
    *args: str,
    env: dict[str, str] | None = None,
    base_env: dict[str, str] | None = None,
    timeout: float = 240,
) -> subprocess.CompletedProcess[str]:
    """``replaystore loop --config loop.yaml ARGS`` in ``cwd``, as a user runs it: a
    child process whose output is captured, its exit status left to the test.

    ``config`` (when given) is written to ``cwd/loop.yaml`` first; ``env`` is added to
    ``base_env`` (default: this process's environment); ``args`` follow the config
    (``--resume``, ``--out``).
    """
    cwd = Path(cwd)
    if config is not None:
        (cwd / "loop.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    return subprocess.run(
        [sys.executable, "-m", "replaystore.cli", "loop", "--config", "loop.yaml", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**(os.environ if base_env is None else base_env), **(env or {})},
        cwd=cwd,
        check=False,
    )
