"""Judging a finished trajectory: reference-answer matching and an optional model judge.

:class:`Evaluator` turns the agent's final answer into a
:class:`~replaystore.trajectories.components.Reward` (WebGym's
``Evaluator.get_verifiable_reward`` job). In order:

1. ``blocked=True`` (the collector saw a CAPTCHA or a 403/429 wall): reward 0,
   ``is_blocked=True``. Nothing else is asked.
2. No answer (the trajectory hit its step limit or timeout first): reward 0.
3. Reference matching on ``task.reference_answer`` (a string, a number, or a list
   of acceptable answers; ``None``/``""`` means there is none). Both sides are
   normalised (Unicode NFKC, case-folded, whitespace collapsed, surrounding quotes
   and punctuation dropped); an answer matches a reference when it is

   * ``exact``: equal after normalisation;
   * ``numeric``: the reference is a number (``"$1,299.00"``, ``"12%"``, ``42``) and
     a number in the answer is within ``numeric_tolerance`` of it
     (``|a - r| <= numeric_tolerance * max(1, |r|)``);
   * ``contains``: the normalised reference occurs in the answer as whole words
     (``"red kettle"`` in ``"it is the red kettle"``; ``"12"`` not in ``"120"``).
     Turn off with ``allow_contains=False`` when answers must be exact.

   An answer that lists candidates (three or more parts separated by ``", "``,
   ``;``, ``/``, ``|`` or line breaks, or two joined by ``" or "`` or ``/``) matches
   only when every part matches the same reference, and a numeric match needs every
   number of the answer to be the reference's: ``"$39.99, Lisbon, 4"``,
   ``"Desk Lamp or Floor Lamp"`` and ``"24 or 39.99"`` are guesses at several answers,
   not an answer: no match. (``"the Red Kettle, in stock"`` is one answer.)

   A match gives reward 1.
4. No match (or no reference) and a judge is configured: the judge
   (:class:`OpenAIJudge`) asks an OpenAI-protocol model with the task's
   ``evaluator_reference`` rubric, the reference answer, the actions taken and the
   last screenshots; its verdict gives 1 or 0. If the judge's server fails, the
   reward is 0 and ``evaluation`` says why (logged as a warning): the trajectory
   is kept, never lost.
5. Otherwise reward 0.

The returned ``Reward`` (for the final step) carries ``evaluation`` (a sentence
saying how the reward was reached), ``submit`` (the agent submitted an answer)
and ``submission_judgment`` (a JSON dict: ``method`` of ``"blocked"``, ``"none"``,
``"exact"``, ``"numeric"``, ``"contains"``, ``"judge"`` or ``"no_match"``, the
``answer``, the ``matched`` reference, and the judge's ``verdict`` text when asked).
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from replaystore.errors import ConfigError, ImageError, ModelServerError
from replaystore.images import image_to_data_url
from replaystore.rollouts.chat_client import ChatCompletionsClient
from replaystore.trajectories.components import Reward, Step, Task

__all__ = [
    "JUDGE_SYSTEM_PROMPT",
    "Evaluator",
    "JudgeVerdict",
    "OpenAIJudge",
    "match_reference",
    "normalize_answer",
    "reference_answers",
]

logger = logging.getLogger("replaystore.rollouts.evaluator")

_PUNCT_EDGES = " \t\n\"'`“”‘’.,;:!?()[]{}<>"
_UNIT = re.compile(r"[^\w\s]{1,3}|[a-z]{1,3}|[^\w\s]{1,3}\s?[a-z]{1,3}")
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+")
#: What separates the candidates of an answer that lists several.
_CANDIDATES = re.compile(r",\s+|;|/|\||\n|\s+or\s+", re.IGNORECASE)
_OR = re.compile(r"\s+or\s+|/", re.IGNORECASE)


def normalize_answer(text: Any) -> str:
    """``text`` as compared: NFKC, case-folded, whitespace collapsed, edge punctuation dropped.

    ``normalize_answer('  "The Red  Kettle." ')`` is ``'the red kettle'``.
    """
    value = unicodedata.normalize("NFKC", str(text)).casefold()
    return " ".join(value.split()).strip(_PUNCT_EDGES)


def _numbers(text: str) -> list[float]:
    return [float(m.group().replace(",", "")) for m in _NUMBER.finditer(text)]


def _as_number(reference: Any) -> float | None:
    """The number a reference stands for (``"$1,299"`` -> 1299.0), or None if it is not one."""
    if isinstance(reference, bool):
        return None
    if isinstance(reference, (int, float)):
        return float(reference) if math.isfinite(reference) else None
    text = normalize_answer(reference)
    found = list(_NUMBER.finditer(text))
    if len(found) != 1:
        return None
    rest = (text[: found[0].start()] + text[found[0].end() :]).strip()
    # A currency sign or a short unit around one number still is that number ("$24",
    # "12 %", "3 km", "24 usd"); "room 12b" is a name, not a number.
    if rest and not _UNIT.fullmatch(rest):
        return None
    return float(found[0].group().replace(",", ""))


def reference_answers(reference: Any) -> list[Any]:
    """The acceptable answers in ``task.reference_answer``: a list (empty when there is none).

    Raises:
        ConfigError: a reference that is neither a string, a number nor a list of them.
    """
    if reference is None:
        return []
    items = list(reference) if isinstance(reference, (list, tuple)) else [reference]
    out = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            raise ConfigError(f"reference_answer entries must be strings or numbers, got {item!r}")
        if isinstance(item, str) and not normalize_answer(item):
            continue
        out.append(item)
    return out


def match_reference(
    answer: str,
    references: Sequence[Any],
    *,
    numeric_tolerance: float = 1e-6,
    allow_contains: bool = True,
) -> tuple[str, Any] | None:
    """``(method, reference)`` for the first reference ``answer`` matches, else ``None``.

    Methods are tried per reference in the order exact, numeric, contains (see the
    module docstring). An answer listing several candidates matches only when each of
    them matches the same reference. Cost: O(len(answer) * len(references)).
    """
    parts = [p for p in (normalize_answer(x) for x in _CANDIDATES.split(str(answer))) if p]
    hedged = _OR.search(str(answer)) is not None
    if len(parts) > 2 or (len(parts) == 2 and hedged):
        matches = [_match_one(p, references, numeric_tolerance, allow_contains) for p in parts]
        first = matches[0]
        if first is not None and all(m is not None and m[1] == first[1] for m in matches):
            return first
        return None
    return _match_one(answer, references, numeric_tolerance, allow_contains)


def _match_one(
    answer: str, references: Sequence[Any], numeric_tolerance: float, allow_contains: bool
) -> tuple[str, Any] | None:
    norm = normalize_answer(answer)
    answer_numbers: list[float] | None = None
    for reference in references:
        ref = normalize_answer(reference)
        if norm == ref:
            return "exact", reference
        value = _as_number(reference)
        if value is not None:
            if answer_numbers is None:
                answer_numbers = _numbers(norm)
            limit = numeric_tolerance * max(1.0, abs(value))
            if answer_numbers and all(abs(a - value) <= limit for a in answer_numbers):
                return "numeric", reference
            continue  # a number must match as a number: "12" is not in "12.5"
        if allow_contains and ref and re.search(rf"(?<!\w){re.escape(ref)}(?!\w)", norm):
            return "contains", reference
    return None


JUDGE_SYSTEM_PROMPT = (
    "You judge whether a web agent completed a task. You get the task, the facts a correct "
    "result must satisfy, the reference answer when there is one, the actions the agent "
    "took, the agent's final answer and screenshots of the last pages it saw. The answer "
    "succeeds only if every fact holds and nothing in the answer contradicts the screenshots "
    "or the reference. Reply with a short analysis, then a last line that is exactly "
    "'Verdict: SUCCESS' or 'Verdict: NOT SUCCESS'."
)

_VERDICT = re.compile(r"verdict\s*[:\-]\s*\**\s*(not\s+success|success)", re.IGNORECASE)


@dataclass(slots=True)
class JudgeVerdict:
    """A judge's decision: ``success`` and the model's full reply ``text``."""

    success: bool
    text: str


def _rubric_lines(evaluator_reference: Any) -> list[str]:
    """WebGym rubrics (``[{"description": ..., "facts": [...]}, "plain fact", ...]``) as lines."""
    if evaluator_reference is None or evaluator_reference == "":
        return []
    items = evaluator_reference if isinstance(evaluator_reference, list) else [evaluator_reference]
    lines = []
    for item in items:
        if isinstance(item, Mapping):
            text = str(item.get("description", "")).strip()
            facts = item.get("facts")
            if isinstance(facts, list) and facts:
                text += (": " if text else "") + "; ".join(str(f) for f in facts)
            lines.append(text or str(dict(item)))
        else:
            lines.append(str(item))
    return lines


class OpenAIJudge:
    """Asks an OpenAI-protocol model (vLLM, OpenAI...) whether a trajectory succeeded.

    The request: :data:`JUDGE_SYSTEM_PROMPT`, then one user message with the task,
    the rubric (``task.evaluator_reference``, one line per fact), the reference
    answer(s), the numbered action strings of every step, the final answer, and the
    screenshots of the last ``max_images`` steps as data URLs. The reply's last
    ``Verdict: SUCCESS|NOT SUCCESS`` line decides; a reply without one is a failure
    (``success=False``) whose text says so.

    Args:
        client: a :class:`ChatCompletionsClient` (shared with a policy or its own).
        base_url: build a client for this API root instead (with ``model``).
        model: the judge model's name (with ``base_url``).
        **options: further ``ChatCompletionsClient`` keywords for that client.
        max_images: how many of the last screenshots to attach (>= 0).
        system_prompt: replaces :data:`JUDGE_SYSTEM_PROMPT`.

    Raises:
        ConfigError: neither ``client`` nor ``base_url``/``model``, or ``max_images`` < 0.
    """

    def __init__(
        self,
        client: ChatCompletionsClient | None = None,
        *,
        base_url: str | None = None,
        model: str | None = None,
        max_images: int = 4,
        system_prompt: str = JUDGE_SYSTEM_PROMPT,
        **options: Any,
    ) -> None:
        if client is None:
            if base_url is None or model is None:
                raise ConfigError("OpenAIJudge needs client= or base_url= and model=")
            client = ChatCompletionsClient(base_url, model, **options)
        elif base_url is not None or model is not None or options:
            raise ConfigError("give OpenAIJudge either client= or base_url/model/options")
        if isinstance(max_images, bool) or not isinstance(max_images, int) or max_images < 0:
            raise ConfigError(f"max_images must be an int >= 0, got {max_images!r}")
        self.client = client
        self.max_images = max_images
        self.system_prompt = system_prompt

    def messages(
        self, task: Task, answer: str, steps: Sequence[Mapping[str, Any] | Step]
    ) -> list[dict[str, Any]]:
        """The chat messages :meth:`judge` sends (reads the attached screenshots).

        Screenshots that are missing or unreadable are left out (logged), not fatal.
        """
        parsed = [Step.from_mapping(step) for step in steps]
        lines = [f"Task: {task.task_name}", f"Website: {task.website}"]
        rubric = _rubric_lines(task.evaluator_reference)
        if rubric:
            lines.append("Facts a correct result must satisfy:")
            lines.extend(f"- {line}" for line in rubric)
        references = reference_answers(task.reference_answer)
        if references:
            lines.append("Reference answer: " + " | ".join(str(r) for r in references))
        lines.append("Actions taken:")
        for number, step in enumerate(parsed, start=1):
            action = step.action.action_string or ""
            url = (step.observation.page_metadata or {}).get("url", "")
            lines.append(f"{number}. {action}" + (f"  (on {url})" if url else ""))
        lines.append(f"Final answer: {answer}")
        parts: list[dict[str, Any]] = [{"type": "text", "text": "\n".join(lines)}]
        shown = parsed[-self.max_images :] if self.max_images else []
        for step in shown:
            path = step.observation.image_path
            if not path:
                continue
            try:
                url = image_to_data_url(path)
            except ImageError as exc:
                logger.warning("judge: screenshot left out: %s", exc)
                continue
            parts.append({"type": "image_url", "image_url": {"url": url}})
        return [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": parts},
        ]

    async def judge(
        self, task: Task, answer: str, steps: Sequence[Mapping[str, Any] | Step]
    ) -> JudgeVerdict:
        """The model's verdict on ``answer`` for ``task`` after ``steps``.

        Raises:
            ModelServerError: the judge's server failed (see ``ChatCompletionsClient``).
        """
        # messages() reads and base64-encodes screenshots: file work, off the event loop.
        messages = await asyncio.to_thread(self.messages, task, answer, steps)
        text = await self.client.complete(messages, temperature=0.0)
        verdicts = _VERDICT.findall(text)
        if not verdicts:
            return JudgeVerdict(False, f"{text}\n[no 'Verdict:' line: counted as NOT SUCCESS]")
        return JudgeVerdict(verdicts[-1].lower() == "success", text)

    async def aclose(self) -> None:
        """Close the judge's HTTP connections."""
        await self.client.aclose()


class Evaluator:
    """Rewards a finished trajectory (decision order in the module docstring).

    Args:
        judge: an :class:`OpenAIJudge` consulted when reference matching does not
            decide (no reference, or no match); ``None``: matching only.
        numeric_tolerance: relative tolerance for numeric references (>= 0), absolute
            below 1: ``|a - r| <= tol * max(1, |r|)``.
        allow_contains: accept an answer that contains a reference as whole words.
        judge_on_mismatch: ask the judge also when a reference exists but did not
            match (paraphrases such as "NYC" for "New York City"); ``False``: only
            tasks without a reference go to the judge.

    Raises:
        ConfigError: a negative or non-finite ``numeric_tolerance``.
    """

    def __init__(
        self,
        *,
        judge: OpenAIJudge | None = None,
        numeric_tolerance: float = 1e-6,
        allow_contains: bool = True,
        judge_on_mismatch: bool = True,
    ) -> None:
        if (
            isinstance(numeric_tolerance, bool)
            or not isinstance(numeric_tolerance, (int, float))
            or not math.isfinite(numeric_tolerance)
            or numeric_tolerance < 0
        ):
            raise ConfigError(
                f"numeric_tolerance must be a finite number >= 0, got {numeric_tolerance!r}"
            )
        self.judge = judge
        self.numeric_tolerance = float(numeric_tolerance)
        self.allow_contains = allow_contains
        self.judge_on_mismatch = judge_on_mismatch

    async def evaluate(
        self,
        task: Task,
        answer: str | None,
        steps: list[dict[str, Any]],
        *,
        blocked: bool = False,
    ) -> Reward:
        """The reward of a trajectory whose final answer is ``answer`` (``None``: none given).

        Args:
            task: the task (its ``reference_answer`` and ``evaluator_reference`` are used).
            answer: the text of the agent's ``answer("...")`` action, or ``None``.
            steps: the trajectory's steps (step mappings), for the judge.
            blocked: the site blocked the agent (anti-bot page).

        Cost: string matching only, unless the judge is asked (one model request).

        Raises:
            ConfigError: ``task.reference_answer`` holds something other than strings,
                numbers or a list of them.
        """
        judgment: dict[str, Any] = {"method": None, "answer": answer, "matched": None}
        if blocked:
            judgment["method"] = "blocked"
            return Reward(
                0.0, "blocked: the website showed an anti-bot page", True, False, judgment
            )
        if answer is None:
            judgment["method"] = "none"
            return Reward(0.0, "no answer before the step limit or timeout", False, False, judgment)
        references = reference_answers(task.reference_answer)
        matched = match_reference(
            answer,
            references,
            numeric_tolerance=self.numeric_tolerance,
            allow_contains=self.allow_contains,
        )
        if matched is not None:
            judgment["method"], judgment["matched"] = matched
            return Reward(
                1.0,
                f"{matched[0]} match with reference {matched[1]!r}",
                False,
                True,
                judgment,
            )
        if self.judge is not None and (not references or self.judge_on_mismatch):
            judgment["method"] = "judge"
            try:
                verdict = await self.judge.judge(task, answer, steps)
            except ModelServerError as exc:
                logger.warning("judge failed for task %r: %s", task.task_id, exc)
                judgment["verdict"] = None
                judgment["error"] = str(exc)
                return Reward(0.0, f"judge failed: {exc}", False, True, judgment)
            judgment["verdict"] = verdict.text
            outcome = "SUCCESS" if verdict.success else "NOT SUCCESS"
            return Reward(
                float(verdict.success), f"judge verdict: {outcome}", False, True, judgment
            )
        judgment["method"] = "no_match"
        why = (
            f"answer {answer!r} matches no reference ({' | '.join(map(str, references))})"
            if references
            else "the task has no reference answer and no judge is configured"
        )
        return Reward(0.0, why, False, True, judgment)

    async def aclose(self) -> None:
        """Close the judge's connections, if any."""
        if self.judge is not None:
            await self.judge.aclose()
