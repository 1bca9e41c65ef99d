"""The servers the harness drives: connecting, and stopping/starting them safely.

PostgreSQL 15, MariaDB and nats-server are the local ones (127.0.0.1), configured by
scripts/setup-local.  Every stop has a matching ``ensure_*`` that starts the server again when
it does not answer; the harness calls them in ``finally`` blocks, so a server is never left
down, whatever failed.

NATS is by default a private nats-server of the run (own port and JetStream directory): stopping
it disturbs nobody.  ``NatsServer.shared()`` drives the machine's shared server instead, with
the exact command it is run with here (tests/integration/nats_fixtures.py does the same).
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
from pathlib import Path
from typing import List, Optional

import nats
import psutil
import psycopg2
import pymysql

from .waiting import wait_for

HOST = "127.0.0.1"
PG_PORT = 5432
PG_USER = "postgres"
MYSQL_PORT = 3306
MYSQL_USER = "root"
MARIADB_BIN = "/usr/sbin/mariadbd"
MARIADB_PID_FILE = "/run/mysqld/mysqld.pid"
NATS_SERVER = "/usr/sbin/nats-server"
NATS_SHARED_PORT = 4222
NATS_SHARED_START = ["start-stop-daemon", "--start", "--oknodo", "--background", "--exec",
                     NATS_SERVER, "--", "-a", HOST, "-p", str(NATS_SHARED_PORT), "-js", "-sd",
                     "/var/lib/nats-server", "-l", "/var/log/nats-server.log"]
PG_CLUSTER = ("15", "main")


def port_open(port: int, host: str = HOST) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def nats_server_on(port: int) -> Optional[psutil.Process]:
    """The nats-server process listening on ``port``, however it was started."""
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port \
                and conn.pid:
            try:
                proc = psutil.Process(conn.pid)
                if "nats-server" in proc.name():
                    return proc
            except psutil.NoSuchProcess:
                continue
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def free_ports(count: int) -> List[int]:
    """``count`` different free ports: all bound at once, so that the kernel cannot hand one
    out twice, as it may to :func:`free_port` called again after the first socket closed."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind((HOST, 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


# -- PostgreSQL ---------------------------------------------------------------------------------

def pg_connect(dbname: str = "postgres", autocommit: bool = True, timeout: int = 3):
    conn = psycopg2.connect(host=HOST, port=PG_PORT, user=PG_USER, dbname=dbname,
                            connect_timeout=timeout)
    conn.autocommit = autocommit
    return conn


def pg_answers() -> bool:
    try:
        pg_connect(timeout=1).close()
        return True
    except psycopg2.Error:
        return False


def restart_postgresql(timeout: float = 120.0) -> None:
    """``pg_ctlcluster restart`` (fast shutdown: every session of every user is cut, so other
    tests running at the same time see it too), then wait until it accepts connections."""
    subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", *PG_CLUSTER, "restart"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                   timeout=timeout)
    wait_for(pg_answers, timeout, "PostgreSQL to accept connections after the restart")


def ensure_postgresql(timeout: float = 120.0) -> None:
    """Start the cluster if it does not answer (after a failed restart)."""
    if pg_answers():
        return
    subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", *PG_CLUSTER, "start"],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout)
    wait_for(pg_answers, timeout, "PostgreSQL to accept connections after start")


# -- MariaDB ------------------------------------------------------------------------------------

def mysql_connect(database: Optional[str] = None, autocommit: bool = True, timeout: int = 3):
    return pymysql.connect(host=HOST, port=MYSQL_PORT, user=MYSQL_USER, password="",
                           database=database, autocommit=autocommit, charset="utf8mb4",
                           connect_timeout=timeout, read_timeout=30, write_timeout=30)


def mariadb_answers() -> bool:
    try:
        mysql_connect(timeout=1).close()
        return True
    except pymysql.err.MySQLError:
        return False


def mariadb_pid_file() -> str:
    """The pid file of the local server's configuration (``my_print_defaults mysqld``)."""
    try:
        out = subprocess.run(["my_print_defaults", "mysqld"], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    for line in out.splitlines():
        if line.startswith("--pid-file="):
            return line.split("=", 1)[1]
    return MARIADB_PID_FILE


def mariadb_process_gone() -> bool:
    """The server of 127.0.0.1:3306 has exited (its pid file is removed at the very end of a
    shutdown).  Not ``start-stop-daemon --status --exec mariadbd``: that also sees other
    mariadbd processes on the machine (private servers of benchmarks), and then a stopped
    server would never be started again."""
    try:
        pid = int(Path(mariadb_pid_file()).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return True
    return not psutil.pid_exists(pid)


def stop_mariadb(timeout: float = 60.0) -> None:
    """``mariadb-admin shutdown`` of the bare mariadbd (started without systemd)."""
    subprocess.run(["mariadb-admin", f"--host={HOST}", f"--port={MYSQL_PORT}",
                    f"--user={MYSQL_USER}", "shutdown"], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=timeout)
    wait_for(mariadb_process_gone, timeout, "mariadbd to exit after mariadb-admin shutdown",
             interval=0.1)


def ensure_mariadb(timeout: float = 60.0) -> None:
    """Start mariadbd as scripts/setup-local does unless it answers; wait until it does.
    ``--pidfile`` makes start-stop-daemon look at this server only."""
    if mariadb_answers():
        return
    if mariadb_process_gone():
        subprocess.run(["start-stop-daemon", "--start", "--oknodo", "--background",
                        "--pidfile", mariadb_pid_file(), "--exec", MARIADB_BIN], check=True)
    wait_for(mariadb_answers, timeout, "MariaDB to answer after start", interval=0.1)


def restart_mariadb(timeout: float = 60.0) -> None:
    try:
        stop_mariadb(timeout)
    finally:
        ensure_mariadb(timeout)


# -- NATS ---------------------------------------------------------------------------------------

def jetstream_ready(url) -> bool:
    """JetStream answers through ``url`` (one URL, or a list: any of them)."""
    async def ping() -> bool:
        nc = await nats.connect(url, connect_timeout=1, allow_reconnect=False)
        try:
            await nc.jetstream().account_info()
            return True
        finally:
            await nc.close()
    try:
        return asyncio.run(ping())
    except Exception:
        return False


class NatsServer:
    """A nats-server with JetStream that the harness may stop and start.

    Stops are clean (SIGTERM): JetStream flushes its files.  A ``kill -9`` of nats-server would
    test NATS's own durability (it fsyncs every 2 minutes by default), not Lapidus's.
    """

    def __init__(self, port: int, store_dir: Optional[Path], log_path: Optional[Path],
                 config_path: Optional[Path] = None):
        self.config_path = config_path      # private only: settings beyond the command line
        self.port = port
        self.url = f"nats://{HOST}:{port}"
        self.store_dir = store_dir
        self.log_path = log_path
        self.binary = Path(NATS_SERVER)
        self.proc: Optional[subprocess.Popen] = None

    @classmethod
    def private(cls, directory: Path, max_payload: Optional[int] = None) -> "NatsServer":
        """``max_payload``: the largest message the server accepts (its command line has no
        option for it, so a configuration file carries it)."""
        config_path = None
        if max_payload is not None:
            config_path = directory / "nats-server.conf"
            config_path.write_text(f"max_payload: {int(max_payload)}\n")
        server = cls(free_port(), directory / "jetstream", directory / "nats-server.log",
                     config_path)
        # A copy of the binary: ``start-stop-daemon --start --oknodo --exec
        # /usr/sbin/nats-server`` (how the shared server is started, by the tests too) would
        # take a private server run from the same file for the shared one, and start nothing.
        server.binary = directory / "nats-server"
        shutil.copy2(NATS_SERVER, server.binary)
        return server

    @classmethod
    def shared(cls) -> "NatsServer":
        return cls(NATS_SHARED_PORT, None, None)

    @property
    def is_private(self) -> bool:
        return self.store_dir is not None

    def start(self, timeout: float = 30.0) -> None:
        if self.is_private:
            if self.proc is None or self.proc.poll() is not None:
                extra = ["-c", str(self.config_path)] if self.config_path else []
                self.proc = subprocess.Popen(
                    [str(self.binary), *extra, "-a", HOST, "-p", str(self.port), "-js", "-sd",
                     str(self.store_dir), "-l", str(self.log_path)],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL)
        else:
            subprocess.run(NATS_SHARED_START, check=True)
        wait_for(lambda: port_open(self.port), timeout, f"nats-server on {self.port}")
        wait_for(lambda: jetstream_ready(self.url), timeout, "JetStream ready")

    def process(self) -> Optional[psutil.Process]:
        if self.is_private:
            if self.proc is not None and self.proc.poll() is None:
                return psutil.Process(self.proc.pid)
            return None
        return nats_server_on(self.port)

    def stop(self, timeout: float = 30.0) -> None:
        proc = self.process()
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(timeout)
        except psutil.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        if self.is_private and self.proc is not None:
            self.proc.wait(10)     # reap it
        wait_for(lambda: not port_open(self.port), 10, "nats-server to stop listening")

    def ensure(self) -> None:
        """Running and answering (after a failed outage, or at the end of a run)."""
        if self.process() is None or not port_open(self.port):
            self.start()

    def shutdown(self) -> None:
        """The end of the run: a private server goes, the shared one stays up."""
        if self.is_private:
            self.stop()
        else:
            self.ensure()
