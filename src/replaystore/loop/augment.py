"""Name swaps: more SFT records from the same demonstrations, each with other names.

A tiny model trained from scratch on a few hundred demonstrations learns them by heart:
every MiniWoB++ episode has its own filler words, which tell the examples apart, so the
cheapest way to fit "click the 'Cancel' button" is to remember that this page wants
'Cancel', not to read the name in the goal. It then answers held-out pages with the names
it saw most (measured: goal "No", reply ``Click the 'yes' button``).

:func:`swap_names` adds copies of each record in which every name the goal quotes
(``Click on the "Cancel" button.``) is replaced, wherever it stands in the record (goal,
page text, history, reply), by a word drawn from a vocabulary (the pages' own word lists,
:func:`~replaystore.rollouts.miniwob.page_vocabulary`) that the record does not contain.
Each copy is as valid a demonstration as the original: the page says 'Joye' where it said
'Cancel', and the reply clicks the same element. Remembering names no longer fits the
data; copying them from the goal does. Nothing of the held-out episodes is used: the
records are the training demonstrations, the words the environment's lexicon.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["quoted_names", "swap_names"]

#: A name the goal quotes: "..." of one to four words, none of them empty.
_QUOTED = re.compile(r'"([^"\n]{1,60})"')


def quoted_names(goal: str) -> list[str]:
    """The strings ``goal`` puts in double quotes (MiniWoB++'s way of naming a target),
    in order, each once."""
    names: dict[str, None] = {}
    for match in _QUOTED.finditer(goal):
        text = match.group(1).strip()
        if text and len(text.split()) <= 4:
            names.setdefault(text, None)
    return list(names)


def _goal_of(record: dict[str, Any]) -> str | None:
    """The goal of a ShareGPT record: the ``Task: ...`` line of its first human turn."""
    for turn in record.get("conversations") or []:
        if turn.get("from") == "human":
            first = str(turn.get("value", "")).split("\n", 1)[0]
            return first[len("Task:") :].strip() if first.startswith("Task:") else None
    return None


def _swap(text: str, pattern: re.Pattern[str], table: dict[str, str]) -> str:
    return pattern.sub(lambda m: table[m.group(0)], text)


def swap_names(
    records: Sequence[dict[str, Any]],
    vocabulary: Sequence[str],
    copies: int,
    rng: np.random.Generator,
) -> list[dict[str, Any]]:
    """``records`` followed by ``copies`` name-swapped copies of each record whose goal
    quotes a name (records without one are not copied).

    In a copy, each quoted name of the goal becomes as many words (same count) drawn from
    ``vocabulary`` without replacement, none of them in the record already; every
    whole-word occurrence is replaced in every turn (``system`` and ``images`` are kept).
    A record whose names cannot all be replaced (the vocabulary is too small) is not
    copied.

    Raises:
        ValueError: ``copies`` < 0.
    """
    if copies < 0:
        raise ValueError(f"copies must be >= 0, got {copies}")
    out = list(records)
    words = np.array(list(dict.fromkeys(w for w in vocabulary if w and " " not in w)))
    if copies == 0 or len(words) == 0:
        return out
    for record in records:
        goal = _goal_of(record)
        names = quoted_names(goal) if goal else []
        if not names:
            continue
        texts = [str(t.get("value", "")) for t in record["conversations"]]
        joined = "\n".join(texts)
        free = words[[w not in joined for w in words.tolist()]]
        needed = sum(len(name.split()) for name in names)
        if len(free) < needed:
            continue
        # Longest names first, so that "Okay" is not rewritten through "Ok".
        ordered = sorted(names, key=len, reverse=True)
        pattern = re.compile("|".join(rf"(?<!\w){re.escape(name)}(?!\w)" for name in ordered))
        for _ in range(copies):
            drawn = rng.choice(free, size=needed, replace=False).tolist()
            table: dict[str, str] = {}
            for name in ordered:
                n = len(name.split())
                table[name], drawn = " ".join(drawn[:n]), drawn[n:]
            copy = dict(record)
            copy["conversations"] = [
                {**turn, "value": _swap(text, pattern, table)}
                for turn, text in zip(record["conversations"], texts, strict=True)
            ]
            out.append(copy)
    return out
