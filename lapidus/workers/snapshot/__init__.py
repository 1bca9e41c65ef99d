"""Snapshots: the rows that already exist, streamed as ``read`` events (docs/snapshots.md).

The source-agnostic core, run in a backend's worker process:

* :mod:`.progress`: which tables are done and the last key of the last emitted chunk; its
  state is part of the worker's checkpoint, so a restart resumes at the next chunk;
* :mod:`.window`: one held chunk and the watermark hand-off (keys changed in the stream while
  the chunk is open are evicted from it; the rest is emitted at the high watermark);
* :mod:`.events`: the ``read`` event and its deterministic id.

A source supplies the database side: the table list, one chunk's SELECT between its two
watermarks, and where watermarks and changes show up in its stream
(:mod:`lapidus.workers.postgresql.snapshot`).
"""

#: the prefix of the logical messages (PostgreSQL) that mark a chunk's watermarks
WATERMARK_PREFIX = "lapidus-snapshot"
