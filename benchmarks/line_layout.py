"""Which page-text line layout a tiny model learns to look up (issue 37's measurement).

    <llamafactory-env>/bin/python benchmarks/line_layout.py --layout A|B --steps 800 \\
        --corpus RUN/iterations/000/dataset/webagent.json

Runs in the LLaMA-Factory tool environment (``bash .ci/install-loop-tools``; it has
``transformers``), like ``replaystore.loop.tiny_model``, whose tokenizer, model settings
and batching it uses. A tiny Qwen2 (hidden 256; 2 layers, ``--layers``) is trained from
scratch on synthetic pages of 2-9 lines whose names are words of the corpus's tokenizer
(``--names made-up``: 1-3 words, some capitalised or ending in a mark, as the pre-training's;
``--names single``: one vocabulary word each, distinct on the page), asked for up to four
lines per page, and scored on 300 fresh pages: the share whose id it completes exactly
(greedy). Layouts:

* ``A``: ``button 'Cancel' id=6``, asked ``Target: button 'Cancel' id=`` (the page text's
  layout, ``replaystore.rollouts.page_text``). The token before every id is ``=``.
* ``B``: ``button 'Cancel 6'``, asked ``Target: button 'Cancel`` then `` 6'``: the id
  follows the name's own last token, so the look-up is one token's induction (copy what
  followed the earlier occurrence of the token just written).

Trains with ``tiny_model.train_on_segments`` (the loss every 50 steps on stderr) and
prints one ``RESULT`` line. One run per call; seeded.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src" / "replaystore" / "loop"))

import tiny_model  # the loop's standalone builder script

#: Warm-up steps (then cosine; AdamW at ``--lr``, default 2e-3, batch ``--batch``, default
#: 16, rows of 160 tokens).
WARMUP = 60


def _line(layout: str, role: str, name: str, ident: int) -> str:
    return f"{role} '{name}' id={ident}" if layout == "A" else f"{role} '{name} {ident}'"


def _query(layout: str, role: str, name: str) -> str:
    return f"Target: {role} '{name}' id=" if layout == "A" else f"Target: {role} '{name}"


def _answer(layout: str, ident: int) -> str:
    return f"{ident}\n" if layout == "A" else f" {ident}'\n"


def _page(
    rng: random.Random, words: list[str], single: bool = False
) -> tuple[list[str], list[str], list[int]]:
    n = rng.randint(2, 9)
    ids = rng.sample(range(1, 60), n)
    roles = [rng.choice(tiny_model._ROLES) for _ in range(n)]
    if single:  # one vocabulary word each, as it is, distinct on the page
        names = rng.sample(words, n)
    else:
        names = [tiny_model._made_up_name(rng, words) for _ in range(n)]
    return roles, names, ids


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layout", choices=("A", "B"), required=True)
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--corpus", type=Path, required=True, help="text the tokenizer learns")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument(
        "--names",
        choices=("made-up", "single"),
        default="made-up",
        help="made-up: 1-3 words, some capitalised or ending in a mark (the default); "
        "single: one vocabulary word as it is, distinct on the page",
    )
    args = parser.parse_args(argv)
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    layout = args.layout
    torch.manual_seed(args.seed)
    _bpe, tok = tiny_model._tokenizer([args.corpus], vocab=2048, max_positions=1024)
    model = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=len(tok),
            hidden_size=256,
            intermediate_size=1024,
            num_hidden_layers=args.layers,
            num_attention_heads=4,
            num_key_value_heads=4,
            max_position_embeddings=1024,
            tie_word_embeddings=True,
            bos_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
            eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
            pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
        )
    )
    words = sorted(t for t in tok.get_vocab() if t.isascii() and t.isalpha() and len(t) >= 3)
    rng = random.Random(args.seed + 1)

    def segments() -> list[tuple[str, bool]]:
        roles, names, ids = _page(rng, words, args.names == "single")
        page = "\n".join(_line(layout, *x) for x in zip(roles, names, ids, strict=True))
        out = [(page + "\n", False)]
        for k in rng.sample(range(len(ids)), min(len(ids), 4)):
            out += [(_query(layout, roles[k], names[k]), False), (_answer(layout, ids[k]), True)]
        return out

    started = time.time()
    tiny_model.train_on_segments(
        model,
        tok,
        segments,
        steps=args.steps,
        warmup=WARMUP,
        label=f"layout {layout}",
        batch=args.batch,
        lr=args.lr,
    )
    check = random.Random(7)
    rows = []
    for _ in range(300):
        roles, names, ids = _page(check, words, args.names == "single")
        k = check.randrange(len(ids))
        page = "\n".join(_line(layout, *x) for x in zip(roles, names, ids, strict=True))
        prompt = f"{page}\n{_query(layout, roles[k], names[k])}"
        rows.append(tiny_model._encode(tok, prompt, _answer(layout, ids[k])))
    input_ids, target, mask = tiny_model._padded(rows, tok.pad_token_id)
    with torch.no_grad():
        guess = model(input_ids=input_ids, attention_mask=mask).logits.argmax(-1)
    wrong = (guess[:, :-1] != target[:, 1:]) & (target[:, 1:] != -100)
    right = int((~wrong.any(dim=1)).sum())
    print(
        f"RESULT layout {layout}, {args.names} names, {args.layers} layers, lr {args.lr:g}, "
        f"batch {args.batch}: "
        f"{args.steps} steps, {right}/300 = {right / 300:.1%} of fresh "
        f"pages' ids exact, {time.time() - started:.0f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
