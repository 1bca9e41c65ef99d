"""The fault injector: a seeded sequence of faults, one at a time, during the load.

Fault kinds (``KINDS``):

* ``kill_worker_pg``, ``kill_worker_mysql``, ``kill_dispatcher``, ``kill_recvlogical``:
  SIGKILL of that Lapidus process; the supervisor (or the worker) must restart it.
* ``kill_supervisor``: SIGKILL of ``lapidus`` itself; its children must die by themselves;
  the harness starts Lapidus again on the same state directory.
* ``nats_outage``: nats-server stopped (cleanly) for 1-4 s, then started again.
* ``mariadb_restart``: ``mariadb-admin shutdown``, then start; half of the time while NATS is
  down (Lapidus behind), and with a bystander, half of the time with the bystander writing
  first after the restart.
* ``pg_restart``: ``pg_ctlcluster 15 main restart`` (cuts every session on the server: off in
  the CI variant).
* ``cut_pg``, ``cut_mysql``, ``cut_nats``: the TCP proxy between Lapidus and that server drops
  every connection and refuses new ones for 0.3-2.5 s.

Every fault restores what it broke in a ``finally`` block.  After each fault the injector waits
until the broken piece is back (a new process, a server answering); with ``settle`` it also
waits until the stream caught up with everything committed before the fault ended, and records
how long that took (a timeout there is a finding: Lapidus did not recover).
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

from . import servers
from .waiting import ChaosTimeout, hold

KINDS = ("kill_worker_pg", "kill_worker_mysql", "kill_dispatcher", "kill_recvlogical",
         "kill_supervisor", "nats_outage", "mariadb_restart", "pg_restart",
         "cut_pg", "cut_mysql", "cut_nats")
CI_KINDS = tuple(k for k in KINDS if k != "pg_restart")


@dataclass
class FaultRecord:
    kind: str
    at: float                      # seconds since the injector started
    duration: float                # the fault itself, restore included
    detail: str = ""
    recovered_in: Optional[float] = None   # seconds until the stream caught up (settle)
    error: Optional[str] = None

    def line(self) -> str:
        text = f"{self.at:7.1f}s {self.kind:<18} {self.duration:5.1f}s"
        if self.recovered_in is not None:
            text += f"  caught up in {self.recovered_in:5.1f}s"
        if self.detail:
            text += f"  {self.detail}"
        if self.error:
            text += f"  ERROR: {self.error}"
        return text


class FaultInjector(threading.Thread):
    """``run`` is the harness (bench.chaos.run.ChaosRun): it owns Lapidus, proxies, servers."""

    def __init__(self, run, kinds: List[str], seed: int, interval: float,
                 per_kind: Optional[int] = None, settle: bool = False,
                 recovery_timeout: float = 120.0, log: Callable[[str], None] = print):
        super().__init__(daemon=True, name="faults")
        unknown = set(kinds) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {', '.join(KINDS)}")
        self.run_ = run
        self.kinds = list(kinds)
        self.rng = random.Random(seed)
        self.interval = interval
        self.per_kind = per_kind
        self.settle = settle
        self.recovery_timeout = recovery_timeout
        self.log = log
        self.records: List[FaultRecord] = []
        self.stop_event = threading.Event()
        self.failure: Optional[BaseException] = None
        self.started_at = time.monotonic()

    def stop(self) -> None:
        self.stop_event.set()

    def deck(self):
        """The faults in the order they will come: shuffled rounds of every kind."""
        rounds = 0
        while self.kinds and (self.per_kind is None or rounds < self.per_kind):
            order = list(self.kinds)
            self.rng.shuffle(order)
            yield from order
            rounds += 1

    def run(self) -> None:
        self.started_at = time.monotonic()
        try:
            for kind in self.deck():
                hold(self.interval * self.rng.uniform(0.5, 1.5), self.stop_event.is_set)
                if self.stop_event.is_set():
                    return
                self.inject(kind)
        except BaseException as exc:        # a broken harness must not look like a pass
            self.failure = exc
            self.log(f"fault injector failed: {exc!r}\n{traceback.format_exc()}")

    def inject(self, kind: str) -> FaultRecord:
        record = FaultRecord(kind, time.monotonic() - self.started_at, 0.0)
        began = time.monotonic()
        try:
            record.detail = getattr(self, kind)() or ""
        except ChaosTimeout as exc:
            record.error = str(exc)
        record.duration = time.monotonic() - began
        if self.settle and record.error is None:
            began = time.monotonic()
            try:
                self.run_.wait_caught_up(self.recovery_timeout)
                record.recovered_in = time.monotonic() - began
            except ChaosTimeout as exc:
                record.error = f"did not catch up: {exc}"
        self.records.append(record)
        self.log(record.line())
        return record

    def summary(self) -> Dict[str, int]:
        counts: Dict[str, int] = {}
        for record in self.records:
            counts[record.kind] = counts.get(record.kind, 0) + 1
        return counts

    # -- the faults --------------------------------------------------------------------------

    def _kill_child(self, name: str) -> str:
        lapidus = self.run_.lapidus
        pid = lapidus.wait_child(name, timeout=60)
        os.kill(pid, signal.SIGKILL)
        new = lapidus.wait_child(name, other_than=pid, timeout=60)
        return f"pid {pid} -> {new}"

    def kill_worker_pg(self) -> str:
        return self._kill_child(f"lapidus:{self.run_.PG_BACKEND}")

    def kill_worker_mysql(self) -> str:
        return self._kill_child(f"lapidus:{self.run_.MYSQL_BACKEND}")

    def kill_dispatcher(self) -> str:
        return self._kill_child("lapidus:dispatch")

    def kill_recvlogical(self) -> str:
        return self._kill_child("pg_recvlogical")

    def kill_supervisor(self) -> str:
        lapidus = self.run_.lapidus
        pid = lapidus.proc.pid
        left = lapidus.kill_supervisor()
        if left:
            self.run_.findings.append(f"kill -9 of the supervisor left children alive: {left}")
        lapidus.start()
        lapidus.wait_streaming(self.run_.backend_names)
        return f"pid {pid} -> {lapidus.proc.pid}" + (f", orphans {left}" if left else "")

    def nats_outage(self) -> str:
        outage = self.rng.uniform(1.0, 4.0)
        nats_server = self.run_.nats_server
        try:
            nats_server.stop()
            hold(outage)                      # the outage's length
        finally:
            nats_server.ensure()
        return f"down {outage:.1f}s"

    def mariadb_restart(self) -> str:
        """Half of the restarts happen while NATS is down, so Lapidus is behind and its
        restarted worker resumes in the binlog file the restart closed and reads on across
        the restart; with a bystander, half of them have the bystander write first after
        the restart, so its table takes the first table id of the new server run."""
        behind = self.rng.random() < 0.5
        bystander_first = self.run_.bystander is not None and self.rng.random() < 0.5
        nats_server = self.run_.nats_server
        try:
            if behind:
                nats_server.stop()
                hold(1.0)                     # the load goes on; Lapidus falls behind
            servers.restart_mariadb()
            if bystander_first:
                self.run_.bystander.write_once()
        finally:
            if behind:
                nats_server.ensure()
        return ", ".join(text for flag, text in ((behind, "while NATS was down"),
                                                 (bystander_first, "bystander first"))
                         if flag)

    def pg_restart(self) -> str:
        try:
            servers.restart_postgresql()
        finally:
            servers.ensure_postgresql()
        return ""

    def _cut(self, name: str) -> str:
        proxy = self.run_.proxies[name]
        outage = self.rng.uniform(0.3, 2.5)
        try:
            dropped = proxy.cut()
            hold(outage)                      # the outage's length
        finally:
            proxy.restore()
        return f"{dropped} connections dropped, refused for {outage:.1f}s"

    def cut_pg(self) -> str:
        return self._cut("postgresql")

    def cut_mysql(self) -> str:
        return self._cut("mysql")

    def cut_nats(self) -> str:
        return self._cut("nats")
