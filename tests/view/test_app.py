"""The viewer's pages through Starlette's TestClient (no browser): content, filters,
paging, bad parameters, path confinement, and that nothing in a store is written."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from html import unescape
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from .stores import make_trajectory_storage

starlette = pytest.importorskip("starlette")
from starlette.testclient import TestClient  # noqa: E402

from replaystore.trajectories import TrajectoryStorage  # noqa: E402
from replaystore.view import build_app  # noqa: E402


def _client(kind: str, target: Any, **options: Any) -> TestClient:
    return TestClient(build_app(kind, target, **options), raise_server_exceptions=False)


def _text(html: str, element_id: str) -> str:
    found = re.search(rf'id="{element_id}"[^>]*>(.*?)</', html, re.S)
    assert found, f"no element #{element_id}"
    return re.sub(r"\s+", " ", found.group(1)).strip()


def _snapshot(root: Path) -> dict[str, tuple[int, str]]:
    """Every file under ``root`` with its size and SHA-256 (what 'unchanged' means)."""
    return {
        str(p.relative_to(root)): (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def traj(traj_store: dict[str, Any]) -> TestClient:
    return _client("trajectory_storage", traj_store["root"])


# --------------------------------------------------------------------------- trajectories


def test_overview_counts_blocked_sites_same_screenshots_and_draws_three_charts(
    traj: TestClient, traj_store: dict[str, Any]
) -> None:
    expected = traj_store["trajectories"]
    html = traj.get("/").text
    assert f"<td>{len(expected)}</td>" in html
    assert _text(html, "blocked-count") == str(sum(t["blocked"] for t in expected))
    assert "botwall.localhost" in _text(html, "blocked-sites")
    # step 0 of every trajectory with more than one step repeats its screenshot
    assert _text(html, "same-count") == str(sum(t["steps"] > 1 for t in expected))
    assert html.count("<svg") == 3
    assert "success rate per iteration" in html and "success rate by website" in html


def test_overview_success_rate_per_iteration_matches_the_data(
    traj: TestClient, traj_store: dict[str, Any]
) -> None:
    html = traj.get("/").text
    for it in (1, 2, 3):
        rows = [t for t in traj_store["trajectories"] if t["iteration"] == it]
        won = sum(t["success"] for t in rows)
        assert f"{it}: {won / len(rows):.0%} ({won} of {len(rows)})" in html


@pytest.mark.parametrize(
    ("query", "keep"),
    [
        ("website=http://botwall.localhost", lambda t: t["blocked"]),
        ("success=yes", lambda t: t["success"]),
        ("success=no&blocked=no", lambda t: not t["success"] and not t["blocked"]),
        ("iteration=2", lambda t: t["iteration"] == 2),
        ("difficulty=3", lambda t: t["difficulty"] == "3"),
        ("min_reward=0.5", lambda t: t["success"]),
        ("max_reward=0.5", lambda t: not t["success"]),
        ("q=ITEM+1", lambda t: "item 1" in t["task"]),
        (
            "q=item+1&website=http://shop.localhost",
            lambda t: "item 1" in t["task"] and "shop" in t["website"],
        ),
    ],
)
def test_list_filters_select_exactly_the_matching_trajectories(
    traj: TestClient, traj_store: dict[str, Any], query: str, keep: Any
) -> None:
    expected = [t["id"] for t in traj_store["trajectories"] if keep(t)]
    html = traj.get(f"/trajectories?{query}&page_size=200").text
    assert _text(html, "match-count").startswith(f"{len(expected)} of 24")
    shown = [int(i) for i in re.findall(r'class="open" href="/trajectory/(\d+)"', html)]
    assert shown == expected


def test_list_pages_server_side_and_keeps_filters_in_page_links(traj: TestClient) -> None:
    first = traj.get("/trajectories?page_size=10&success=no").text
    assert "page 1 of" in first
    link = re.search(r'id="next-page" href="([^"]+)"', first).group(1).replace("&amp;", "&")
    assert "success=no" in link and "page=2" in link
    ids = [
        re.findall(
            r'href="/trajectory/(\d+)"', traj.get(f"/trajectories?page_size=10&page={p}").text
        )
        for p in (1, 2, 3)
    ]
    assert [len(i) for i in ids] == [10, 10, 4]
    assert sorted(int(x) for page in ids for x in page) == list(range(24))


def test_trajectory_page_shows_action_click_point_reward_flag_and_export_record(
    traj: TestClient, traj_store: dict[str, Any]
) -> None:
    html = traj.get("/trajectory/4?step=0").text  # t=4: shop, 2 steps, successful
    assert _text(html, "action-string") == "click(40, 30)"
    assert 'data-x="40.0" data-y="30.0"' in html
    assert _text(html, "same-flag") == "yes"
    assert _text(html, "task-name") == traj_store["trajectories"][4]["task"]
    assert "prompt from the stored prompt" in html
    assert "Task: task 4: find item 4" in html and "step 0 of task 4" in html
    last = traj.get("/trajectory/4?step=1").text
    assert _text(last, "action-string") == "answer(&#34;answer 4&#34;)"
    assert _text(last, "step-reward") == "1.0"
    assert _text(last, "final-reward") == "1"
    assert "&#34;match&#34;: true" in last
    assert 'id="next-step"' not in last and 'id="prev-step"' in last


def test_trajectory_without_stored_prompt_shows_the_rebuilt_export_conversation(
    traj: TestClient,
) -> None:
    html = traj.get("/trajectory/7?step=1").text
    assert "rebuilt with the default ConversationBuilder" in html
    assert "step 0 of task 7" in html  # the history's response is a turn of the record


def _text_mode_storage(root: Path) -> Path:
    """Two text-observation trajectories by a trained model: the first without
    screenshots, the second with one stored (for the viewer only); hostile metadata."""
    from replaystore.trajectories.components import Action, Observation, Response, Reward, Task
    from replaystore.trajectories.context import ConversationBuilder

    builder = ConversationBuilder(observation="text")
    trajectories = []
    for t in range(2):
        task = Task(f"text task {t}", "shopping", "stores", "http://shop.localhost", 1, None, "x")
        shot = ""
        if t == 1:
            (root / "shots").mkdir(parents=True)
            shot = str(root / "shots" / "text.png")
            Image.new("RGB", (32, 24), (10, 20, 30)).save(shot)
        steps: list[dict[str, Any]] = []
        for s in range(2):
            tree = f"[0] link 'Kettles <{t}.{s}>' @(60,90)"
            obs = Observation(task, shot, tree, {"url": f"http://shop.localhost/{s}", "title": "T"})
            prompt = json.dumps(builder.build(task, steps, obs))
            raw = f"<think>go</think>\nAction: click(60, 90) {s}"
            steps.append(
                {
                    "observation": obs,
                    "action": Action({"key": "click", "x": 60.0, "y": 90.0}, "click(60, 90)"),
                    "response": Response(raw, None, prompt),
                    "reward": Reward(float(s), None),
                }
            )
        steps[-1]["trajectory_metadata"] = {
            "status": "answered",
            "observation": "text",
            "policy": "model",
            "checkpoint": "<script>alert(1)</script>/run/checkpoints/iteration_0001",
        }
        trajectories.append(steps)
    TrajectoryStorage(root).save_iteration(1, trajectories, rank=None)
    return root


def test_text_observation_step_shows_its_prompt_text_and_no_broken_image(tmp_path: Path) -> None:
    client = _client("trajectory_storage", _text_mode_storage(tmp_path / "storage"))
    html = client.get("/trajectory/0?step=1").text
    assert "<img" not in html
    assert "text observation: the model saw no screenshot" in html
    assert _text(html, "no-screenshot") == "no screenshot"
    assert _text(html, "ac-tree") == "[0] link &#39;Kettles &lt;0.1&gt;&#39; @(60,90)"
    assert "Accessibility tree:\n[0] link &#39;Kettles &lt;0.1&gt;&#39;" in html  # the prompt
    assert "URL: http://shop.localhost/1" in html
    assert "no image in this prompt" in html and "&lt;image&gt;" not in html
    # a text step whose screenshot was kept for the viewer shows it, and says it was not sent
    with_shot = client.get("/trajectory/1?step=0").text
    assert 'id="screenshot"' in with_shot and "the model saw no screenshot" in with_shot
    assert client.get("/screenshot/1/0").status_code == 200


def test_trajectory_page_shows_the_policy_and_checkpoint_escaped(tmp_path: Path) -> None:
    client = _client("trajectory_storage", _text_mode_storage(tmp_path / "storage"))
    html = client.get("/trajectory/0").text
    assert _text(html, "policy") == "model"
    assert _text(html, "checkpoint") == (
        "&lt;script&gt;alert(1)&lt;/script&gt;/run/checkpoints/iteration_0001"
    )
    assert _text(html, "observation-mode") == "text"
    assert "<script>alert(1)" not in html


def test_trajectory_without_producer_metadata_has_no_policy_line(traj: TestClient) -> None:
    html = traj.get("/trajectory/4").text
    assert 'id="producer"' not in html and 'id="screenshot"' in html


def test_missing_screenshot_file_is_a_note_not_a_broken_image(tmp_path: Path) -> None:
    root = make_trajectory_storage(tmp_path / "storage")["root"]
    (root / "shots" / "004_0.png").unlink()
    html = _client("trajectory_storage", root).get("/trajectory/4?step=0").text
    assert "<img" not in html
    assert _text(html, "no-screenshot").startswith("screenshot file not found: ")


def test_refused_screenshot_shows_why_and_the_image_root_to_pass(tmp_path: Path) -> None:
    # The README quick start: screenshots in the working directory, the storage below it.
    source = make_trajectory_storage(tmp_path / "source")["root"]
    trajs = TrajectoryStorage(source).load_all(last_n_iterations=None)[:1]
    work = tmp_path / "work"
    shot = work / "step0.png"
    work.mkdir()
    shutil.copy(source / "shots" / "000_0.png", shot)
    trajs[0][0]["observation"].image_path = str(shot)
    root = work / "replay" / "train"
    TrajectoryStorage(root).save_iteration(1, trajs, rank=None)
    html = _client("trajectory_storage", root).get("/trajectory/0?step=0").text
    assert "<img" not in html
    note = unescape(_text(html, "no-screenshot"))
    assert "outside the image root" in note and str(root.resolve()) in note
    assert note.endswith(f"--image-root {work.resolve()}"), note
    refused = _client("trajectory_storage", root).get("/screenshot/0/0")
    assert refused.status_code == 403
    assert f"--image-root {work.resolve()}" in unescape(refused.text)
    # passing exactly that shows it
    wide = _client("trajectory_storage", root, image_root=work.resolve())
    assert 'id="screenshot"' in wide.get("/trajectory/0?step=0").text
    assert wide.get("/screenshot/0/0").content == shot.read_bytes()


def test_a_screenshot_that_is_no_image_file_says_so(tmp_path: Path) -> None:
    source = make_trajectory_storage(tmp_path / "source")["root"]
    trajs = TrajectoryStorage(source).load_all(last_n_iterations=None)[:1]
    root = tmp_path / "storage"
    (root / "shots").mkdir(parents=True)
    (root / "shots" / "notes.txt").write_text("not an image")
    trajs[0][0]["observation"].image_path = str(root / "shots" / "notes.txt")
    TrajectoryStorage(root).save_iteration(1, trajs, rank=None)
    html = _client("trajectory_storage", root).get("/trajectory/0?step=0").text
    assert "<img" not in html
    assert "is not an image file" in unescape(_text(html, "no-screenshot"))


def test_screenshot_is_served_from_the_storage(
    traj: TestClient, traj_store: dict[str, Any]
) -> None:
    response = traj.get("/screenshot/4/1")
    assert response.status_code == 200
    assert response.headers["content-type"] == "image/png"
    assert response.content == (traj_store["root"] / "shots" / "004_1.png").read_bytes()


@pytest.mark.parametrize(
    ("url", "status", "says"),
    [
        ("/trajectories?page=x", 400, "'page' must be an integer"),
        ("/trajectories?page=0", 400, "'page' must be >= 1"),
        ("/trajectories?page=99", 404, "page 99 does not exist"),
        ("/trajectories?page_size=100000", 400, "'page_size' must be between 1 and 200"),
        ("/trajectories?iteration=two", 400, "'iteration' must be an integer"),
        ("/trajectories?min_reward=nan", 400, "'min_reward' must be finite"),
        ("/trajectories?max_reward=abc", 400, "'max_reward' must be a number"),
        ("/trajectories?success=maybe", 400, "'success' must be yes, no or any"),
        ("/trajectories?website=%3Cscript%3E", 400, "unknown value"),
        ("/trajectory/24", 404, "trajectory 24 does not exist"),
        ("/trajectory/0?step=9", 400, "'step' must be between 0 and 1"),
        ("/trajectory/-1", 404, "Not Found"),
        ("/screenshot/0/7", 404, "trajectory 0 has no step 7"),
        ("/nothing/here", 404, "Not Found"),
        ("/static/../app.py", 404, "Not Found"),
        ("/static/%2e%2e/app.py", 404, "Not Found"),
        ("/static/..%2f__init__.py", 404, "Not Found"),
    ],
)
def test_bad_parameters_get_a_clear_4xx_page_without_traceback(
    traj: TestClient, url: str, status: int, says: str
) -> None:
    response = traj.get(url)
    assert response.status_code == status
    assert response.headers["content-type"].startswith("text/html")
    assert says in unescape(response.text)
    assert "Traceback" not in response.text and 'File "' not in response.text
    assert "<script>" not in response.text  # the bad value is escaped


def test_screenshots_outside_the_image_root_are_refused(tmp_path: Path) -> None:
    source = make_trajectory_storage(tmp_path / "source")["root"]
    trajs = TrajectoryStorage(source).load_all(last_n_iterations=None)[:3]
    root = tmp_path / "storage"
    (root / "shots").mkdir(parents=True)
    outside = tmp_path / "secret.png"
    shutil.copy(source / "shots" / "000_0.png", outside)
    shutil.copy(source / "shots" / "003_0.png", root / "shots" / "ok.png")
    (root / "shots" / "link.png").symlink_to(outside)  # a link inside pointing out
    hostile = {
        (0, 0): str(outside),  # absolute path elsewhere
        (0, 1): str(root / "shots" / "link.png"),  # symbolic link out of the root
        (1, 0): str(root / "shots" / ".." / ".." / "secret.png"),  # ".." out of the root
        (1, 1): "/etc/passwd",  # not even an image
        (2, 0): str(root / "shots" / "ok.png"),
    }
    for (t, s), image in hostile.items():
        trajs[t][s]["observation"].image_path = image
    TrajectoryStorage(root).save_iteration(1, trajs, rank=None)
    client = _client("trajectory_storage", root)
    for t, s in ((0, 0), (0, 1), (1, 0), (1, 1)):
        response = client.get(f"/screenshot/{t}/{s}")
        assert response.status_code == 403, (t, s)
        assert "outside the image root" in response.text
        assert "Traceback" not in response.text
    assert client.get("/screenshot/2/0").status_code == 200  # an ordinary one still works
    # --image-root widens it explicitly
    wide = _client("trajectory_storage", root, image_root=tmp_path)
    assert wide.get("/screenshot/0/0").content == outside.read_bytes()
    assert wide.get("/screenshot/1/1").status_code == 403  # still outside the wider root


def test_a_store_damaged_after_start_gives_a_500_page_with_one_line(tmp_path: Path) -> None:
    root = make_trajectory_storage(tmp_path / "storage")["root"]
    client = _client("trajectory_storage", root)
    (root / "iteration_000002.jsonl").unlink()
    response = client.get("/trajectory/9")
    assert response.status_code == 500
    assert "was removed after the viewer indexed it" in response.text
    assert "Traceback" not in response.text


def test_viewing_every_page_writes_nothing(
    traj: TestClient, traj_store: dict[str, Any], exp_store: Path, transitions: dict[str, Path]
) -> None:
    roots = [traj_store["root"], exp_store.parent, transitions["memmap"].parent]
    before = [_snapshot(r) for r in roots]
    # A read-only SQLite connection to a WAL store may create SQLite's own -wal and
    # -shm side files (the reader's shared-memory index; see test_sqlite_live.py):
    # the directory holding the store changes, the store's file does not.
    mtimes = [os.stat(r).st_mtime_ns for r in roots if r != exp_store.parent]
    for t in range(24):
        traj.get(f"/trajectory/{t}")
        traj.get(f"/screenshot/{t}/0")
    traj.get("/")
    traj.get("/trajectories?q=item")
    exp = _client("sqlite_experience_store", exp_store)
    for url in ("/", "/rows", "/rows?field=exp_meta.agent_id&op=eq&value=browser", "/row/row-00-0"):
        assert exp.get(url).status_code == 200
    for kind, key in (("transitions_memmap", "memmap"), ("transitions_checkpoint", "checkpoint")):
        assert _client(kind, transitions[key]).get("/").status_code == 200
    after = [_snapshot(r) for r in roots]
    side_files = {f"{exp_store.name}-wal", f"{exp_store.name}-shm"}
    for snapshot in (before[1], after[1]):
        for name in side_files & snapshot.keys():
            if name.endswith("-wal"):
                assert snapshot.pop(name)[0] == 0  # an empty log: no reader writes a page
            else:
                snapshot.pop(name)
    assert after == before
    assert [os.stat(r).st_mtime_ns for r in roots if r != exp_store.parent] == mtimes


# --------------------------------------------------------------------------- experience


@pytest.fixture(scope="module")
def exp(exp_store: Path) -> TestClient:
    return _client("sqlite_experience_store", exp_store)


def test_experience_tasks_page_counts_and_pages(exp: TestClient) -> None:
    html = exp.get("/").text
    assert _text(html, "store-counts") == "36 rows in 12 tasks"
    third = exp.get("/?page_size=5&page=3").text
    assert re.findall(r'value=(task-\d+)"', third) == ["task-10", "task-11"]


def test_experience_tasks_page_without_a_tasks_table(exp_store: Path, tmp_path: Path) -> None:
    import sqlite3

    copy = tmp_path / "old.sqlite"
    shutil.copy(exp_store, copy)
    with sqlite3.connect(copy) as conn:  # a file from before the tasks table existed
        conn.execute("DROP TABLE tasks")
    conn.close()
    html = _client("sqlite_experience_store", copy).get("/?page_size=5&page=3").text
    assert _text(html, "store-counts") == "36 rows in 12 tasks"
    assert re.findall(r'value=(task-\d+)"', html) == ["task-10", "task-11"]


@pytest.mark.parametrize(
    ("query", "count"),
    [
        ("field=exp_meta.agent_id&op=eq&value=browser", 18),
        ("field=exp_data.reward_t&op=gt&value=0.5", 4),
        ("field=exp_meta.step&op=in&value=0,2", 24),
        ("field=exp_meta.task_id&op=like&value=task-1", 6),  # task-10, task-11
        ("field=exp_meta.agent_id&op=eq&value=browser&field=exp_meta.step&op=gte&value=1", 12),
        ("field=exp_data.state.url&op=eq&value=http://site/3", 3),
        ("field=exp_meta.pre_agent&op=is_null&value=", 36),
        ("field=&op=eq&value=", 36),
    ],
)
def test_experience_filter_form_maps_to_querybuilder(
    exp: TestClient, query: str, count: int
) -> None:
    response = exp.get(f"/rows?{query}")
    assert response.status_code == 200
    assert _text(response.text, "match-count") == f"{count} rows match"


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("field=bogus&op=eq&value=1", "unknown field"),
        ("field=exp_meta.step&op=zz&value=1", "unknown filter operator"),
        ("field=exp_meta.step&op=eq&value=", "give a value"),
        ("field=exp_meta.step&op=in&value=", "comma-separated list"),
        ("field=exp_meta.step&op=eq", "needs a field, an op and a value"),
        ("page=-3", "'page' must be >= 1"),
    ],
)
def test_experience_bad_filters_get_a_400_page(exp: TestClient, query: str, says: str) -> None:
    response = exp.get(f"/rows?{query}")
    assert response.status_code == 400
    assert says in unescape(response.text)
    assert "Traceback" not in response.text


def test_experience_row_page_pretty_prints_its_json(exp: TestClient) -> None:
    html = exp.get("/row/row-03-2").text
    body = _text(html, "row-json").replace("&#34;", '"')
    assert '"task_id": "task-03"' in body and '"reward_t": 1.0' in body
    assert '\n    "step": 2' in re.search(r'id="row-json">(.*?)</pre>', html, re.S).group(
        1
    ).replace("&#34;", '"')
    missing = exp.get("/row/nope")
    assert missing.status_code == 404 and "no row with id" in missing.text


# --------------------------------------------------------------------------- transitions


@pytest.mark.parametrize("key", ["memmap", "checkpoint"])
def test_transitions_page_shows_schema_fill_and_histograms(
    transitions: dict[str, Path], key: str
) -> None:
    kind = "transitions_memmap" if key == "memmap" else "transitions_checkpoint"
    html = _client(kind, transitions[key]).get("/").text
    assert _text(html, "fill") == "40 (62.5% full)"
    assert _text(html, "episodes") == "8"
    assert "<td>obs</td><td>float32</td><td>4</td>" in html
    assert "rewards (reward) (40 values)" in html
    assert "priorities (40 values)" in html
    assert "episode returns (8 values)" in html
    assert "[5, 5.033): 8" in html  # every episode returns 5


def test_transitions_episode_returns_follow_the_ring_after_it_wraps(tmp_path: Path) -> None:
    import numpy as np

    from replaystore.transitions import TransitionBuffer
    from replaystore.view.transitions import read_transitions

    buf = TransitionBuffer("cpu", "cpu", 12, path=tmp_path / "mm", seed=0)
    for i in range(17):  # episodes end at items 4, 9, 14; the ring keeps items 5..16
        buf.add({"reward": np.float32(i), "done": np.bool_(i % 5 == 4)})
    buf.save(tmp_path / "ckpt" / "buffer")
    buf.flush()
    buf.close()
    for kind, target in (
        ("transitions_memmap", tmp_path / "mm"),
        ("transitions_checkpoint", tmp_path / "ckpt" / "buffer.metadata"),
    ):
        s = read_transitions(kind, target)
        assert (s.size, s.capacity, s.pointer) == (12, 12, 5)
        assert sorted(s.rewards.tolist()) == list(range(5, 17))
        # items 5..9 may have begun before the oldest kept item: left out; 15, 16 unfinished
        assert s.episode_returns.tolist() == [10 + 11 + 12 + 13 + 14]
