"""Issue 16, item 6: a task file with no task is refused, naming the file."""

from __future__ import annotations

import pytest

from replaystore.errors import SchemaError
from replaystore.pipeline.task_sampler import TaskSampler

ROW = (
    '{"task_name": "find a hat", "website": "shop.example", "domain": "shopping", '
    '"subdomain": "", "difficulty": 1, "evaluator_reference": null, "reference_answer": null}\n'
)


@pytest.mark.parametrize(
    ("name", "text"),
    [("empty.jsonl", ""), ("blank.jsonl", "\n\n  \n"), ("header_only.csv", "task_name,website\n")],
)
def test_task_file_without_tasks_is_refused(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(SchemaError, match=rf"{name}.*no tasks"):
        TaskSampler(path)
    with pytest.raises(SchemaError, match="no tasks"):
        TaskSampler.from_file(path)


def test_empty_file_among_good_files_is_still_refused(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text(ROW)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert len(TaskSampler(good)) == 1
    with pytest.raises(SchemaError, match=r"empty\.jsonl"):
        TaskSampler([good, empty])
