"""Polling helper for tests that wait on another thread or process.

Importable from any test (``tests/`` is on ``sys.path``): ``from waiting import wait_until``.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(condition: Callable[[], object], timeout_s: float = 10.0) -> bool:
    """Whether ``condition()`` became true within ``timeout_s`` (polled every 10 ms)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return bool(condition())
