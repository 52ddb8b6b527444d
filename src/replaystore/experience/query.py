"""Query conditions: :class:`QueryBuilder`, validation, an in-memory evaluator and a SQL compiler.

A condition is AWorld's dict form, so conditions built elsewhere work too:

* a leaf ``{"field": "exp_meta.agent_id", "op": "eq", "value": "a1"}``;
* ``{"and_": [cond, cond, ...]}`` and ``{"or_": [cond, cond, ...]}``;
* ``None``: every row.

Fields are dotted paths: ``id``, ``exp_meta.<meta field>`` and
``exp_data.<payload field>[.<key>...]`` into the stored JSON (a segment of
digits indexes a list: ``exp_data.actions.0.name``). A bare metadata name
(``task_id``, ``task_name``, ``agent_id``, ``step``, ``execute_time``,
``pre_agent``), as AWorld's own query examples write it, means
``exp_meta.<name>`` in every storage; the condition dict keeps the name as
written.

Semantics (the same in every storage; the evaluator and the SQL compiler are
tested against each other):

* A missing or ``None`` value makes every comparison false, ``ne``, ``not_in``
  and ``not_like`` included; only ``is_null`` is true for it.
* ``eq``/``in`` compare like JSON values of the same kind: numbers with
  numbers (``1 == 1.0``), strings with strings, booleans with booleans;
  ``gt``/``gte``/``lt``/``lte`` order numbers or strings (by code point) and are
  false across kinds or against lists/objects.
* ``ne``, ``not_in``, ``not_like`` are true exactly when the value is present
  (not missing, not None) and ``eq``, ``in``, ``like`` is false.
* ``like`` is a case-sensitive substring test on strings.
* In :class:`QueryBuilder`, AND binds tighter than OR; ``nested()`` groups.
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, get_args

import numpy as np

from replaystore.errors import QueryError
from replaystore.experience.rows import META_FIELDS, PAYLOAD_FIELDS, DataRow, to_json_value

__all__ = [
    "OPS",
    "Condition",
    "Operator",
    "QueryBuilder",
    "canonical_field",
    "compile_predicate",
    "compile_sql",
    "validate_condition",
]

Condition = dict[str, Any]

Operator = Literal[
    "eq",
    "ne",
    "gt",
    "gte",
    "lt",
    "lte",
    "in",
    "not_in",
    "like",
    "not_like",
    "is_null",
    "is_not_null",
]
"""A leaf condition's ``op``, as a type (AWorld's ``BaseCondition.op``)."""

OPS: tuple[str, ...] = get_args(Operator)
"""Leaf operators. ``in`` is what ``QueryBuilder.in_`` writes (as AWorld does); ``in_`` is
accepted as a spelling of it."""

_ORDER_OPS = {"gt": operator.gt, "gte": operator.ge, "lt": operator.lt, "lte": operator.le}
_SQL_ORDER = {"gt": ">", "gte": ">=", "lt": "<", "lte": "<="}
_SCALAR_TYPES = (str, int, float, bool)
_MISSING = object()


class QueryBuilder:
    """Build a condition dict fluently, as AWorld's ``QueryBuilder`` does.

    >>> QueryBuilder().eq("exp_meta.task_id", "123").and_().eq("exp_meta.agent_id", "456").build()
    {'and_': [{'field': 'exp_meta.task_id', 'value': '123', 'op': 'eq'}, \
{'field': 'exp_meta.agent_id', 'value': '456', 'op': 'eq'}]}

    Conditions are joined by ``and_()``/``or_()`` between them; AND binds
    tighter than OR (``a OR b AND c`` is ``a OR (b AND c)``), and
    ``nested(builder)`` inserts a parenthesised group. Each verb checks its
    field and value at once and raises :class:`~replaystore.errors.QueryError`.
    """

    def __init__(self) -> None:
        self.conditions: list[Condition] = []
        self.logical_ops: list[str] = []

    def _leaf(self, field: str, op: str, value: Any = _MISSING) -> QueryBuilder:
        value = _plain(value)
        if isinstance(value, list | tuple):
            value = [_plain(v) for v in value]
        cond: Condition = {"field": field, "op": op}
        if value is not _MISSING:
            cond = {"field": field, "value": value, "op": op}
        validate_condition(cond)
        self._push(cond)
        return self

    def _push(self, cond: Condition) -> None:
        if len(self.conditions) > len(self.logical_ops):
            raise QueryError(
                f"two conditions in a row without and_()/or_() between them (before {cond!r})"
            )
        self.conditions.append(cond)

    def eq(self, field: str, value: Any) -> QueryBuilder:
        """Rows whose ``field`` equals ``value`` (a string, number or bool)."""
        return self._leaf(field, "eq", value)

    def ne(self, field: str, value: Any) -> QueryBuilder:
        """Rows whose ``field`` is present and differs from ``value``."""
        return self._leaf(field, "ne", value)

    def gt(self, field: str, value: Any) -> QueryBuilder:
        """Rows whose ``field`` is greater than ``value`` (number or string)."""
        return self._leaf(field, "gt", value)

    def gte(self, field: str, value: Any) -> QueryBuilder:
        """Rows whose ``field`` is greater than or equal to ``value``."""
        return self._leaf(field, "gte", value)

    def lt(self, field: str, value: Any) -> QueryBuilder:
        """Rows whose ``field`` is less than ``value``."""
        return self._leaf(field, "lt", value)

    def lte(self, field: str, value: Any) -> QueryBuilder:
        """Rows whose ``field`` is less than or equal to ``value``."""
        return self._leaf(field, "lte", value)

    def in_(self, field: str, value: Sequence[Any]) -> QueryBuilder:
        """Rows whose ``field`` equals one of ``value`` (a list/tuple/set of scalars)."""
        return self._leaf(field, "in", list(value) if isinstance(value, set | frozenset) else value)

    def not_in(self, field: str, value: Sequence[Any]) -> QueryBuilder:
        """Rows whose ``field`` is present and equals none of ``value``."""
        return self._leaf(
            field, "not_in", list(value) if isinstance(value, set | frozenset) else value
        )

    def like(self, field: str, value: str) -> QueryBuilder:
        """Rows whose ``field`` is a string containing ``value`` (case-sensitive)."""
        return self._leaf(field, "like", value)

    def not_like(self, field: str, value: str) -> QueryBuilder:
        """Rows whose ``field`` is present and is not a string containing ``value``."""
        return self._leaf(field, "not_like", value)

    def is_null(self, field: str) -> QueryBuilder:
        """Rows where ``field`` is missing or None."""
        return self._leaf(field, "is_null")

    def is_not_null(self, field: str) -> QueryBuilder:
        """Rows where ``field`` is present and not None."""
        return self._leaf(field, "is_not_null")

    def _logical(self, op: str) -> QueryBuilder:
        if len(self.logical_ops) >= len(self.conditions):
            where = "at the start" if not self.conditions else "right after another and_()/or_()"
            raise QueryError(f"{op}() {where}: put a condition before it")
        self.logical_ops.append(op)
        return self

    def and_(self) -> QueryBuilder:
        """Join the previous and the next condition with AND."""
        return self._logical("and_")

    def or_(self) -> QueryBuilder:
        """Join the previous and the next condition with OR."""
        return self._logical("or_")

    def nested(self, builder: QueryBuilder) -> QueryBuilder:
        """Insert ``builder``'s whole condition as one parenthesised operand."""
        if not isinstance(builder, QueryBuilder):
            raise QueryError(f"nested() takes a QueryBuilder, got {type(builder).__name__}")
        inner = builder.build()
        if inner is None:
            raise QueryError("nested() got an empty QueryBuilder")
        self._push(inner)
        return self

    def build(self) -> Condition | None:
        """The condition dict (``None`` when no condition was added).

        Raises:
            QueryError: a dangling ``and_()``/``or_()`` with no condition after it.
        """
        if not self.conditions:
            if self.logical_ops:
                raise QueryError("and_()/or_() with no conditions")
            return None
        if len(self.logical_ops) != len(self.conditions) - 1:
            raise QueryError(
                f"dangling {self.logical_ops[-1]}(): {len(self.conditions)} condition(s) "
                f"but {len(self.logical_ops)} and_()/or_(); add a condition after it"
            )
        groups: list[list[Condition]] = [[self.conditions[0]]]
        for op, cond in zip(self.logical_ops, self.conditions[1:], strict=True):
            if op == "and_":
                groups[-1].append(cond)
            else:
                groups.append([cond])
        terms = [g[0] if len(g) == 1 else {"and_": list(g)} for g in groups]
        return terms[0] if len(terms) == 1 else {"or_": terms}


def _plain(value: Any) -> Any:
    """NumPy values as Python ones (``np.int64(3)`` -> ``3``, arrays -> lists); else unchanged."""
    if isinstance(value, np.generic | np.ndarray):
        return value.tolist()
    return value


def _parse_field(field: Any) -> tuple[str, tuple[str, ...]]:
    """Split a dotted field into (root, rest), checking it names something a row has."""
    if not isinstance(field, str) or not field:
        raise QueryError(f"field must be a non-empty dotted string, got {field!r}")
    parts = tuple(field.split("."))
    if any(not p for p in parts):
        raise QueryError(f"field {field!r} has an empty segment")
    root = parts[0]
    if len(parts) == 1 and root in META_FIELDS:
        # AWorld's own examples write bare names ("task_id"); its Redis and ODPS storages
        # read a field's last segment, so "task_id" is "exp_meta.task_id" everywhere.
        return "exp_meta", parts
    if root == "id":
        if len(parts) != 1:
            raise QueryError(f"field {field!r}: 'id' has no sub-fields")
    elif root == "exp_meta":
        if len(parts) != 2 or parts[1] not in META_FIELDS:
            raise QueryError(
                f"unknown field {field!r}: exp_meta fields are {', '.join(META_FIELDS)}"
            )
    elif root == "exp_data":
        if len(parts) < 2 or parts[1] not in PAYLOAD_FIELDS:
            raise QueryError(
                f"unknown field {field!r}: exp_data fields are {', '.join(PAYLOAD_FIELDS)}"
            )
        if any('"' in p or "\\" in p or not p.isprintable() for p in parts):
            raise QueryError(
                f"field {field!r}: segments may not contain '\"', '\\' or control characters"
            )
    else:
        raise QueryError(
            f"unknown field {field!r}: a field starts with exp_meta, exp_data or id, "
            f"or is a bare metadata name ({', '.join(META_FIELDS)})"
        )
    return root, parts[1:]


def canonical_field(field: str) -> str:
    """``field`` in its full dotted form: a bare metadata name gets its ``exp_meta.`` prefix.

    ``canonical_field("task_id")`` is ``"exp_meta.task_id"``; any other valid
    field comes back unchanged. Storages use it to recognise indexed fields.

    Raises:
        QueryError: ``field`` names nothing a row has.
    """
    root, rest = _parse_field(field)
    return ".".join((root, *rest))


def _check_scalar(value: Any, op: str, field: str) -> None:
    if value is None:
        raise QueryError(
            f"{op} on {field!r} with value None: a comparison with None is always false; "
            "use is_null/is_not_null"
        )
    if not isinstance(value, _SCALAR_TYPES):
        raise QueryError(
            f"{op} on {field!r}: value must be a string, number or bool, got {type(value).__name__}"
        )
    if isinstance(value, float) and value != value:
        raise QueryError(f"{op} on {field!r}: value is NaN")


def validate_condition(cond: Any, *, _depth: int = 0) -> None:
    """Check a condition dict; raise :class:`QueryError` naming what is wrong.

    ``None`` (no condition) is valid. Checks: known operators and fields, a
    value of the right type for the operator, non-empty ``and_``/``or_`` lists.
    """
    if cond is None and _depth == 0:
        return
    if _depth > 100:
        raise QueryError("condition is nested more than 100 levels deep")
    if not isinstance(cond, Mapping):
        raise QueryError(f"a condition must be a dict, got {type(cond).__name__}: {cond!r}")
    if "and_" in cond or "or_" in cond:
        if len(cond) != 1:
            raise QueryError(f"a logical condition has exactly one key, got {sorted(cond)}")
        key = next(iter(cond))
        items = cond[key]
        if not isinstance(items, list | tuple) or not items:
            raise QueryError(f"{key} needs a non-empty list of conditions, got {items!r}")
        for item in items:
            validate_condition(item, _depth=_depth + 1)
        return
    if "field" not in cond or "op" not in cond:
        raise QueryError(
            f"a condition is {{'field', 'op'[, 'value']}} or {{'and_'|'or_': [...]}}, "
            f"got keys {sorted(cond)}"
        )
    extra = set(cond) - {"field", "op", "value"}
    if extra:
        raise QueryError(f"unknown key(s) {sorted(extra)} in condition {cond!r}")
    op = cond["op"]
    field = cond["field"]
    if op == "in_":
        op = "in"
    if op not in OPS:
        raise QueryError(f"unknown operator {op!r} on {field!r}; operators: {', '.join(OPS)}")
    _parse_field(field)
    if op in ("is_null", "is_not_null"):
        return
    if "value" not in cond:
        raise QueryError(f"{op} on {field!r} needs a value")
    value = cond["value"]
    if op in ("in", "not_in"):
        if isinstance(value, str | bytes | Mapping) or not isinstance(value, list | tuple):
            raise QueryError(
                f"{op} on {field!r}: value must be a list or tuple of values, "
                f"got {type(value).__name__}"
            )
        for item in value:
            _check_scalar(item, op, field)
    elif op in ("like", "not_like"):
        if not isinstance(value, str):
            raise QueryError(f"{op} on {field!r}: value must be a string, got {value!r}")
    else:
        _check_scalar(value, op, field)
        if op in _ORDER_OPS and isinstance(value, bool):
            raise QueryError(f"{op} on {field!r}: booleans are not ordered")


# ----------------------------------------------------------------------------- evaluator


def _kind(value: Any) -> str:
    if value is None or value is _MISSING:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "num"
    if isinstance(value, str):
        return "str"
    return "container"


def _getter(field: str) -> Callable[[DataRow], Any]:
    root, rest = _parse_field(field)
    if root == "id":
        return lambda row: row.id
    if root == "exp_meta":
        name = rest[0]
        return lambda row: getattr(row.exp_meta, name)
    head, path = rest[0], rest[1:]

    def get(row: DataRow) -> Any:
        # The value as the JSON-storing storages hold it: plain dicts (str keys),
        # lists and scalars are read as they are; anything else on the path (a
        # pydantic model, a dataclass, a tuple, a dict with other keys, a NumPy
        # value) is first converted as it would be stored (to_json_value).
        cur = getattr(row.exp_data, head)
        for seg in path:
            cls = type(cur)
            if cls is not list and (cls is not dict or {*map(type, cur)} - _STR_KEYS):
                if cls in _SCALARS or cur is _MISSING:
                    return _MISSING
                cur = to_json_value(cur, f"row {row.id!r}: {field}")
                cls = type(cur)
            if cls is dict:
                cur = cur.get(seg, _MISSING)
            elif cls is list and seg.isdigit() and seg.isascii():
                i = int(seg)
                cur = cur[i] if i < len(cur) else _MISSING
            else:
                return _MISSING
        if type(cur) not in _JSON_TYPES and cur is not _MISSING:
            cur = to_json_value(cur, f"row {row.id!r}: {field}")
        return cur

    return get


_STR_KEYS = frozenset({str})
_SCALARS = frozenset({str, int, float, bool, type(None)})
# Values read as they are (containers are never equal to a query value, whatever they hold).
_JSON_TYPES = _SCALARS | {dict, list, tuple}


def _same(a: Any, b: Any) -> bool:
    return _kind(a) == _kind(b) and a == b


def _leaf_predicate(cond: Mapping[str, Any]) -> Callable[[DataRow], bool]:
    get = _getter(cond["field"])
    op = "in" if cond["op"] == "in_" else cond["op"]
    value: Any = cond.get("value")
    if op == "is_null":
        return lambda row: _kind(get(row)) == "null"
    if op == "is_not_null":
        return lambda row: _kind(get(row)) != "null"
    if op == "eq":
        return lambda row: _same(get(row), value)
    if op == "ne":
        return lambda row: _kind(x := get(row)) != "null" and not _same(x, value)
    if op in ("in", "not_in"):
        values = list(value)
        positive = op == "in"
        return lambda row: (
            (x := get(row)) is not _MISSING
            and x is not None
            and any(_same(x, v) for v in values) == positive
        )
    if op in ("like", "not_like"):
        positive = op == "like"
        return lambda row: (
            _kind(x := get(row)) != "null" and (isinstance(x, str) and value in x) == positive
        )
    compare = _ORDER_OPS[op]
    want = _kind(value)
    return lambda row: _kind(x := get(row)) == want and compare(x, value)


def compile_predicate(cond: Condition | None) -> Callable[[DataRow], bool]:
    """A function ``row -> bool`` for ``cond`` (validated first; ``None`` matches every row).

    Raises:
        QueryError: ``cond`` is malformed.
    """
    validate_condition(cond)
    if cond is None:
        return lambda row: True
    return _compile(cond)


def _compile(cond: Mapping[str, Any]) -> Callable[[DataRow], bool]:
    if "and_" in cond:
        parts = [_compile(c) for c in cond["and_"]]
        return lambda row: all(p(row) for p in parts)
    if "or_" in cond:
        parts = [_compile(c) for c in cond["or_"]]
        return lambda row: any(p(row) for p in parts)
    return _leaf_predicate(cond)


# ----------------------------------------------------------------------------- SQL


_TEXT_COLUMNS = {"id", "task_id", "task_name", "agent_id", "pre_agent"}
_NUMBER_COLUMNS = {"step", "execute_time"}


def _json_path(path: Sequence[str]) -> str:
    out = ["$"]
    for seg in path:
        if seg.isdigit() and seg.isascii():
            out.append(f"[{int(seg)}]")
        else:
            out.append(f'."{seg}"')
    return "".join(out)


def compile_sql(
    cond: Condition | None, payload_column: str = "data", *, dialect: str = "sqlite"
) -> tuple[str, list[Any]]:
    """Compile ``cond`` to a ``WHERE`` expression and its bound parameters.

    Metadata fields map to the columns of the same name, ``id`` to ``id``, payload
    paths to ``payload_column``. Values and JSON path segments are always bound
    parameters; only whitelisted column names and fixed SQL text are written
    into the expression.

    Args:
        cond: a condition dict (validated first) or ``None`` (every row).
        payload_column: the column holding the payload JSON.
        dialect: ``"sqlite"`` (``?`` placeholders, ``json_extract``/``json_type`` on
            JSON text) or ``"postgresql"`` (``%s`` placeholders for psycopg,
            ``->``/``#>`` and ``jsonb_typeof`` on a JSONB column, string order by
            code point with ``COLLATE "C"``).

    Raises:
        QueryError: ``cond`` is malformed or ``dialect`` is unknown.
    """
    validate_condition(cond)
    if dialect == "postgresql":
        if cond is None:
            return "TRUE", []
        pg_params: list[Any] = []
        return _pg_sql(cond, pg_params, payload_column), pg_params
    if dialect != "sqlite":
        raise QueryError(f"unknown SQL dialect {dialect!r}; dialects: sqlite, postgresql")
    if cond is None:
        return "1", []
    params: list[Any] = []
    sql = _sql(cond, params, payload_column)
    return sql, params


def _sql(cond: Mapping[str, Any], params: list[Any], col: str) -> str:
    if "and_" in cond:
        return "(" + " AND ".join(_sql(c, params, col) for c in cond["and_"]) + ")"
    if "or_" in cond:
        return "(" + " OR ".join(_sql(c, params, col) for c in cond["or_"]) + ")"
    root, rest = _parse_field(cond["field"])
    op = "in" if cond["op"] == "in_" else cond["op"]
    if root == "exp_data":
        return _sql_json(op, cond.get("value"), _json_path(rest[1:]), rest[0], params, col)
    return _sql_column(op, cond.get("value"), "id" if root == "id" else rest[0], params)


def _sql_column(op: str, value: Any, column: str, params: list[Any]) -> str:
    """Leaf on a typed column: text columns hold str or NULL, number columns never NULL."""
    kind = "str" if column in _TEXT_COLUMNS else "num"
    if op == "is_null":
        return f"({column} IS NULL)"
    if op == "is_not_null":
        return f"({column} IS NOT NULL)"
    present = f"({column} IS NOT NULL)"
    if op in ("eq", "ne"):
        if _kind(value) != kind:
            return "0" if op == "eq" else present
        params.append(value)
        return f"({column} = ?)" if op == "eq" else f"({column} != ?)"
    if op in ("in", "not_in"):
        same = [v for v in value if _kind(v) == kind]
        if not same:
            return "0" if op == "in" else present
        params.extend(same)
        marks = ", ".join("?" * len(same))
        return f"({column} IN ({marks}))" if op == "in" else f"({column} NOT IN ({marks}))"
    if op in ("like", "not_like"):
        if kind != "str":
            return "0" if op == "like" else present
        params.append(value)
        return f"(instr({column}, ?) > 0)" if op == "like" else f"(instr({column}, ?) = 0)"
    if _kind(value) != kind:
        return "0"
    params.append(value)
    return f"({column} {_SQL_ORDER[op]} ?)"


def _sql_json(op: str, value: Any, path: str, field: str, params: list[Any], col: str) -> str:
    """Leaf on a JSON path of the payload; json_type says the kind, NULL when missing."""
    # The payload object's top-level key is the Experience field; the path below it follows.
    full = f'$."{field}"' + path[1:]

    def typ() -> str:
        params.append(full)
        return f"json_type({col}, ?)"

    def val() -> str:
        params.append(full)
        return f"json_extract({col}, ?)"

    def present() -> str:
        return f"(coalesce({typ()}, 'null') != 'null')"

    def kind_test(kind: str) -> str:
        if kind == "num":
            return f"({typ()} IN ('integer', 'real'))"
        if kind == "str":
            return f"({typ()} = 'text')"
        raise AssertionError(kind)

    def equal(v: Any) -> str:
        if isinstance(v, bool):
            return f"({typ()} = '{'true' if v else 'false'}')"
        test = kind_test(_kind(v))
        expr = val()
        params.append(v)
        return f"({test} AND {expr} = ?)"

    if op == "is_null":
        return f"(coalesce({typ()}, 'null') = 'null')"
    if op == "is_not_null":
        return present()
    if op == "eq":
        return equal(value)
    if op == "ne":
        p = present()
        return f"({p} AND NOT {equal(value)})"
    if op in ("in", "not_in"):
        p = present() if op == "not_in" else ""
        groups: list[str] = []
        for kind in ("num", "str"):
            same = [v for v in value if _kind(v) == kind]
            if same:
                test = kind_test(kind)
                expr = val()
                params.extend(same)
                groups.append(f"({test} AND {expr} IN ({', '.join('?' * len(same))}))")
        bools = sorted({"true" if v else "false" for v in value if isinstance(v, bool)})
        if bools:
            t = typ()
            groups.append(f"({t} IN ({', '.join(repr(b) for b in bools)}))")
        anyof = "(" + " OR ".join(groups) + ")" if groups else "0"
        if op == "in":
            return anyof
        return f"({p} AND NOT {anyof})"
    if op in ("like", "not_like"):
        p = present() if op == "not_like" else ""
        test = kind_test("str")
        expr = val()
        params.append(value)
        like = f"({test} AND instr({expr}, ?) > 0)"
        if op == "like":
            return like
        return f"({p} AND NOT {like})"
    test = kind_test(_kind(value))
    expr = val()
    params.append(value)
    return f"({test} AND {expr} {_SQL_ORDER[op]} ?)"


# ----------------------------------------------------------------------------- PostgreSQL
#
# The PostgreSQL dialect reads the payload from a JSONB column. A leaf may be NULL (a NULL
# column, a missing path) where the semantics say false: harmless, since conditions only
# combine leaves with AND/OR, under which NULL acts as FALSE, and every NOT inside a leaf
# is applied to a coalesce(..., FALSE) or after a presence test. Column leaves stay bare
# so that their indexes are used. JSON values are compared as JSONB (numbers exactly, as
# numeric; strings exactly; no equality across kinds), strings are ordered by code point
# (COLLATE "C" on UTF-8), and PostgreSQL text can hold no NUL character, so a query value
# with one is rewritten into an equivalent test without it (it equals no stored string).


def _pg_sql(cond: Mapping[str, Any], params: list[Any], col: str) -> str:
    if "and_" in cond:
        return "(" + " AND ".join(_pg_sql(c, params, col) for c in cond["and_"]) + ")"
    if "or_" in cond:
        return "(" + " OR ".join(_pg_sql(c, params, col) for c in cond["or_"]) + ")"
    root, rest = _parse_field(cond["field"])
    op = "in" if cond["op"] == "in_" else cond["op"]
    value = cond.get("value")
    if root == "exp_data":
        return _pg_json(op, value, rest, params, col)
    return _pg_column(op, value, "id" if root == "id" else rest[0], params)


def _unstorable(value: Any) -> bool:
    """True for a value no stored value can equal: an infinite float, a string with NUL."""
    if isinstance(value, float):
        return value != value or value in (float("inf"), float("-inf"))
    return isinstance(value, str) and "\x00" in value


def _pg_string_order(op: str, value: str) -> tuple[str, str]:
    """``(sql_op, bound)`` free of NUL: no stored string has one, so ``s >= "ab\\0c"``
    is ``s > "ab"`` and ``s < "ab\\0c"`` is ``s <= "ab"``."""
    cut = value.find("\x00")
    if cut < 0:
        return _SQL_ORDER[op], value
    return (">" if op in ("gt", "gte") else "<="), value[:cut]


def _pg_number_test(column: str, op: str, value: Any, integer: bool, params: list[Any]) -> str:
    """``column <op> value`` for a never-NULL number column, exact as Python's comparison.

    ``integer`` columns (BIGINT) compare with a float by rounding the bound the
    right way; float columns (DOUBLE PRECISION) compare with an int that no float
    equals by moving to the nearest float and adjusting the operator, so no
    precision is lost in a cast either way.
    """
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        if op == "eq":
            return "FALSE"
        if op in ("lt", "lte"):
            return "TRUE" if value > 0 else "FALSE"
        return "FALSE" if value > 0 else "TRUE"
    if integer and isinstance(value, float):
        if op == "eq":
            if not value.is_integer():
                return "FALSE"
            value = int(value)
        else:
            value = math.floor(value) if op in ("gt", "lte") else math.ceil(value)
    elif not integer and isinstance(value, int):
        try:
            near = float(value)
        except OverflowError:
            if op == "eq":
                return "FALSE"
            below = op in ("lt", "lte")  # every float is below a huge positive int
            return "TRUE" if below == (value > 0) else "FALSE"
        if near != value:
            if op == "eq":
                return "FALSE"
            if near > value:  # no float lies between value and near
                op = "gte" if op in ("gt", "gte") else "lt"
            else:
                op = "gt" if op in ("gt", "gte") else "lte"
        value = near
    params.append(value)
    return f"({column} {'=' if op == 'eq' else _SQL_ORDER[op]} %s)"


def _pg_column(op: str, value: Any, column: str, params: list[Any]) -> str:
    """Leaf on a typed column: TEXT columns hold str or NULL; step/execute_time never NULL."""
    text = column in _TEXT_COLUMNS
    kind = "str" if text else "num"
    present = f"({column} IS NOT NULL)"
    if op == "is_null":
        return f"({column} IS NULL)"
    if op == "is_not_null":
        return present
    if op in ("eq", "ne", "in", "not_in"):
        values = [value] if op in ("eq", "ne") else list(value)
        tests: list[str] = []
        for v in values:
            if _kind(v) != kind or _unstorable(v):
                continue
            if text:
                params.append(v)
                tests.append(f"({column} = %s)")
            else:
                test = _pg_number_test(column, "eq", v, column == "step", params)
                if test != "FALSE":
                    tests.append(test)
        anyof = "(" + " OR ".join(tests) + ")" if tests else "FALSE"
        return anyof if op in ("eq", "in") else f"({present} AND NOT {anyof})"
    if op in ("like", "not_like"):
        if not text or "\x00" in value:
            return "FALSE" if op == "like" else present
        params.append(value)
        like = f"(strpos({column}, %s) > 0)"
        return like if op == "like" else f"({present} AND NOT {like})"
    if _kind(value) != kind:
        return "FALSE"
    if text:
        sql_op, bound = _pg_string_order(op, value)
        params.append(bound)
        return f'({column} COLLATE "C" {sql_op} %s)'
    return _pg_number_test(column, op, value, column == "step", params)


def _pg_json(op: str, value: Any, path: Sequence[str], params: list[Any], col: str) -> str:
    """Leaf on a path into the JSONB payload; the path is NULL where it does not exist."""

    def node() -> str:
        # ``-> text`` follows an object key (NULL on an array); ``#> {digits}`` also
        # indexes arrays, as the evaluator does for a segment of ASCII digits.
        expr = col
        for seg in path:
            if seg.isdigit() and seg.isascii():
                params.append([seg])
                expr = f"({expr} #> %s::text[])"
            else:
                params.append(seg)
                expr = f"({expr} -> %s::text)"
        return expr

    def present() -> str:
        return f"(coalesce(jsonb_typeof({node()}), 'null') <> 'null')"

    def typed(kind: str) -> str:
        return f"(jsonb_typeof({node()}) = '{kind}')"

    def anyof(values: Sequence[Any]) -> str:
        usable = [v for v in values if not _unstorable(v)]
        if not usable:
            return "FALSE"
        expr = node()
        params.extend(_dumps_json(v) for v in usable)
        marks = ", ".join(["%s::jsonb"] * len(usable))
        return f"({expr} IN ({marks}))"

    def like() -> str:
        if "\x00" in value:
            return "FALSE"
        test = typed("string")
        expr = node()
        params.append(value)
        return f"({test} AND strpos({expr} #>> '{{}}', %s) > 0)"

    if op == "is_null":
        return f"(coalesce(jsonb_typeof({node()}), 'null') = 'null')"
    if op == "is_not_null":
        return present()
    if op in ("eq", "in"):
        return anyof([value] if op == "eq" else value)
    if op in ("ne", "not_in"):
        p = present()
        return f"({p} AND NOT coalesce({anyof([value] if op == 'ne' else value)}, FALSE))"
    if op == "like":
        return like()
    if op == "not_like":
        p = present()
        return f"({p} AND NOT coalesce({like()}, FALSE))"
    if isinstance(value, str):
        sql_op, bound = _pg_string_order(op, value)
        test = typed("string")
        expr = node()
        params.append(bound)
        return f"({test} AND ({expr} #>> '{{}}') COLLATE \"C\" {sql_op} %s)"
    if value in (float("inf"), float("-inf")):
        above = op in ("gt", "gte")
        return "FALSE" if above == (value > 0) else typed("number")
    test = typed("number")
    expr = node()
    params.append(_dumps_json(value))
    return f"({test} AND {expr} {_SQL_ORDER[op]} %s::jsonb)"


def _dumps_json(value: Any) -> str:
    """A scalar as JSON text (floats in their shortest round-trip form, as rows store them)."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False)
