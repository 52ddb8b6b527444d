"""The lock under which a storage checks whether it now runs in a forked child.

A storage opened in a parent and first used in a forked child drops the parent's
connection (or pool) and thread lock: a thread of the parent may have held that
lock at the fork, and nothing would release it in the child. The check and the
swap run under :func:`fork_check_lock`, which every child gets fresh
(``os.register_at_fork``), so when several threads of a child make their first
call at once, exactly one swaps and the others use what it opened.
"""

from __future__ import annotations

import os
import threading

_lock = threading.Lock()


def _fresh_in_child() -> None:
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):  # POSIX; elsewhere there is no fork
    os.register_at_fork(after_in_child=_fresh_in_child)


def fork_check_lock() -> threading.Lock:
    """This process's lock for the fork check (never one a parent's thread held)."""
    return _lock
