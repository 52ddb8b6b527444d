"""One real local Ray runtime per test module (``ray.init(num_cpus=2)``, small object store)."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from typing import Any

import pytest

if importlib.util.find_spec("ray") is None:
    if os.environ.get("CI") == "true":
        raise ImportError('CI=true: the distributed tests need Ray: pip install "replaystore[ray]"')
    pytest.skip('Ray is not installed (pip install "replaystore[ray]")', allow_module_level=True)


@pytest.fixture(scope="module")
def ray_session() -> Iterator[Any]:
    import ray

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=200 * 1024 * 1024,
        log_to_driver=False,
        configure_logging=False,
    )
    try:
        yield ray
    finally:
        ray.shutdown()
