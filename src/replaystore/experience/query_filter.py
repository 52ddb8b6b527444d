"""AWorld's ``aworld.replay_buffer.query_filter``: :class:`QueryBuilder`, :class:`QueryFilter`.

``from aworld.replay_buffer.query_filter import QueryBuilder, QueryFilter`` becomes
``from replaystore.experience.query_filter import QueryBuilder, QueryFilter``.

:class:`QueryFilter` tests rows held in Python (a list of
:class:`~replaystore.experience.rows.DataRow`, or any object with ``exp_meta``
and ``exp_data`` attributes) against a condition dict, as AWorld's in-memory
storage does. It uses the evaluator every storage of ours uses, so a condition
selects the same rows here as in ``InMemoryStorage``, ``SqliteStorage`` and
``PostgresStorage`` (see :mod:`replaystore.experience.query` for the semantics;
bare metadata names such as ``"task_id"`` mean ``"exp_meta.task_id"``).
Where it differs from AWorld's: a malformed condition raises
:class:`~replaystore.errors.QueryError` when the filter is made (AWorld's
returns False per row), and comparisons across kinds (``"1"`` against ``1``) or
with a missing value are false instead of raising ``TypeError``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypedDict, TypeVar, Union

from replaystore.experience.query import Condition, Operator, QueryBuilder, compile_predicate

__all__ = [
    "BaseCondition",
    "LogicalCondition",
    "QueryBuilder",
    "QueryCondition",
    "QueryFilter",
]

Row = TypeVar("Row")


class BaseCondition(TypedDict, total=False):
    """A leaf: ``{"field": ..., "op": ..., "value": ...}`` (no value for the null tests)."""

    field: str
    value: Any
    op: Operator


class LogicalCondition(TypedDict, total=False):
    """``{"and_": [...]}`` or ``{"or_": [...]}`` (exactly one of the two keys)."""

    and_: list[Any]
    or_: list[Any]


QueryCondition = Union[BaseCondition, LogicalCondition]  # noqa: UP007 - AWorld's alias, kept
"""A condition dict, as :meth:`QueryBuilder.build` returns it (``None`` means every row)."""


class QueryFilter:
    """Test rows in memory against one condition.

    Args:
        query_condition: a condition dict (or ``None``: every row matches), or a
            :class:`QueryBuilder` (its ``build()`` is used).

    Raises:
        QueryError: the condition is malformed (unknown field or operator, a value
            of the wrong type); raised here, before any row is looked at.

    Cost: building compiles the condition once; each row test is a few
    attribute reads per leaf.
    """

    def __init__(self, query_condition: Condition | QueryBuilder | None) -> None:
        if isinstance(query_condition, QueryBuilder):
            query_condition = query_condition.build()
        self.query_condition = query_condition
        # Any object with exp_meta/exp_data attributes works, not only DataRow.
        self._predicate: Callable[[Any], bool] = compile_predicate(query_condition)

    def check_condition(self, row: Any) -> bool:
        """True when ``row`` (a ``DataRow``-shaped object) matches the condition."""
        return bool(self._predicate(row))

    def filter(self, rows: Iterable[Row]) -> list[Row]:
        """The rows that match, in their order (all of them when the condition is ``None``)."""
        if self.query_condition is None:
            return list(rows)
        predicate = self._predicate
        return [row for row in rows if predicate(row)]
