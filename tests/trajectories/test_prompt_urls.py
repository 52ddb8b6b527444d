"""Prompt image URLs stored relative to the storage directory (issue 23, item 5)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from replaystore.trajectories.prompt_urls import relative_prompt, resolve_prompt, root_url

ROOT = root_url("/runs/old place/storage")  # percent-encoded: file:///runs/old%20place/storage
NEW = root_url("/elsewhere/storage")


def _prompt(text: str, *urls: str, plain: bool = False) -> str:
    parts: list[dict[str, object]] = [{"type": "text", "text": text}]
    for url in urls:
        parts.append({"type": "image_url", "image_url": url if plain else {"url": url}})
    return json.dumps([{"role": "user", "content": parts}], ensure_ascii=False)


def test_urls_under_the_root_become_relative_and_resolve_under_the_new_root() -> None:
    inside = f"{ROOT}/screenshots/step_000.png"
    outside = "file:///tmp/other.png"
    stored = relative_prompt(_prompt("look", inside, outside), ROOT)
    assert stored is not None and ROOT not in stored and outside in stored
    assert json.loads(resolve_prompt(stored, NEW)) == json.loads(
        _prompt("look", f"{NEW}/screenshots/step_000.png", outside)
    )


def test_a_plain_string_image_url_is_made_relative_too() -> None:
    stored = relative_prompt(_prompt("x", f"{ROOT}/a.png", plain=True), ROOT)
    assert stored is not None
    assert json.loads(resolve_prompt(stored, NEW)) == json.loads(
        _prompt("x", f"{NEW}/a.png", plain=True)
    )


def test_prompts_without_images_under_the_root_are_left_alone() -> None:
    assert relative_prompt(_prompt("no image"), ROOT) is None
    assert relative_prompt(_prompt("x", "data:image/png;base64,AAAA"), ROOT) is None
    assert relative_prompt("not json " + ROOT + "/", ROOT) is None
    # an old bare relative path would be resolved against the root when read: keep all
    assert relative_prompt(_prompt("x", f"{ROOT}/a.png", "shots/b.png"), ROOT) is None


@given(st.text())
def test_page_text_is_never_changed(text: str) -> None:
    """Text that looks like a url key (an accessibility tree can say anything) stays."""
    text = text + ' "url": "screenshots/x.png" "image_url": "y"'
    stored = relative_prompt(_prompt(text, f"{ROOT}/s.png"), ROOT)
    assert stored is not None
    (message,) = json.loads(resolve_prompt(stored, NEW))
    assert message["content"][0]["text"] == text
    assert message["content"][1]["image_url"]["url"] == f"{NEW}/s.png"
