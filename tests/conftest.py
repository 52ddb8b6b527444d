"""Suite-wide test configuration: deterministic property tests.

Hypothesis draws its examples from a fixed seed (``derandomize=True``) and keeps
no example database, so every run, in every ``pytest-xdist`` worker, tries the
same inputs: a property test cannot pass on one run and fail on the next.
``HYPOTHESIS_PROFILE=explore`` switches to fresh random examples for a local
bug hunt (a failure prints the seed to reproduce it).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

settings.register_profile("replaystore", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", derandomize=False, database=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "replaystore"))


# Test files that start a Ray runtime in the pytest process (the distributed tests,
# and the README's Ray example run by the docs test). Ray loads its C core and
# threads into the process, and a process forked from it afterwards (a
# multiprocessing Manager or writer, without exec) may crash inside Ray's library:
# seen once under load in CI, a Manager dying mid-test. So these files run last,
# in every worker: pytest-xdist hands out tests in collection order, so a worker
# that has started one of them gets nothing but them afterwards.
_RAY_FILES = ("distributed", "test_docs.py")


def _starts_ray(item: pytest.Item) -> bool:
    parts = item.path.relative_to(item.config.rootpath).parts
    return len(parts) > 1 and parts[0] == "tests" and parts[1] in _RAY_FILES


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=_starts_ray)  # stable: the order within each group is kept
