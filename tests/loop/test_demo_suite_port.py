"""The loop demo serves the local suite on one port, so its training data repeat.

Two quick loop demos whose demonstrations differed only in the suite's random port
(every prompt shows the sites' URLs) trained models that solved 11/14 and 0/14 of
the tasks (2026-11-26).
"""

from __future__ import annotations

import logging
import socket

import pytest

from replaystore.demos import loop as loop_demo


def test_the_demo_asks_for_its_fixed_port_when_free(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:  # a port known to be free right now
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    monkeypatch.setattr(loop_demo, "SUITE_PORT", free)
    assert loop_demo._suite_port() == free


def test_a_taken_port_falls_back_to_a_free_one_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        monkeypatch.setattr(loop_demo, "SUITE_PORT", taken.getsockname()[1])
        with caplog.at_level(logging.WARNING, logger="replaystore.demos.loop"):
            assert loop_demo._suite_port() == 0
    assert "training data differ" in caplog.text
