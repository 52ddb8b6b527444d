"""The experience pages over a PostgreSQL store (a throwaway local server)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from postgres_server import postgres_url_fixture
from replaystore.experience import ExperienceBuffer
from replaystore.experience.storage.urls import open_storage

from .stores import experience_rows

starlette = pytest.importorskip("starlette")
from starlette.testclient import TestClient  # noqa: E402

from replaystore.view import build_app  # noqa: E402

postgres_url = pytest.fixture(scope="module")(postgres_url_fixture)


@pytest.fixture(scope="module")
def client(postgres_url: str) -> Iterator[TestClient]:
    url = f"{postgres_url}&schema=view_test"
    storage = open_storage(url)
    storage.clear()
    ExperienceBuffer(storage).store_batch(experience_rows())
    storage.close()
    yield TestClient(build_app("postgres_experience_store", url), raise_server_exceptions=False)


def test_postgres_tasks_rows_filter_and_row_pages(client: TestClient) -> None:
    tasks = client.get("/?page_size=5&page=3").text
    assert "36 rows in 12 tasks" in tasks
    assert re.findall(r"value=(task-\d+)\"", tasks) == ["task-10", "task-11"]
    rows = client.get("/rows?field=exp_data.reward_t&op=gt&value=0.5").text
    assert "4 rows match" in rows
    assert (
        client.get("/rows?field=exp_meta.agent_id&op=eq&value=browser").text.count('class="open"')
        == 18
    )
    row = client.get("/row/row-03-2")
    assert row.status_code == 200 and "task-03" in row.text
    assert client.get("/row/nope").status_code == 404
    bad = client.get("/rows?field=bogus&op=eq&value=1")
    assert bad.status_code == 400 and "unknown field" in bad.text


def test_a_missing_postgres_store_is_refused_and_not_created(postgres_url: str) -> None:
    from replaystore.errors import StorageError
    from replaystore.experience.storage.postgres import read_summary

    url = f"{postgres_url}&schema=view_absent"
    with pytest.raises(StorageError, match="no replaystore experience store"):
        build_app("postgres_experience_store", url)
    with pytest.raises(StorageError, match="no replaystore experience store"):
        read_summary(url)  # still none: the viewer created nothing
