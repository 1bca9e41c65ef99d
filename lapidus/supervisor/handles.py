"""One supervised child process (a backend worker or the dispatcher) and its state.

Runs in the supervisor process.  A handle owns the multiprocessing.Process, the pipe on which
the child reports (ready, stats, errors), the restart policy and what ``lapidusctl status`` shows.
"""

from __future__ import annotations

import collections
import select
import signal
import time
from typing import Any, Callable, Deque, Dict, Optional, Tuple

import psutil

from .. import exitcodes
from ..backoff import RestartPolicy
from ..procutil import signal_tree
from .rates import RateHistory
from .states import State


LINK_LOST_DELAY = 0.2   # seconds before a worker whose dispatcher died starts again

# what a "waiting" report adds to the status, removed again by the next "ready"
WAITING_FIELDS = ("waiting_for", "waiting_since")


class ChildHandle:
    def __init__(self, name: str, policy: RestartPolicy, log):
        self.name = name
        self.policy = policy
        self.log = log
        self.state = State.STOPPED
        self.process = None
        self.conn = None
        self.started_at: Optional[float] = None
        self.last_report: float = 0.0         # monotonic time of the child's last message
        self.next_start: float = 0.0
        self.restarts = 0
        self.last_error: Optional[str] = None
        self.fatal_reported = False
        self.restart_requested = False    # an operator asked for stop-then-start
        self.removed = False              # gone from the configuration after a reload
        self.held_by_operator = False     # lapidusctl stop: not started with its lease
        self.stop_deadline = 0.0          # monotonic time after which a STOPPING child is killed
        self.killed = False               # SIGKILL sent to this process (reaped like any death)
        self.info: Dict[str, Any] = {}
        self.rate_samples: Deque[Tuple[float, int]] = collections.deque()
        self.rate_history = RateHistory()     # the status page's chart
        # kind -> callback(fields) for messages beyond the ones handled here (the
        # dispatcher's "tail" for the status page, the lease child's "leases")
        self.on_message: Dict[str, Callable[[dict], None]] = {}
        # event counts of earlier processes of this backend, so exported counters never shrink
        self.counts_base: Dict[Tuple[str, str], int] = {}

    @property
    def pid(self) -> Optional[int]:
        return self.process.pid if self.process is not None else None

    def spawn(self, ctx, target: Callable, args: tuple, with_pipe: bool = True,
              duplex: bool = False) -> None:
        """STOPPED/BACKOFF -> STARTING.  With ``duplex`` the child also reads requests from
        its pipe (:meth:`tell`)."""
        child_conn = None
        if with_pipe:
            self.conn, child_conn = ctx.Pipe(duplex=duplex)
            args = args + (child_conn,)
        self.process = ctx.Process(target=target, args=args, name=f"lapidus:{self.name}",
                                   daemon=False)
        self.process.start()
        if child_conn is not None:
            child_conn.close()   # the child holds its own copy
        self.started_at = self.last_report = time.monotonic()
        self.fatal_reported = False
        self.killed = False
        self.state = State.STARTING
        self.log.info("started", pid=self.process.pid)

    def receive(self) -> None:
        """Read every message the child sent (called when its pipe is readable)."""
        while self.conn is not None:
            try:
                if not self.conn.poll():
                    return
                kind, fields = self.conn.recv()
            except (EOFError, OSError):
                self.conn.close()
                self.conn = None
                return
            self.last_report = time.monotonic()
            if kind == "ready":
                if self.state in (State.STARTING, State.WAITING):
                    # STARTING/WAITING -> RUNNING: connected and positioned, not merely alive
                    self.state = State.RUNNING
                    self.log.info("running", **fields)
                for key in WAITING_FIELDS:
                    self.info.pop(key, None)
                self.info.update(fields)
            elif kind == "waiting":
                # The worker cannot reach its database and retries by itself (not a crash);
                # it repeats this report while it waits, which keeps its heartbeat.
                if self.state in (State.STARTING, State.RUNNING):
                    # STARTING/RUNNING -> WAITING
                    self.state = State.WAITING
                self.info.update(waiting_for=fields.get("target"),
                                 waiting_since=fields.get("since"))
                self.last_error = fields.get("error") or self.last_error
            elif kind == "stats":
                self.info.update(fields)
                self._sample_rate(fields.get("events"))
            elif kind == "error":
                self.last_error = fields.get("message")
                self.fatal_reported = bool(fields.get("fatal"))
            elif kind in self.on_message:
                self.on_message[kind](fields)

    def tell(self, message: tuple) -> bool:
        """Send a small request to a child spawned with ``duplex``, unless its pipe is full (a
        child that does not read): the loop never waits on it.  False when not sent.

        A unix socket polls writable only while at most a quarter of its send buffer is
        used, so a message of a few hundred bytes then goes in without blocking."""
        if self.conn is None:
            return False
        poller = select.poll()
        poller.register(self.conn.fileno(), select.POLLOUT)
        if not poller.poll(0):
            return False
        try:
            self.conn.send(message)
        except OSError:
            return False
        return True

    def _sample_rate(self, events: Optional[int]) -> None:
        """Keep a minute of (time, events) samples for the events/s column."""
        if events is None:
            return
        now = time.monotonic()
        if self.rate_samples and events < self.rate_samples[-1][1]:
            self.rate_samples.clear()   # a new worker process counts from zero again
        self.rate_samples.append((now, events))
        self.rate_history.add(time.time(), events)
        while now - self.rate_samples[0][0] > 60.0:
            self.rate_samples.popleft()

    def events_per_second(self) -> float:
        if len(self.rate_samples) < 2:
            return 0.0
        (t0, e0), (t1, e1) = self.rate_samples[0], self.rate_samples[-1]
        return (e1 - e0) / (t1 - t0) if t1 > t0 else 0.0

    def exited(self) -> Optional[int]:
        """The exit code once the process ended (and is reaped), else None."""
        if self.process is None or self.process.is_alive():
            return None
        return self.process.exitcode

    def on_exit(self, code: int, now: float) -> None:
        """Decide what a death means: stopped, restart after backoff, or FATAL."""
        self.receive()
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        self.process = None
        for key, count in (self.info.pop("event_counts", None) or {}).items():
            self.counts_base[key] = self.counts_base.get(key, 0) + count
        if self.state == State.STOPPING:
            # STOPPING -> STOPPED
            self.state = State.STOPPED
            self.log.info("stopped", exit_code=code)
            return
        if code == exitcodes.CHILD_FATAL or self.fatal_reported:
            # STARTING/RUNNING -> FATAL: retrying cannot help (configuration, credentials ...)
            self.state = State.FATAL
            self.log.error("backend is FATAL; fix the problem and restart it",
                           error=self.last_error)
            return
        if code == exitcodes.LEASE_LOST:
            # RUNNING -> STOPPED: this node's lease is lost or ran out (cluster mode);
            # the worker did nothing wrong, and starts again here only with a new lease
            self.state = State.STOPPED
            self.restart_requested = False
            self.log.info("stopped: the lease is not this node's any more", exit_code=code)
            return
        if code == exitcodes.LINK_LOST:
            # RUNNING/STARTING -> BACKOFF: its dispatcher went away, the worker did nothing
            # wrong; it starts again as soon as there is a dispatcher, without a crash counted.
            self.state = State.BACKOFF
            self.next_start = now + LINK_LOST_DELAY
            self.log.info("lost its dispatcher; starting again", exit_code=code)
            return
        if code == exitcodes.FORK_SERVER_LOST:
            # RUNNING/STARTING -> BACKOFF: killed with its parent, the workers' fork server
            # (a new one is started with the next worker); not counted as a crash
            self.state = State.BACKOFF
            self.next_start = now + LINK_LOST_DELAY
            self.last_error = "the workers' fork server died, and this worker with it"
            self.log.warning("lost its fork server; starting again", exit_code=code)
            return
        if code == exitcodes.CHILD_OK:
            self.last_error = self.last_error or "exited unexpectedly"
        elif code is not None and code < 0 and not (self.killed and self.last_error):
            # (a kill of ours keeps the reason it was given, "no heartbeat ...")
            self.last_error = f"killed by signal {-code}"
        self.policy.record_crash(now)
        if self.policy.exhausted():
            # BACKOFF -> FATAL: too many restarts inside the window
            self.state = State.FATAL
            self.log.error("backend is FATAL: too many restarts", restarts=self.restarts,
                           crashes_in_window=len(self.policy.crashes),
                           window=self.policy.window, error=self.last_error)
            return
        delay = self.policy.delay()
        # RUNNING/STARTING -> BACKOFF
        self.state = State.BACKOFF
        self.next_start = now + delay
        self.restarts += 1
        self.log.warning("exited; restarting after backoff", exit_code=code,
                         restart_in=round(delay, 2), restarts=self.restarts,
                         error=self.last_error)

    def stop(self, timeout: float, now: Optional[float] = None) -> None:
        """Ask the child to stop (SIGTERM); the loop reaps it, and kills it once
        :attr:`stop_deadline` (``timeout`` seconds from now) has passed."""
        if self.process is not None and self.exited() is None:
            # * -> STOPPING
            if self.state != State.STOPPING:
                self.stop_deadline = (now or time.monotonic()) + timeout
            self.state = State.STOPPING
            self.process.terminate()
        elif self.state in (State.BACKOFF, State.STARTING, State.WAITING):
            self.state = State.STOPPED

    def stop_overdue(self, now: float) -> bool:
        """A child asked to stop that is still alive after its stop timeout (it ignores
        SIGTERM, or is frozen)."""
        return (self.state == State.STOPPING and self.process is not None
                and not self.killed and now >= self.stop_deadline)

    def kill(self) -> None:
        """SIGKILL the child and its descendants now; the loop learns the exit (reaps) as for
        any other death, so a killed child is restarted like a crashed one."""
        if self.process is not None and self.process.pid and self.exited() is None:
            self.killed = True
            signal_tree(self.process.pid, signal.SIGKILL)

    def snapshot(self) -> dict:
        """What ``lapidusctl status`` shows for this child."""
        out = {"name": self.name, "state": self.state.value, "pid": self.pid,
               "restarts": self.restarts, "last_error": self.last_error}
        if self.started_at is not None and self.state in (State.RUNNING, State.STARTING,
                                                          State.WAITING):
            out["uptime"] = round(time.monotonic() - self.started_at, 1)
        if self.pid:
            try:
                out["rss_bytes"] = psutil.Process(self.pid).memory_info().rss
            except psutil.NoSuchProcess:
                pass
        out.update((k, v) for k, v in self.info.items() if k != "event_counts")
        if self.state == State.WAITING and self.info.get("waiting_since"):
            out["waiting_seconds"] = round(max(0.0, time.time() - self.info["waiting_since"]), 1)
        # {"schema.table": {"insert": n, ...}}: JSON-safe for lapidusctl, nested for /metrics
        counts: Dict[str, Dict[str, int]] = {}
        for source in (self.counts_base, self.info.get("event_counts") or {}):
            for (table, kind), count in source.items():
                per_table = counts.setdefault(table, {})
                per_table[kind] = per_table.get(kind, 0) + count
        out["event_counts"] = counts
        out["events_per_second"] = round(self.events_per_second(), 1)
        return out
