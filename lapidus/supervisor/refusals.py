"""What a backend's pipeline does with an event a sink refuses for good (``on_undeliverable``).

Runs in the dispatcher process, called by :class:`Pipeline` when a sink raises
:class:`UndeliverableError` for one record.  ``"hold"``: the backend stays at that record (the
pipeline sends the same records again after a wait, so nothing is skipped) and the record is
shown in ``lapidusctl status``; ``"dead_letter"``: the record is appended to the backend's
dead-letter file (:mod:`lapidus.deadletters`, fsynced first) and the rest goes on.  Also reads
the resend file when an operator sends the dead letters again.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from .. import deadletters
from ..events import Record
from ..sinks.base import UndeliverableError


class RefusedEvents:
    def __init__(self, backend: str, policy: str, dead_letters: Optional[Path], log):
        self.backend = backend
        self.policy = policy              # "hold" | "dead_letter"
        self.path = dead_letters          # the backend's dead-letter file
        self.log = log
        self.held: Dict[str, dict] = {}   # plugin name -> the record it refuses, and why
        self.count = deadletters.count(dead_letters) if dead_letters else 0

    def refused(self, name: str, records: Sequence[Record],
                exc: UndeliverableError) -> Optional[List[Record]]:
        """Sink ``name`` refused ``records[exc.index]`` for good: the records to send it again
        at once (the refused one moved to the dead letters), or None to hold (send the same
        records again after a wait)."""
        record = records[exc.index]
        if self.policy == "dead_letter" and self.path is not None:
            deadletters.append(self.path, record, backend=self.backend, sink=name,
                               error=exc.reason, fix=exc.fix)
            self.count += 1
            self.log.warning("a sink refuses an event for good; moved it to the dead letters "
                             "and streaming on", sink=name, file=str(self.path),
                             **_described(record, exc))
            return list(records[:exc.index]) + list(records[exc.index + 1:])
        before = self.held.get(name, {})
        self.held[name] = {**_described(record, exc),
                           "since": before.get("since", time.time())}
        if before.get("id") != record.id:
            self.log.error("a sink refuses an event for good; the backend is held at it "
                           "(on_undeliverable = \"hold\"): fix the cause, or set "
                           "on_undeliverable = \"dead_letter\"", sink=name,
                           **_described(record, exc))
        return None

    def delivered(self, name: str) -> None:
        """Sink ``name`` confirmed a delivery: it holds nothing (any more)."""
        if self.held.pop(name, None) is not None:
            self.log.info("the refused event was delivered; streaming on", sink=name)

    # -- sending the dead letters again -------------------------------------------------------

    @property
    def resend_path(self) -> Optional[Path]:
        return self.path.with_name(deadletters.RESEND_FILE) if self.path else None

    def to_resend(self) -> List[Record]:
        """The records of the resend file (empty without one)."""
        path = self.resend_path
        return [record for _, record in deadletters.read(path)] if path else []

    def resent(self) -> None:
        """Every record of the resend file was delivered (or dead-lettered again)."""
        if self.resend_path is None:
            return
        try:
            self.resend_path.unlink()
        except FileNotFoundError:
            pass
        self.count = deadletters.count(self.path)


def _described(record: Record, exc: UndeliverableError) -> dict:
    return {"id": record.id, "table": deadletters.table_of(record), "size": len(record.data),
            "error": exc.reason, "fix": exc.fix}
