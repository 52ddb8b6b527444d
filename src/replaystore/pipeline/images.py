"""Compatibility name for :mod:`replaystore.images` (screenshots as URLs).

The image helpers live in :mod:`replaystore.images`, below both
:mod:`replaystore.trajectories` and :mod:`replaystore.pipeline`, so neither
package imports the other for them. Every public name is re-exported here
unchanged (the same objects), so ``from replaystore.pipeline.images import
image_to_data_url`` keeps working.
"""

from __future__ import annotations

# The same names and the same objects: one list, kept in replaystore.images.
from replaystore.images import *  # noqa: F403
from replaystore.images import __all__ as __all__
