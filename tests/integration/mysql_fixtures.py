"""Fixtures for the MySQL/MariaDB integration tests (import them into a test module).

They need the local MariaDB configured by ``scripts/setup-local`` (binlog on, ROW, FULL image,
FULL metadata) at 127.0.0.1:3306, root without password.  Tests are skipped when the server
cannot be reached and fail when it runs with a binlog configuration CDC cannot use.

Each test session works in its own database ``lapidus_test_mysql_<pid>`` (so parallel runs on
one server do not collide), re-created empty for every test and dropped at the end; databases
left behind by dead sessions are dropped at start.  Sources opened through ``open_source`` are
closed after the test.  Waiting is always on a condition with a deadline, never a fixed sleep.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from typing import Any, Callable, Dict, List, Tuple

import pymysql
import pytest
import structlog

from bench.chaos.servers import ensure_mariadb, mariadb_process_gone

from lapidus.config import BackendConfig
from lapidus.events import Event
from lapidus.workers.base import Batch
from lapidus.workers.mysql import MysqlSource

HOST = os.environ.get("LAPIDUS_TEST_MYSQL_HOST", "127.0.0.1")
PORT = int(os.environ.get("LAPIDUS_TEST_MYSQL_PORT", "3306"))
ROOT = os.environ.get("LAPIDUS_TEST_MYSQL_USER", "root")
ROOT_PASSWORD = os.environ.get("LAPIDUS_TEST_MYSQL_PASSWORD", "")
DATABASE = f"lapidus_test_mysql_{os.getpid()}"

# 900 blocks of 1,000 ids below 5,000,000, one per test process: pytest-xdist's workers (gw0,
# gw1, ... up to gw5) get blocks of their own, so two side by side never collide whatever
# their pids.
_worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:] or 0)
_server_ids = iter(range(4_100_000 + (_worker * 150 + os.getpid() % 150) * 1000, 5_000_000))


def gtid_sequence(gtid: str) -> int:
    """The sequence number of a one-domain MariaDB GTID position ("0-1-42" -> 42): other
    tests commit on the shared server too, so a test compares positions, not expects one."""
    return int(gtid.rsplit("-", 1)[1])


def next_server_id() -> int:
    """A server_id no other reader in this session uses."""
    return next(_server_ids)


def root_connection(**extra: Any) -> pymysql.connections.Connection:
    return pymysql.connect(host=HOST, port=PORT, user=ROOT, password=ROOT_PASSWORD,
                           autocommit=True, charset="utf8mb4", **extra)


def database_connection(autocommit: bool = True) -> pymysql.connections.Connection:
    """A root connection in this session's test database (outside autocommit with
    ``autocommit=False``: a source writer's, committing its own transactions)."""
    conn = root_connection()
    conn.select_db(DATABASE)
    conn.autocommit(autocommit)
    return conn


class Sql:
    """A root connection for driving the server in tests."""

    def __init__(self) -> None:
        self.conn = root_connection()

    def run(self, *statements: str, args: Any = None) -> None:
        with self.conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement, args)

    def rows(self, statement: str, args: Any = None) -> List[tuple]:
        with self.conn.cursor() as cur:
            cur.execute(statement, args)
            return list(cur.fetchall())

    def value(self, statement: str, args: Any = None) -> Any:
        rows = self.rows(statement, args)
        return rows[0][0] if rows else None

    def close(self) -> None:
        self.conn.close()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@pytest.fixture(scope="session")
def mysql_server() -> Dict[str, str]:
    """The server's binlog settings; skips without a server, fails when misconfigured."""
    try:
        conn = root_connection(connect_timeout=3)
    except pymysql.err.MySQLError as exc:
        pytest.skip(f"MariaDB/MySQL not reachable at {HOST}:{PORT} ({exc}); "
                    f"run scripts/setup-local")
    with conn.cursor() as cur:
        cur.execute("SELECT @@log_bin, @@binlog_format, @@binlog_row_image, @@binlog_row_metadata")
        log_bin, fmt, image, metadata = cur.fetchone()
        wanted = (1, "ROW", "FULL", "FULL")
        if (int(log_bin), fmt, image, metadata) != wanted:
            conn.close()
            pytest.fail(f"server binlog is log_bin={log_bin} binlog_format={fmt} "
                        f"binlog_row_image={image} binlog_row_metadata={metadata}; "
                        f"run scripts/setup-local")
        cur.execute("SHOW DATABASES LIKE 'lapidus\\_test\\_mysql\\_%'")
        for (name,) in cur.fetchall():
            pid = name.rsplit("_", 1)[-1]
            if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
                cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
    conn.close()
    yield {"host": HOST, "port": str(PORT)}
    with root_connection() as conn, conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS `{DATABASE}`")


@pytest.fixture
def sql(mysql_server) -> Sql:
    """A root connection, with this session's test database freshly created and empty."""
    helper = Sql()
    helper.run(f"DROP DATABASE IF EXISTS `{DATABASE}`",
               f"CREATE DATABASE `{DATABASE}` CHARACTER SET utf8mb4")
    helper.run(f"USE `{DATABASE}`")
    yield helper
    helper.close()


def backend(name: str = "crm", *, include: Tuple[str, ...] = (), exclude: Tuple[str, ...] = (),
            **options: Any) -> BackendConfig:
    opts = {"host": HOST, "port": PORT, "user": ROOT, "password": ROOT_PASSWORD,
            "database": DATABASE, "server_id": next_server_id(), "heartbeat_seconds": 1}
    opts.update(options)
    return BackendConfig(name=name, type="mysql", options=opts, include_tables=include,
                         exclude_tables=exclude)


@pytest.fixture
def open_source(mysql_server, tmp_path) -> Callable[..., MysqlSource]:
    """``open_source(checkpoint=None, name="crm", encoded=False, **options)`` -> an opened
    MysqlSource, closed after the test."""
    opened: List[MysqlSource] = []

    def make(checkpoint: Any = None, name: str = "crm", *, include=(), exclude=(),
             encoded: bool = False, **options: Any) -> MysqlSource:
        source = MysqlSource(backend(name, include=include, exclude=exclude, **options),
                             tmp_path / name, structlog.get_logger().bind(backend=name))
        source.encoded_reads = encoded      # as the worker loop sets it (snapshot chunks)
        opened.append(source)
        source.open(checkpoint)
        return source

    yield make
    for source in opened:
        source.close()


class FreezableProxy:
    """A TCP proxy to the server that can stop forwarding without closing anything: to the
    client the link looks alive but silent, as after a network partition."""

    def __init__(self, target: Tuple[str, int]):
        self.target = target
        self.frozen = threading.Event()
        self.closed = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: List[socket.socket] = [self._listener]
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            self._sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                thread = threading.Thread(target=self._pump, args=(a, b), daemon=True)
                self._threads.append(thread)
                thread.start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        source.settimeout(0.1)
        while not self.closed.is_set():
            if self.frozen.is_set():
                self.closed.wait(0.1)      # leave the bytes unread: the link goes silent
                continue
            try:
                data = source.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                return
            if not data:
                return
            try:
                sink.sendall(data)
            except OSError:
                return

    def freeze(self) -> None:
        self.frozen.set()

    def close(self) -> None:
        self.closed.set()
        for sock in self._sockets:
            try:
                sock.close()
            except OSError:
                pass
        for thread in self._threads:
            thread.join(timeout=2)


@pytest.fixture
def tcp_proxy(mysql_server) -> FreezableProxy:
    proxy = FreezableProxy((HOST, PORT))
    yield proxy
    proxy.close()


def read_until(source: MysqlSource, done: Callable[[List[Event]], bool], *,
               timeout: float = 10.0, max_events: int = 1000) -> Tuple[List[Event], Any]:
    """Read batches until ``done(events)`` holds; returns the events and the last checkpoint.

    Fails the test when the condition does not hold within ``timeout`` seconds.
    """
    events: List[Event] = []
    checkpoint = None
    give_up = time.monotonic() + timeout
    while not done(events):
        if time.monotonic() > give_up:
            pytest.fail(f"condition not met within {timeout} s; got {len(events)} events: "
                        f"{[e.id for e in events][:20]}")
        batch: Batch = source.read(max_events, 0.2)
        events.extend(batch.events)
        checkpoint = batch.checkpoint
    return events, checkpoint


def read_count(source: MysqlSource, count: int, **kwargs: Any) -> Tuple[List[Event], Any]:
    return read_until(source, lambda events: len(events) >= count, **kwargs)


def read_to_marker(source: MysqlSource, marker_table: str = "marker",
                   **kwargs: Any) -> Tuple[List[Event], Any]:
    """Everything up to and including the first insert into ``marker_table``: writing a marker
    after the statements under test proves that nothing else came before it."""
    return read_until(
        source, lambda events: any(e.table == marker_table and e.type == "insert"
                                   for e in events), **kwargs)


def without_marker(events: List[Event], marker_table: str = "marker") -> List[Event]:
    cut = next(i for i, e in enumerate(events) if e.table == marker_table and e.type == "insert")
    return events[:cut]


# --------------------------------------------------------------------------------------------
# The real ``lapidus`` process with a mysql backend (tests/integration/test_mysql_supervised.py)


MARIADB_BIN = "/usr/sbin/mariadbd"

# next_server_id() runs dry in sessions whose pid ends in 900..999 (its range then starts past
# its end); these ids are the supervised tests' own: 100 per session, apart from those.
_SUPERVISED_IDS_FROM = 6_000_000 + (os.getpid() % 1_000_000) * 100
_supervised_server_ids = iter(range(_SUPERVISED_IDS_FROM, _SUPERVISED_IDS_FROM + 100))


def lapidus_backend(name: str = "crm", **options: Any) -> dict:
    """A mysql backend entry for a ``lapidus`` configuration file (the dict form of
    :func:`backend`): this session's database, a fresh server_id, quick heartbeats."""
    entry = {"name": name, "type": "mysql", "host": HOST, "port": PORT, "user": ROOT,
             "password": ROOT_PASSWORD, "database": DATABASE,
             "server_id": next(_supervised_server_ids), "heartbeat_seconds": 1}
    entry.update(options)
    return entry


def server_answers() -> bool:
    """True when the server accepts a root connection right now."""
    try:
        root_connection(connect_timeout=1).close()
    except pymysql.err.MySQLError:
        return False
    return True


def server_process_gone() -> bool:
    """The shared server has exited; judged by its pid file, because other ``mariadbd``
    processes may run on the machine (see bench.chaos.servers.mariadb_process_gone)."""
    return mariadb_process_gone()


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    give_up = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > give_up:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def begin_server_shutdown() -> subprocess.Popen:
    """Start ``mariadb-admin shutdown`` of the local bare ``mariadbd`` without waiting for it
    (the server was started without systemd; see scripts/setup-local)."""
    argv = ["mariadb-admin", f"--host={HOST}", f"--port={PORT}", f"--user={ROOT}"]
    if ROOT_PASSWORD:
        argv.append(f"--password={ROOT_PASSWORD}")
    return subprocess.Popen(argv + ["shutdown"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)


def start_server(timeout: float = 60.0) -> None:
    """Start ``mariadbd`` as scripts/setup-local does and wait until it answers; nothing to
    do when it already answers.  Call it in a ``finally`` after any shutdown."""
    ensure_mariadb(timeout)


def restart_server(shutdown: "subprocess.Popen | None" = None, timeout: float = 60.0) -> None:
    """Shut the server down (or finish the shutdown begun by :func:`begin_server_shutdown`),
    wait until the process is gone, start it again and wait until it answers."""
    shutdown = shutdown or begin_server_shutdown()
    shutdown.wait(timeout)
    _wait(server_process_gone, timeout, "mariadbd to exit after mariadb-admin shutdown")
    start_server(timeout)


@pytest.fixture
def mysql_user(sql) -> Callable[[str], str]:
    """``mysql_user(password)`` -> the name of a new user ``'name'@'%'`` with REPLICATION
    SLAVE, REPLICATION CLIENT and SELECT, identified by ``password``; dropped after the test."""
    made: List[str] = []

    def make(password: str) -> str:
        name = f"lapidus_u{os.getpid()}_{len(made)}"
        with sql.conn.cursor() as cur:
            cur.execute(f"DROP USER IF EXISTS '{name}'@'%'")
            # with arguments pymysql %-formats the statement: the host wildcard is '%%'
            cur.execute(f"CREATE USER '{name}'@'%%' IDENTIFIED BY %s", (password,))
            cur.execute(f"GRANT REPLICATION SLAVE, REPLICATION CLIENT, SELECT ON *.* "
                        f"TO '{name}'@'%'")
        made.append(name)
        return name

    yield make
    with root_connection() as conn, conn.cursor() as cur:
        for name in made:
            cur.execute(f"DROP USER IF EXISTS '{name}'@'%'")
