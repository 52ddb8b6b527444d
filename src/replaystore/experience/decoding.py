"""Getting your types back: :class:`FieldDecoders` turn stored JSON into your classes.

Storages that keep rows as JSON (:class:`~replaystore.experience.storage.sqlite.SqliteStorage`,
:class:`~replaystore.experience.storage.multiproc.MultiProcMemoryStorage`) give
``state``/``actions``/``messages`` back as plain JSON values (dicts, lists, ...),
since nothing we store is pickled. Register a decoder per field and rows come
back with your types::

    from aworld.core.common import ActionModel, Observation

    store = SqliteStorage("exp.sqlite", decoders={"state": Observation, "actions": ActionModel})
    row = store.get_all()[0]
    row.exp_data.state        # an Observation
    row.exp_data.actions[0]   # an ActionModel

A decoder is one of:

* a **pydantic model class**: ``Model.model_validate(value)``;
* a **dataclass type**: ``Cls(**value)`` (``value`` must be a JSON object; nested
  dataclasses stay dicts: use pydantic or a callable for nested types);
* any other **callable** (a function, or a class taking the value): ``decoder(value)``.

``actions`` and ``messages`` are decoded **item by item** when the stored value is
a list (AWorld's ``actions: List[ActionModel]``), else as one value; ``state`` is
decoded as one value. ``None`` stays ``None`` (nothing stored, nothing decoded).

Queries always run on the stored JSON, never on decoded objects, so a condition
selects the same rows in every storage. The in-memory storage needs no decoders:
it returns the very row objects you stored, as AWorld's does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from replaystore.errors import ConfigError, SchemaError
from replaystore.experience.rows import DataRow, Experience

__all__ = ["DECODABLE_FIELDS", "Decoder", "FieldDecoders", "as_decoders"]

Decoder = Callable[[Any], Any]
"""A pydantic model class, a dataclass type, or any callable taking the stored JSON value."""

DECODABLE_FIELDS: tuple[str, ...] = ("state", "actions", "messages")
"""The :class:`~replaystore.experience.rows.Experience` fields a decoder can be registered for."""

_PER_ITEM = frozenset({"actions", "messages"})

_HINTS = {
    "action": "did you mean 'actions'? (its decoder is applied to each action)",
    "message": "did you mean 'messages'? (its decoder is applied to each message)",
    "observation": "did you mean 'state'?",
    "obs": "did you mean 'state'?",
}


def _name(decoder: Any) -> str:
    return getattr(decoder, "__qualname__", None) or type(decoder).__name__


def _resolve(field: str, decoder: Any) -> Callable[[Any], Any]:
    """The function that decodes one value with ``decoder``; ConfigError if it cannot."""
    if isinstance(decoder, type):
        validate = getattr(decoder, "model_validate", None)
        if callable(validate):  # pydantic v2 model class, duck-typed (pydantic stays optional)
            return validate
        if dataclasses.is_dataclass(decoder):

            def from_fields(value: Any) -> Any:
                if not isinstance(value, Mapping):
                    raise TypeError(f"expected a JSON object, got {type(value).__name__}")
                return decoder(**value)

            return from_fields
        return decoder
    if hasattr(decoder, "model_validate") or (
        dataclasses.is_dataclass(decoder) and not callable(decoder)
    ):
        cls = type(decoder).__name__
        raise ConfigError(
            f"decoder for {field!r} is an instance of {cls}, not a class; pass {cls} itself"
        )
    if not callable(decoder):
        raise ConfigError(
            f"decoder for {field!r} must be a pydantic model class, a dataclass type or a "
            f"callable taking the stored JSON value, got {decoder!r:.80}"
        )
    return decoder


@dataclass(frozen=True, slots=True)
class FieldDecoders:
    """Decoders for the JSON-stored fields of :class:`~replaystore.experience.rows.Experience`.

    Args:
        state: decoder of ``exp_data.state`` (the whole value).
        actions: decoder of each item of ``exp_data.actions`` (or of the value, if not a list).
        messages: decoder of each item of ``exp_data.messages`` (or of the value, if not a list).

    Each is ``None`` (leave the JSON as is), a pydantic model class, a dataclass
    type or a callable (see the module docs). Storages take them as
    ``decoders=FieldDecoders(...)`` or as a mapping ``{"state": ..., "actions": ...}``.
    To cross processes started with ``spawn``, decoders must be picklable
    (module-level classes and functions are; lambdas are not).

    Raises:
        ConfigError: a decoder is neither a class nor a callable (e.g. a model
            *instance* where its class was meant).

    Cost: one decoder call per decoded value of each row returned (pydantic
    validation is typically a few microseconds per small model).
    """

    state: Decoder | None = None
    actions: Decoder | None = None
    messages: Decoder | None = None
    _fns: tuple[tuple[str, Callable[[Any], Any]], ...] = dataclasses.field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        fns = tuple(
            (name, _resolve(name, getattr(self, name)))
            for name in DECODABLE_FIELDS
            if getattr(self, name) is not None
        )
        object.__setattr__(self, "_fns", fns)

    def __getstate__(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in DECODABLE_FIELDS}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name in DECODABLE_FIELDS:
            object.__setattr__(self, name, state.get(name))
        self.__post_init__()

    def __bool__(self) -> bool:
        """True when at least one field has a decoder."""
        return bool(self._fns)

    def decode_experience(self, exp: Experience, row_id: str = "?") -> Experience:
        """A new :class:`Experience` with the registered fields decoded (``exp`` is not changed).

        Raises:
            SchemaError: a decoder failed on a stored value; the message names the
                row id, the field (and item index) and the decoder.
        """
        out = Experience.__new__(Experience)
        out.state = exp.state
        out.actions = exp.actions
        out.reward_t = exp.reward_t
        out.adv_t = exp.adv_t
        out.v_t = exp.v_t
        out.messages = exp.messages
        for name, fn in self._fns:
            value = getattr(exp, name)
            if value is None:
                continue
            if name in _PER_ITEM and isinstance(value, list):
                decoded: Any = [
                    self._call(fn, item, row_id, f"{name}[{i}]", name)
                    for i, item in enumerate(value)
                ]
            else:
                decoded = self._call(fn, value, row_id, name, name)
            setattr(out, name, decoded)
        return out

    def _call(
        self, fn: Callable[[Any], Any], value: Any, row_id: str, where: str, name: str
    ) -> Any:
        try:
            return fn(value)
        except Exception as exc:
            raise SchemaError(
                f"row {row_id!r}: exp_data.{where}: decoder {_name(getattr(self, name))} "
                f"failed on the stored value {value!r:.120}: {exc}"
            ) from exc

    def decode_row(self, row: DataRow) -> DataRow:
        """A new :class:`DataRow` with the same id and metadata and decoded experience."""
        return DataRow(row.exp_meta, self.decode_experience(row.exp_data, row.id), row.id)

    def decode_rows(self, rows: list[DataRow]) -> list[DataRow]:
        """:meth:`decode_row` of each row (a Python call per row: decoding builds objects)."""
        return [self.decode_row(r) for r in rows]


def as_decoders(decoders: FieldDecoders | Mapping[str, Any] | None) -> FieldDecoders | None:
    """Validate a storage's ``decoders=`` argument; ``None`` when nothing is to be decoded.

    Args:
        decoders: a :class:`FieldDecoders`, a mapping ``{field: decoder}`` with
            fields among :data:`DECODABLE_FIELDS`, or ``None``.

    Raises:
        ConfigError: an unknown field (with a hint for ``action``/``message``),
            a decoder that is not a class or callable, or an argument of another type.
    """
    if decoders is None:
        return None
    if isinstance(decoders, FieldDecoders):
        return decoders if decoders else None
    if not isinstance(decoders, Mapping):
        raise ConfigError(
            "decoders must be a FieldDecoders or a mapping like "
            f"{{'state': Observation, 'actions': ActionModel}}, got {type(decoders).__name__}"
        )
    for key in decoders:
        if key not in DECODABLE_FIELDS:
            hint = _HINTS.get(key) if isinstance(key, str) else None
            raise ConfigError(
                f"cannot register a decoder for {key!r}: decodable fields are "
                f"{', '.join(DECODABLE_FIELDS)}" + (f"; {hint}" if hint else "")
            )
    made = FieldDecoders(**dict(decoders))
    return made if made else None
