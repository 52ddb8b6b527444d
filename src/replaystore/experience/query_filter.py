"""AWorld's import path ``aworld.replay_buffer.query_filter``, kept so imports map one to one.

``from aworld.replay_buffer.query_filter import QueryBuilder`` becomes
``from replaystore.experience.query_filter import QueryBuilder``; the class is
:class:`replaystore.experience.query.QueryBuilder`.
"""

from replaystore.experience.query import QueryBuilder

__all__ = ["QueryBuilder"]
