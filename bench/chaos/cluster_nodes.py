"""Lapidus cluster nodes as separate processes, and the ownership log they leave.

A :class:`ClusterNode` is a ``lapidus -c CONFIG`` with a ``[cluster]`` table and its own state
directory.  The supervisor logs ``cluster: streaming this backend here`` when it starts a
backend's worker on its lease and ``cluster: stopped streaming this backend here`` when that
worker has exited (reaped); :meth:`ClusterNode.intervals` turns those into wall-clock
intervals, and :func:`overlaps` finds two nodes streaming one backend at once.  A node killed
with ``kill -9`` (:meth:`ClusterNode.kill9`, the whole process group: a machine that dies) logs
no end: its intervals end at the kill.  A worker that stopped itself because its lease was not
renewed in time (its supervisor frozen) ends its interval when it logs so, not when the
supervisor reaps it after thawing.
"""

from __future__ import annotations

import datetime
import os
import signal
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Set, Tuple

from .lapidus import LapidusProcess

STARTED = "cluster: streaming this backend here"
STOPPED = "cluster: stopped streaming this backend here"
LEASE_LOST = "this node does not hold this backend's lease any more; stopping at once"

Interval = Tuple[str, str, float, float]      # node, backend, start, end (epoch seconds)


def node_config(name: str, workdir: Path, servers: Sequence[str], backends: List[dict],
                plugins: dict, lease_ttl: float = 4.0, **cluster) -> dict:
    return {"state_dir": str(workdir / "state"), "log": {"format": "json", "level": "info"},
            "control": {"socket": str(workdir / "lapidus.sock")},
            "supervisor": {"backoff_initial": 0.2, "backoff_max": 1.0},
            "cluster": {"servers": list(servers), "node": name, "lease_ttl": lease_ttl,
                        **cluster},
            "plugins": plugins, "backends": backends}


class ClusterNode(LapidusProcess):
    def __init__(self, name: str, config: dict, workdir: Path):
        workdir.mkdir(parents=True, exist_ok=True)
        super().__init__(config, workdir)
        self.name = name
        self.kills: List[float] = []      # time.time() of each kill -9

    @property
    def killed_at(self) -> Optional[float]:
        """The time of the last kill -9 (None: never killed)."""
        return self.kills[-1] if self.kills else None

    def kill9(self) -> float:
        """SIGKILL the node's whole process group at once; returns the time of the kill."""
        self.kills.append(time.time())
        try:
            os.killpg(os.getpgid(self.proc.pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)
        return self.kills[-1]

    def intervals(self) -> List[Interval]:
        """When this node streamed which backend (open intervals end now, or at the kill)."""
        open_: Dict[str, float] = {}
        out: List[Interval] = []
        for record in self.records():
            event, backend = record.get("event"), record.get("backend")
            if event == STARTED:
                open_[backend] = _when(record)
            elif event in (STOPPED, LEASE_LOST) and backend in open_:
                out.append((self.name, backend, open_.pop(backend), _when(record)))
            elif event == "lapidus starting":
                # a new run after a kill: what the killed run streamed ended at that kill
                began = _when(record)
                end = max((k for k in self.kills if k <= began), default=began)
                out += [(self.name, b, start, end) for b, start in open_.items()]
                open_.clear()
        end = self.killed_at if self.killed_at and not self.alive() else time.time()
        out += [(self.name, b, start, end) for b, start in open_.items()]
        return out

    def streams(self, backend: str) -> bool:
        """This node's worker of ``backend`` runs and has reported ready (positioned in its
        source: what is committed from now on reaches the sinks)."""
        return backend in self.streaming()

    def streaming(self) -> Set[str]:
        """The backends whose worker runs here and has reported ready (one read of the log)."""
        if not self.alive():
            return set()
        state: Dict[str, str] = {}
        for record in self.records(current=True):
            backend, event = record.get("backend"), record.get("event")
            if event in (STARTED, STOPPED):
                state[backend] = event
            elif event == "running" and record.get("process") == "supervisor" \
                    and state.get(backend) == STARTED:
                state[backend] = "running"
        return {backend for backend, seen in state.items() if seen == "running"}

    def started(self, backend: str) -> bool:
        """A worker of ``backend`` was started here and has not been reaped since."""
        state = None
        for record in self.records(current=True):
            if record.get("backend") == backend and record.get("event") in (STARTED, STOPPED):
                state = record["event"]
        return self.alive() and state == STARTED

    def first_start_after(self, backend: str, moment: float) -> Optional[float]:
        starts = [start for _n, b, start, _e in self.intervals() if b == backend
                  and start >= moment]
        return min(starts) if starts else None


def overlaps(nodes: Sequence[ClusterNode]) -> List[Tuple[Interval, Interval]]:
    """Pairs of intervals in which two nodes streamed the same backend at the same time."""
    every = [i for node in nodes for i in node.intervals()]
    found = []
    for index, a in enumerate(every):
        for b in every[index + 1:]:
            if a[0] != b[0] and a[1] == b[1] and a[2] < b[3] and b[2] < a[3]:
                found.append((a, b))
    return found


def _when(record: dict) -> float:
    stamp = record["timestamp"].replace("Z", "+00:00")
    return datetime.datetime.fromisoformat(stamp).timestamp()
