"""Issue 16: an export confined to the storage refuses image paths outside it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from replaystore.errors import ExportError
from replaystore.trajectories.export import export_llamafactory


def sample(image: str | Path) -> dict:
    url = image if str(image).startswith("file:") else Path(image).as_uri()
    return {
        "message": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is on the screen?"},
                    {"type": "image_url", "image_url": {"url": url}},
                ],
            }
        ],
        "action": "click(3)",
    }


@pytest.fixture
def layout(tmp_path):
    store = tmp_path / "store"
    (store / "shots").mkdir(parents=True)
    inside = store / "shots" / "a.png"
    outside = tmp_path / "elsewhere.png"
    for path in (inside, outside):
        Image.new("RGB", (8, 8), (10, 20, 30)).save(path)
    return store, inside, outside


def test_absolute_path_outside_the_storage_is_refused(tmp_path, layout):
    store, inside, _ = layout
    with pytest.raises(ExportError, match=r"/etc/passwd is outside the image root"):
        export_llamafactory(
            [sample(inside), sample("/etc/passwd")], tmp_path / "out", image_root=store
        )
    assert not (tmp_path / "out" / "dataset_info.json").exists()


@pytest.mark.parametrize("copy_images", [False, True])
def test_image_outside_escaping_by_dotdot_or_symlink_is_refused(tmp_path, layout, copy_images):
    store, inside, outside = layout
    link = store / "shots" / "link.png"
    link.symlink_to(outside)
    dotdot = f"{store}/shots/../../{outside.name}"
    report = export_llamafactory(
        [sample(inside), sample(outside), sample(link), sample("file://" + dotdot)],
        tmp_path / "out",
        image_root=store,
        copy_images=copy_images,
        on_error="skip",
        shuffle=False,
    )
    assert report.num_train == 1
    reasons = {r.index: r.reason for r in report.rejected}
    assert sorted(reasons) == [1, 2, 3]
    assert all("outside the image root" in reason for reason in reasons.values())
    assert "resolves to" in reasons[2]
    records = json.loads(report.train_file.read_text())
    copied = list((tmp_path / "out" / "images").glob("*")) if copy_images else []
    assert len(records) == 1 and len(copied) == (1 if copy_images else 0)


def test_without_image_root_behaviour_is_unchanged_and_root_must_exist(tmp_path, layout):
    _, inside, outside = layout
    report = export_llamafactory([sample(inside), sample(outside)], tmp_path / "out")
    assert report.num_train == 2
    with pytest.raises(ValueError, match="image_root"):
        export_llamafactory([sample(inside)], tmp_path / "out2", image_root=tmp_path / "nope")
