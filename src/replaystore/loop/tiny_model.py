"""Build a tiny, randomly initialised Qwen2 chat model locally: no download.

This file is a standalone script. It runs in the LLaMA-Factory tool environment
(which has ``transformers`` and ``tokenizers``), never inside replaystore's own
environment::

    <llamafactory-env>/bin/python tiny_model.py --out DIR [--corpus FILE ...]
        [--layers 4] [--hidden 256] [--heads 4] [--vocab 2048] [--seed 0]

``replaystore loop --make-tiny-model DIR`` runs it for you with the right Python.

What it writes in ``DIR`` (what ``vllm serve DIR`` and ``llamafactory-cli train``
both read): ``config.json``, ``model.safetensors``, ``generation_config.json``,
``tokenizer.json``, ``tokenizer_config.json`` (with a ChatML chat template, the
same text LLaMA-Factory's ``qwen`` template produces, so the model is prompted
at serving time exactly as it was trained) and ``tiny_model.json`` (the
settings it was built with).

The tokenizer is a byte-level BPE trained on the corpus files (any UTF-8 text;
a LLaMA-Factory ShareGPT/OpenAI JSON dataset contributes the text of its
messages), so every byte is representable and the text the model sees most is
cheap in tokens. With no corpus it trains on a small built-in text of the
action grammar. The head size is fixed at 64 (``hidden / heads``): vLLM's CPU
attention rejects smaller heads (``Unsupported CPU attention configuration:
head_dim=16``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

#: ChatML, as LLaMA-Factory's ``qwen`` template writes it (system, user, assistant turns
#: ending in ``<|im_end|>``; the generation prompt opens the assistant turn).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

#: Qwen2's pre-tokenization (digits one by one). The tokenizer is saved as a
#: ``Qwen2Tokenizer``, and transformers 5 rebuilds that class's pre-tokenizer from this
#: pattern whatever ``tokenizer.json`` says: training it the same way keeps the token ids
#: identical in the LLaMA-Factory environment (transformers 5.6) and in vLLM's (5.19).
#: A byte-level BPE with the default regex (digits grouped) trained in one and served by
#: the other sees different ids for every number in a prompt.
PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

#: Text the tokenizer learns from when no corpus is given: the action grammar and
#: the shape of the prompts of ``replaystore.rollouts``.
BUILTIN_CORPUS = """\
<think>Click the link 'Search' [3]. (plan step 1/3)</think>
Action: click(412, 230)
Action: type(120, 64, "kettle")
Action: key(Enter)
Action: scroll(down)
Action: answer("9-5")
Action: back()
Task: Find the opening hours
Current step: 1
URL: http://127.0.0.1:8000/
Title: Shop
Accessibility tree:
[0] link 'Home' @(40,20)
[1] textbox 'Search products' @(300,64)
[2] button 'Search' @(520,64)
"""


def corpus_texts(paths: list[Path]) -> Iterator[str]:
    """The text of each corpus file; JSON datasets give the text of their messages."""
    if not paths:
        yield BUILTIN_CORPUS
        return
    for path in paths:
        raw = path.read_text(encoding="utf-8")
        try:
            data = json.loads(raw)
        except ValueError:
            yield raw
            continue
        yield from _json_strings(data)


def _json_strings(data: object) -> Iterator[str]:
    if isinstance(data, str):
        yield data
    elif isinstance(data, dict):
        for key, value in data.items():
            if key not in ("images", "from", "role"):
                yield from _json_strings(value)
    elif isinstance(data, list):
        for item in data:
            yield from _json_strings(item)


def build(
    out: Path,
    corpus: list[Path],
    *,
    layers: int,
    hidden: int,
    heads: int,
    vocab: int,
    seed: int,
    max_positions: int,
) -> dict[str, object]:
    """Train the tokenizer, build the model, save both under ``out``; the settings used."""
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import (
        AutoTokenizer,
        GenerationConfig,
        PreTrainedTokenizerFast,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    if hidden % heads or hidden // heads != 64:
        raise SystemExit(
            f"hidden / heads must be 64 (vLLM's CPU attention needs head_dim 64), "
            f"got hidden={hidden} heads={heads}"
        )
    torch.manual_seed(seed)
    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(corpus_texts(corpus), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        additional_special_tokens=["<|im_start|>"],
        model_max_length=max_positions,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        torch_dtype="float32",
    )
    model = Qwen2ForCausalLM(config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    tokenizer_config = out / "tokenizer_config.json"
    settings_json = json.loads(tokenizer_config.read_text(encoding="utf-8"))
    settings_json["tokenizer_class"] = "Qwen2Tokenizer"
    _atomic_write_text(tokenizer_config, json.dumps(settings_json, indent=2))
    probe = "Task: 38043 @(151,189)\nAction: click(72, 27)"
    reloaded = AutoTokenizer.from_pretrained(out)
    if reloaded(probe, add_special_tokens=False)["input_ids"] != bpe.encode(probe).ids:
        raise SystemExit(
            f"the saved tokenizer ({type(reloaded).__name__}) does not reproduce the trained "
            "tokenization: the model would be served with other token ids than it was trained on"
        )
    GenerationConfig(
        eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id, do_sample=False
    ).save_pretrained(out)
    settings: dict[str, object] = {
        "architecture": "Qwen2ForCausalLM",
        "layers": layers,
        "hidden": hidden,
        "heads": heads,
        "head_dim": hidden // heads,
        "vocab_size": len(tokenizer),
        "parameters": sum(p.numel() for p in model.parameters()),
        "max_positions": max_positions,
        "seed": seed,
        "corpus": [str(p) for p in corpus],
    }
    _atomic_write_text(out / "tiny_model.json", json.dumps(settings, indent=2))
    return settings


def _atomic_write_text(path: Path, text: str) -> None:
    """Temporary file, fsync, rename (replaystore.atomic's sequence: this script runs in the
    LLaMA-Factory environment, where replaystore is not installed)."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--corpus", action="append", type=Path, default=[])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-positions", type=int, default=4096)
    args = parser.parse_args(argv)
    settings = build(
        args.out,
        args.corpus,
        layers=args.layers,
        hidden=args.hidden,
        heads=args.heads,
        vocab=args.vocab,
        seed=args.seed,
        max_positions=args.max_positions,
    )
    sys.stdout.write(json.dumps(settings) + "\n")  # the settings, for the caller
    return 0


if __name__ == "__main__":
    sys.exit(main())
