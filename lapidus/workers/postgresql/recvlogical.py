"""The supervised ``pg_recvlogical`` child of a PostgreSQL worker.

Runs in the PostgreSQL worker process.  The child streams the slot into the spool
(``-f <spool>/active``) and fsyncs before it confirms a position to the server.  Secrets never
appear in its argv (``ps`` shows argv to every user): the password travels in ``PGPASSWORD`` or a
passfile.  The child gets ``PR_SET_PDEATHSIG`` so it dies with the worker, and ``--no-loop`` so
that reconnecting is the worker's decision (with backoff, and with a look at why it died).
The worker learns of a death without polling: :attr:`RecvLogical.pidfd` becomes readable when
the child exits (Linux 5.3 and later; elsewhere the worker looks once a second).

``--status-interval`` is how often pg_recvlogical tells the server how far it wrote and
fsynced (the slot advances no further); it also wakes pg_recvlogical that often when nothing
happens.  Lapidus's default is pg_recvlogical's own, 10 s: the slot trails the spool by up to
that much more, and after a restart the server sends that much again, which the spool reader
skips (transactions at or before the checkpoint's LSN); nothing is lost or sent twice.  A stop
(SIGINT) sends no last report, so a pg_recvlogical that runs shorter than its interval never
moves the slot: one started again after a pause at the spool cap, which runs only until the
spool is full again, reports every second (``RESUMED_STATUS_INTERVAL``), or the server would
send the same WAL again at every resume and the spool would never get past it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import List, Optional

from ...procutil import die_with_parent
from .tls import tls_options

# Session settings for the walsender: values arrive in one predictable text form.
#: Default of the backend settings status_interval and fsync_interval (seconds).
STATUS_INTERVAL = 10.0
FSYNC_INTERVAL = 1.0
#: status_interval of a pg_recvlogical started again after a pause at the spool cap (seconds).
RESUMED_STATUS_INTERVAL = 1

SESSION_OPTIONS = ("-c timezone=UTC -c datestyle=ISO,YMD -c intervalstyle=postgres "
                   "-c extra_float_digits=3 -c bytea_output=hex")


def find_pg_recvlogical(configured: Optional[str] = None) -> str:
    """The pg_recvlogical binary: configured, on PATH, or in Debian's versioned directory."""
    if configured:
        return configured
    found = shutil.which("pg_recvlogical")
    if found:
        return found
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_recvlogical"),
                        key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0)
    if candidates:
        return str(candidates[-1])
    raise FileNotFoundError(
        "pg_recvlogical not found: install the PostgreSQL client package "
        "(apt-get install postgresql-client) or set the backend option pg_recvlogical")


def conninfo(options: dict, application_name: str) -> str:
    """libpq connection string without the password; with the TLS settings (sslmode,
    sslrootcert, sslcert, sslkey: paths, nothing secret, so argv may show them)."""
    parts = {
        "host": options.get("host", "127.0.0.1"),
        "port": options.get("port", 5432),
        "user": options.get("user", "postgres"),
        "dbname": options["database"],
        "application_name": application_name,
        "connect_timeout": options.get("connect_timeout", 10),
    }
    # Paths only (no secrets): the same TLS settings as the worker's own connections.
    parts.update(tls_options(options, None))

    def quote(value) -> str:
        text = str(value).replace("\\", "\\\\").replace("'", "\\'")
        return f"'{text}'"

    return " ".join(f"{k}={quote(v)}" for k, v in parts.items())


def child_environment(options: dict) -> dict:
    """Environment for the child: the password and session options, nothing in argv."""
    env = dict(os.environ)
    env.pop("PGPASSWORD", None)
    if options.get("password"):
        env["PGPASSWORD"] = str(options["password"])
    if options.get("passfile"):
        env["PGPASSFILE"] = str(options["passfile"])
    env["PGOPTIONS"] = SESSION_OPTIONS
    env["LC_MESSAGES"] = "C"
    return env


class SpoolChild:
    """The child that streams the slot into the spool, one process at a time, restartable:
    ``pg_recvlogical`` (:class:`RecvLogical`), or ``lapidus-walstream`` in cluster mode
    (:class:`~lapidus.workers.postgresql.walstream.WalStream`).  Subclasses give its
    :meth:`argv` and :meth:`start` it with :meth:`_popen`; the rest (its pidfd, its log, a
    stop with SIGINT) is the same for both."""

    def __init__(self, *, options: dict, slot: str, output: Path, plugin_options: List[str],
                 log_path: Path, application_name: str):
        self.options = options
        self.slot = slot
        self.output = output
        self.plugin_options = plugin_options
        self.log_path = log_path
        self.application_name = application_name
        self.proc: Optional[subprocess.Popen] = None
        self.pidfd: Optional[int] = None     # readable once proc has exited (None: unknown)
        self.resumed = False    # started again after a pause at the spool cap (see the module)
        self._log_start = 0

    def argv(self) -> List[str]:
        raise NotImplementedError

    @property
    def pid(self) -> Optional[int]:
        return self.proc.pid if self.proc else None

    def _popen(self, env: dict, stdin) -> None:
        log = open(self.log_path, "ab")
        # recent_errors() reads only what this process writes, not an earlier one's complaints
        self._log_start = log.seek(0, os.SEEK_END)
        parent = os.getpid()
        try:
            self.proc = subprocess.Popen(
                self.argv(), env=env, stdin=stdin, stdout=log, stderr=log, close_fds=True,
                # Own session: a Ctrl-C on the terminal must not stop it behind the worker's
                # back; the worker stops it (SIGINT) when it is told to stop.
                start_new_session=True,
                preexec_fn=lambda: die_with_parent(signal.SIGKILL, parent))
        finally:
            log.close()
        self.pidfd = _pidfd(self.proc.pid)

    def forget(self) -> None:
        """The child died and was reaped (:meth:`exit_code`), or was stopped: let go of it
        (its pidfd, and its stdin where the worker writes to it)."""
        if self.proc is not None and self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        self.proc = None
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None

    def exit_code(self) -> Optional[int]:
        """None while running; the exit status once it died (and it was reaped)."""
        if self.proc is None:
            return None
        return self.proc.poll()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def reopen_output(self) -> None:
        """SIGHUP: fsync, close and reopen the output path (after a spool rotation)."""
        if self.running():
            self.proc.send_signal(signal.SIGHUP)

    def recent_errors(self, limit: int = 2000) -> str:
        """The last lines the child wrote to its log, for error messages."""
        try:
            with open(self.log_path, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(self._log_start, size - limit))
                return f.read().decode("utf-8", "replace").strip()
        except FileNotFoundError:
            return ""

    def stop(self, grace: float = 5.0) -> None:
        """SIGINT, then SIGKILL after ``grace`` seconds.  pg_recvlogical fsyncs and exits 0
        (without a last report to the server: the slot stays where its last periodic report
        put it); lapidus-walstream reads the last acks, confirms them and ends the stream."""
        if not self.proc:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.forget()


class RecvLogical(SpoolChild):
    """``pg_recvlogical``: confirms to the server what it fsynced to the spool."""

    STATUS_KEY = "pg_recvlogical_pid"       # its pid's name in the backend's status

    def __init__(self, *, binary: str, **child):
        super().__init__(**child)
        self.binary = binary

    def argv(self) -> List[str]:
        fsync = max(1, int(round(float(self.options.get("fsync_interval") or FSYNC_INTERVAL))))
        status = max(1, int(round(float(self.options.get("status_interval")
                                        or STATUS_INTERVAL))))
        if self.resumed:
            status = min(status, RESUMED_STATUS_INTERVAL)
        argv = [self.binary, "--start", "--no-loop",
                "-d", conninfo(self.options, self.application_name),
                "--slot", self.slot, "-f", str(self.output),
                f"--fsync-interval={fsync}", f"--status-interval={status}"]
        for opt in self.plugin_options:
            argv += ["-o", opt]
        return argv

    def start(self) -> None:
        self._popen(child_environment(self.options), subprocess.DEVNULL)


def _pidfd(pid: int) -> Optional[int]:
    """A pidfd of ``pid`` (readable once it exits), or None where the kernel has none."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None
