"""The supervisor's main loop (the arbiter).

Runs in the ``lapidus`` process.  It forks the dispatcher and one worker per enabled backend,
then loops: wait for a child message or a signal (with a timeout), handle queued signals, reap
dead children and decide (restart after backoff, or FATAL), start what is due.  Signal handlers
only queue the signal; all work, logging included, happens in the loop.

Shutdown (SIGTERM/SIGINT): workers first (they stop reading, wait for their last batches to be
confirmed and save their checkpoints), then the dispatcher; anything still alive after the stop
timeout is killed with its whole process tree.  Exit 0.
"""

from __future__ import annotations

import fcntl
import multiprocessing
import multiprocessing.connection
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

from .. import logs
from ..workers.runner import worker_main
from .. import exitcodes
from ..backoff import RestartPolicy
from .control_server import ControlServer
from .dispatcher import dispatcher_main
from .handles import ChildHandle
from .http import HttpServer
from .notify import Notifier
from .states import State

TICK = 0.5


class AlreadyRunning(Exception):
    """Another supervisor holds this state directory."""


class Arbiter:
    def __init__(self, config):
        self.config = config
        self.log = logs.get_logger(process="supervisor")
        self.ctx = multiprocessing.get_context("fork")
        self.signals: List[int] = []
        self.stopping = False
        self.stop_deadline = 0.0
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
        self.dispatcher = ChildHandle("dispatcher", RestartPolicy(
            10**9, 60.0, 0.2, 5.0), self.log.bind(child="dispatcher"))
        self._lock_fd: Optional[int] = None
        self.notifier = Notifier()
        self.http = None
        if config.http is not None:
            self.http = HttpServer(config.http.host, config.http.port, self.status, self.log)
        self._last_status_line = ""
        self.control = ControlServer(config.control.socket, {
            "status": lambda _req: {"ok": True, **self.status()},
            "restart": self.cmd_restart, "stop": self.cmd_stop, "start": self.cmd_start,
        }, self.log)

    def _add_backend(self, backend) -> ChildHandle:
        sup = self.config.supervisor
        policy = RestartPolicy(sup.max_restarts, sup.restart_window, sup.backoff_initial,
                               sup.backoff_max)
        handle = ChildHandle(backend.name, policy, self.log.bind(backend=backend.name))
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

    # -- lifecycle ------------------------------------------------------------------------

    def _lock_state_dir(self) -> None:
        state_dir = Path(self.config.state_dir)
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(state_dir / "lapidus.lock", os.O_RDWR | os.O_CREAT, 0o600)
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

    def run(self) -> int:
        self._lock_state_dir()
        wakeup = self._install_signals()
        self.control.open()
        if self.http is not None:
            self.http.open()
        self.log.info("lapidus starting", backends=list(self.workers), pid=os.getpid())
        self._spawn_dispatcher()
        for handle in self.workers.values():
            self._spawn_worker(handle)
        try:
            while True:
                self._wait(wakeup)
                self._handle_signals()
                self._reap()
                self._kill_stale_workers()
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
            self.control.close()
            if self.http is not None:
                self.http.close()
            for handle in list(self.workers.values()) + [self.dispatcher]:
                handle.kill()
            try:
                os.unlink(self.socket_path)
                os.rmdir(self.socket_dir)
            except OSError:
                pass
        self.log.info("lapidus stopped", exit_code=self.exit_code)
        return self.exit_code

    def _wait(self, wakeup: int) -> None:
        conns = [h.conn for h in list(self.workers.values()) + [self.dispatcher]
                 if h.conn is not None]
        if self.http is not None:
            conns.append(self.http)
        timeout = TICK
        due = [h.next_start for h in self.workers.values() if h.state == State.BACKOFF]
        if due:
            timeout = max(0.0, min(timeout, min(due) - time.monotonic()))
        ready = multiprocessing.connection.wait(conns + [wakeup, self.control], timeout)
        if self.control in ready:
            self.control.answer_pending()
        if self.http is not None and self.http in ready:
            self.http.answer_pending()
        for item in ready:
            if item == wakeup:
                try:
                    while os.read(wakeup, 512):
                        pass
                except BlockingIOError:
                    pass
        for handle in list(self.workers.values()) + [self.dispatcher]:
            if handle.conn is not None and handle.conn in ready:
                handle.receive()

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

    def _kill_stale_workers(self) -> None:
        """A RUNNING worker that stopped reporting is wedged: kill it so it restarts."""
        now = time.monotonic()
        timeout = float(self.config.supervisor.heartbeat_timeout)
        for handle in self.workers.values():
            if handle.state in (State.RUNNING, State.WAITING) and handle.process is not None \
                    and now - handle.last_report > timeout:
                handle.last_error = f"no heartbeat for {timeout:.0f}s; killed"
                self.log.error("worker stopped reporting; killing it", backend=handle.name,
                               seconds=round(now - handle.last_report, 1))
                handle.kill()

    def _spawn_worker(self, handle: ChildHandle) -> None:
        backend = self.backends[handle.name]
        state_dir = str(Path(self.config.state_dir) / backend.name)
        handle.spawn(self.ctx, worker_main, (
            backend, state_dir, self.socket_path, self.config.log.format,
            self.config.log.level, os.getpid()))

    def _spawn_dispatcher(self) -> None:
        self.dispatcher.spawn(self.ctx, dispatcher_main,
                              (self.config, self.socket_path, os.getpid()))
        self.dispatcher.state = State.RUNNING

    def _reap(self) -> None:
        now = time.monotonic()
        for handle in self.workers.values():
            code = handle.exited()
            if code is not None:
                handle.on_exit(code, now)
        code = self.dispatcher.exited()
        if code is not None:
            self.dispatcher.receive()
            self.dispatcher.process = None
            if code == exitcodes.OUTPUT_CLOSED:
                self.log.info("output closed; stopping")
                self.begin_stop("output closed")
            elif self.stopping:
                self.dispatcher.state = State.STOPPED
            else:
                # Its workers lose their connection and restart from their checkpoints.
                self.log.error("dispatcher died; restarting it", exit_code=code)
                self.dispatcher.restarts += 1
                self._spawn_dispatcher()

    def _start_due(self) -> None:
        now = time.monotonic()
        for handle in self.workers.values():
            if handle.state == State.BACKOFF and now >= handle.next_start:
                # BACKOFF -> STARTING
                self._spawn_worker(handle)
            elif handle.state == State.STOPPED and handle.restart_requested:
                # STOPPED -> STARTING: an operator's restart
                handle.restart_requested = False
                self._spawn_worker(handle)

    def begin_stop(self, reason: str) -> None:
        if self.stopping:
            return
        self.stopping = True
        self.notifier.stopping()
        self.stop_deadline = time.monotonic() + float(self.config.supervisor.stop_timeout) - 1.5
        self.log.info("stopping", reason=reason)
        for handle in self.workers.values():
            handle.stop()

    def _stop_progress(self) -> bool:
        """True once everything has exited.  Workers first, then the dispatcher."""
        now = time.monotonic()
        alive = [h for h in self.workers.values() if h.process is not None]
        if alive and now < self.stop_deadline:
            return False
        for handle in alive:
            self.log.warning("did not stop in time; killing", pid=handle.pid)
            handle.kill()
            handle.on_exit(-9, now)
        if self.dispatcher.process is not None:
            if self.dispatcher.state != State.STOPPING:
                self.dispatcher.stop()
                self.dispatcher_deadline = now + 1.0
                return False
            if now < self.dispatcher_deadline:
                return False
            self.dispatcher.kill()
            self.dispatcher.process = None
        return True

    # -- operator commands (control socket, signals) -----------------------------------------

    def _handles(self, name: Optional[str]):
        if name is None:
            return list(self.workers.values())
        if name not in self.workers:
            raise KeyError(f'unknown backend "{name}" (configured: {", ".join(self.workers)})')
        return [self.workers[name]]

    def cmd_restart(self, request: dict) -> dict:
        """Restart one backend, or all: stop (draining), then start at once, crash count reset."""
        handles = self._handles(request.get("backend"))
        for handle in handles:
            handle.policy.reset()
            handle.restart_requested = True
            if handle.process is not None:
                handle.stop()
            else:
                handle.state = State.STOPPED
        return {"ok": True, "restarted": [h.name for h in handles]}

    def cmd_stop(self, request: dict) -> dict:
        handles = self._handles(request.get("backend") or "")
        for handle in handles:
            handle.restart_requested = False
            handle.stop()
        return {"ok": True, "stopped": [h.name for h in handles]}

    def cmd_start(self, request: dict) -> dict:
        handles = self._handles(request.get("backend") or "")
        for handle in handles:
            if handle.process is None:
                # STOPPED/FATAL -> STARTING: the operator fixed the cause
                handle.policy.reset()
                handle.last_error = None
                self._spawn_worker(handle)
        return {"ok": True, "started": [h.name for h in handles]}

    def reload(self) -> None:
        """SIGHUP: read the configuration again; restart only backends whose settings changed."""
        from ..config import ConfigError, load_config
        from ..sinks import registry
        try:
            new = load_config(self.config.source, plugin_validators=registry.validators())
        except ConfigError as exc:
            self.log.error("reload refused: the configuration is invalid; still running the old",
                           problems=exc.problems)
            return
        if "stdout" in self.config.plugins and "stdout" not in new.plugins:
            new = new.with_plugin("stdout")   # --stdout was given on the command line
        old_backends = self.backends
        new_backends = {b.name: b for b in new.backends if b.options.get("enabled", True)}
        plugins_changed = any(self.config.plugins_for(b) != new.plugins_for(b)
                              for b in new_backends.values() if b.name in old_backends) \
            or self.config.plugins != new.plugins
        self.config = new
        for name in old_backends.keys() - new_backends.keys():
            self.log.info("reload: backend removed", backend=name)
            self.workers[name].restart_requested = False
            self.workers[name].stop()
            self.workers[name].removed = True
        for name, backend in new_backends.items():
            if name not in old_backends:
                self.log.info("reload: backend added", backend=name)
                self._spawn_worker(self._add_backend(backend))
            elif backend != old_backends[name]:
                self.log.info("reload: backend changed; restarting it", backend=name)
                self.backends[name] = backend
                self.cmd_restart({"backend": name})
        if plugins_changed and self.dispatcher.process is not None:
            self.log.info("reload: plugins changed; restarting the dispatcher")
            self.dispatcher.kill()   # workers reconnect and resend what was not confirmed
        self.log.info("configuration reloaded", backends=list(new_backends))

    # -- status ---------------------------------------------------------------------------

    def status(self) -> dict:
        dispatcher = self.dispatcher.snapshot()
        health = dispatcher.get("sink_health") or {}
        backends = []
        for handle in self.workers.values():
            if getattr(handle, "removed", False):
                continue
            row = handle.snapshot()
            row["sinks"] = health.get(handle.name, {})   # {plugin: connection state}
            backends.append(row)
        return {"pid": os.getpid(), "config": self.config.source, "backends": backends,
                "dispatcher": dispatcher}
