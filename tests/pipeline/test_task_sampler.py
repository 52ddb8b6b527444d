"""TaskSampler: loading task files, weighted train draws, ratio strategy, ranks, test split."""

from __future__ import annotations

import csv
import json
import logging
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from replaystore.errors import SchemaError
from replaystore.pipeline.blocklist import Blocklist
from replaystore.pipeline.task_history import TaskHistory
from replaystore.pipeline.task_sampler import TaskSampler, load_tasks
from replaystore.trajectories.components import Observation, Reward, Task

LOGGER = "replaystore.pipeline.task_sampler"


def make_task(i: int, website: str = "site.com", difficulty: int = 1, level: int = 0) -> Task:
    return Task(
        task_name=f"task {i}",
        domain="shopping",
        subdomain="retail",
        website=website,
        difficulty=difficulty,
        evaluator_reference=None,
        reference_answer=None,
        attempt_level=level,
        task_id=str(i),
    )


def spread_tasks(n: int = 30, websites: int = 5, difficulties: int = 3) -> list[Task]:
    return [make_task(i, f"w{i % websites}.com", 1 + i % difficulties) for i in range(n)]


def ids(tasks: list[Task]) -> list[str]:
    return [t.task_id for t in tasks]


def row(i: int, **overrides) -> dict:
    base = {
        "task_name": f"task {i}",
        "domain": "shopping",
        "subdomain": "retail",
        "website": f"w{i}.com",
        "difficulty": 2,
        "evaluator_reference": "ref",
        "reference_answer": "answer",
        "task_id": i,
    }
    base.update(overrides)
    return base


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_csv(path: Path, header: list[str], rows: list[list]) -> Path:
    with open(path, "w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


# -- loading ------------------------------------------------------------------------------


def test_load_jsonl_keeps_file_order_and_fields(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [row(2), row(0, max_steps=15), row(1)])
    tasks = load_tasks(path)
    assert ids(tasks) == ["2", "0", "1"]
    assert tasks[1].max_steps == 15
    assert tasks[0].reference_answer == "answer"
    assert tasks[0].attempt_level == 0


def test_load_csv_parses_numbers_and_empty_cells(tmp_path: Path) -> None:
    header = [*row(0), "attempt_level", "max_steps"]
    path = write_csv(
        tmp_path / "t.csv",
        header,
        [
            ["a", "shop", "", "a.com", "3", "ref", "", "7", "2", ""],
            ["b", "shop", "x", "b.com", "hard", "", "42", "", "", "20"],
        ],
    )
    first, second = load_tasks(path)
    assert (first.difficulty, first.attempt_level, first.task_id) == (3, 2, "7")
    assert (first.subdomain, first.reference_answer, first.max_steps) == ("", None, None)
    assert (second.difficulty, second.evaluator_reference, second.task_id) == ("hard", None, None)
    assert (second.reference_answer, second.attempt_level, second.max_steps) == ("42", 0, 20)


def test_jsonl_bad_row_error_names_file_and_line(tmp_path: Path) -> None:
    missing = row(1)
    del missing["website"]
    path = write_jsonl(tmp_path / "t.jsonl", [row(0), missing])
    with pytest.raises(SchemaError, match=r"t\.jsonl line 2: missing column 'website'"):
        load_tasks(path)
    path.write_text(json.dumps(row(0)) + "\n\n{oops\n", encoding="utf-8")
    with pytest.raises(SchemaError, match=r"t\.jsonl line 3: not valid JSON"):
        load_tasks(path)


def test_csv_bad_row_error_names_file_and_line(tmp_path: Path) -> None:
    header = [*row(0), "attempt_level"]
    good = ["a", "shop", "x", "a.com", "1", "r", "a", "1", "0"]
    bad_level = ["b", "shop", "x", "b.com", "1", "r", "a", "2", "seven"]
    path = write_csv(
        tmp_path / "t.csv", header, [good, [*good[:3], "c.com", *good[4:7], "3", "1"], bad_level]
    )
    with pytest.raises(SchemaError, match=r"t\.csv line 4: 'attempt_level' must be an integer"):
        load_tasks(path)
    path = write_csv(tmp_path / "short.csv", header, [good, good[:5]])
    with pytest.raises(SchemaError, match=r"short\.csv line 3: fewer fields"):
        load_tasks(path)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"website": ""}, "'website' must be a non-empty string"),
        ({"attempt_level": 6}, r"'attempt_level' must be 0\.\.5"),
        ({"max_steps": 0}, "'max_steps' must be >= 1"),
        ({"task_id": True}, "'task_id' must be a string or integer"),
        ({"domain": None}, "'domain' must be a string"),
    ],
)
def test_jsonl_field_errors_name_the_field(tmp_path: Path, override: dict, message: str) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [row(0, **override)])
    with pytest.raises(SchemaError, match=rf"t\.jsonl line 1: {message}"):
        load_tasks(path)


def test_unknown_column_is_an_error_unless_ignored(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [row(0, intent="buy")])
    with pytest.raises(SchemaError, match="unknown column 'intent'"):
        load_tasks(path)
    assert ids(load_tasks(path, ignore_unknown_columns=True)) == ["0"]


def test_parquet_without_pyarrow_gives_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    path = tmp_path / "t.parquet"
    path.write_bytes(b"PAR1")
    with pytest.raises(ImportError, match=r"t\.parquet needs pyarrow.*pip install pyarrow"):
        load_tasks(path)


def test_parquet_loads_in_row_order(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "t.parquet"
    pq.write_table(pa.Table.from_pylist([row(1), row(0)]), path)
    assert ids(load_tasks(path)) == ["1", "0"]


def test_unknown_suffix_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"\.jsonl, \.csv or \.parquet"):
        load_tasks(tmp_path / "tasks.txt")


def test_sampler_reads_several_files_in_order(tmp_path: Path) -> None:
    a = write_jsonl(tmp_path / "a.jsonl", [row(0), row(1)])
    b = write_csv(tmp_path / "b.csv", list(row(2)), [list(row(2).values())])
    assert ids(TaskSampler([a, b]).sample_test()) == ["0", "1", "2"]


def test_duplicate_task_ids_are_rejected() -> None:
    with pytest.raises(SchemaError, match="appears twice"):
        TaskSampler([make_task(1), make_task(2), make_task(1)])


# -- test split ---------------------------------------------------------------------------


def test_test_split_is_the_first_n_tasks_in_file_order(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [row(i) for i in (5, 3, 9, 1, 7)])
    sampler = TaskSampler(path, blocklist={"w3.com"}, seed=1)
    assert ids(sampler.sample_test(3)) == ["5", "3", "9"]
    assert ids(TaskSampler(path, seed=99).sample_test(3)) == ["5", "3", "9"]
    assert ids(sampler.sample_test(3)) == ["5", "3", "9"]


@pytest.mark.parametrize("n", [None, 0, -1])
def test_test_split_takes_all_tasks_when_n_is_none_or_not_positive(n) -> None:
    sampler = TaskSampler(spread_tasks(7))
    assert ids(sampler.sample_test(n)) == [str(i) for i in range(7)]


def test_test_split_shares_across_ranks_are_disjoint_and_cover() -> None:
    sampler = TaskSampler(spread_tasks(11))
    shares = [ids(sampler.sample_test(10, rank=r, world_size=3)) for r in range(3)]
    assert shares[0] == ["0", "3", "6", "9"]
    assert sorted((i for share in shares for i in share), key=int) == [str(i) for i in range(10)]


# -- train split: ranks and seeds ---------------------------------------------------------


@pytest.mark.parametrize("strategy", ["uniform", "ratio"])
@pytest.mark.parametrize(("n", "world_size"), [(12, 3), (13, 4), (5, 8), (30, 1)])
def test_rank_shares_are_disjoint_and_cover_the_sample(strategy, n, world_size) -> None:
    sampler = TaskSampler(spread_tasks(40))
    kwargs = {"strategy": strategy, "seed": 11}
    if strategy == "ratio":
        kwargs["difficulty_ratio"] = {1: 0.5, 2: 0.3, 3: 0.2}
    full = sampler.sample_train_indices(n, **kwargs)
    shares = [
        sampler.sample_train_indices(n, rank=r, world_size=world_size, **kwargs)
        for r in range(world_size)
    ]
    together = np.concatenate(shares)
    assert len(full) == n
    assert len(set(together.tolist())) == len(together)  # disjoint
    assert sorted(together.tolist()) == sorted(full.tolist())  # covering
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_ranks_need_a_seed() -> None:
    with pytest.raises(ValueError, match="needs a seed"):
        TaskSampler(spread_tasks()).sample_train(4, rank=0, world_size=2)
    assert len(TaskSampler(spread_tasks(), seed=5).sample_train(4, rank=1, world_size=2)) == 2


@pytest.mark.parametrize(("rank", "world_size"), [(2, 2), (-1, 2), (0, 0)])
def test_bad_rank_is_rejected(rank: int, world_size: int) -> None:
    with pytest.raises(ValueError, match=r"rank|world_size"):
        TaskSampler(spread_tasks(), seed=0).sample_train(4, rank=rank, world_size=world_size)


def test_same_seed_same_sample_and_draws_are_distinct() -> None:
    sampler = TaskSampler(spread_tasks())
    first = ids(sampler.sample_train(10, seed=42))
    assert first == ids(sampler.sample_train(10, seed=42))
    assert first != ids(sampler.sample_train(10, seed=43))
    assert len(set(first)) == 10


def test_sampler_seed_gives_a_reproducible_sequence_of_draws() -> None:
    a, b = TaskSampler(spread_tasks(), seed=7), TaskSampler(spread_tasks(), seed=7)
    draws_a = [ids(a.sample_train(5)) for _ in range(3)]
    assert draws_a == [ids(b.sample_train(5)) for _ in range(3)]
    assert draws_a[0] != draws_a[1]


def test_asking_for_more_than_available_returns_all_and_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sampler = TaskSampler(spread_tasks(6), blocklist={"w0.com"})
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        drawn = sampler.sample_train(50, seed=0)
    assert sorted(ids(drawn), key=int) == ["1", "2", "3", "4"]
    assert "50 tasks requested but only 4 can be drawn" in caplog.text


# -- train split: blocked websites --------------------------------------------------------


def test_blocked_websites_are_never_drawn_for_train() -> None:
    tasks = [
        make_task(i, website) for i, website in enumerate(["a.com", "shop.b.com", "c.com"] * 5)
    ]
    sampler = TaskSampler(tasks, blocklist={"b.com", "c.com"})  # bare hosts: + subdomains
    for seed in range(5):
        assert {t.website for t in sampler.sample_train(5, seed=seed)} == {"a.com"}


def test_a_blocked_site_on_one_port_leaves_the_other_ports_drawable(tmp_path: Path) -> None:
    sites = ["http://localhost:18432/", "http://localhost:5000/", "http://shop.localhost:1234/"]
    tasks = [make_task(i, website) for i, website in enumerate(sites * 3)]
    blocklist = Blocklist(tmp_path / "blocklist.jsonl")
    blocklist.record_blocked_website("http://localhost:18432/forbidden")
    sampler = TaskSampler(tasks, blocklist=blocklist)
    drawn = {t.website for t in sampler.sample_train(9, seed=0)}
    assert drawn == set(sites[1:])


def test_blocklist_is_read_at_each_draw(tmp_path: Path) -> None:
    blocklist = Blocklist(tmp_path / "blocklist.jsonl")
    tasks = [make_task(i, f"w{i % 2}.com") for i in range(10)]
    sampler = TaskSampler(tasks, blocklist=blocklist, seed=0)
    assert {t.website for t in sampler.sample_train(10)} == {"w0.com", "w1.com"}
    blocklist.record_blocked_website("https://w1.com/captcha")
    assert {t.website for t in sampler.sample_train(10)} == {"w0.com"}
    assert sampler.blocked_mask().sum() == 5


# -- train split: weights -----------------------------------------------------------------


SITE_SIZES = {"one.com": 1, "four.com": 4, "sixteen.com": 16}


def sites_tasks() -> list[Task]:
    tasks, i = [], 0
    for site, size in SITE_SIZES.items():
        for _ in range(size):
            tasks.append(make_task(i, site))
            i += 1
    return tasks


def first_draw_sites(sampler: TaskSampler, draws: int, **kwargs) -> list[int]:
    rng = np.random.default_rng(2024)
    counts = Counter(sampler.sample_train(1, seed=rng, **kwargs)[0].website for _ in range(draws))
    return [counts[site] for site in SITE_SIZES]


def test_each_website_gets_the_same_total_weight() -> None:
    sampler = TaskSampler(sites_tasks())
    weights = sampler.train_weights()
    per_site = [weights[[t.website == s for t in sampler.tasks]].sum() for s in SITE_SIZES]
    np.testing.assert_allclose(per_site, per_site[0])


def test_drawn_websites_are_uniform_by_chi_square() -> None:
    counts = first_draw_sites(TaskSampler(sites_tasks()), 1500)
    assert chisquare(counts).pvalue > 0.01


def test_unweighted_draws_follow_task_counts_not_websites() -> None:
    counts = first_draw_sites(TaskSampler(sites_tasks()), 1500, weighted=False)
    assert chisquare(counts).pvalue < 1e-6
    expected = np.array(list(SITE_SIZES.values())) / 21 * 1500
    assert chisquare(counts, expected).pvalue > 0.01


def history_with_levels(tasks: list[Task], levels: list[int]) -> TaskHistory:
    def traj(task: Task, reward: float) -> list[dict]:
        obs = Observation(task=task, image_path="s.png", ac_tree=None)
        return [
            {"observation": obs, "action": None, "response": None, "reward": Reward(reward, None)}
        ]

    history = TaskHistory()
    for task, level in zip(tasks, levels, strict=True):
        history.update([traj(task, 1.0)] if level == 5 else [traj(task, 0.0)] * level)
    return history


def test_weights_are_website_share_times_attempt_level_weight() -> None:
    tasks = [make_task(0, "a.com"), make_task(1, "a.com"), make_task(2, "b.com")]
    sampler = TaskSampler(tasks, history=history_with_levels(tasks, [0, 5, 2]))
    np.testing.assert_allclose(sampler.train_weights(), [100 / 2, 0.001 / 2, 1.0])
    custom = TaskSampler(tasks, history=sampler.history, level_weights={5: 0.0, 2: 3.0})
    np.testing.assert_allclose(custom.train_weights(), [50, 0, 3])


def test_without_history_the_tasks_own_attempt_level_is_used() -> None:
    tasks = [make_task(0, level=1), make_task(1, level=3)]
    np.testing.assert_allclose(TaskSampler(tasks).train_weights(), [10 / 2, 0.1 / 2])


def test_zero_level_weight_excludes_solved_tasks() -> None:
    tasks = spread_tasks(10)
    sampler = TaskSampler(
        tasks, history=history_with_levels(tasks, [5] * 6 + [0] * 4), level_weights={5: 0}
    )
    assert sorted(ids(sampler.sample_train(10, seed=0)), key=int) == ["6", "7", "8", "9"]


def test_drawn_tasks_carry_their_current_attempt_level() -> None:
    tasks = spread_tasks(4)
    sampler = TaskSampler(tasks, history=history_with_levels(tasks, [3, 0, 5, 1]))
    levels = {t.task_id: t.attempt_level for t in sampler.sample_train(4, seed=0)}
    assert levels == {"0": 3, "1": 0, "2": 5, "3": 1}
    assert [t.attempt_level for t in tasks] == [0, 0, 0, 0]


# -- train split: ratio strategy ----------------------------------------------------------


def difficulty_counts(tasks: list[Task]) -> dict:
    return dict(Counter(t.difficulty for t in tasks))


def test_ratio_draws_target_shares_per_difficulty() -> None:
    sampler = TaskSampler(spread_tasks(60))
    drawn = sampler.sample_train(
        10, strategy="ratio", difficulty_ratio={1: 0.2, 2: 0.5, 3: 0.3}, seed=0
    )
    assert difficulty_counts(drawn) == {1: 2, 2: 5, 3: 3}
    assert len(set(ids(drawn))) == 10


def test_ratio_shortfall_is_filled_from_other_difficulties_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tasks = [make_task(i, f"w{i}.com", difficulty=1 if i < 2 else 2 + i % 2) for i in range(32)]
    sampler = TaskSampler(tasks)  # difficulty 1: 2 tasks; 2 and 3: 15 each
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        drawn = sampler.sample_train(
            12, strategy="ratio", difficulty_ratio={1: 0.5, 2: 0.25, 3: 0.25}, seed=3
        )
    assert difficulty_counts(drawn) == {1: 2, 2: 5, 3: 5}
    assert "difficulty 1 has 2 drawable tasks for a target of 6 (short by 4)" in caplog.text
    assert "4 of 4 missing tasks filled from other difficulties" in caplog.text


def test_ratio_accepts_webgym_range_groups() -> None:
    tasks = [make_task(i, f"w{i}.com", difficulty=1 + i % 9) for i in range(90)]
    ratio = {
        "easy": {"range": [1, 3], "weight": 0.2},
        "medium": {"range": [4, 6], "weight": 0.5},
        "hard": {"range": [7, 100], "weight": 0.3},
    }
    drawn = TaskSampler(tasks).sample_train(20, strategy="ratio", difficulty_ratio=ratio, seed=0)
    bands = Counter(
        "easy" if t.difficulty <= 3 else "medium" if t.difficulty <= 6 else "hard" for t in drawn
    )
    assert bands == {"easy": 4, "medium": 10, "hard": 6}


def test_ratio_never_draws_unlisted_or_zero_share_difficulties() -> None:
    sampler = TaskSampler(spread_tasks(30))
    drawn = sampler.sample_train(15, strategy="ratio", difficulty_ratio={1: 1.0, 2: 0.0}, seed=0)
    assert difficulty_counts(drawn) == {1: 10}


def test_ratio_mixes_difficulties_in_the_drawn_order() -> None:
    drawn = TaskSampler(spread_tasks(60)).sample_train(
        30, strategy="ratio", difficulty_ratio={1: 1, 2: 1, 3: 1}, seed=0
    )
    order = [t.difficulty for t in drawn]
    assert order != sorted(order)


@pytest.mark.parametrize(
    "ratio",
    [None, {}, {1: -0.5}, {1: 0.0}, {"easy": {"range": [1], "weight": 1}}, {1: "half"}],
)
def test_bad_difficulty_ratio_is_rejected(ratio) -> None:
    with pytest.raises(ValueError, match="difficulty_ratio"):
        TaskSampler(spread_tasks()).sample_train(
            3, strategy="ratio", difficulty_ratio=ratio, seed=0
        )


def test_unknown_strategy_and_split_are_rejected() -> None:
    sampler = TaskSampler(spread_tasks(), seed=0)
    with pytest.raises(ValueError, match="unknown strategy"):
        sampler.sample_train(3, strategy="stratified")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown split"):
        sampler.sample_tasks("valid", 3)  # type: ignore[arg-type]


def test_sample_tasks_dispatches_by_split() -> None:
    sampler = TaskSampler(spread_tasks(), seed=0)
    assert ids(sampler.sample_tasks("test", 2)) == ["0", "1"]
    assert ids(sampler.sample_tasks("train", 4, seed=1)) == ids(sampler.sample_train(4, seed=1))


def test_duplicate_in_a_file_names_both_lines(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [row(0), row(1), row(0)])
    with pytest.raises(SchemaError, match=r"t\.jsonl line 3: .* \(first at .*t\.jsonl line 1\)"):
        TaskSampler(path)


def test_difficulty_ratio_with_uniform_strategy_is_an_error() -> None:
    with pytest.raises(ValueError, match="only by strategy='ratio'"):
        TaskSampler(spread_tasks()).sample_train(3, difficulty_ratio={1: 1.0}, seed=0)


def test_only_rank_0_logs_the_ratio_shortfall(caplog: pytest.LogCaptureFixture) -> None:
    sampler = TaskSampler(spread_tasks(9))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        sampler.sample_train(
            6, strategy="ratio", difficulty_ratio={1: 1, 4: 1}, rank=1, world_size=2, seed=0
        )
    assert caplog.text == ""


@settings(max_examples=60, deadline=None)
@given(
    counts=st.lists(st.integers(0, 8), min_size=1, max_size=4),
    shares=st.lists(st.integers(0, 5), min_size=4, max_size=4),
    n=st.integers(0, 40),
    seed=st.integers(0, 2**32 - 1),
)
def test_ratio_draws_min_of_n_and_available_with_no_group_over_its_supply(
    counts: list[int], shares: list[int], n: int, seed: int
) -> None:
    tasks: list[Task] = []
    for difficulty, count in enumerate(counts):
        for _ in range(count):
            tasks.append(make_task(len(tasks), f"w{len(tasks) % 3}.com", difficulty=difficulty))
    ratio = {d: shares[d] for d in range(len(counts))}
    if sum(ratio.values()) == 0:
        ratio[0] = 1
    drawable = sum(counts[d] for d in ratio if ratio[d] > 0)
    drawn = TaskSampler(tasks).sample_train(n, strategy="ratio", difficulty_ratio=ratio, seed=seed)
    assert len(drawn) == min(n, drawable)
    assert len(set(ids(drawn))) == len(drawn)
    per_difficulty = difficulty_counts(drawn)
    assert all(ratio[d] > 0 and k <= counts[d] for d, k in per_difficulty.items())
