"""AWorld's import path ``aworld.replay_buffer.storage.multi_proc_mem``, kept for imports.

``from aworld.replay_buffer.storage.multi_proc_mem import MultiProcMemoryStorage``
becomes ``from replaystore.experience.storage.multi_proc_mem import
MultiProcMemoryStorage``; the class is
:class:`replaystore.experience.storage.multiproc.MultiProcMemoryStorage`.
"""

from replaystore.experience.storage.multiproc import MultiProcMemoryStorage

__all__ = ["MultiProcMemoryStorage"]
