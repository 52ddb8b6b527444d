"""Utilities around the trajectory buffer (WebGym's ``webgym/utils``).

Each utility lives in its own submodule and is imported from there, e.g.
``from replaystore.pipeline.images import image_to_data_url``. This package
imports nothing eagerly, so adding a submodule never changes import cost or
import order for the others.
"""
