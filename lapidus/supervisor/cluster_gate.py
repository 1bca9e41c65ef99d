"""The supervisor's side of cluster mode: which workers may run on this node, and until when.

Runs in the supervisor process (no asyncio, no NATS).  The lease child reports, about once a
second, a :class:`~lapidus.cluster.protocol.Grant` per lease it holds.  The gate keeps the
newest and answers from it alone, so the fencing holds even when the lease child is wedged
or dead: a worker runs only while its grant says ``run`` and its newest confirmed renewal is
younger than ``STOP_AT * lease_ttl``; past that the worker is asked to stop (it drains and
checkpoints), and one still alive at ``KILL_AT * lease_ttl`` is killed with its process tree.
A grant that disappears (the lease was lost) keeps its last renewal time for these deadlines.

The gate answers back (``workers``: which workers are alive, and the newest report acted on),
which lets the lease child release a lease it hands over only once that worker is gone.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from ..cluster.protocol import Grant


class ClusterGate:
    def __init__(self, cluster, log):
        self.cluster = cluster
        self.ttl = float(cluster.lease_ttl)
        self.log = log
        self.grants: Dict[str, Grant] = {}
        self.last: Dict[str, Grant] = {}       # the newest grant of every backend ever held
        self.seq = 0
        self.view: Dict[str, Any] = {}
        self.outbox = None                     # the pipe to the lease child
        self._sent: Optional[tuple] = None

    def on_message(self, kind: str, fields: dict) -> None:
        if kind != "leases":
            return
        self.grants = dict(fields.get("grants") or {})
        self.last.update(self.grants)
        self.seq = int(fields.get("seq") or 0)
        self.view = fields.get("view") or {}

    def lost_child(self) -> None:
        """The lease child died: nothing renews the leases any more.  The grants stay, with
        their renewal times, so the deadlines run out as they would have."""
        self.outbox = None
        self._sent = None

    # -- what the loop asks ----------------------------------------------------------------

    def may_run(self, backend: str, now: float) -> bool:
        grant = self.grants.get(backend)
        return grant is not None and grant.run and now < grant.stop_at(self.ttl)

    def stop_at(self, backend: str) -> float:
        """When a worker of ``backend`` must have stopped by the lease's timing (0.0: now,
        the lease is lost).  A hand-over (``run`` false) is not a reason here: that worker
        is stopped with SIGTERM, drains and saves its checkpoint."""
        grant = self.grants.get(backend)
        return grant.stop_at(self.ttl) if grant is not None else 0.0

    def epoch(self, backend: str) -> Optional[int]:
        grant = self.grants.get(backend)
        return grant.epoch if grant is not None else None

    def kill_at(self, backend: str) -> Optional[float]:
        """When a worker of ``backend`` still alive must be killed (None: no lease was ever
        held here, so no worker can be running)."""
        grant = self.last.get(backend)
        return grant.kill_at(self.ttl) if grant is not None else None

    def deadlines(self, now: float, alive: List[str]) -> List[float]:
        """The moments the loop must wake for: a grant's stop or kill time still ahead."""
        due = []
        for backend in alive:
            grant = self.last.get(backend)
            if grant is not None:
                due += [t for t in (grant.stop_at(self.ttl), grant.kill_at(self.ttl)) if t > now]
        return due

    def owner(self, backend: str) -> Optional[str]:
        for lease in self.view.get("leases") or ():
            if lease.get("backend") == backend:
                return lease.get("owner")
        return None

    def tell(self, running: List[str]) -> None:
        """Tell the lease child which workers are alive (only when that, or the report acted
        on, changed)."""
        message = ("workers", {"ack": self.seq, "running": sorted(running)})
        key = (self.seq, tuple(sorted(running)))
        if self.outbox is None or key == self._sent:
            return
        try:
            self.outbox.send(message)
            self._sent = key
        except (OSError, ValueError):
            self.outbox = None
