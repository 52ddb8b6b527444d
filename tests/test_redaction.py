"""``replaystore.redaction``: the one rule that keeps passwords out of output."""

from __future__ import annotations

import json
import logging

from replaystore.redaction import RedactingFormatter, redact, redact_data, url_passwords


def test_the_password_of_every_url_in_a_text_is_masked() -> None:
    text = "copied from postgresql://u:secret@h/db?schema=s to postgres://:pw2@h2:5432/x"
    assert (
        redact(text) == "copied from postgresql://u:***@h/db?schema=s to postgres://:***@h2:5432/x"
    )


def test_a_raw_at_sign_in_a_password_leaves_no_tail_behind() -> None:
    assert redact("postgresql://u:p@ss@h/db") == "postgresql://u:***@h/db"


def test_libpq_keyword_passwords_are_masked() -> None:
    assert redact("host=h password=hunter2 dbname=x") == "host=h password=*** dbname=x"
    assert redact("postgresql:///db?password=hunter2&host=/run") == (
        "postgresql:///db?password=***&host=/run"
    )


def test_urls_without_a_password_and_plain_text_are_unchanged() -> None:
    for text in ("postgresql://u@h/db", "sqlite:///a.sqlite", "mail me at a@b.c", "x: y"):
        assert redact(text) == text


def test_json_stays_valid() -> None:
    text = json.dumps({"url": "postgresql://u:pw@h/db", "other": "a@b"})
    assert json.loads(redact(text)) == {"url": "postgresql://u:***@h/db", "other": "a@b"}


def test_known_secrets_are_masked_anywhere() -> None:
    secrets = url_passwords(["copy", "postgresql://u:se%7Ecret@h/db", "b.sqlite"])
    assert secrets == ["se%7Ecret", "se~cret"]
    assert redact('invalid token: "se~cret"', secrets) == 'invalid token: "***"'


def test_nested_data_is_masked_and_other_values_kept() -> None:
    data = {"store": "postgresql://u:pw@h/db", "n": 3, "all": ["mysql://a:b@c/d", ("x",)]}
    assert redact_data(data) == {
        "store": "postgresql://u:***@h/db",
        "n": 3,
        "all": ["mysql://a:***@c/d", ("x",)],
    }


def test_the_formatter_masks_messages_and_tracebacks() -> None:
    try:
        raise RuntimeError("cannot open postgresql://u:pw@h/db")
    except RuntimeError as exc:
        record = logging.LogRecord(
            "t",
            logging.ERROR,
            "f",
            1,
            "opening %s",
            ("postgres://a:pw@h/d",),
            (type(exc), exc, exc.__traceback__),
        )
    text = RedactingFormatter("%(message)s").format(record)
    assert ":pw@" not in text
    assert text.startswith("opening postgres://a:***@h/d\n")
    assert text.endswith("RuntimeError: cannot open postgresql://u:***@h/db")
