"""Where a backend's very first open started, kept until its first checkpoint is saved.

Runs in the worker process, for sources that start "from now" when there is no checkpoint
(MySQL/MariaDB: the binlog's end; MongoDB: the change stream's current token). Without this, a
worker that restarts before its first checkpoint (a crash, a kill -9, a lost dispatcher)
would start from a *new* now, and the changes committed in between would never be read.
PostgreSQL needs none: its slot, created at the first open, holds the position on the server.

The position lives in ``<state_dir>/<source>-first-start.json`` (in cluster mode in the
bucket, beside the fenced checkpoint: :meth:`share`), written before ``open`` returns and
removed once the worker saved a real checkpoint (:meth:`settled`, from the source's
``commit``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from ..checkpoint import CheckpointStore


class FirstStart:
    def __init__(self, state_dir: Optional[Path], filename: str, log):
        self.store = CheckpointStore(Path(state_dir), filename) if state_dir is not None \
            else None
        self.log = log
        self.pending = False        # a marker is on disk that the next commit removes

    def share(self, store) -> None:
        """Cluster mode: keep the marker in the bucket (``store.marker``), so the node that
        takes the backend over resumes from it too."""
        self.store = store.marker("first-start")

    def recall(self, checkpoint: Optional[Any]) -> Optional[Any]:
        """The position to open at when the worker has no ``checkpoint``: the first open's,
        or None (a real first start: from now).  With a checkpoint, a marker left by a crash
        right after the first save is removed, and None is returned."""
        if self.store is None:
            return None
        if checkpoint is not None:
            if self.store.load() is not None:
                self.store.clear()
            return None
        marker = self.store.load()
        if marker is not None:
            self.pending = True
            self.log.info("resuming from the first-start position (no checkpoint saved yet)",
                          path=str(self.store.path))
        return marker

    def remember(self, position: Any) -> None:
        """The first open's position, before ``open`` returns."""
        if self.store is not None:
            self.store.save(position)
            self.pending = True

    def settled(self) -> None:
        """The worker saved a real checkpoint: the marker has done its job."""
        if self.pending and self.store is not None:
            self.store.clear()
            self.pending = False
