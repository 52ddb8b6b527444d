"""Prompt splitting: a prompt written as a JSON list of chat messages (compact, or
``json.dumps(messages, indent=2 or 4)`` as WebGym writes it) split into its messages'
exact texts, so formats 3 and 4 store each distinct message once, and joined back
character for character."""

from __future__ import annotations

from collections.abc import Sequence

from replaystore.trajectories.files.jsonfast import SCAN

# Version 4: prompt_separators value of a step whose prompt is not split (255).
NOT_SPLIT = 255
# The layouts of a split prompt (index = "p" in its head line, ``prompt_separators`` in a
# version 4 header): ``(opening, separator, closing)`` with ``prompt == opening +
# separator.join(messages) + closing``. 0 and 1: json.dumps's compact lists (", " is its
# default separator); 2 and 3: json.dumps(messages, indent=2 or 4), as WebGym writes
# every step's raw_prompt (indent=2, ensure_ascii=False: the texts are kept as they are).
PROMPT_LAYOUTS = (
    ("[", ", ", "]"),
    ("[", ",", "]"),
    ("[\n  ", ",\n  ", "\n]"),
    ("[\n    ", ",\n    ", "\n]"),
)
# How many characters of a message's start index the messages already seen, and how
# many texts are kept per start (the most recent).
_KNOWN_KEY = 64
_KNOWN_PER_KEY = 4


def split_prompt(prompt: str, known: dict[str, list[str]]) -> tuple[int, list[str]] | None:
    """``(layout, message texts)`` with ``prompt == opening + separator.join(texts) +
    closing`` exactly for that layout of :data:`PROMPT_LAYOUTS` (the texts are slices of
    ``prompt``), or None (not written as a JSON list of objects in one of those layouts:
    then the prompt is stored as it is).

    Every text but the last is one JSON object (parsed here, or found in ``known``);
    the last, found as the first text after which no text starts with the same key
    (``{"role"``), is the rest of the prompt, not parsed: a reader that finds it is
    not one JSON value falls back to parsing the joined prompt, as before (same
    result, same error). ``known`` indexes texts already parsed by their first characters: one
    found again at the same place is taken without parsing (a JSON object ends where
    its text ends, so the slice is the same value); new ones are added.
    """
    if prompt.startswith("[{"):
        layouts: tuple[int, ...] = (0, 1)  # which one: the first gap between messages says
    elif prompt.startswith("[\n  {"):
        layouts = (2,)
    elif prompt.startswith("[\n    {"):
        layouts = (3,)
    else:
        return None
    opening, _, closing = PROMPT_LAYOUTS[layouts[0]]
    if not prompt.endswith("}" + closing) or not prompt.startswith(opening + "{"):
        return None
    parts: list[str] = []
    layout = -1 if len(layouts) > 1 else layouts[0]
    seen_gap = False
    last = len(prompt) - len(closing)
    i = len(opening)
    while True:
        text = None
        for seen in known.get(prompt[i : i + _KNOWN_KEY], ()):
            if prompt.startswith(seen, i):
                text = seen  # the same text object: its hash is made already
                break
        if text is None and seen_gap:
            # No later text starts like this message (its first key): this is the last
            # message, the rest of the prompt.
            quote = prompt.find('"', i + 1)
            first_key = prompt[i : prompt.find('"', quote + 1) + 1]
            if quote < 0 or prompt.find(PROMPT_LAYOUTS[layout][1] + first_key, i) < 0:
                text = prompt[i:last]
        if text is None:
            try:
                value, end = SCAN(prompt, i)
            except ValueError:
                return None
            if not isinstance(value, dict):
                return None
            text = prompt[i:end]
            texts = known.setdefault(prompt[i : i + _KNOWN_KEY], [])
            texts.insert(0, text)
            del texts[_KNOWN_PER_KEY:]
        parts.append(text)
        end = i + len(text)
        if end == last:
            return max(layout, 0), parts
        if layout < 0:  # a compact list: ", " or ","
            if prompt.startswith(", {", end):
                layout = 0
            elif prompt.startswith(",{", end):
                layout = 1
            else:
                return None
        separator = PROMPT_LAYOUTS[layout][1]
        if not prompt.startswith(separator + "{", end):
            return None
        seen_gap = True
        i = end + len(separator)


def join_prompt(layout: int, parts: Sequence[str]) -> str:
    opening, separator, closing = PROMPT_LAYOUTS[layout]
    return opening + separator.join(parts) + closing
