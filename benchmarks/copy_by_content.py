"""Does a tiny model learn to copy by content? (issue 37's missing skill, measured alone.)

    <llamafactory-env>/bin/python benchmarks/copy_by_content.py --model RUN/model \\
        --task fixed|shifted|recall [--steps 1500] [--lr 2e-3] [--kinds N] [--batch 16] [--seed 0]

Runs in the LLaMA-Factory tool environment (``bash .ci/install-loop-tools``; it has
``transformers``), on a tiny model directory the loop built (``RUN/model``: its
initialisation and tokenizer, untrained), trains it from that start on token sequences
built directly (no text, so no tokenization question), and scores fresh rows:

* ``fixed``: a random sequence of 24 tokens, then the same again: every token of the
  second copy after its first is a target. The copy is always 24 positions back, so a
  model can learn it by position alone.
* ``shifted``: a random sequence of 6-30 tokens, then 0-40 random tokens, then the same
  sequence again, after 0-50 random tokens: only the content finds the original (an
  induction head: attend to where the token just written appeared before, copy what
  followed it).
* ``recall``: pages of 2-12 lines ``role 'NAME' id=N`` (the loop's page-text lines, the
  name 1-3 of the tokenizer's word tokens, N from 1 to 59, in page order half the time),
  then ``Target: role 'NAME' id=`` whose targets are the id's tokens. With a tokenizer
  that has ``' id=N`` tokens (the id-token experiment in RESULTS.md) the id is the one
  token right after the name (one induction step); else it is its digits after ``'``,
  `` id`` and ``=``, tokens every line shares, as the loop's tokenizer writes it.

The tokens are the tokenizer's word pieces (letters only, 2+ long) and its ``' id=N``
tokens; ``--kinds N`` keeps the first N of them (fewer kinds, more repeats by chance).
``--batch`` rows a step (16), AdamW (weight decay 0.01), gradient norm clipped at 1,
constant ``--lr``. The loss and the share of targets right on 64 fresh rows every 100
steps go to stdout, then one ``RESULT`` line. One run per call; seeded. Findings:
benchmarks/RESULTS.md, "Copying by content does not form in the tiny model".
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src" / "replaystore" / "loop"))

import tiny_model  # the loop's standalone builder script: its batch padding

ROLES = ("button", "link", "textbox", "StaticText", "checkbox", "radio", "tab", "option")


class Rows:
    """The tasks' rows as ``(token ids, labels)`` (-100: not a target)."""

    def __init__(self, tokenizer: Any, kinds: int | None) -> None:
        vocab = tokenizer.get_vocab()
        self.id_tokens = sorted(i for s, i in vocab.items() if s.startswith("' id="))
        words = sorted(i for s, i in vocab.items() if s.isascii() and s.isalpha() and len(s) >= 2)
        self.words = words
        tokens = words + self.id_tokens
        self.tokens = tokens[:kinds] if kinds else tokens

        def enc(text: str) -> list[int]:
            return list(tokenizer(text, add_special_tokens=False)["input_ids"])

        self.roles = [enc(r) for r in ROLES]
        self.roles_after_space = [enc(" " + r) for r in ROLES]
        self.quote, self.newline, self.target = enc(" '"), enc("\n"), enc("Target:")
        self.id_token = {int(s.split("=")[1]): i for s, i in vocab.items() if s.startswith("' id=")}
        self.id_prefix = enc("' id=")
        self.digit = {str(d): enc(str(d))[0] for d in range(10)}

    def fixed(self, rng: random.Random) -> tuple[list[int], list[int]]:
        seq = [rng.choice(self.tokens) for _ in range(24)]
        return seq + seq, [-100] * 25 + seq[1:]

    def shifted(self, rng: random.Random) -> tuple[list[int], list[int]]:
        n, before, between = rng.randint(6, 30), rng.randint(0, 50), rng.randint(0, 40)
        seq = [rng.choice(self.tokens) for _ in range(n)]
        pre = [rng.choice(self.tokens) for _ in range(before)]
        gap = [rng.choice(self.tokens) for _ in range(between)]
        return pre + seq + gap + seq, [-100] * (before + n + between + 1) + seq[1:]

    def recall(self, rng: random.Random) -> tuple[list[int], list[int]]:
        n = rng.randint(2, 12)
        numbers = rng.sample(range(1, 60), n)
        if rng.random() < 0.5:
            numbers.sort()  # page order half the time, as the pages number their elements
        roles = [rng.randrange(len(ROLES)) for _ in range(n)]
        names = [[rng.choice(self.words) for _ in range(rng.randint(1, 3))] for _ in range(n)]
        x: list[int] = []
        for role, name, number in zip(roles, names, numbers, strict=True):
            x += self.roles[role] + self.quote + name + self.id_of(number) + self.newline
        y = [-100] * len(x)
        for k in rng.sample(range(n), min(n, 4)):
            query = self.target + self.roles_after_space[roles[k]] + self.quote + names[k]
            answer = self.id_of(numbers[k])
            if not self.id_tokens:  # the shared "' id=" is part of the query, the digits not
                digits = self.digits(numbers[k])
                query, answer = query + answer[: -len(digits)], digits
            x += query + answer + self.newline
            y += [-100] * len(query) + answer + [-100] * len(self.newline)
        return x, y

    def id_of(self, number: int) -> list[int]:
        """The tokens after a line's name: its id token, else ``' id=`` and the digits."""
        if self.id_tokens:
            return [self.id_token[number]]
        return self.id_prefix + self.digits(number)

    def digits(self, number: int) -> list[int]:
        return [self.digit[c] for c in str(number)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="a tiny model directory")
    parser.add_argument("--task", choices=("fixed", "shifted", "recall"), required=True)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--kinds", type=int, help="use only the first N token kinds")
    parser.add_argument("--batch", type=int, default=16, help="rows per step (default 16)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.lr <= 0 or (args.kinds is not None and args.kinds < 2):
        parser.error("--steps must be >= 1, --lr > 0 and --kinds >= 2")
    if args.batch < 1:
        parser.error(f"--batch must be >= 1, got {args.batch}")
    import torch
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    torch.manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = Qwen2ForCausalLM.from_pretrained(args.model)
    rows = Rows(tokenizer, args.kinds)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    make = getattr(rows, args.task)
    rng = random.Random(args.seed + 1)

    def score() -> float:
        check = random.Random(77)
        ids, labels, mask = tiny_model._padded([make(check) for _ in range(64)], pad)
        with torch.no_grad():
            guess = model(input_ids=ids, attention_mask=mask).logits.argmax(-1)
        target = labels[:, 1:]
        marked = target != -100
        return int(((guess[:, :-1] == target) & marked).sum()) / int(marked.sum())

    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    uniform = math.log(len(rows.tokens))
    print(
        f"{args.task}: {len(rows.tokens)} token kinds (uniform loss {uniform:.2f}), "
        f"{len(rows.id_tokens)} id tokens, right before training {score():.1%}",
        flush=True,
    )
    started = time.time()
    loss = float("nan")
    for step in range(args.steps):
        model.train()
        ids, labels, mask = tiny_model._padded([make(rng) for _ in range(args.batch)], pad)
        out = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        out.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss = float(out.item())
        if (step + 1) % 100 == 0 or step + 1 == args.steps:
            model.eval()
            print(
                f"step {step + 1} {time.time() - started:.0f} s: loss {loss:.3f}, "
                f"right {score():.1%}",
                flush=True,
            )
    model.eval()
    print(
        f"RESULT {args.task}, {len(rows.tokens)} token kinds, {len(rows.id_tokens)} id tokens, "
        f"lr {args.lr:g}, batch {args.batch}, {args.steps} steps: loss {loss:.3f} (uniform "
        f"over the token kinds {uniform:.2f}), {score():.1%} of fresh rows' targets right, "
        f"{time.time() - started:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
