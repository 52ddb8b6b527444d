"""Pydantic models whose JSON is their fields' values as they are: written without pydantic.

pydantic-core's serialiser costs about 1-2 us for a small model (AWorld's
``Observation``: 1.85 us), most of it its own set-up per call, where the model's
JSON is often nothing but ``{"field": value, ...}`` of plain values. For a model
class whose core schema promises exactly that, the experience encoders write the
fields from the instance's ``__dict__`` themselves (the compiled
``replaystore._jsoncopy`` walk), and call the serialiser only for an instance
holding a value the walk does not write (anything but None, bool, 64-bit int,
finite float, str, list, tuple and dict with str keys, and the instances of
other such models), so what is stored is what pydantic writes.

A class qualifies (:func:`plain_fields`) when every node of its core schema
serialises a value as JSON infers it:

* ``any``, ``str``, ``int``, ``float``, ``bool``, ``none``, ``literal`` of JSON
  values, a plain validator function (serialised as ``any``);
* ``default``, ``nullable`` and the before/after/wrap validator functions around
  such a schema; ``list``, ``dict`` (str keys) and ``union`` of such schemas;
* a nested model (``model``, or a reference to one) that qualifies itself,

and no node carries a custom serialiser (``serialization``: ``@field_serializer``,
``@model_serializer``, ``PlainSerializer``...), no field an alias or an exclusion,
no model computed fields, extra fields kept (``extra="allow"``) or a root model.
Datetimes, enums, UUIDs, bytes, tuples, sets, dataclasses and the like do not
qualify: their JSON is not their Python value.

One thing the schema cannot promise: a field typed as a model class ``C`` holding
an instance of a subclass of ``C`` is written by pydantic as a ``C`` (the
subclass's own fields left out). So a class whose fields are typed with model
classes qualifies only while none of those has a subclass: :func:`typed_models`
names them, and the encoders check them before each batch.

Also left to pydantic's own path: a field given a value of another type after
validation (``model.count = True`` on an ``int`` field, which pydantic warns about
when it serialises it) is written here as the value is (``true``, where pydantic
may write ``1``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["plain_fields", "typed_models"]

# Schema types serialised by value inference, exactly as the walk writes the value.
_AS_VALUE = frozenset({"any", "str", "int", "float", "bool", "none", "function-plain"})
# Schema types serialised as their inner "schema".
_AROUND = frozenset({"default", "nullable", "function-after", "function-before", "function-wrap"})
# A model-field's keys that change what is written.
_FIELD_KEYS = ("serialization_alias", "serialization_exclude", "serialization_exclude_if")


class _Walk:
    """One class's schema, walked once; ``typed`` collects the nested model classes."""

    def __init__(self) -> None:
        self.definitions: dict[str, Any] = {}
        self.typed: set[type] = set()
        self.visiting: set[str] = set()

    def node(self, node: Any) -> bool:
        if not isinstance(node, dict) or "serialization" in node:
            return False
        kind = node.get("type")
        if kind in _AS_VALUE:
            return True
        if kind in _AROUND:
            return self.node(node.get("schema"))
        if kind == "literal":
            return all(type(v) in (str, int, bool, type(None)) for v in node.get("expected", ()))
        if kind == "list":
            return self.node(node.get("items_schema", {"type": "any"}))
        if kind == "dict":
            keys = node.get("keys_schema", {"type": "any"})
            return (
                isinstance(keys, dict)
                and keys.get("type") in ("str", "any")
                and "serialization" not in keys
                and self.node(node.get("values_schema", {"type": "any"}))
            )
        if kind == "union":
            choices = node.get("choices", ())
            return bool(choices) and all(
                self.node(c[0] if isinstance(c, tuple) else c) for c in choices
            )
        if kind == "definitions":
            for definition in node.get("definitions", ()):
                ref = definition.get("ref") if isinstance(definition, dict) else None
                if ref is None:
                    return False
                self.definitions[ref] = definition
            return self.node(node.get("schema"))
        if kind == "definition-ref":
            ref = str(node.get("schema_ref"))
            target = self.definitions.get(ref)
            if ref in self.visiting:  # recursion: the model is being walked already
                if isinstance(target, dict) and isinstance(target.get("cls"), type):
                    self.typed.add(target["cls"])
                return True
            return target is not None and self.node(target)
        if kind == "model":
            return self.model(node, nested=True)
        return False

    def model(self, node: dict[str, Any], nested: bool) -> bool:
        if "serialization" in node or node.get("root_model"):
            return False
        config = node.get("config") or {}
        if config.get("extra_fields_behavior") == "allow":
            return False
        cls = node.get("cls")
        if not isinstance(cls, type):
            return False
        if nested:
            self.typed.add(cls)
        ref = node.get("ref")
        if ref is not None:
            if ref in self.visiting:
                return True
            self.visiting.add(ref)
        fields = node.get("schema")
        if not isinstance(fields, dict) or fields.get("type") != "model-fields":
            return False
        if fields.get("computed_fields") or "serialization" in fields:
            return False
        if fields.get("extra_behavior") == "allow":
            return False
        for spec in fields.get("fields", {}).values():
            if not isinstance(spec, dict) or spec.get("type") != "model-field":
                return False
            if any(spec.get(key) for key in _FIELD_KEYS) or "serialization" in spec:
                return False
            if not self.node(spec.get("schema")):
                return False
        return True


# class -> (field names, typed model classes) or None; worked out once per class
_SEEN: dict[type, tuple[tuple[str, ...], frozenset[type]] | None] = {}


def _analyse(cls: type) -> tuple[tuple[str, ...], frozenset[type]] | None:
    found = _SEEN.get(cls, False)
    if found is not False:
        return found  # type: ignore[return-value]
    result = None
    schema = getattr(cls, "__pydantic_core_schema__", None)
    fields = getattr(cls, "__pydantic_fields__", None)
    if (
        isinstance(schema, dict)
        and isinstance(fields, dict)
        and getattr(cls, "__pydantic_complete__", False)
    ):
        walk = _Walk()
        root: Any = schema
        if schema.get("type") == "definitions":
            for definition in schema.get("definitions", ()):
                if isinstance(definition, dict) and "ref" in definition:
                    walk.definitions[definition["ref"]] = definition
            root = schema.get("schema")
            if isinstance(root, dict) and root.get("type") == "definition-ref":
                root = walk.definitions.get(str(root.get("schema_ref")))
        if (
            isinstance(root, dict)
            and root.get("type") == "model"
            and root.get("cls") is cls
            and walk.model(root, nested=False)
        ):
            names = tuple(root["schema"]["fields"])
            if names == tuple(fields):
                result = (names, frozenset(walk.typed))
    _SEEN[cls] = result
    return result


def plain_fields(cls: type) -> tuple[str, ...] | None:
    """The field names of a pydantic model class whose JSON is ``{name: value, ...}``
    of its fields' values as they are (see the module docstring), or None."""
    found = _analyse(cls)
    return None if found is None else found[0]


def typed_models(cls: type) -> frozenset[type]:
    """The model classes ``cls``'s fields are typed with (nested, at any depth; ``cls``
    itself when it refers to itself): while one of them has a subclass, ``cls`` is
    written by pydantic's serialiser. Empty for a class :func:`plain_fields` refuses."""
    found = _analyse(cls)
    return frozenset() if found is None else found[1]
