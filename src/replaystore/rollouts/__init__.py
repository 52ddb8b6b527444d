"""Web-agent rollouts in a real browser (seed 002's AsyncWebGym, WebAgent, vLLM client).

* :class:`BrowserPool` (``browser``): Chromium through Playwright, launched locally
  or reached over CDP; one isolated, reused context per task.
* :func:`parse_action` / :func:`execute_action` (``actions``): the action grammar.
* :class:`RolloutCollector` (``collector``): parallel rollouts -> trajectory storage.
* :class:`ScriptedPolicy` (``scripted``): a policy for tests and the demo.
* :class:`LocalSuite` (``sites``): six small local websites and their tasks.
* :class:`WebAgent`, :class:`OpenAIChatPolicy`, :class:`PolicyRequest` (``policy``):
  prompts, the OpenAI chat-completions client (vLLM), response decomposition.
* :class:`ChatCompletionsClient` (``chat_client``): the HTTP client under the policy
  and the judge (retries with backoff, concurrency limit).
* :class:`Evaluator`, :class:`OpenAIJudge` (``evaluator``): reference matching and a
  model judge -> ``Reward``.
* :class:`ExperimentLogger` (``experiment_logger``): per-iteration metrics to W&B
  (offline by default), TensorBoard, or nowhere.

Names are resolved lazily: ``import replaystore.rollouts`` imports neither
Playwright nor httpx. Needs the ``rollouts`` extra (``pip install 'replaystore[rollouts]'``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from replaystore._lazy import lazy_exports

_BROWSER = "replaystore.rollouts.browser"
_ACTIONS = "replaystore.rollouts.actions"
_COLLECTOR = "replaystore.rollouts.collector"
_OUTCOMES = "replaystore.rollouts.outcomes"
_POLICY = "replaystore.rollouts.policy"

_LAZY = {
    "BrowserPool": _BROWSER,
    "BrowserUnavailableError": _BROWSER,
    "find_chromium": _BROWSER,
    "accessibility_tree": _BROWSER,
    "parse_action": _ACTIONS,
    "execute_action": _ACTIONS,
    "format_action": _ACTIONS,
    "ActionOutcome": _ACTIONS,
    "RolloutCollector": _COLLECTOR,
    "IterationResult": _OUTCOMES,
    "TaskOutcome": _OUTCOMES,
    "DEFAULT_MAX_STEPS": _OUTCOMES,
    "difficulty_category": _OUTCOMES,
    "ScriptedPolicy": "replaystore.rollouts.scripted",
    "LocalSuite": "replaystore.rollouts.sites",
    "Policy": _POLICY,
    "PolicyRequest": _POLICY,
    "WebAgent": _POLICY,
    "OpenAIChatPolicy": _POLICY,
    "ChatCompletionsClient": "replaystore.rollouts.chat_client",
    "Evaluator": "replaystore.rollouts.evaluator",
    "OpenAIJudge": "replaystore.rollouts.evaluator",
    "JudgeVerdict": "replaystore.rollouts.evaluator",
    "ExperimentLogger": "replaystore.rollouts.experiment_logger",
}

__all__ = [
    "DEFAULT_MAX_STEPS",
    "ActionOutcome",
    "BrowserPool",
    "BrowserUnavailableError",
    "ChatCompletionsClient",
    "Evaluator",
    "ExperimentLogger",
    "IterationResult",
    "JudgeVerdict",
    "LocalSuite",
    "OpenAIChatPolicy",
    "OpenAIJudge",
    "Policy",
    "PolicyRequest",
    "RolloutCollector",
    "ScriptedPolicy",
    "TaskOutcome",
    "WebAgent",
    "accessibility_tree",
    "difficulty_category",
    "execute_action",
    "find_chromium",
    "format_action",
    "parse_action",
]

__getattr__, __dir__ = lazy_exports(__name__, globals(), _LAZY)

if TYPE_CHECKING:
    from replaystore.rollouts.actions import (
        ActionOutcome,
        execute_action,
        format_action,
        parse_action,
    )
    from replaystore.rollouts.browser import (
        BrowserPool,
        BrowserUnavailableError,
        accessibility_tree,
        find_chromium,
    )
    from replaystore.rollouts.chat_client import ChatCompletionsClient
    from replaystore.rollouts.collector import RolloutCollector
    from replaystore.rollouts.evaluator import Evaluator, JudgeVerdict, OpenAIJudge
    from replaystore.rollouts.experiment_logger import ExperimentLogger
    from replaystore.rollouts.outcomes import (
        DEFAULT_MAX_STEPS,
        IterationResult,
        TaskOutcome,
        difficulty_category,
    )
    from replaystore.rollouts.policy import OpenAIChatPolicy, Policy, PolicyRequest, WebAgent
    from replaystore.rollouts.scripted import ScriptedPolicy
    from replaystore.rollouts.sites import LocalSuite
