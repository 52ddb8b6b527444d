"""Image files <-> file:// URLs <-> base64 data URLs, and message-list conversion."""

from __future__ import annotations

import base64
import copy
from pathlib import Path

import pytest
from PIL import Image

from replaystore.errors import ImageError
from replaystore.pipeline.images import (
    data_url_to_file,
    decode_data_url,
    file_url_to_path,
    image_mime_type,
    image_to_data_url,
    image_to_file_url,
    messages_to_data_urls,
    messages_to_file_urls,
    read_image,
)


def draw(path: Path, fmt: str, color: tuple[int, int, int] = (200, 30, 30)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 6), color).save(path, format=fmt)
    return path


def image_message(url: str) -> dict:
    return {
        "role": "user",
        "content": [
            {"type": "text", "text": "look"},
            {"type": "image_url", "image_url": {"url": url, "detail": "high"}},
        ],
    }


@pytest.mark.parametrize(
    ("fmt", "mime"),
    [("PNG", "image/png"), ("JPEG", "image/jpeg"), ("WEBP", "image/webp"), ("GIF", "image/gif")],
)
def test_mime_type_comes_from_magic_bytes_not_extension(tmp_path, fmt, mime):
    path = draw(tmp_path / "shot.bin", fmt)
    assert image_mime_type(path) == mime
    assert image_to_data_url(path).startswith(f"data:{mime};base64,")


def test_read_image_returns_type_and_bytes(tmp_path):
    path = draw(tmp_path / "shot", "JPEG")
    assert read_image(path) == ("image/jpeg", path.read_bytes())


def test_png_named_jpg_is_labelled_png(tmp_path):
    path = draw(tmp_path / "shot.jpg", "PNG")
    assert image_to_data_url(path).startswith("data:image/png;base64,")


def test_non_image_file_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "notes.png"
    path.write_text("hello, not an image")
    with pytest.raises(ImageError, match=r"notes\.png"):
        image_to_data_url(path)
    with pytest.raises(ImageError, match=r"notes\.png"):
        image_mime_type(path)


def test_missing_file_is_reported_by_name(tmp_path):
    with pytest.raises(ImageError, match=r"gone\.png"):
        image_to_data_url(tmp_path / "gone.png")
    with pytest.raises(ImageError, match=r"gone\.png"):
        image_to_file_url(tmp_path / "gone.png")


def test_file_url_is_absolute_percent_encoded_and_round_trips(tmp_path, monkeypatch):
    path = draw(tmp_path / "a dir #1" / "shot 100%.png", "PNG")
    monkeypatch.chdir(tmp_path)
    url = image_to_file_url(Path("a dir #1") / "shot 100%.png")
    assert url.startswith("file:///")
    assert " " not in url and "#" not in url
    assert "%20" in url and "%23" in url and "%25" in url
    assert file_url_to_path(url) == path


def test_file_url_to_path_accepts_localhost_and_rejects_other_hosts():
    assert file_url_to_path("file://localhost/tmp/x.png") == Path("/tmp/x.png")
    with pytest.raises(ImageError, match="remote host"):
        file_url_to_path("file://server/share/x.png")
    with pytest.raises(ImageError, match="not a file"):
        file_url_to_path("https://example.com/x.png")


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF"])
def test_round_trip_file_to_data_url_to_file_keeps_bytes(tmp_path, fmt):
    source = draw(tmp_path / "src" / "shot", fmt)
    written = data_url_to_file(image_to_data_url(source), tmp_path / "out")
    assert written.read_bytes() == source.read_bytes()
    assert written.suffix == {"PNG": ".png", "JPEG": ".jpg", "WEBP": ".webp", "GIF": ".gif"}[fmt]
    assert written.is_absolute()


def test_same_image_is_written_once_under_its_content_hash(tmp_path):
    url = image_to_data_url(draw(tmp_path / "a.png", "PNG"))
    other = image_to_data_url(draw(tmp_path / "b.png", "PNG", color=(0, 0, 255)))
    first = data_url_to_file(url, tmp_path / "out")
    again = data_url_to_file(url, tmp_path / "out")
    different = data_url_to_file(other, tmp_path / "out")
    assert first == again != different
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(
        {first.name, different.name}
    )


def test_declared_type_of_data_url_is_not_trusted(tmp_path):
    png = draw(tmp_path / "a.png", "PNG").read_bytes()
    mislabelled = "data:image/jpeg;base64," + base64.b64encode(png).decode()
    mime, data = decode_data_url(mislabelled)
    assert (mime, data) == ("image/png", png)
    assert data_url_to_file(mislabelled, tmp_path / "out").suffix == ".png"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("data:image/png;base64,%%%notbase64", "invalid base64"),
        ("data:image/png," + "abc", "not base64"),
        ("data:text/plain;base64," + base64.b64encode(b"hi").decode(), "not an image type"),
        ("data:image/png;base64," + base64.b64encode(b"plain text").decode(), "does not hold"),
        ("data:image/png;base64", "no ','"),
        ("file:///x.png", "not a data URL"),
    ],
)
def test_malformed_data_urls_are_refused(url, message):
    with pytest.raises(ImageError, match=message):
        decode_data_url(url)


def test_messages_to_data_urls_inlines_file_images_and_keeps_the_rest(tmp_path):
    shot = draw(tmp_path / "shot.png", "PNG")
    inline = image_to_data_url(draw(tmp_path / "other.png", "PNG", color=(1, 2, 3)))
    messages = [
        {"role": "system", "content": "be brief"},
        image_message(shot.as_uri()),
        image_message(inline),
        image_message("https://example.com/remote.png"),
    ]
    before = copy.deepcopy(messages)
    out = messages_to_data_urls(messages)
    assert messages == before  # input untouched
    assert out[0] == messages[0]
    assert out[1]["content"][1]["image_url"] == {
        "url": image_to_data_url(shot),
        "detail": "high",
    }
    assert out[1]["content"][0] == {"type": "text", "text": "look"}
    assert out[2] == messages[2]
    assert out[3] == messages[3]


def test_messages_to_file_urls_writes_each_image_once(tmp_path):
    shot = draw(tmp_path / "shot.png", "PNG")
    data_url = image_to_data_url(shot)
    messages = [image_message(data_url), image_message(data_url), image_message(shot.as_uri())]
    out = messages_to_file_urls(messages, tmp_path / "decoded")
    urls = [m["content"][1]["image_url"]["url"] for m in out]
    assert urls[0] == urls[1] != urls[2]
    assert urls[2] == shot.as_uri()
    assert file_url_to_path(urls[0]).read_bytes() == shot.read_bytes()
    assert len(list((tmp_path / "decoded").iterdir())) == 1
    assert messages[0]["content"][1]["image_url"]["url"] == data_url


def test_conversion_round_trip_restores_file_images(tmp_path):
    shot = draw(tmp_path / "shot.png", "PNG")
    messages = [image_message(shot.as_uri())]
    back = messages_to_file_urls(messages_to_data_urls(messages), tmp_path / "decoded")
    path = file_url_to_path(back[0]["content"][1]["image_url"]["url"])
    assert path.read_bytes() == shot.read_bytes()


def test_bare_string_image_url_form_is_kept(tmp_path):
    shot = draw(tmp_path / "shot.png", "PNG")
    out = messages_to_data_urls(
        [{"role": "user", "content": [{"type": "image_url", "image_url": shot.as_uri()}]}]
    )
    assert out[0]["content"][0]["image_url"] == image_to_data_url(shot)


def test_conversion_error_names_message_and_part(tmp_path):
    messages = [
        {"role": "system", "content": "x"},
        image_message((tmp_path / "missing.png").as_uri()),
    ]
    with pytest.raises(ImageError, match=r"messages\[1\]\.content\[1\].*missing\.png"):
        messages_to_data_urls(messages)


def test_unknown_url_scheme_is_refused(tmp_path):
    with pytest.raises(ImageError, match="ftp"):
        messages_to_data_urls([image_message("ftp://host/x.png")])
