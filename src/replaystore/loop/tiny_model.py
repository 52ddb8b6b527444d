"""Build a tiny, randomly initialised Qwen2 chat model locally: no download.

This file is a standalone script. It runs in the LLaMA-Factory tool environment
(which has ``transformers`` and ``tokenizers``), never inside replaystore's own
environment::

    <llamafactory-env>/bin/python tiny_model.py --out DIR [--corpus FILE ...]
        [--layers 4] [--hidden 256] [--heads 4] [--vocab 2048] [--seed 0]
        [--pretrain-steps 0]

``replaystore loop --make-tiny-model DIR`` runs it for you with the right Python.

What it writes in ``DIR`` (what ``vllm serve DIR`` and ``llamafactory-cli train``
both read): ``config.json``, ``model.safetensors``, ``generation_config.json``,
``tokenizer.json``, ``tokenizer_config.json`` (with a ChatML chat template, the
same text LLaMA-Factory's ``qwen`` template produces, so the model is prompted
at serving time exactly as it was trained) and ``tiny_model.json`` (the
settings it was built with).

``--pretrain-steps N`` then trains the model N steps on synthetic find-and-copy text
before it is saved (:func:`pretrain`): lines in the page-text format of
``replaystore.rollouts.page_text`` (``role 'name' id=N``) whose names are random
combinations of the tokenizer's own whole-word pieces, where the model completes
``Target: role 'name' id=`` with the line's id, and goals whose quoted names it copies.
No page, task or episode is used (the pieces come from the corpus the tokenizer learned,
iteration 0's training data in the loop): it is the skill of finding a name in the prompt
and copying what follows it, which a model trained from scratch on a few hundred
demonstrations does not acquire (it answers with names frequent in its data). Its
accuracy on fresh synthetic examples is recorded in ``tiny_model.json``. Measured (2
layers, hidden 256, 2 cores, one run each): 1,200 steps (9 min) copy a goal's quoted name
59% of the time and find a named line's id 5% (2026-11-27, one question per page);
asking each page for up to four of its lines (:func:`training_segments`, as now) gave 63%
and 7.3% (2026-11-28), and the same with lines written ``role 'name'=N`` (the id one
token nearer the name) 0.3% and 1.7%. Finding a line by its name is the skill that does
not emerge in minutes on a CPU.

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
from typing import Any

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


def _tokenizer(corpus: list[Path], *, vocab: int, max_positions: int) -> tuple[Any, Any]:
    """The byte-level BPE trained on ``corpus`` (``vocab`` tokens) and its transformers
    tokenizer with the ChatML chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

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
    return bpe, tokenizer


def _save(out: Path, model: Any, tokenizer: Any, bpe: Any) -> None:
    """Save the model, its tokenizer (checked to reproduce the trained tokenization) and
    its generation config under ``out``."""
    from transformers import AutoTokenizer, GenerationConfig

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
        eos_token_id=model.config.eos_token_id,
        pad_token_id=model.config.pad_token_id,
        do_sample=False,
    ).save_pretrained(out)


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
    pretrain_steps: int = 0,
) -> dict[str, object]:
    """Train the tokenizer, build the model (``pretrain_steps`` of :func:`pretrain` when
    > 0), save both under ``out``; the settings used."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if hidden % heads or hidden // heads != 64:
        raise SystemExit(
            f"hidden / heads must be 64 (vLLM's CPU attention needs head_dim 64), "
            f"got hidden={hidden} heads={heads}"
        )
    torch.manual_seed(seed)
    bpe, tokenizer = _tokenizer(corpus, vocab=vocab, max_positions=max_positions)
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
    pretrained = None
    if pretrain_steps > 0:  # torch's threads as the environment sets them (OMP_NUM_THREADS)
        pretrained = pretrain(model, tokenizer, steps=pretrain_steps, seed=seed)
    _save(out, model, tokenizer, bpe)
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
        "pretrain": pretrained,
    }
    _atomic_write_text(out / "tiny_model.json", json.dumps(settings, indent=2))
    return settings


#: Roles of the synthetic page lines (the page-text roles a web page has most).
_ROLES = ("button", "link", "textbox", "StaticText", "checkbox", "radio", "tab", "option")
_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _made_up_word(rng: Any, words: list[str] | None = None) -> str:
    if words:
        word = rng.choice(words)
    else:
        word = "".join(rng.choice(_LETTERS) for _ in range(rng.randint(2, 9)))
    if rng.random() < 0.4:
        word = word.capitalize()
    if rng.random() < 0.1:
        word += rng.choice(".,:")
    return word


def _made_up_name(rng: Any, words: list[str] | None = None) -> str:
    return " ".join(_made_up_word(rng, words) for _ in range(rng.choice((1, 1, 1, 2, 3))))


def synthetic_example(
    rng: Any, kind: int | None = None, words: list[str] | None = None
) -> tuple[str, str]:
    """One ``(prompt, answer)`` of find-and-copy text (see the module docstring).

    Three kinds, equally often: a page of lines then ``Target: role 'name' id=`` (answer:
    that line's id); a goal quoting made-up words then a reply that opens a quote (answer:
    the words); a goal, a page and ``Target: role '`` (answer: the goal's name, then the
    line's id). ``words``: draw the names' words from these (default: random letters).
    """
    kind = rng.randrange(3) if kind is None else kind
    n = rng.randint(2, 9)
    ids = rng.sample(range(1, 60), n)
    roles = [rng.choice(_ROLES) for _ in range(n)]
    names = [_made_up_name(rng, words) for _ in range(n)]
    page = "\n".join(f"{r} '{w}' id={i}" for r, w, i in zip(roles, names, ids, strict=True))
    k = rng.randrange(n)
    verb = rng.choice(("Click on", "Enter", "Select", "Find", "Type", "Choose"))
    if kind == 0:
        return f"{page}\nTarget: {roles[k]} '{names[k]}' id=", f"{ids[k]}\n"
    if kind == 1:
        return f'Task: {verb} "{names[k]}".\nReply: "', f'{names[k]}"\n'
    goal = f'Task: {verb} the {roles[k]} "{names[k]}".'
    return f"{goal}\n{page}\nTarget: {roles[k]} '", f"{names[k]}' id={ids[k]}\n"


def _encode(tokenizer: Any, prompt: str, answer: str) -> tuple[list[int], list[int]]:
    """Token ids of ``prompt + answer`` tokenized together, and labels: -100 on the prompt
    (a token that starts inside the answer is a target)."""
    return _encode_segments(tokenizer, [(prompt, False), (answer, True)])


def _encode_segments(
    tokenizer: Any, segments: list[tuple[str, bool]]
) -> tuple[list[int], list[int]]:
    """Token ids of the segments' texts tokenized together, and labels: a token that starts
    inside a segment marked ``True`` is a target, every other token -100."""
    text = "".join(part for part, _ in segments)
    targets: list[tuple[int, int]] = []
    at = 0
    for part, is_target in segments:
        if is_target:
            targets.append((at, at + len(part)))
        at += len(part)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(encoded["input_ids"])
    labels = [
        t if any(a <= start < b for a, b in targets) else -100
        for t, (start, _) in zip(ids, encoded["offset_mapping"], strict=True)
    ]
    return ids, labels


def training_segments(rng: Any, words: list[str] | None = None) -> list[tuple[str, bool]]:
    """One training example as ``(text, is_target)`` segments: :func:`synthetic_example`'s
    three kinds, equally often, where a page (the first kind) is asked for up to four of its
    lines one after the other (``Target: role 'name' id=`` then the id, each id a target):
    four lookups for one page's tokens, as the answers are a token or two each."""
    kind = rng.randrange(3)
    if kind != 0:
        prompt, answer = synthetic_example(rng, kind, words)
        return [(prompt, False), (answer, True)]
    n = rng.randint(2, 9)
    ids = rng.sample(range(1, 60), n)
    roles = [rng.choice(_ROLES) for _ in range(n)]
    names = [_made_up_name(rng, words) for _ in range(n)]
    page = "\n".join(f"{r} '{w}' id={i}" for r, w, i in zip(roles, names, ids, strict=True))
    segments: list[tuple[str, bool]] = [(page + "\n", False)]
    for k in rng.sample(range(n), min(n, 4)):
        segments += [(f"Target: {roles[k]} '{names[k]}' id=", False), (f"{ids[k]}\n", True)]
    return segments


def _padded(rows: list[tuple[list[int], list[int]]], pad: int) -> tuple[Any, Any, Any]:
    """``(ids, labels)`` rows right-padded into one batch: input ids, targets, attention mask."""
    import torch

    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    target = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (ids, labels) in enumerate(rows):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        target[i, : len(labels)] = torch.tensor(labels)
        mask[i, : len(ids)] = 1
    return input_ids, target, mask


def _accuracy(model: Any, tokenizer: Any, words: list[str], *, seed: int) -> dict[str, float]:
    """The exact-match rate of the answers on 300 fresh examples of each kind."""
    import random

    import torch

    accuracy: dict[str, float] = {}
    check = random.Random(seed + 2)
    with torch.no_grad():
        for kind, name in enumerate(("find the id", "copy the quote", "copy then find")):
            # One right-padded batch per kind: with causal attention and the padding masked,
            # a row's logits are those it has alone.
            rows = [_encode(tokenizer, *synthetic_example(check, kind, words)) for _ in range(300)]
            input_ids, target, mask = _padded(rows, tokenizer.pad_token_id)
            guess = model(input_ids=input_ids, attention_mask=mask).logits.argmax(-1)
            # the token at i is predicted at i - 1; a row is right when every answer token is
            wrong = (guess[:, :-1] != target[:, 1:]) & (target[:, 1:] != -100)
            accuracy[name] = int((~wrong.any(dim=1)).sum()) / len(rows)
    return accuracy


def train_on_segments(
    model: Any,
    tokenizer: Any,
    segments: Any,
    *,
    steps: int,
    warmup: int,
    label: str,
    batch: int = 16,
    max_tokens: int = 160,
    lr: float = 2e-3,
) -> list[float]:
    """Train ``model`` ``steps`` steps on examples from ``segments()`` (each a list of
    ``(text, is_target)``; loss on the targets only), packed up to ``max_tokens`` a row;
    AdamW at ``lr`` with ``warmup`` warm-up steps then cosine down to a tenth. The loss
    every 50 steps goes to stderr as ``{label} step N/steps``. Returns each step's loss."""
    import math

    import torch

    newline = tokenizer.convert_tokens_to_ids("\u010a")

    def make_batch() -> tuple[Any, Any, Any]:
        rows = []
        for _ in range(batch):
            ids: list[int] = []
            labels: list[int] = []
            while True:
                more_ids, more_labels = _encode_segments(tokenizer, segments())
                if ids and len(ids) + len(more_ids) + 1 > max_tokens:
                    break
                if ids:
                    ids.append(newline)
                    labels.append(-100)
                ids += more_ids
                labels += more_labels
            rows.append((ids[:max_tokens], labels[:max_tokens]))
        return _padded(rows, tokenizer.pad_token_id)

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)

    def rate(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, rate)
    model.train()
    losses: list[float] = []
    for step in range(steps):
        input_ids, target, mask = make_batch()
        loss = model(input_ids=input_ids, attention_mask=mask, labels=target).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if step % 50 == 0 or step == steps - 1:
            sys.stderr.write(f"{label} step {step + 1}/{steps}: loss {losses[-1]:.4f}\n")
            sys.stderr.flush()
    model.eval()
    return losses


def pretrain(
    model: Any, tokenizer: Any, *, steps: int, seed: int, batch: int = 16, max_tokens: int = 160
) -> dict[str, object]:
    """Train ``model`` ``steps`` steps on :func:`training_segments` text
    (:func:`train_on_segments`, 100 warm-up steps at most); what it reached.

    Returns:
        ``{"steps", "loss_first", "loss_last", "accuracy"}``: the exact-match rate of the
        answers (every answer token the model's most likely next token) on 300 fresh
        examples of each kind.
    """
    import random

    rng = random.Random(seed + 1)
    # The names' words: the tokenizer's own whole-word pieces (letters only, 3+ long), so
    # that a name is a token or two as a page's names are, not a string of fragments.
    words = sorted(t for t in tokenizer.get_vocab() if t.isascii() and t.isalpha() and len(t) >= 3)
    losses = train_on_segments(
        model,
        tokenizer,
        lambda: training_segments(rng, words),
        steps=steps,
        warmup=min(100, max(1, steps // 10)),
        label="pretrain",
        batch=batch,
        max_tokens=max_tokens,
    )
    accuracy = _accuracy(model, tokenizer, words, seed=seed)
    sys.stderr.write(f"pretrain accuracy on fresh examples: {accuracy}\n")
    return {
        "steps": steps,
        "loss_first": losses[0] if losses else None,
        "loss_last": sum(losses[-20:]) / len(losses[-20:]) if losses else None,
        "accuracy": accuracy,
    }


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
    parser.add_argument("--pretrain-steps", type=int, default=0)
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
        pretrain_steps=args.pretrain_steps,
    )
    sys.stdout.write(json.dumps(settings) + "\n")  # the settings, for the caller
    return 0


if __name__ == "__main__":
    sys.exit(main())
