"""QueryBuilder output, precedence, validation, and evaluator semantics."""

from __future__ import annotations

from typing import get_args, get_type_hints

import pytest

from replaystore.errors import QueryError
from replaystore.experience import InMemoryStorage, QueryBuilder
from replaystore.experience.query import OPS, compile_predicate, compile_sql
from replaystore.experience.query_filter import BaseCondition
from replaystore.view.experience import FILTER_OPS

from .helpers import make_row

A = {"field": "exp_meta.agent_id", "value": "a", "op": "eq"}
B = {"field": "exp_meta.agent_id", "value": "b", "op": "eq"}
C = {"field": "exp_meta.step", "value": 1, "op": "gt"}


def q():
    return QueryBuilder()


def test_and_binds_tighter_than_or():
    cond = (
        q()
        .eq("exp_meta.agent_id", "a")
        .or_()
        .eq("exp_meta.agent_id", "b")
        .and_()
        .gt("exp_meta.step", 1)
        .build()
    )
    assert cond == {"or_": [A, {"and_": [B, C]}]}


def test_or_then_and_then_or_groups_the_middle():
    cond = (
        q()
        .eq("exp_meta.agent_id", "a")
        .and_()
        .gt("exp_meta.step", 1)
        .or_()
        .eq("exp_meta.agent_id", "b")
        .build()
    )
    assert cond == {"or_": [{"and_": [A, C]}, B]}


def test_in_writes_the_seed_operator_name():
    assert q().in_("exp_meta.agent_id", ["a", "b"]).build()["op"] == "in"


def test_every_verb_builds_a_leaf():
    f = "exp_data.reward_t"
    built = [
        q().eq(f, 1),
        q().ne(f, 1),
        q().gt(f, 1),
        q().gte(f, 1),
        q().lt(f, 1),
        q().lte(f, 1),
        q().in_(f, [1]),
        q().not_in(f, [1]),
        q().like("exp_meta.agent_id", "x"),
        q().not_like("exp_meta.agent_id", "x"),
        q().is_null(f),
        q().is_not_null(f),
    ]
    ops = [b.build()["op"] for b in built]
    assert ops == list(OPS)


def test_one_operator_list_serves_the_builder_the_aworld_types_and_the_viewer_form():
    assert OPS == (
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
    )
    assert get_args(get_type_hints(BaseCondition)["op"]) == OPS
    assert FILTER_OPS is OPS


def test_empty_builder_builds_none_meaning_all_rows():
    assert q().build() is None


@pytest.mark.parametrize(
    "make",
    [
        lambda: q().eq("exp_meta.task_id", "1").and_().build(),  # dangling and_()
        lambda: q().and_(),
        lambda: q().eq("exp_meta.task_id", "1").or_().or_(),
        lambda: q().eq("exp_meta.task_id", "1").eq("exp_meta.task_id", "2"),
        lambda: q().eq("exp_metadata.task_id", "1"),  # unknown top-level field
        lambda: q().eq("exp_meta.nope", "1"),
        lambda: q().eq("exp_data.nope", "1"),
        lambda: q().in_("exp_meta.task_id", "abc"),  # wrong value type for in_
        lambda: q().in_("exp_meta.task_id", 5),
        lambda: q().eq("exp_meta.task_id", None),
        lambda: q().eq("exp_meta.task_id", {"a": 1}),
        lambda: q().gt("exp_meta.step", True),
        lambda: q().like("exp_meta.task_id", 3),
        lambda: q().nested(q()),
    ],
)
def test_malformed_conditions_raise_query_error(make):
    with pytest.raises(QueryError):
        make()


@pytest.mark.parametrize(
    "cond",
    [
        {"field": "exp_meta.task_id", "op": "similar", "value": "x"},
        {"field": "task", "op": "eq", "value": "x"},  # neither a path nor a bare meta name
        {"and_": []},
        {"and_": [A], "or_": [B]},
        {"field": "exp_meta.task_id", "op": "eq"},
        "exp_meta.task_id = 1",
    ],
)
def test_malformed_condition_dicts_raise_query_error_in_every_entry_point(cond, tmp_path):
    with pytest.raises(QueryError):
        compile_predicate(cond)
    with pytest.raises(QueryError):
        compile_sql(cond)
    with pytest.raises(QueryError):
        InMemoryStorage().get_all(cond)


def test_in_underscore_is_accepted_as_operator_name():
    row = make_row(agent_id="a")
    assert compile_predicate({"field": "exp_meta.agent_id", "op": "in_", "value": ["a"]})(row)


def _match(cond, row):
    return compile_predicate(cond.build() if isinstance(cond, QueryBuilder) else cond)(row)


def test_missing_and_none_values_compare_false_without_raising():
    row = make_row(agent_id=None, state={"url": None})
    for field in ("exp_meta.agent_id", "exp_data.state.url", "exp_data.state.nothing.deeper"):
        for b in (
            q().eq(field, "x"),
            q().ne(field, "x"),
            q().gt(field, 1),
            q().lt(field, "z"),
            q().in_(field, ["x"]),
            q().not_in(field, ["x"]),
            q().like(field, "x"),
            q().not_like(field, "x"),
            q().is_not_null(field),
        ):
            assert not _match(b, row), (field, b.build())
        assert _match(q().is_null(field), row)


def test_comparisons_across_kinds_are_false_and_negations_true():
    row = make_row(state={"n": 3, "s": "3", "flag": True, "xs": [1, 2]})
    assert not _match(q().eq("exp_data.state.n", "3"), row)
    assert _match(q().eq("exp_data.state.n", 3.0), row)
    assert not _match(q().eq("exp_data.state.flag", 1), row)
    assert _match(q().eq("exp_data.state.flag", True), row)
    assert not _match(q().gt("exp_data.state.s", 1), row)
    assert _match(q().ne("exp_data.state.s", 3), row)
    assert _match(q().ne("exp_data.state.xs", 1), row)


def test_dotted_paths_reach_into_payload_and_list_items():
    row = make_row(state={"page": {"url": "https://example.org/a"}})
    assert _match(q().like("exp_data.state.page.url", "example.org"), row)
    assert _match(q().eq("exp_data.actions.0.a", 0), row)
    assert not _match(q().eq("exp_data.actions.5.a", 0), row)


def test_like_is_case_sensitive_substring_not_a_pattern():
    row = make_row(agent_id="Agent_%1")
    assert _match(q().like("exp_meta.agent_id", "_%"), row)
    assert not _match(q().like("exp_meta.agent_id", "agent"), row)


def test_sql_binds_values_as_parameters():
    evil = "x'); DROP TABLE rows; --"
    sql, params = compile_sql(
        q().eq("exp_meta.agent_id", evil).or_().like("exp_data.state.url", evil).build()
    )
    assert evil not in sql
    assert params.count(evil) == 2


def test_numpy_values_become_python_values():
    import numpy as np

    assert q().eq("exp_meta.step", np.int64(3)).build()["value"] == 3
    assert q().in_("exp_meta.step", np.array([1, 2])).build()["value"] == [1, 2]
    assert type(q().gt("exp_data.reward_t", np.float32(0.5)).build()["value"]) is float
