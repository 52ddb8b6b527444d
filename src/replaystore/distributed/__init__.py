"""Distributed replay on Ray: remote buffers, batching writers, sharded prioritized replay.

Needs the optional ``ray`` extra (``pip install "replaystore[ray]"``). Ray is
imported when an actor is first created, not when this package is imported.

* :class:`RemoteBuffer`: any of the library's buffers in one Ray actor, with a
  client whose methods are the buffer's (errors keep their type).
* :class:`BatchingWriter`: batches single adds (size and time thresholds),
  bounded in-flight calls (back-pressure).
* :class:`ShardedReplayBuffer`: transitions over N shard actors with exact
  uniform/prioritized sampling over the union, global-index priority
  updates, atomic whole checkpoints and restart from periodic checkpoints.
* :class:`RemoteActorError`: a hosting actor is dead (the message names it).
"""

from __future__ import annotations

from replaystore.distributed._ray import RemoteActorError
from replaystore.distributed.remote import RemoteBuffer
from replaystore.distributed.sharded import ShardedReplayBuffer
from replaystore.distributed.writer import BatchingWriter

__all__ = ["BatchingWriter", "RemoteActorError", "RemoteBuffer", "ShardedReplayBuffer"]
