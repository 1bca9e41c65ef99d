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
* ``stop_worker_pg``, ``stop_worker_mysql``, ``stop_dispatcher``, ``stop_supervisor``: ``kill
  -STOP`` of that process, ``kill -CONT`` after a freeze shorter or longer than the run's
  ``heartbeat_timeout`` (:mod:`bench.chaos.freezes`).
* ``reload_backends``, ``reload_sink_option``, ``reload_backend_option``: the configuration
  file rewritten and SIGHUP to the supervisor, under load: the extra backend removed or added
  again, a nats option that keeps subjects changed, a backend's ``batch_size`` changed
  (:mod:`bench.chaos.reloads`).
* ``dead_letter``: one insert whose event is larger than the private nats-server's
  ``max_payload``, amid a transaction of the load; with ``on_undeliverable = "dead_letter"``
  it must land in the backend's dead letters while the stream goes on
  (:mod:`bench.chaos.deadletters`).
* ``slow_clients``: 50 clients on the control socket and ``[http] listen`` at once, half of
  them trickling a byte every half second, half silent; ``lapidusctl status`` must answer
  meanwhile (:mod:`bench.chaos.slowclients`).

In cluster mode (``CLUSTER_KINDS``, with several Lapidus nodes and a three-server NATS cluster):

* ``kill_node``: SIGKILL of the process group of the node streaming a backend drawn at random;
  it is started again after a moment, or once the other nodes took its backends over (half
  each).
* ``kill_nats_server``: SIGKILL of one of the three nats-servers, started again after 2-5 s.
* ``freeze_node``: SIGSTOP of the supervisor and the lease child of the node streaming a
  backend drawn at random, SIGCONT once the other nodes stream its backends: its workers, left
  running, must have stopped themselves.

Of the kinds above, only those in ``CLUSTER_COMPATIBLE`` (the database servers and the
proxies between them and every node) make sense in cluster mode; :func:`refused` says which
kinds a mode refuses.

Every fault restores what it broke in a ``finally`` block.  After each fault the injector waits
until the broken piece is back (a new process, a server answering; for the new kinds:
``lapidusctl status`` shows every configured backend RUNNING with a running process, and the
dispatcher's process running); with ``settle`` it also
waits until the stream caught up with everything committed before the fault ended, and records
how long that took (a timeout there is a finding: Lapidus did not recover).  After the first
fault that Lapidus did not recover from, the injector stops (and the run ends its load): the
fences and the checker say what that fault cost.
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

from . import ctl, deadletters, servers
from .cluster_nodes import LEASE_LOST, STOPPED
from .freezes import freeze, freeze_length
from .load import TABLE
from .slowclients import SlowCrowd
from .waiting import ChaosTimeout, hold, wait_for

CLASSIC_KINDS = ("kill_worker_pg", "kill_worker_mysql", "kill_dispatcher", "kill_recvlogical",
                 "kill_supervisor", "nats_outage", "mariadb_restart", "pg_restart",
                 "cut_pg", "cut_mysql", "cut_nats")
STOP_KINDS = ("stop_worker_pg", "stop_worker_mysql", "stop_dispatcher", "stop_supervisor")
RELOAD_KINDS = ("reload_backends", "reload_sink_option", "reload_backend_option")
# the lifecycle faults; none of them touches the shared PostgreSQL or MariaDB server
FORK_SERVER_KINDS = ("kill_fork_server", "stop_fork_server")
NEW_KINDS = STOP_KINDS + RELOAD_KINDS + FORK_SERVER_KINDS + ("dead_letter", "slow_clients")
KINDS = CLASSIC_KINDS + NEW_KINDS
CI_KINDS = tuple(k for k in CLASSIC_KINDS if k != "pg_restart")
CLUSTER_KINDS = ("kill_node", "kill_nats_server", "freeze_node")
# the kinds that mean the same with several nodes: the database servers, and the proxies
# between them and every node (each node reaches NATS directly)
CLUSTER_COMPATIBLE = ("mariadb_restart", "pg_restart", "cut_pg", "cut_mysql")
ALL_KINDS = KINDS + CLUSTER_KINDS
SLOW_CLIENTS = 50
SLOW_CLIENTS_STATUS_DEADLINE = 5.0   # lapidusctl status with the crowd connected
CTL_PATIENCE = 20.0                  # longer than lapidusctl's own timeout on the socket
RECOVERY = 60.0                      # seconds for a process-level recovery (status RUNNING)


def default_kinds(cluster: bool) -> List[str]:
    """Every kind of the mode."""
    return list(CLUSTER_KINDS + CLUSTER_COMPATIBLE if cluster else KINDS)


def refused(kinds: List[str], cluster: bool) -> Optional[str]:
    """Why ``kinds`` cannot run in this mode (None: they can)."""
    unknown = [k for k in kinds if k not in ALL_KINDS]
    if unknown:
        return f"unknown fault kinds {unknown}; known: {', '.join(ALL_KINDS)}"
    if cluster:
        wrong = [k for k in kinds if k not in CLUSTER_KINDS + CLUSTER_COMPATIBLE]
        if wrong:
            return (f"fault kinds {wrong} make no sense in cluster mode (they act on a single "
                    f"Lapidus or a single nats-server); with --cluster use "
                    f"{', '.join(CLUSTER_KINDS + CLUSTER_COMPATIBLE)}")
    else:
        wrong = [k for k in kinds if k in CLUSTER_KINDS]
        if wrong:
            return f"fault kinds {wrong} need --cluster"
    return None


@dataclass
class FaultRecord:
    kind: str
    at: float                      # seconds since the injector started
    duration: float                # the fault itself, restore included
    detail: str = ""
    recovered_in: Optional[float] = None   # seconds until the stream caught up (settle)
    error: Optional[str] = None
    back_in: Optional[float] = None   # cluster kinds: from the fault until the cluster recovered

    def line(self) -> str:
        text = f"{self.at:7.1f}s {self.kind:<18} {self.duration:5.1f}s"
        if self.back_in is not None:
            text += f"  back in {self.back_in:5.1f}s"
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
        problem = refused(kinds, run.nodes != [])
        if problem:
            raise ValueError(problem)
        self.run_ = run
        self.kinds = list(kinds)
        self.rng = random.Random(seed)
        self.interval = interval
        self.per_kind = per_kind
        self.settle = settle
        self.recovery_timeout = recovery_timeout
        self.log = log
        self.records: List[FaultRecord] = []
        self.current: Optional[FaultRecord] = None     # the fault under way
        self.stop_event = threading.Event()
        self.failure: Optional[BaseException] = None
        self.gave_up = False          # stopped early: Lapidus did not recover from a fault
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
                record = self.inject(kind)
                if record.error is not None:
                    # Lapidus did not recover: every later fault would wait for the same
                    # recovery and time out, which costs minutes and says nothing new
                    self.log("no more faults: Lapidus did not recover from the last one")
                    self.gave_up = True
                    return
        except BaseException as exc:        # a broken harness must not look like a pass
            self.failure = exc
            self.log(f"fault injector failed: {exc!r}\n{traceback.format_exc()}")

    def inject(self, kind: str) -> FaultRecord:
        record = self.current = FaultRecord(kind, time.monotonic() - self.started_at, 0.0)
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
        # (in cluster mode there is no single nats-server to stop)
        behind = self.run_.nats_server is not None and self.rng.random() < 0.5
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

    # -- lifecycle: frozen processes ------------------------------------------------------------

    def _wait_recovered(self, what: str, timeout: float = RECOVERY) -> ctl.CtlAnswer:
        """``lapidusctl status`` shows every configured backend RUNNING with a running process,
        and the dispatcher's process runs; ChaosTimeout naming the last status otherwise."""
        run = self.run_
        last: List[ctl.CtlAnswer] = []

        def recovered():
            answer = ctl.status(run.lapidus.config_path, timeout=CTL_PATIENCE,
                                log=run.ctl_log)
            last[:] = [answer]
            return answer if ctl.all_running(answer, run.backend_names) else None
        try:
            return wait_for(recovered, timeout, what, interval=0.3)
        except ChaosTimeout as exc:
            raise ChaosTimeout(f"{exc}; last status: "
                               f"{ctl.describe(last[0]) if last else '-'}") from None

    def _freeze_child(self, name: str) -> str:
        run = self.run_
        self._wait_recovered(f"every backend RUNNING before freezing {name}")
        pid = run.lapidus.wait_child(name, timeout=60)
        length = freeze_length(self.rng, run.heartbeat_timeout)
        existed = freeze(pid, length)
        self._wait_recovered(f"every backend RUNNING after {name} was frozen {length:.1f}s")
        now = run.lapidus.find(name)
        fate = "resumed" if existed and now == pid else f"replaced by {now}"
        return (f"pid {pid} frozen {length:.1f}s (heartbeat_timeout "
                f"{run.heartbeat_timeout:g}s), {fate}")

    def stop_worker_pg(self) -> str:
        return self._freeze_child(f"lapidus:{self.run_.PG_BACKEND}")

    # -- lifecycle: the workers' fork server ------------------------------------------------

    def kill_fork_server(self) -> str:
        """kill -9 of the fork server: every worker dies with it and starts again through a
        new one."""
        detail = self._kill_child("lapidus:forker")
        self._wait_recovered("every backend RUNNING after the fork server was killed")
        return detail

    def stop_fork_server(self) -> str:
        """The fork server frozen, and the PostgreSQL worker killed meanwhile: only the frozen
        server could report that exit, so the supervisor must see it through the worker's
        silence and replace the server (its other workers are restarted with it)."""
        run = self.run_
        self._wait_recovered("every backend RUNNING before freezing the fork server")
        server = run.lapidus.wait_child("lapidus:forker", timeout=60)
        worker = run.lapidus.wait_child(f"lapidus:{run.PG_BACKEND}", timeout=60)
        os.kill(server, signal.SIGSTOP)
        try:
            os.kill(worker, signal.SIGKILL)
            self._wait_recovered("every backend RUNNING after a worker died under the frozen "
                                 "fork server")
        finally:
            try:
                os.kill(server, signal.SIGCONT)
            except ProcessLookupError:
                pass        # killed by the supervisor, as it should be
        return (f"fork server {server} frozen, worker {worker} killed; fork server now "
                f"{run.lapidus.find('lapidus:forker')}")

    def stop_worker_mysql(self) -> str:
        return self._freeze_child(f"lapidus:{self.run_.MYSQL_BACKEND}")

    def stop_dispatcher(self) -> str:
        return self._freeze_child("lapidus:dispatch")

    def stop_supervisor(self) -> str:
        run = self.run_
        self._wait_recovered("every backend RUNNING before freezing the supervisor")
        pid = run.lapidus.proc.pid
        length = freeze_length(self.rng, run.heartbeat_timeout)
        freeze(pid, length)
        self._wait_recovered(f"every backend RUNNING after the supervisor was frozen "
                             f"{length:.1f}s")
        return f"pid {pid} frozen {length:.1f}s (heartbeat_timeout {run.heartbeat_timeout:g}s)"

    # -- lifecycle: reloads -------------------------------------------------------------------

    def _reload(self, change: str, restarted: Optional[str] = None) -> str:
        """Rewrite the configuration (already flipped in the plan), SIGHUP, and wait until the
        reload is logged and every configured backend runs; with ``restarted`` (a child's
        name) also until that child is a new process."""
        run = self.run_
        old = run.lapidus.find(restarted) if restarted else None
        offset = run.lapidus.reload(run.plan.render())
        run.lapidus.wait_logged("configuration reloaded", offset, timeout=RECOVERY)
        if restarted:
            run.lapidus.wait_child(restarted, other_than=old, timeout=RECOVERY)
        self._wait_recovered(f"every backend RUNNING after the reload ({change})")
        return change + (f", {restarted} pid {old} -> {run.lapidus.find(restarted)}"
                         if restarted else "")

    def reload_backends(self) -> str:
        run = self.run_
        change = "extra backend " + run.plan.flip_extra()
        detail = self._reload(change)
        if not run.plan.extra_present:
            run.lapidus.wait_children_gone(f"lapidus:{run.EXTRA_BACKEND}", timeout=RECOVERY)
        return detail

    def reload_sink_option(self) -> str:
        # a global plugin option: every backend that uses the global plugins restarts and gets
        # sinks made from the new options (the dispatcher keeps running)
        run = self.run_
        return self._reload(run.plan.flip_sink_option(), restarted=f"lapidus:{run.PG_BACKEND}")

    def reload_backend_option(self) -> str:
        run = self.run_
        backend = self.rng.choice([run.PG_BACKEND, run.MYSQL_BACKEND])
        return self._reload(run.plan.flip_backend_option(backend),
                            restarted=f"lapidus:{backend}")

    # -- lifecycle: an event too large for NATS ---------------------------------------------------

    def dead_letter(self) -> str:
        """An oversized insert amid one of the load's transactions; back when it is in the
        backend's dead letters and the stream caught up past it (the backend goes on)."""
        run = self.run_
        writer = self.rng.choice([t for t in run.loads if t.backend in
                                  (run.PG_BACKEND, run.MYSQL_BACKEND)])
        before = writer.request_oversized(run.options.oversized_pad)
        change = wait_for(lambda: writer.oversized_after(before), RECOVERY,
                          f"{writer.backend}: the oversized insert committed")
        wait_for(lambda: deadletters.holds(run.state_dir, writer.backend, change.key, TABLE),
                 RECOVERY, f"{writer.backend}: key {change.key} in "
                           f"{deadletters.path_of(run.state_dir, writer.backend)}",
                 interval=0.2)
        return (f"{writer.backend} key {change.key} ({run.options.oversized_pad} bytes of pad, "
                f"max_payload {run.options.max_payload}) dead-lettered")

    # -- lifecycle: slow clients ----------------------------------------------------------------

    def slow_clients(self) -> str:
        """50 slow clients for a few seconds; meanwhile ``lapidusctl status`` must answer
        within SLOW_CLIENTS_STATUS_DEADLINE, every time it is asked."""
        run = self.run_
        length = self.rng.uniform(3.0, 6.0)
        slow: List[str] = []
        asked = 0
        with SlowCrowd(str(run.control_socket), run.http_address, SLOW_CLIENTS) as crowd:
            began = time.monotonic()
            while time.monotonic() - began < length:     # the crowd's stay, by design
                # lapidusctl gets longer than the deadline, so that its own handling of a
                # supervisor that does not answer (a line, or a traceback) shows too
                answer = ctl.status(run.lapidus.config_path, timeout=CTL_PATIENCE,
                                    log=run.ctl_log)
                asked += 1
                if answer.status is None or answer.seconds > SLOW_CLIENTS_STATUS_DEADLINE:
                    slow.append((f"answered after {answer.seconds:.1f}s" if answer.status
                                 else answer.reason())
                                + (" (with a traceback)" if answer.traceback else ""))
                hold(0.5)                                 # pace of the questions
            summary = crowd.summary()
        detail = f"{summary}, {length:.1f}s, status asked {asked} times"
        problems = []
        if slow:
            problems.append(f"{len(slow)} not answered within "
                            f"{SLOW_CLIENTS_STATUS_DEADLINE:g}s: {'; '.join(slow[:3])}")
        try:
            self._wait_recovered("every backend RUNNING after the slow clients left")
        except ChaosTimeout as exc:
            problems.append(str(exc))
        if problems:
            raise ChaosTimeout(f"{detail}; " + "; ".join(problems))
        return detail


    # -- cluster mode ---------------------------------------------------------------------------

    def _wait_balanced(self, what: str) -> None:
        wait_for(self.run_.balanced, RECOVERY, what, interval=0.2)

    def _victim(self, kind: str):
        """The node that streams a backend drawn at random (once the cluster is balanced), and
        the backends it streams."""
        run = self.run_
        self._wait_balanced(f"every backend streamed by one node before {kind}")
        owner = run.owners()[self.rng.choice(run.backend_names)][0]
        node = next(node for node in run.nodes if node.name == owner)
        return node, sorted(node.streaming())

    def _taken_over(self, node, backends: List[str]) -> bool:
        """Other nodes stream each of ``backends``."""
        others = [other.streaming() for other in self.run_.nodes if other is not node]
        return all(any(backend in streaming for streaming in others) for backend in backends)

    def kill_node(self) -> str:
        """``kill -9`` of a node's process group; started again after a moment (while its
        leases still stand under its name) or once the other nodes took its backends over,
        half each.  Back when the cluster is balanced again, the node included."""
        node, held = self._victim("kill_node")
        at_once = self.rng.random() < 0.5
        killed = time.monotonic()
        node.kill9()
        try:
            if at_once:
                hold(self.rng.uniform(0.5, 2.0))        # the moment before the restart
                how = "restarted at once"
            else:
                wait_for(lambda: self._taken_over(node, held), RECOVERY,
                         f"the other nodes streaming {held} after {node.name} was killed",
                         interval=0.2)
                how = f"taken over in {time.monotonic() - killed:.1f}s, then restarted"
        finally:
            node.start()
        self._wait_balanced(f"the cluster balanced again after {node.name} was killed")
        self.current.back_in = time.monotonic() - killed
        return f"{node.name} (streaming {', '.join(held)}) killed, {how}"

    def kill_nats_server(self) -> str:
        """``kill -9`` of one of the three nats-servers, started again after 2-5 s (one fault
        at a time: never two down).  Back when every replica of the stream and of the bucket
        is current again and every backend streams on one node."""
        run = self.run_
        cluster = run.nats_cluster
        index = self.rng.randrange(len(cluster.procs))
        down = self.rng.uniform(2.0, 5.0)
        offsets = [node.log_size() for node in run.nodes]
        killed = time.monotonic()
        try:
            cluster.kill(index)
            hold(down)                                  # the outage's length
        finally:
            cluster.start(index)
        wait_for(lambda: cluster.replicas_current(run.replicated_streams), RECOVERY,
                 f"every replica of {run.replicated_streams} current after n{index} came back",
                 interval=0.5)
        self._wait_balanced(f"every backend streamed by one node after n{index} came back")
        self.current.back_in = time.monotonic() - killed
        stopped = sum(1 for node, offset in zip(run.nodes, offsets)
                      for record in node.records_since(offset) if record.get("event") == STOPPED)
        return f"n{index} down {down:.1f}s, {stopped} workers stopped meanwhile"

    def freeze_node(self) -> str:
        """``kill -STOP`` of a node's supervisor and lease child (its workers and dispatcher
        run on) until the other nodes stream its backends, then ``kill -CONT``.  Its workers
        must have stopped themselves (their lease was not renewed in time): a worker that did
        not is a finding.  Back when the cluster is balanced again."""
        run = self.run_
        node, held = self._victim("freeze_node")
        offset = node.log_size()
        pids = [node.proc.pid, node.wait_child("lapidus:cluster", timeout=RECOVERY)]
        frozen = time.monotonic()
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            wait_for(lambda: self._taken_over(node, held), RECOVERY,
                     f"the other nodes streaming {held} while {node.name} is frozen",
                     interval=0.2)
            taken = time.monotonic() - frozen
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        quiet = {record.get("backend") for record in node.records_since(offset)
                 if record.get("event") == LEASE_LOST}
        if set(held) - quiet:
            run.findings.append(f"freeze_node: the workers of {sorted(set(held) - quiet)} on "
                                f"{node.name} did not stop themselves before the takeover")
        self._wait_balanced(f"the cluster balanced again after {node.name} was thawed")
        self.current.back_in = time.monotonic() - frozen
        return (f"{node.name} (streaming {', '.join(held)}) frozen {taken:.1f}s (lease_ttl "
                f"{run.options.lease_ttl:g}s) until taken over; its workers stopped themselves: "
                f"{', '.join(sorted(quiet & set(held))) or 'none'}")
