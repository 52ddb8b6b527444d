"""Data components of a web-agent trajectory, with WebGym's field names and defaults.

A trajectory is a list of steps. A step is either a mapping in WebGym's shape
(``{"observation": Observation, "action": Action, "response": Response,
"reward": Reward, "same_as_next_screenshot": bool?, "trajectory_metadata": dict?}``)
or a :class:`Step`. Every component round-trips losslessly through JSON with
``to_dict()`` / ``from_dict()``; :func:`step_to_dict` / :func:`step_from_dict`
do the same for whole steps. Nothing here is ever pickled.

Like WebGym's classes, components are read by attribute (``obs.image_path``);
they also answer ``obs["image_path"]`` and ``obs.get("page_metadata", {})`` by
field name, because WebGym code written for observation dicts
(``observation['image_path']`` in its conversation builder) meets these objects
too. They are not iterable (WebGym's raise on ``obj[0]`` too).
:data:`domain_subdomain_map` is WebGym's table of task domains and subdomains.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, InitVar, dataclass, field
from typing import Any, ClassVar, Self

from replaystore.errors import SchemaError

__all__ = [
    "STEP_KEYS",
    "Action",
    "Observation",
    "Response",
    "Reward",
    "Step",
    "Task",
    "domain_subdomain_map",
    "step_from_dict",
    "step_to_dict",
    "trajectory_from_dicts",
    "trajectory_to_dicts",
]


#: WebGym's task taxonomy (``webgym.data.components.domain_subdomain_map``):
#: domain -> its subdomains, in WebGym's order.
domain_subdomain_map: dict[str, list[str]] = {
    "Lifestyle & Leisure": [
        "Shopping",
        "Food & Cooking",
        "Sports & Fitness",
        "Health & Medicine",
        "Pets & Animal Welfare",
        "Fashion & Beauty",
        "Hobbies & DIY",
    ],
    "Entertainment": [
        "Films & TV Shows",
        "Gaming & Virtual Worlds",
        "Live Shows & Performances",
        "Music",
        "Books & Reading",
    ],
    "Misc.": [
        "General Info.",
        "News",
        "Legal & Government Services",
        "Real Estate",
        "Finance & Investment",
    ],
    "Science & Research": ["Research & Academia", "Technology & Science"],
    "Career & Education": ["Education & Learning", "Jobs & Career"],
    "Travel & Transportation": [
        "Travel & Accommodation",
        "Outdoor & Recreation",
        "Ticketed Activities",
    ],
}


# The field names of each component class, in order (to_dict runs once per step saved).
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


class _Component:
    """Shared JSON conversion: ``to_dict`` gives JSON values, ``from_dict`` checks fields."""

    __slots__ = ()
    _nested: ClassVar[dict[str, type[_Component]]] = {}
    # Not iterable: with __getitem__ defined, Python would otherwise try obj[0], obj[1], ...
    __iter__ = None

    def _field_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(self))  # type: ignore[arg-type]

    def __getitem__(self, name: str) -> Any:
        """The field ``name`` (``obs["image_path"]`` is ``obs.image_path``).

        Raises:
            KeyError: no such field (the message lists the fields).
            TypeError: ``name`` is not a string (components are not sequences).
        """
        if not isinstance(name, str):
            raise TypeError(
                f"{type(self).__name__} is indexed by field name, not {type(name).__name__}"
            )
        if name not in self._field_names():
            raise KeyError(
                f"{type(self).__name__} has no field {name!r} "
                f"(fields: {', '.join(self._field_names())})"
            )
        return getattr(self, name)

    def get(self, name: str, default: Any = None) -> Any:
        """The field ``name``, or ``default`` when the component has no such field."""
        if isinstance(name, str) and name in self._field_names():
            return getattr(self, name)
        return default

    def __contains__(self, name: object) -> bool:
        """Whether ``name`` is a field of this component."""
        return isinstance(name, str) and name in self._field_names()

    def to_dict(self, *, shared: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The fields as a dict of JSON-compatible values (nested components as dicts).

        ``shared``: ready dicts of nested components, by field name, used as they are
        (:func:`step_to_dict` shares one task's dict among a trajectory's steps).
        """
        names = _FIELD_NAMES.get(type(self))
        if names is None:
            names = _FIELD_NAMES[type(self)] = self._field_names()
        out: dict[str, Any] = {}
        for name in names:
            if shared is not None and name in shared:
                out[name] = shared[name]
                continue
            value = getattr(self, name)
            out[name] = value.to_dict() if isinstance(value, _Component) else value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | Self) -> Self:
        """Build from a mapping made by :meth:`to_dict` (or return ``data`` if already one).

        Raises:
            SchemaError: ``data`` is not a mapping, lacks a required field or has an unknown one.
        """
        if isinstance(data, cls):
            return data
        if not isinstance(data, Mapping):
            raise SchemaError(f"{cls.__name__} expects a mapping, got {type(data).__name__}")
        fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise SchemaError(f"{cls.__name__} has no field {unknown[0]!r}")
        missing = [
            name
            for name, f in fields.items()
            if name not in data
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        ]
        if missing:
            raise SchemaError(f"{cls.__name__} is missing required field {missing[0]!r}")
        kwargs = dict(data)
        for name, component in cls._nested.items():
            if kwargs.get(name) is not None:
                kwargs[name] = component.from_dict(kwargs[name])
        return cls(**kwargs)


@dataclass(slots=True)
class Task(_Component):
    """A web task: what to do, where, how hard, and how it is judged."""

    task_name: str
    domain: str
    subdomain: str
    website: str
    difficulty: Any
    evaluator_reference: Any
    reference_answer: Any
    attempt_level: int = 0
    task_id: str | None = None
    max_steps: int | None = None
    trajectory_index: int | None = None


@dataclass(slots=True)
class Observation(_Component):
    """What the agent saw: the task, a screenshot file, the accessibility tree, page metadata.

    ``submit=`` (keyword only) is accepted as WebGym accepts it: deprecated,
    discarded with a :class:`DeprecationWarning` when not None (``Reward.submit``
    holds it).
    """

    task: Task
    image_path: str | None
    ac_tree: str | None
    page_metadata: dict[str, Any] | None = None
    _: KW_ONLY
    submit: InitVar[Any] = None

    def __post_init__(self, submit: Any) -> None:
        if submit is not None:
            warnings.warn(
                "Observation(submit=...) is deprecated and ignored, as in WebGym; "
                "use Reward(submit=...) instead",
                DeprecationWarning,
                stacklevel=3,
            )


@dataclass(slots=True)
class Action(_Component):
    """The parsed action (``action``, e.g. ``{"key": "click", ...}``) and its text form."""

    action: Any
    action_string: str | None


@dataclass(slots=True)
class Response(_Component):
    """The model's raw output, its token count/ids, and the prompt that produced it.

    ``raw_prompt`` is the JSON-encoded list of chat messages, or ``""`` when the
    prompt was not kept (the buffer then rebuilds it with a conversation builder).
    """

    raw_response: str
    answering_tokens: Any
    raw_prompt: str = ""


@dataclass(slots=True)
class Reward(_Component):
    """The judged outcome of a step: ``reward`` (1 means the task was solved)."""

    reward: float | None
    evaluation: Any
    is_blocked: bool = False
    submit: bool = False
    submission_judgment: Any = None


Observation._nested = {"task": Task}

STEP_KEYS: tuple[str, ...] = ("observation", "action", "response", "reward")
_STEP_TYPES: dict[str, type[_Component]] = {
    "observation": Observation,
    "action": Action,
    "response": Response,
    "reward": Reward,
}
_OPTIONAL_STEP_KEYS = ("same_as_next_screenshot", "trajectory_metadata")


@dataclass(slots=True)
class Step:
    """One step of a trajectory; :meth:`to_mapping` gives WebGym's mapping shape."""

    observation: Observation
    action: Action
    response: Response
    reward: Reward
    same_as_next_screenshot: bool | None = None
    trajectory_metadata: dict[str, Any] | None = field(default=None)

    def to_mapping(self) -> dict[str, Any]:
        """WebGym's step mapping (component objects; optional keys only when set)."""
        out: dict[str, Any] = {key: getattr(self, key) for key in STEP_KEYS}
        for key in _OPTIONAL_STEP_KEYS:
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out

    @classmethod
    def from_mapping(cls, step: Mapping[str, Any] | Step) -> Step:
        """Build from a WebGym step mapping whose values are components or their dicts."""
        if isinstance(step, Step):
            return step
        return cls(**step_from_dict(step))


def step_to_dict(
    step: Mapping[str, Any] | Step, *, tasks: dict[int, tuple[Task, dict[str, Any]]] | None = None
) -> dict[str, Any]:
    """A step (mapping or :class:`Step`) as JSON-compatible nested dicts.

    Args:
        step: the step.
        tasks: a memo for steps converted together (a trajectory shares one
            :class:`Task`): each Task object's dict is made once and shared by the
            observations of every step that holds that object (so do not change it).

    Raises:
        SchemaError: a required key is missing or holds the wrong component type.
    """
    mapping = step.to_mapping() if isinstance(step, Step) else step
    if type(mapping) is not dict and not isinstance(mapping, Mapping):
        raise SchemaError(f"a step must be a mapping or a Step, got {type(mapping).__name__}")
    out: dict[str, Any] = {}
    for key, component in _STEP_TYPES.items():
        if key not in mapping:
            raise SchemaError(f"step is missing {key!r}")
        value = mapping[key]
        if tasks is not None and type(value) is Observation and type(value.task) is Task:
            task = value.task
            known = tasks.get(id(task))
            if known is None or known[0] is not task:
                known = tasks[id(task)] = (task, task.to_dict())
            observation = value.to_dict(shared={"task": known[1]})
            out[key] = observation
        elif isinstance(value, component):
            out[key] = value.to_dict()
        elif isinstance(value, Mapping):
            out[key] = component.from_dict(value).to_dict()
        else:
            raise SchemaError(
                f"step[{key!r}] must be a {component.__name__}, got {type(value).__name__}"
            )
    for key in _OPTIONAL_STEP_KEYS:
        if mapping.get(key) is not None:
            out[key] = mapping[key]
    return out


def step_from_dict(data: Mapping[str, Any]) -> dict[str, Any]:
    """A step mapping with component objects, from :func:`step_to_dict` output.

    Raises:
        SchemaError: a required key is missing, a field is unknown, or a key is not a step key.
    """
    if not isinstance(data, Mapping):
        raise SchemaError(f"a step must be a mapping, got {type(data).__name__}")
    unknown = sorted(set(data) - set(_STEP_TYPES) - set(_OPTIONAL_STEP_KEYS))
    if unknown:
        raise SchemaError(f"step has unknown key {unknown[0]!r}")
    out: dict[str, Any] = {}
    for key, component in _STEP_TYPES.items():
        if key not in data:
            raise SchemaError(f"step is missing {key!r}")
        out[key] = component.from_dict(data[key])
    for key in _OPTIONAL_STEP_KEYS:
        if data.get(key) is not None:
            out[key] = data[key]
    return out


def trajectory_to_dicts(trajectory: Sequence[Mapping[str, Any] | Step]) -> list[dict[str, Any]]:
    """A trajectory (list of steps) as a list of JSON-compatible dicts."""
    return [step_to_dict(step) for step in trajectory]


def trajectory_from_dicts(steps: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The inverse of :func:`trajectory_to_dicts`: WebGym-shaped step mappings."""
    return [step_from_dict(step) for step in steps]
