"""Suite-wide test configuration: deterministic property tests.

Hypothesis draws its examples from a fixed seed (``derandomize=True``) and keeps
no example database, so every run, in every ``pytest-xdist`` worker, tries the
same inputs: a property test cannot pass on one run and fail on the next.
``HYPOTHESIS_PROFILE=explore`` switches to fresh random examples for a local
bug hunt (a failure prints the seed to reproduce it).
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("replaystore", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", derandomize=False, database=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "replaystore"))
