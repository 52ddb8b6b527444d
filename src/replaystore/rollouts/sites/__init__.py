"""The local website suite: six small sites, a task file and the scripted solutions.

See :mod:`replaystore.rollouts.sites.server` (:class:`LocalSuite`) and
:mod:`replaystore.rollouts.sites.pages` (what each site shows).
"""

from __future__ import annotations

from .pages import SITES
from .server import PLANS_FILE, TASKS_FILE, LocalSuite, load_plans, localize_url

__all__ = ["PLANS_FILE", "SITES", "TASKS_FILE", "LocalSuite", "load_plans", "localize_url"]
