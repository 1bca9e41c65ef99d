"""The supervisor's main loop (the arbiter).

Runs in the ``lapidus`` process.  It forks the dispatcher, has the workers' fork server fork
one worker per enabled backend (:mod:`.worker_forks`), then loops: poll the children's status
pipes and exit sentinels, the signal wake-up pipe, the control socket and the HTTP socket with
their clients (with a timeout), handle queued signals, reap dead children
and decide (restart after backoff, or FATAL), kill what is overdue (silent for
``heartbeat_timeout``, or still alive ``stop_timeout`` after SIGTERM), start what is due.
Signal handlers only queue the signal; all work, logging included, happens in the loop, and
nothing in it waits on a child or a client.

Reaping happens in one place: :meth:`ChildHandle.exited` (multiprocessing's own non-blocking
``waitpid``).  Kills only send signals, so a killed child is seen dead, and restarted, exactly
like a crashed one.

The dispatcher has a restart policy of its own (backoff, never FATAL); a worker that lost its
dispatcher exits with ``exitcodes.LINK_LOST`` and starts again once a dispatcher runs, without
a crash counted against its backend.

Cluster mode (``[cluster]``, docs/cluster.md): a lease child (``lapidus:cluster``) holds the
leases in NATS; a worker runs only while the :class:`ClusterGate` says its lease is held here
and fresh, and is stopped, then killed, by this loop when it is not (whatever the lease child
does meanwhile).

Shutdown (SIGTERM/SIGINT): workers first (they stop reading, wait for their last batches to be
confirmed and save their checkpoints), then the dispatcher; anything still alive after the stop
timeout is killed with its whole process tree.  Exit 0.
"""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import select
import signal
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

from .. import exitcodes, logs
from ..backoff import RestartPolicy
from ..procutil import keep_files_private
from ..workers.wakeup import WAKE_SIGNAL
from .cluster_gate import ClusterGate
from .control_server import ControlServer, SocketInUse
from .handles import ChildHandle
from .http import HttpServer
from .listener import READ, LoopListener
from .notify import Notifier
from .reload import ReloadPlan
from .states import State
from .status_page import StatusPage
from .tail_view import TailView
from .worker_forks import WorkerForks

# The loop sleeps until the next thing it knows of falls due (_timeout): a child's
# heartbeat deadline, a restart, a stop or client deadline, a systemd watchdog ping, or a
# message, signal or client that wakes it.  This only bounds the sleep, as a last resort.
LONGEST_SLEEP = 5.0
REAP_EVERY = 5.0      # seconds between looks at every child without a SIGCHLD (_reap_due)
REAP_GRACE = 2.0      # seconds to wait for killed children to be reaped before giving up


class AlreadyRunning(Exception):
    """Another supervisor holds this state directory."""


class StartFailed(Exception):
    """The supervisor cannot start (a port in use, a control socket of another Lapidus);
    the message names the setting and the fix."""


class Arbiter:
    def __init__(self, config):
        self.config = config
        self.log = logs.get_logger(process="supervisor")
        self.ctx = multiprocessing.get_context("fork")
        self.worker_forks = WorkerForks((b.type for b in config.backends), self.log)
        self.signals: List[int] = []
        self.reap_at = 0.0      # monotonic time of the next look at every child (_reap_due)
        self.stopping = False
        self.stop_deadline = 0.0
        self.dispatcher_deadline = 0.0
        self.exit_code = 0
        # Short path (unix socket paths are limited to 107 bytes), private (mode 0700);
        # under systemd in the service's RuntimeDirectory.
        self.socket_dir = tempfile.mkdtemp(prefix="lapidus-",
                                           dir=os.environ.get("RUNTIME_DIRECTORY") or None)
        self.socket_path = os.path.join(self.socket_dir, "dispatch.sock")
        self.workers: Dict[str, ChildHandle] = {}
        self.backends = {}
        for backend in config.backends:
            if backend.options.get("enabled", True):
                self._add_backend(backend)
        # The dispatcher is never FATAL: without it no backend streams.  It restarts after
        # a backoff that grows while it keeps dying.
        self.dispatcher = ChildHandle("dispatcher", RestartPolicy(
            10**9, 60.0, 0.2, 5.0), self.log.bind(child="dispatcher"))
        self.gate: Optional[ClusterGate] = None
        self.stop_ats: Dict[str, object] = {}     # cluster: each worker's stop time, shared
        self.lease_child: Optional[ChildHandle] = None
        if config.cluster is not None:
            self.gate = ClusterGate(config.cluster, self.log.bind(child="cluster"))
            self.lease_child = ChildHandle("cluster", RestartPolicy(
                10**9, 60.0, 0.2, 5.0), self.log.bind(child="cluster"))
            self.lease_child.on_message["leases"] = \
                lambda fields: self.gate.on_message("leases", fields)
        self._lock_fd: Optional[int] = None
        self.notifier = Notifier()
        self.http = None
        self.tail_view = TailView(self.dispatcher.tell)   # the status page's tail
        # a sink's own snapshot run was asked for (lapidus.sink_runs): start it now
        self.dispatcher.on_message["wake"] = self._wake_backend
        if config.http is not None:
            page = StatusPage(self.status, self.rate_histories, self.tail_view,
                              config.http.token, self.log)
            self.dispatcher.on_message["tail"] = page.tail_arrived
            self.http = HttpServer(config.http.host, config.http.port, self.status, self.log,
                                   page)
        self._last_status_line = ""
        self.control = ControlServer(config.control.socket, {
            "status": lambda _req: {"ok": True, **self.status()},
            "restart": self.cmd_restart, "stop": self.cmd_stop, "start": self.cmd_start,
            "resend_dead_letters": self.cmd_resend_dead_letters,
            "backfill": self.cmd_backfill, "cluster": self.cmd_cluster,
        }, self.log)

    @property
    def listeners(self) -> List[LoopListener]:
        return [self.control] + ([self.http] if self.http is not None else [])

    def _policy(self) -> RestartPolicy:
        sup = self.config.supervisor
        return RestartPolicy(sup.max_restarts, sup.restart_window, sup.backoff_initial,
                             sup.backoff_max)

    def _add_backend(self, backend) -> ChildHandle:
        handle = ChildHandle(backend.name, self._policy(), self.log.bind(backend=backend.name))
        self.workers[backend.name] = handle
        self.backends[backend.name] = backend
        return handle

    # -- signals --------------------------------------------------------------------------

    def _queue_signal(self, signum, _frame) -> None:
        self.signals.append(signum)

    def _install_signals(self) -> int:
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        os.set_blocking(write_fd, False)
        signal.set_wakeup_fd(write_fd)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, self._queue_signal)
        return read_fd

    def _handle_signals(self) -> None:
        while self.signals:
            signum = self.signals.pop(0)
            if signum in (signal.SIGTERM, signal.SIGINT):
                self.begin_stop(f"received {signal.Signals(signum).name}")
            elif signum == signal.SIGHUP:
                self.reload()
                self.reap_at = 0.0      # a removed backend's handle goes at the next look
            elif signum == signal.SIGCHLD:
                self.reap_at = 0.0      # a child exited: look at them all now

    # -- lifecycle ------------------------------------------------------------------------

    def _lock_state_dir(self) -> None:
        state_dir = Path(self.config.state_dir)
        try:
            state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            keep_files_private(state_dir)
            fd = os.open(state_dir / "lapidus.lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            # what lapidus -t could not foresee (a disk full or read-only since, a race)
            raise StartFailed(
                f"state_dir = {str(state_dir)!r}: cannot create it or its lock file "
                f"({exc.strerror or exc}); set state_dir to a directory this user may "
                f"write") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise AlreadyRunning(
                f"another lapidus is already running with state_dir {state_dir}; stop it first "
                f"or give this configuration its own state_dir") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def _open_listeners(self) -> None:
        """The HTTP port first: when it is taken nothing else was created (no stale control
        socket left behind)."""
        if self.http is not None:
            try:
                self.http.open()
            except OSError as exc:
                from ..config import bind_problem
                raise StartFailed(bind_problem(self.config.http.listen, exc)) from None
        try:
            self.control.open()
        except SocketInUse as exc:
            if self.http is not None:
                self.http.close()
            raise StartFailed(str(exc)) from None
        except OSError as exc:
            if self.http is not None:
                self.http.close()
            raise StartFailed(f"control.socket = {str(self.config.control.socket)!r}: cannot "
                              f"listen there: {exc.strerror or exc}; choose a path in a "
                              f"directory this user can write") from None

    def run(self) -> int:
        self._lock_state_dir()
        self._open_listeners()
        wakeup = self._install_signals()
        self.log.info("lapidus starting", backends=list(self.workers), pid=os.getpid())
        self._spawn_dispatcher()
        if self.lease_child is not None:
            self._spawn_lease_child()       # workers start once their leases are held
        else:
            for handle in self.workers.values():
                self._spawn_worker(handle)
        try:
            while True:
                self._wait(wakeup)
                self._handle_signals()
                self._reap_due()
                self._enforce_leases()
                self._kill_stale()
                self._kill_overdue_stops()
                self._notify_systemd()
                if self.stopping:
                    if self._stop_progress():
                        break
                    continue
                self._start_due()
                if self.workers and all(h.state == State.FATAL for h in self.workers.values()):
                    self.log.error("every backend is FATAL; exiting")
                    self.exit_code = 1
                    self.begin_stop("no backend left")
        finally:
            for listener in self.listeners:
                listener.close()
            self._kill_everything()
            try:
                os.unlink(self.socket_path)
                os.rmdir(self.socket_dir)
            except OSError:
                pass
        self.log.info("lapidus stopped", exit_code=self.exit_code)
        return self.exit_code

    def _children(self) -> List[ChildHandle]:
        extra = [self.lease_child] if self.lease_child is not None else []
        return list(self.workers.values()) + [self.dispatcher] + extra

    def _wait(self, wakeup: int) -> None:
        """Poll everything the loop serves, at most until the next thing falls due."""
        callbacks: Dict[int, Callable[[int], None]] = {}
        poller = select.poll()

        def watch(fd: int, mask: int, callback: Callable[[int], None]) -> None:
            poller.register(fd, mask)
            callbacks[fd] = callback

        for handle in self._children():
            if handle.conn is not None:
                watch(handle.conn.fileno(), READ, lambda _e, h=handle: self._receive(h))
        for handle in self.workers.values():
            # a worker's exit is reported to its parent, the fork server, not by a SIGCHLD
            # here: its sentinel turns readable then
            if handle.process is not None:
                watch(handle.process.sentinel, READ, lambda _e: self._reap_now())
        watch(wakeup, READ, lambda _e: _drain(wakeup))
        for listener in self.listeners:
            for fd, mask, callback in listener.poll_entries():
                watch(fd, mask, callback)
        for fd, events in poller.poll(self._timeout() * 1000):
            callbacks[fd](events)
        now = time.monotonic()
        for listener in self.listeners:
            listener.expire(now)

    def _timeout(self) -> float:
        """Seconds until the next thing the loop must do on its own falls due."""
        now = time.monotonic()
        children = self._children()
        due = [h.next_start for h in children if h.state == State.BACKOFF]
        due += [h.stop_deadline for h in children if h.state == State.STOPPING]
        due += [d for d in (listener.next_deadline() for listener in self.listeners) if d]
        due.append(self.reap_at)
        stale = self._stale_deadline(children)
        if stale is not None:
            due.append(stale)
        ping = self.notifier.next_ping()
        if ping is not None:
            due.append(ping)
        if self.gate is not None:
            due += self.gate.deadlines(now, [n for n, h in self.workers.items()
                                             if h.process is not None])
        if self.stopping:
            due.append(now + 0.1)
        return max(0.0, min([LONGEST_SLEEP] + [d - now for d in due]))

    def _stale_deadline(self, children: List[ChildHandle]) -> Optional[float]:
        """When the quietest watched child becomes overdue (:meth:`_kill_stale`)."""
        timeout = float(self.config.supervisor.heartbeat_timeout)
        last = [h.last_report for h in children if _heartbeat_watched(h)]
        return min(last) + timeout if last else None

    def _notify_systemd(self) -> None:
        """READY once every backend is running or failed; STATUS on change; WATCHDOG always."""
        self.notifier.watchdog()
        states = [h.state for h in self.workers.values() if not h.removed]
        line = ", ".join(f"{states.count(st)} {st.value.lower()}" for st in State
                         if states.count(st))
        if not self.notifier.ready_sent and all(s != State.STARTING for s in states):
            self.notifier.ready(line)
        elif line != self._last_status_line:
            self.notifier.status(line)
        self._last_status_line = line

    def _kill_stale(self) -> None:
        """A child that stopped reporting is wedged or frozen: kill it so it restarts.

        Workers report once a second while waiting for their database or while their figures
        change, and at least four times per timeout when idle (runner.QUIET_REPORT_EVERY); so
        does the dispatcher.  The loop wakes for the first such deadline (_stale_deadline)."""
        now = time.monotonic()
        timeout = float(self.config.supervisor.heartbeat_timeout)
        for handle in self._children():
            if _heartbeat_watched(handle) and now - handle.last_report > timeout:
                handle.last_error = f"no heartbeat for {timeout:g}s; killed"
                self.log.error("child stopped reporting; killing it", child=handle.name,
                               seconds=round(now - handle.last_report, 1))
                handle.kill()
                # its exit is reported by the fork server, which must not be frozen itself
                self.worker_forks.kill_server_if_frozen()

    def _kill_overdue_stops(self) -> None:
        """A child asked to stop (restart, stop, reload) that is still alive after
        ``stop_timeout`` ignores SIGTERM or is frozen: kill it, which ends the stop."""
        if self.stopping:
            return   # the shutdown has its own deadline (_stop_progress)
        now = time.monotonic()
        for handle in self._children():
            if handle.stop_overdue(now):
                self.log.warning("did not stop within stop_timeout; killing", child=handle.name,
                                 pid=handle.pid)
                handle.kill()
                self.worker_forks.kill_server_if_frozen()

    def _spawn_worker(self, handle: ChildHandle) -> None:
        backend = self.backends[handle.name]
        state_dir = str(Path(self.config.state_dir) / backend.name)
        lease = None
        if self.gate is not None:
            from ..cluster.protocol import WorkerLease
            epoch = self.gate.epoch(handle.name)
            assert epoch is not None, "a worker is started only with its lease"
            stop_at = self.worker_forks.ctx.RawValue("d", self.gate.stop_at(handle.name))
            self.stop_ats[handle.name] = stop_at
            lease = WorkerLease(self.config.cluster, epoch, stop_at)
            self.log.info("cluster: streaming this backend here", backend=handle.name,
                          epoch=epoch, node=self.config.cluster.node)
        self.worker_forks.start(handle, (
            backend.with_plugins(self.config.plugins_for(backend)), state_dir,
            self.socket_path, self.config.log.format, self.config.log.level,
            float(self.config.supervisor.heartbeat_timeout), lease))

    def _spawn_dispatcher(self) -> None:
        # duplex: the status page asks it for the events of the backends it shows
        self.dispatcher.spawn(self.ctx, _dispatcher_main,
                              (self.config, self.socket_path, os.getpid()), duplex=True)
        self.tail_view.dispatcher_started()
        self.dispatcher.state = State.RUNNING

    def _spawn_lease_child(self) -> None:
        from ..cluster.agent import cluster_main
        assert self.lease_child is not None and self.gate is not None
        inbox, outbox = self.ctx.Pipe(duplex=False)
        names = [name for name, h in self.workers.items() if not h.removed]
        self.lease_child.spawn(self.ctx, cluster_main, (
            self.config.cluster, names, self.config.log.format, self.config.log.level,
            os.getpid(), inbox))
        inbox.close()       # the child holds its own copy
        self.gate.outbox = outbox
        self.lease_child.state = State.RUNNING

    def _reap_now(self) -> None:
        self.reap_at = 0.0

    def _receive(self, handle: ChildHandle) -> None:
        """Read a child's reports; when its pipe closes, it has exited (or is about to)."""
        handle.receive()
        if handle.conn is None and self.workers.get(handle.name) is handle:
            # a worker's exit is reported by its parent, the fork server: a frozen one
            # would leave it unseen until the heartbeat timeout, so look now
            self.worker_forks.kill_server_if_frozen()
            self._reap_now()

    def _reap_due(self) -> None:
        """Look for exited children after a SIGCHLD (or a reload), and every REAP_EVERY
        seconds as a last resort; not at every turn of the loop: a waitpid per child per
        wake-up is most of what a hundred idle workers would cost the supervisor."""
        now = time.monotonic()
        if now >= self.reap_at:
            self.reap_at = now + REAP_EVERY
            self._reap()

    def _reap(self) -> None:
        now = time.monotonic()
        for name, handle in list(self.workers.items()):
            code = handle.exited()
            if code is not None:
                handle.on_exit(code, now)
                if self.gate is not None:
                    self.log.info("cluster: stopped streaming this backend here",
                                  backend=name, node=self.config.cluster.node, exit_code=code)
            if handle.removed and handle.process is None:
                del self.workers[name]
                self.backends.pop(name, None)
        self._reap_lease_child(now)
        code = self.dispatcher.exited()
        if code is None:
            return
        self.dispatcher.receive()
        self.dispatcher.process = None
        if code == exitcodes.OUTPUT_CLOSED:
            self.log.info("output closed; stopping")
            self.begin_stop("output closed")
        elif self.stopping:
            self.dispatcher.state = State.STOPPED
        else:
            # Its workers lose their connection and start again from their checkpoints once
            # a new dispatcher runs; its own deaths back off, and never count as theirs.
            policy = self.dispatcher.policy
            policy.record_crash(now)
            delay = policy.delay()
            self.dispatcher.restarts += 1
            self.dispatcher.state = State.BACKOFF
            self.dispatcher.next_start = now + delay
            self.log.error("dispatcher died; restarting it after backoff", exit_code=code,
                           restart_in=round(delay, 2), restarts=self.dispatcher.restarts)

    def _reap_lease_child(self, now: float) -> None:
        """A dead lease child is started again after a backoff (never FATAL).  Its leases
        are not renewed meanwhile: the gate's deadlines stop their workers in time."""
        child = self.lease_child
        if child is None:
            return
        code = child.exited()
        if code is None:
            return
        child.receive()
        child.process = None
        assert self.gate is not None
        self.gate.lost_child()
        if self.stopping:
            child.state = State.STOPPED
            return
        child.policy.record_crash(now)
        delay = child.policy.delay()
        child.restarts += 1
        child.state = State.BACKOFF
        child.next_start = now + delay
        self.log.error("the lease child died; restarting it after backoff (the workers stop "
                       "when their leases run out)", exit_code=code, restart_in=round(delay, 2))

    def _enforce_leases(self) -> None:
        """Cluster mode: stop what the leases no longer cover, kill what outlived its lease's
        kill time, and mark for start what they newly cover."""
        if self.gate is None:
            return
        gate = self.gate
        now = time.monotonic()
        for name, handle in self.workers.items():
            if handle.removed:
                continue
            allowed = gate.may_run(name, now)
            if name in self.stop_ats:
                self.stop_ats[name].value = gate.stop_at(name)
            if handle.process is not None:
                if allowed:
                    continue
                kill_at = gate.kill_at(name)
                if kill_at is not None and now >= kill_at and not handle.killed:
                    self.log.error("cluster: the lease is about to expire and the worker is "
                                   "still running; killing it", backend=name)
                    handle.kill()
                elif handle.state != State.STOPPING:
                    grant = gate.grants.get(name)
                    handover = grant is not None and not grant.run
                    self.log.warning(
                        "cluster: handing this backend over; stopping its worker" if handover
                        else "cluster: the lease is not renewed; stopping the worker in time",
                        backend=name)
                    handle.restart_requested = False
                    timeout = self._stop_timeout() if handover else \
                        max(0.0, (kill_at or now) - now)
                    handle.stop(timeout, now)
            elif allowed:
                if handle.state == State.STOPPED and not handle.restart_requested \
                        and not handle.held_by_operator:
                    handle.restart_requested = True     # started by _start_due
            elif handle.state in (State.BACKOFF, State.STOPPED):
                handle.state = State.STOPPED
                handle.restart_requested = False
        gate.tell([name for name, h in self.workers.items() if h.process is not None])

    def _start_due(self) -> None:
        now = time.monotonic()
        dispatcher = self.dispatcher
        if dispatcher.state == State.BACKOFF and now >= dispatcher.next_start:
            # BACKOFF -> RUNNING (the dispatcher has no READY of its own)
            self._spawn_dispatcher()
        child = self.lease_child
        if child is not None and child.state == State.BACKOFF and now >= child.next_start:
            self._spawn_lease_child()
        if dispatcher.process is None:
            return   # a worker started now would only lose its link again
        for handle in self.workers.values():
            if self.gate is not None and not self.gate.may_run(handle.name, now):
                continue
            if handle.state == State.BACKOFF and now >= handle.next_start:
                # BACKOFF -> STARTING
                self._spawn_worker(handle)
            elif handle.state == State.STOPPED and handle.restart_requested:
                # STOPPED -> STARTING: an operator's restart, or a reload's
                handle.restart_requested = False
                self._spawn_worker(handle)

    def begin_stop(self, reason: str) -> None:
        if self.stopping:
            return
        self.stopping = True
        self.notifier.stopping()
        now = time.monotonic()
        self.stop_deadline = now + float(self.config.supervisor.stop_timeout) - 1.5
        self.log.info("stopping", reason=reason)
        for handle in self.workers.values():
            handle.restart_requested = False
            handle.stop(self.stop_deadline - now, now)

    def _stop_progress(self) -> bool:
        """True once everything has exited.  Workers first, then the dispatcher; whatever is
        still alive at its deadline is killed, and reaped by :meth:`_reap`."""
        now = time.monotonic()
        alive = [h for h in self.workers.values() if h.process is not None]
        if alive:
            if now >= self.stop_deadline:
                for handle in alive:
                    if not handle.killed:
                        self.log.warning("did not stop in time; killing", child=handle.name,
                                         pid=handle.pid)
                        handle.kill()
                self.worker_forks.kill_server_if_frozen()
                if now >= self.stop_deadline + REAP_GRACE:
                    return True   # unkillable (D state): the finally block gives up on it
            return False
        if self.gate is not None:
            self.gate.tell([])          # every worker is gone: the leases may be released
        child = self.lease_child
        if child is not None and child.process is not None and child.state != State.STOPPING:
            child.stop(1.0, now)
        dispatcher = self.dispatcher
        if dispatcher.process is None:
            if child is None or child.process is None:
                return True
            if now >= child.stop_deadline and not child.killed:
                child.kill()
            return now >= child.stop_deadline + REAP_GRACE
        if dispatcher.state != State.STOPPING:
            dispatcher.stop(1.0, now)
            self.dispatcher_deadline = now + 1.0
            return False
        if now >= self.dispatcher_deadline and not dispatcher.killed:
            dispatcher.kill()
            if child is not None:
                child.kill()
        return now >= self.dispatcher_deadline + REAP_GRACE

    def _kill_everything(self) -> None:
        """Last resort on the way out: SIGKILL whatever still runs and reap it (bounded)."""
        for handle in self._children():
            handle.kill()
        deadline = time.monotonic() + REAP_GRACE
        for handle in self._children():
            if handle.process is not None:
                handle.process.join(max(0.0, deadline - time.monotonic()))

    # -- operator commands (control socket, signals) -----------------------------------------

    def _handles(self, name: Optional[str]):
        if name is None:
            return list(self.workers.values())
        if name not in self.workers or self.workers[name].removed:
            raise KeyError(f'unknown backend "{name}" (configured: {", ".join(self.workers)})')
        return [self.workers[name]]

    def _stop_timeout(self) -> float:
        return float(self.config.supervisor.stop_timeout)

    def cmd_restart(self, request: dict) -> dict:
        """Restart one backend, or all: stop (draining), then start at once, crash count reset."""
        handles = self._handles(request.get("backend"))
        for handle in handles:
            self._restart(handle)
        return {"ok": True, "restarted": [h.name for h in handles]}

    def _restart(self, handle: ChildHandle) -> None:
        handle.policy.reset()
        handle.restart_requested = True
        if handle.process is not None:
            handle.stop(self._stop_timeout())
        else:
            handle.state = State.STOPPED

    def cmd_stop(self, request: dict) -> dict:
        handles = self._handles(request.get("backend") or "")
        for handle in handles:
            handle.restart_requested = False
            handle.held_by_operator = True   # cluster mode: not started again with its lease
            handle.stop(self._stop_timeout())
        return {"ok": True, "stopped": [h.name for h in handles]}

    def cmd_start(self, request: dict) -> dict:
        handles = self._handles(request.get("backend") or "")
        for handle in handles:
            handle.held_by_operator = False
            if handle.process is None:
                # STOPPED/FATAL -> STARTING: the operator fixed the cause
                handle.policy.reset()
                handle.last_error = None
                handle.state = State.STOPPED
                handle.restart_requested = True   # started by _start_due with a dispatcher
        self._start_due()
        return {"ok": True, "started": [h.name for h in handles]}

    def cmd_resend_dead_letters(self, request: dict) -> dict:
        """Hand a backend's dead letters to the dispatcher to send again: the file becomes
        the resend file (lapidus.deadletters), and SIGUSR1 tells the dispatcher."""
        from .. import deadletters
        (handle,) = self._handles(request.get("backend") or "")
        path = deadletters.path_for(self.config.state_dir, handle.name)
        resend = deadletters.resend_path_for(self.config.state_dir, handle.name)
        if resend.exists():
            return {"ok": False, "code": "busy", "error": f"a resend of {handle.name}'s dead "
                    f"letters is under way ({resend}); try again when it is gone"}
        count = deadletters.count(path)
        if count == 0:
            return {"ok": True, "resending": []}
        os.rename(path, resend)
        if self.dispatcher.pid is not None:
            os.kill(self.dispatcher.pid, signal.SIGUSR1)
        self.log.info("dead letters handed to the dispatcher to send again",
                      backend=handle.name, events=count)
        return {"ok": True, "resending": [f"{count} event(s) of {handle.name}"]}

    def _wake_backend(self, fields: dict) -> None:
        handle = self.workers.get(fields.get("backend") or "")
        if handle is not None:
            _wake_worker(handle)

    def cmd_backfill(self, request: dict) -> dict:
        """Queue a backfill of one table of a backend, or cancel the backend's backfills
        (those of ``table`` only, when given).  The request is a file the worker picks up
        (lapidus.workers.snapshot.requests); the worker checks the table and the condition,
        so its verdict shows in the status (``snapshot``, ``backfills``), not here."""
        from ..workers.snapshot.requests import BackfillQueue
        (handle,) = self._handles(request.get("backend") or "")
        if self.gate is not None:
            return {"ok": False, "code": "unsupported", "error":
                    "backfills are not available in cluster mode yet: the request would stay "
                    "on this node while another may stream the backend; run the backfill on a "
                    "Lapidus without [cluster]"}
        queue = BackfillQueue(Path(self.config.state_dir) / handle.name)
        table = request.get("table") or None
        if request.get("cancel"):
            gone = queue.cancel(table)
            if gone:
                self.log.info("backfills cancelled", backend=handle.name,
                              backfills=[r.n for r in gone])
                _wake_worker(handle)
            return {"ok": True, "cancelled": [r.fields() for r in gone]}
        if not isinstance(table, str):
            return {"ok": False, "code": "bad_request", "error": "backfill needs a table"}
        where = request.get("where")
        queued = queue.add(table, where if isinstance(where, str) and where.strip() else None)
        self.log.info("backfill requested", backend=handle.name, n=queued.n, table=table,
                      where=queued.where)
        _wake_worker(handle)
        return {"ok": True, "backfill": queued.fields(), "state": handle.state.value}

    def reload(self) -> None:
        """SIGHUP: read the configuration again; start, stop and restart only the backends whose
        settings (their own, or the plugins they use) changed.  The dispatcher keeps running:
        a restarted worker tells it its plugins when it connects."""
        from ..config import ConfigError, load_config
        from ..sinks import registry
        try:
            new = load_config(self.config.source, plugin_validators=registry.validators())
        except ConfigError as exc:
            self.log.error("reload refused: the configuration is invalid; still running the old",
                           problems=exc.problems)
            return
        from ..config import state_dir_problems
        problems = state_dir_problems(new)
        if problems:
            self.log.error("reload refused: a state directory is not usable; still running the "
                           "old configuration", problems=problems)
            return
        if "stdout" in self.config.plugins and "stdout" not in new.plugins:
            new = new.with_plugin("stdout")   # --stdout was given on the command line
        live = {name: self.backends[name] for name, h in self.workers.items() if not h.removed}
        plan = ReloadPlan.between(self.config, new, live)
        if self.gate is not None and (plan.added or plan.removed or
                                      new.cluster != self.config.cluster):
            self.log.error("reload refused: in cluster mode the backends section and [cluster] "
                           "change only when lapidus restarts (every node must run the same "
                           "backends); still running the old configuration",
                           added=sorted(plan.added), removed=sorted(plan.removed))
            return
        for setting in plan.not_applied:
            self.log.warning("reload: this setting changes only when lapidus restarts; still "
                             "using the old value", setting=setting)
        self.config = new
        if self.http is not None and self.http.page is not None and new.http is not None:
            self.http.page.token = new.http.token
        if plan.supervisor_changed:
            for handle in self.workers.values():
                handle.policy = self._policy()
        for name in plan.removed:
            self.log.info("reload: backend removed; stopping it", backend=name)
            handle = self.workers[name]
            handle.restart_requested = False
            handle.removed = True
            handle.stop(self._stop_timeout())
        for name in plan.added:
            backend = plan.backends[name]
            handle = self.workers.get(name)
            if handle is not None:   # removed by an earlier reload and not yet gone
                self.log.info("reload: backend added back; restarting it", backend=name)
                handle.removed = False
                self.backends[name] = backend
                self._restart(handle)
                continue
            self.log.info("reload: backend added", backend=name)
            handle = self._add_backend(backend)
            handle.restart_requested = True   # started by _start_due (when a dispatcher runs)
        for name in plan.changed:
            self.log.info("reload: backend changed; restarting it", backend=name)
            self.backends[name] = plan.backends[name]
            self._restart(self.workers[name])
        self._start_due()
        self.log.info("configuration reloaded", backends=list(plan.backends))

    # -- status ---------------------------------------------------------------------------

    def rate_histories(self) -> dict:
        """backend -> its events/s over the last minutes (the status page's chart)."""
        return {name: h.rate_history for name, h in self.workers.items() if not h.removed}

    def status(self) -> dict:
        dispatcher = self.dispatcher.snapshot()
        health = dispatcher.get("sink_health") or {}
        failing = dispatcher.get("sink_failing") or {}
        held = dispatcher.get("undeliverable") or {}
        dead = dispatcher.get("dead_letters") or {}
        backends = []
        for handle in self.workers.values():
            if handle.removed:
                continue
            row = handle.snapshot()
            row["sinks"] = health.get(handle.name, {})   # {plugin: connection state}
            if failing.get(handle.name):
                row["sink_error"] = "; ".join(f"{sink}: {error}" for sink, error
                                              in failing[handle.name].items())
            if held.get(handle.name):
                row["undeliverable"] = held[handle.name]   # {plugin: the event and why}
            row["dead_letters"] = dead.get(handle.name, 0)
            if self.gate is not None:
                row["owner"] = self.gate.owner(handle.name)
            backends.append(row)
        out = {"pid": os.getpid(), "config": self.config.source, "backends": backends,
               "dispatcher": dispatcher}
        if self.gate is not None:
            out["cluster"] = self.cluster_view()
        return out

    def cluster_view(self) -> dict:
        """The lease child's view (nodes, leases, owners, hand-overs), and what this node
        runs; ``{}`` parts while the lease child has not reported yet."""
        assert self.gate is not None and self.lease_child is not None
        view = dict(self.gate.view) or {"node": self.config.cluster.node, "nodes": [],
                                         "leases": [], "connected": False}
        view["running_here"] = sorted(n for n, h in self.workers.items()
                                      if h.process is not None)
        view["lease_child"] = self.lease_child.snapshot()
        return view

    def cmd_cluster(self, _request: dict) -> dict:
        if self.gate is None:
            return {"ok": False, "code": "not_clustered", "error": "this lapidus runs alone "
                    "(its configuration has no [cluster])"}
        return {"ok": True, **self.cluster_view()}


def _wake_worker(handle: ChildHandle) -> None:
    """Make a streaming worker look at its backfill requests now, not at its next keep-alive
    (lapidus.workers.wakeup).  Only a RUNNING one: it has said ready, so its handler is in
    place (the signal's default action ends a process); any other looks when it starts
    streaming."""
    if handle.state != State.RUNNING or handle.pid is None or handle.killed:
        return
    try:
        os.kill(handle.pid, WAKE_SIGNAL)
    except OSError:
        pass            # it just exited: the next worker looks when it starts streaming


def _heartbeat_watched(handle: ChildHandle) -> bool:
    """A live child that must keep reporting (RUNNING or WAITING, not killed already)."""
    return handle.state in (State.RUNNING, State.WAITING) and handle.process is not None \
        and not handle.killed


def _dispatcher_main(*args) -> None:
    """The dispatcher's entry point, importing its module in the dispatcher process only: the
    sinks and their libraries are the dispatcher's alone, and whatever the supervisor has
    imported is inherited by every worker it forks."""
    from .dispatcher import dispatcher_main
    dispatcher_main(*args)


def _drain(fd: int) -> None:
    """Empty the signal wake-up pipe (the signals themselves are queued by the handler)."""
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass
