"""Fixtures for integration tests: real PostgreSQL, and Lapidus run as a real process.

The servers are the local ones configured by scripts/setup-local (`make test` runs it).
Every database, slot and process a test creates is removed afterwards, even on failure:
a leftover logical slot would keep WAL forever and stop PostgreSQL from starting with a
lower wal_level.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import psycopg2
import pytest

from bench.chaos.lapidus import stop_group
from tests.conftest import wait_until

PG = dict(host="127.0.0.1", port=5432, user="postgres")


def pg_connect(dbname: str = "postgres"):
    conn = psycopg2.connect(dbname=dbname, **PG)
    conn.autocommit = True
    return conn


def drop_slots_of(conn, database: str) -> None:
    """Drop every slot of ``database``.  A Lapidus of the test may still run (fixtures are torn
    down in reverse order) and its worker reconnects by itself, taking the slot again: so
    terminate its connection and drop, until a drop wins the race."""
    with conn.cursor() as cur:
        cur.execute("SELECT slot_name FROM pg_replication_slots WHERE database = %s", (database,))
        for (slot,) in cur.fetchall():
            wait_until(lambda: _drop_slot(conn, slot), 20, interval=0.1,
                       message=f"slot {slot} dropped")


def _drop_slot(conn, slot: str) -> bool:
    with conn.cursor() as cur:
        cur.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,))
        row = cur.fetchone()
        if row is None:
            return True
        if row[0]:
            cur.execute("SELECT pg_terminate_backend(%s)", (row[0],))
            return False
        try:
            cur.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        except psycopg2.errors.ObjectInUse:
            return False     # taken again between the look and the drop
        return True


class PgDatabase:
    """A throw-away database: ``sql()`` runs statements, ``name`` goes into backend configs."""

    def __init__(self, name: str):
        self.name = name
        self.conn = pg_connect(name)

    def sql(self, *statements, args=None):
        with self.conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement, args)
            if cur.description:
                return cur.fetchall()
        return None

    def slot(self, slot: str):
        with self.conn.cursor() as cur:
            cur.execute("SELECT active, active_pid, confirmed_flush_lsn::text "
                        "FROM pg_replication_slots WHERE slot_name = %s", (slot,))
            return cur.fetchone()


@pytest.fixture
def pg_db():
    yield from throwaway_database(f"lapidus_it_{uuid.uuid4().hex[:10]}")


def throwaway_database(name: str):
    """A fixture's body: the database ``name`` created, yielded, then dropped with its
    slots."""
    admin = pg_connect()
    with admin.cursor() as cur:
        cur.execute(f"CREATE DATABASE {name}")
    db = PgDatabase(name)
    try:
        yield db
    finally:
        db.conn.close()
        drop_slots_of(admin, name)
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.close()


class LapidusProcess:
    """``lapidus -c CONFIG`` in its own process group, stdout captured to a file."""

    def __init__(self, config: dict, workdir: Path, extra_args=(), env=None):
        self.workdir = workdir
        self.config_path = workdir / "lapidus.json"
        self.config_path.write_text(json.dumps(config))
        self.stdout_path = workdir / "events.jsonl"
        self.stderr_path = workdir / "lapidus.log"
        self.extra_args = list(extra_args)
        self.env = None if env is None else {**os.environ, **env}
        self.proc = None

    def start(self):
        out = open(self.stdout_path, "ab")
        err = open(self.stderr_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lapidus", "-c", str(self.config_path), *self.extra_args],
            stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True,
            cwd=self.workdir, env=self.env)
        out.close()
        err.close()
        return self

    # -- observing ----------------------------------------------------------------------

    def events(self):
        if not self.stdout_path.exists():
            return []
        data = self.stdout_path.read_bytes()
        # only complete lines: the last one may be in the middle of being written
        lines = data[:data.rfind(b"\n") + 1].splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def wait_events(self, count: int, timeout: float = 30.0):
        return wait_until(lambda: (lambda ev: ev if len(ev) >= count else None)(self.events()),
                          timeout, message=f"{count} events on stdout; log:\n{self.log()[-3000:]}")

    def log(self) -> str:
        return self.stderr_path.read_text() if self.stderr_path.exists() else ""

    def records(self) -> list:
        """The JSON log lines on standard error, parsed (anything else skipped)."""
        records = []
        for line in self.log().splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                pass
        return records

    def wait_log(self, text: str, timeout: float = 30.0):
        wait_until(lambda: text in self.log(), timeout,
                   message=f"{text!r} in the log:\n{self.log()[-3000:]}")

    def children(self):
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def child_pid(self, name: str, what: str) -> int:
        """The pid of the descendant process called ``name`` (of which the kernel keeps 15
        characters), once there is one."""
        def find():
            for child in self.children():
                try:
                    if child.name() == name[:15]:
                        return child.pid
                except psutil.NoSuchProcess:
                    pass
            return None
        return wait_until(find, 20, message=what)

    def worker_pid(self, backend: str) -> int:
        return self.child_pid(f"lapidus:{backend}", f"worker process of {backend}")

    def recvlogical_pid(self) -> int:
        return self.child_pid("pg_recvlogical", "pg_recvlogical process")

    def dispatcher_pid(self) -> int:
        return self.child_pid("lapidus:dispatch", "the dispatcher process")

    def wait_streaming(self, backends: int) -> "LapidusProcess":
        """Until ``backends`` backends logged that they stream; the log's tail is printed when
        lapidus exits first or they do not get there."""
        try:
            wait_until(lambda: self.log().count('"streaming"') >= backends
                       or self.proc.poll() is not None, 30,
                       message=f"{backends} backend(s) streaming")
            assert self.proc.poll() is None, "lapidus exited"
        except BaseException:
            print(self.log()[-5000:])
            raise
        return self

    # -- stopping -----------------------------------------------------------------------

    def terminate(self, timeout: float = 15.0) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self):
        """SIGKILL the supervisor only (its children must die by themselves)."""
        self.proc.kill()
        self.proc.wait(10)

    def cleanup(self):
        if self.proc is not None:
            stop_group(self.proc, 15)


@pytest.fixture
def lapidus_factory(tmp_path):
    """Start Lapidus processes; every one is stopped at the end of the test."""
    started = []

    def start(config: dict, extra_args=(), workdir: Path = None, env=None):
        directory = workdir or tmp_path
        config.setdefault("state_dir", str(tmp_path / "state"))
        config.setdefault("log", {"format": "json", "level": "info"})
        proc = LapidusProcess(config, directory, extra_args, env).start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.cleanup()


def pg_backend(db: PgDatabase, name: str = "pg", **options) -> dict:
    backend = {"name": name, "type": "postgresql", "host": "127.0.0.1", "port": 5432,
               "user": "postgres", "database": db.name, "slot": f"{db.name}_{name}"}
    backend.update(options)
    return backend


def backend_status(config_path, name=None) -> dict:
    """A backend's row of ``lapidusctl status --json`` (the first one without ``name``); {}
    while no Lapidus answers on the control socket yet."""
    result = subprocess.run([sys.executable, "-m", "lapidus.ctl", "-c", str(config_path),
                             "status", "--json"], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        return {}
    rows = json.loads(result.stdout)["backends"]
    return next((row for row in rows if name is None or row["name"] == name), {})


def ctl(config_path, *args):
    """``lapidusctl -c CONFIG ARGS...``: (exit code, stdout, stderr)."""
    result = subprocess.run([sys.executable, "-m", "lapidus.ctl", "-c", str(config_path), *args],
                            capture_output=True, text=True, timeout=30)
    return result.returncode, result.stdout, result.stderr


def status(config_path) -> dict:
    """Every backend's row of ``lapidusctl status --json``, by name (the call must work)."""
    code, out, err = ctl(config_path, "status", "--json")
    assert code == 0, err
    return {b["name"]: b for b in json.loads(out)["backends"]}


def running(config_path, name):
    """The backend's status row while it is RUNNING, else None (also while nothing answers)."""
    code, out, _ = ctl(config_path, "status", "--json")
    if code == 3:
        return None   # not listening yet
    row = {b["name"]: b for b in json.loads(out)["backends"]}.get(name)
    return row if row and row["state"] == "RUNNING" else None
