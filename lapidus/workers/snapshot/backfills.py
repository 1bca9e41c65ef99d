"""The worker's side of ``lapidusctl backfill``: start, cancel and forget queued requests.

Runs in the worker process, called by the worker loop about once a second while the source
is open (:meth:`Backfills.poll`).  One run at a time: a request starts only when no run
(the initial snapshot included) is in progress, oldest first.  The request file of a run
stays on disk until a *saved* checkpoint says the run finished, so a crash at any point
resumes the run (from its checkpointed progress) instead of forgetting it.
"""

from __future__ import annotations

from typing import Any, List, Optional

from .requests import BackfillQueue, BackfillRequest
from .run import SnapshotRefused

KEEP_REFUSED = 20     # refusals kept for lapidusctl (status, --wait)


class Backfills:
    def __init__(self, queue: BackfillQueue, log):
        self.queue = queue
        self.log = log
        self.queued: List[BackfillRequest] = []

    def poll(self, source, saved: Any) -> None:
        """Bring the source's run in line with the request files (see the module)."""
        saved_run = saved.get("snapshot") if isinstance(saved, dict) else None
        if saved_run and saved_run.get("done") and saved_run.get("n", 0) >= 1:
            self.queue.finished(saved_run["n"])
        pending = self.queue.pending()
        progress = source.snapshot_progress
        if progress is not None and not progress.done:
            if progress.n >= 1 and all(r.n != progress.n for r in pending):
                source.cancel_snapshot()    # its file is gone: lapidusctl backfill --cancel
            else:
                self.queued = [r for r in pending if r.n > progress.n]
                return
        latest = progress.n if progress is not None else 0
        # requests up to ``latest`` are finished, their files wait for the saved checkpoint
        waiting = [r for r in pending if r.n > latest]
        while waiting:
            request = waiting.pop(0)
            if self._start(source, request):
                break
        self.queued = waiting

    def _start(self, source, request: BackfillRequest) -> bool:
        try:
            table = source.start_backfill(request.n, request.table, request.where,
                                          sink=request.sink)
        except SnapshotRefused as exc:
            self.log.warning("backfill refused", n=request.n, table=request.table,
                             reason=str(exc))
            self.queue.refuse(request, str(exc), keep=KEEP_REFUSED)
            return False
        self.log.info("backfill started", n=request.n, table=table, where=request.where,
                      sink=request.sink)
        return True

    def status(self) -> Optional[dict]:
        """``backfills`` of the worker's stats: what waits, and the recent refusals."""
        refused = self.queue.refused()
        if not self.queued and not refused:
            return None
        return {"queued": [r.fields() for r in self.queued], "refused": refused}
