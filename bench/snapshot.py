"""Initial snapshot of a table: Lapidus's read events beside the database's own client, same run.

    .venv/bin/python bench/snapshot.py [--source postgresql|mariadb] [--rows 1000000] [--runs 3]
                                       [--chunk-rows 5000] [--profile DIR] [--timeout 900]

``--source postgresql`` (the default) is described first; ``--source mariadb`` at the end.

Creates the throw-away database ``lapidus_bench_snapshot`` with one table of ROWS rows
(``id int PRIMARY KEY, name text, price numeric(12,2), updated_at timestamptz``, from
``generate_series``, then ``VACUUM ANALYZE``), and then, alternating, RUNS times:

  * baseline: ``psql -c "COPY (SELECT * FROM t) TO STDOUT"`` into /dev/null, timed from the
    process start to its exit;
  * Lapidus:  ``lapidus -c CONFIG --stdout`` with that backend, ``decoder = "pgoutput"``,
    ``snapshot = "initial"`` and ``snapshot_chunk_rows = CHUNK_ROWS``, a fresh state_dir and a
    fresh slot; its standard output is read in 1 MiB blocks until the ROWS-th line with
    ``"type":"read"`` arrived, timed from the process start to that line; then SIGTERM, and
    the slot is dropped.

The worker process (``lapidus:bench``) is polled every 0.1 s for its RSS (max kept) and its
``VmHWM`` (peak RSS as the kernel counts it) is read from /proc right after the last row, before
the stop. Prints rows/s of each, the ratio Lapidus / COPY per run and the median, the time to
the first ``read`` event, the ratio a Lapidus whose rows cost nothing beyond the client's own
time could reach after its start-up (``COPY / (start-up + COPY)``), the CPU seconds of the
Lapidus processes, and the worker's peak RSS.
With ``--profile DIR`` the workers and the dispatcher write cProfile statistics there
(``LAPIDUS_PROFILE_DIR``; cProfile slows Python code down, so do not compare those rates).

Talks only to the local PostgreSQL (127.0.0.1:5432, user postgres; another port with
BENCH_PG_PORT=N; another database, and slots named after it, with BENCH_SNAPSHOT_DB=NAME).
The database and its slots are dropped at the end, also after a failure.

``--source mariadb``: the same on the local MariaDB (scripts/setup-local; 127.0.0.1:3306, root
without password, another port with BENCH_MYSQL_PORT=N), the helpers of the sibling
mysql_drain.py.  The throw-away database ``lapidus_bench_snapshot`` holds one table of ROWS
rows (``id INT PRIMARY KEY, name VARCHAR(64), price DECIMAL(12,2), updated_at TIMESTAMP(6)``,
from the sequence engine's ``seq_1_to_ROWS``, then ``ANALYZE TABLE``); the baseline is
``mariadb --quick -e "SELECT * FROM t"`` into /dev/null (rows streamed, not buffered, the
text protocol as Lapidus reads it), Lapidus a ``type = "mysql"`` backend with ``snapshot =
"initial"`` and a fresh state_dir per run.  The database is dropped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from pg_drain import PG, connect, sql  # noqa: E402  (the sibling script: same server helpers)
import mysql_drain  # noqa: E402  (the MariaDB helpers of the sibling script)

# BENCH_SNAPSHOT_DB=NAME: another throw-away database, so that two runs on one server (two
# checkouts compared, or two people) do not drop each other's
DB = os.environ.get("BENCH_SNAPSHOT_DB", "lapidus_bench_snapshot")
BACKEND = "bench"
WORKER_NAME = f"lapidus:{BACKEND}"[:15]   # the kernel keeps 15 bytes of a process name
MIB = 2 ** 20
READ_MARK = b'"type":"read"'


def drop_slots(admin, timeout: float = 15.0) -> None:
    """Drop every slot of the bench database, waiting for its reader to go away first."""
    deadline = time.monotonic() + timeout
    while True:
        slots = sql(admin, "SELECT slot_name, active_pid FROM pg_replication_slots "
                           "WHERE database = %s", (DB,))
        if not slots:
            return
        for slot, active_pid in slots:
            if active_pid is None:
                sql(admin, "SELECT pg_drop_replication_slot(%s)", (slot,))
            elif time.monotonic() > deadline:
                # a pg_recvlogical of ours that outlived its Lapidus: end its walsender
                sql(admin, "SELECT pg_terminate_backend(%s)", (active_pid,))
        time.sleep(0.2)


def drop_database() -> None:
    admin = connect()
    try:
        drop_slots(admin)
        sql(admin, f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
    finally:
        admin.close()


def make_table(rows: int) -> str:
    drop_database()
    admin = connect()
    sql(admin, f"CREATE DATABASE {DB}")
    admin.close()
    conn = connect(DB)
    try:
        sql(conn, "CREATE TABLE t (id int PRIMARY KEY, name text, price numeric(12,2), "
                  "updated_at timestamptz)")
        sql(conn, "INSERT INTO t SELECT g, 'item ' || g, g / 100.0, "
                  "timestamptz '2026-01-01 00:00:00+00' + g * interval '1 second' "
                  "FROM generate_series(1, %s) g", (rows,))
        # hint bits set and statistics taken now, not by whichever reader comes first
        sql(conn, "VACUUM ANALYZE t")
        return sql(conn, "SELECT pg_size_pretty(pg_table_size('t'))")[0][0]
    finally:
        conn.close()


def run_copy() -> float:
    argv = ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", PG["host"], "-p", str(PG["port"]),
            "-U", PG["user"], "-d", DB, "-c", "COPY (SELECT * FROM t) TO STDOUT"]
    started = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


class WorkerWatch(threading.Thread):
    """Polls the worker, ``lapidus:bench`` among the supervisor's descendants (the fork
    server's child), every 0.1 s; keeps its max RSS."""

    def __init__(self, supervisor_pid: int):
        super().__init__(daemon=True)
        self.supervisor = psutil.Process(supervisor_pid)
        self.worker = None
        self.max_rss = 0
        self.halt = threading.Event()

    def find(self):
        try:
            for child in self.supervisor.children(recursive=True):
                if child.name() == WORKER_NAME:
                    return child
        except psutil.Error:
            pass
        return None

    def run(self):
        while not self.halt.is_set():
            if self.worker is None:
                self.worker = self.find()
            if self.worker is not None:
                try:
                    self.max_rss = max(self.max_rss, self.worker.memory_info().rss)
                except psutil.Error:
                    self.worker = None   # gone (restarted?): look for it again
            self.halt.wait(0.1)

    def vm_hwm(self):
        """The worker's peak RSS as the kernel counts it (bytes), None if unknown."""
        if self.worker is None:
            return None
        try:
            for line in Path(f"/proc/{self.worker.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None


def cpu_seconds(supervisor: psutil.Process) -> dict:
    cpu = {"supervisor": sum(supervisor.cpu_times()[:2])}
    for child in supervisor.children(recursive=True):
        try:
            name = child.name()
            cpu[name] = cpu.get(name, 0.0) + sum(child.cpu_times()[:2])
        except psutil.Error:
            pass
    return cpu


class Postgres:
    """The PostgreSQL side: table, COPY baseline, backend, clean-up (the default source)."""

    client = "psql COPY TO STDOUT > /dev/null"

    make_table = staticmethod(make_table)
    run_client = staticmethod(run_copy)
    drop_database = staticmethod(drop_database)

    @staticmethod
    def backend(run: int, chunk_rows: int) -> dict:
        return {"name": BACKEND, "type": "postgresql", "host": PG["host"], "port": PG["port"],
                "user": PG["user"], "database": DB, "slot": f"{DB}_{run}",   # slot names are the whole server's
                "decoder": "pgoutput", "snapshot": "initial", "snapshot_chunk_rows": chunk_rows}

    @staticmethod
    def after_run() -> None:
        admin = connect()
        try:
            drop_slots(admin)
        finally:
            admin.close()


class Mariadb:
    """The MariaDB side (``--source mariadb``; see the module docstring)."""

    client = "mariadb --quick SELECT > /dev/null"

    @staticmethod
    def make_table(rows: int) -> str:
        conn = mysql_drain.connect()
        try:
            q = mysql_drain.query
            q(conn, f"DROP DATABASE IF EXISTS {DB}")
            q(conn, f"CREATE DATABASE {DB}")
            q(conn, f"CREATE TABLE {DB}.t (id INT PRIMARY KEY, name VARCHAR(64), "
                    f"price DECIMAL(12,2), updated_at TIMESTAMP(6) NULL)")
            q(conn, "SET time_zone = '+00:00'")
            q(conn, f"INSERT INTO {DB}.t SELECT seq, CONCAT('item ', seq), seq / 100, "
                    f"TIMESTAMP'2026-01-01 00:00:00' + INTERVAL seq SECOND "
                    f"FROM {DB}.seq_1_to_{int(rows)}")
            q(conn, f"ANALYZE TABLE {DB}.t")
            size = q(conn, "SELECT DATA_LENGTH + INDEX_LENGTH FROM information_schema.TABLES "
                           "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = 't'", (DB,))[0][0]
            return f"{int(size) / 1e6:.0f} MB"
        finally:
            conn.close()

    @staticmethod
    def run_client() -> float:
        argv = ["mariadb", "--quick", "-h", mysql_drain.HOST, "-P", str(mysql_drain.PORT),
                "-u", mysql_drain.USER, "-D", DB, "-e", "SELECT * FROM t"]
        started = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, check=True)
        return time.perf_counter() - started

    @staticmethod
    def drop_database() -> None:
        conn = mysql_drain.connect()
        try:
            mysql_drain.query(conn, f"DROP DATABASE IF EXISTS {DB}")
        finally:
            conn.close()

    @staticmethod
    def backend(run: int, chunk_rows: int) -> dict:
        return {"name": BACKEND, "type": "mysql", "host": mysql_drain.HOST,
                "port": mysql_drain.PORT, "user": mysql_drain.USER, "password": "",
                "database": DB, "server_id": mysql_drain.LAPIDUS_SERVER_ID + 10 + run,
                "snapshot": "initial", "snapshot_chunk_rows": chunk_rows}

    @staticmethod
    def after_run() -> None:
        pass


SOURCES = {"postgresql": Postgres, "mariadb": Mariadb}


def run_lapidus(workdir: Path, source, run: int, rows: int, chunk_rows: int, timeout: float,
                profile_dir) -> dict:
    config = {
        "state_dir": str(workdir / "state"), "log": {"format": "json", "level": "warning"},
        "backends": [source.backend(run, chunk_rows)],
    }
    path = workdir / "lapidus.json"
    path.write_text(json.dumps(config))
    log_path = workdir / "lapidus.log"
    env = dict(os.environ)
    if profile_dir:
        env["LAPIDUS_PROFILE_DIR"] = str(profile_dir)
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "lapidus", "-c", str(path), "--stdout"],
                            stdout=subprocess.PIPE, stderr=open(log_path, "ab"),
                            start_new_session=True, env=env)
    watch = WorkerWatch(proc.pid)
    watch.start()
    fd = proc.stdout.fileno()
    reads = lines = 0
    tail = b""
    first = None
    deadline = time.monotonic() + timeout
    try:
        while reads < rows:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"timed out after {timeout:g} s with {reads:,} of {rows:,} "
                                   f"read events; see {log_path}")
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if not ready:
                continue
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise RuntimeError(f"lapidus exited early ({reads:,} read events); "
                                   f"log: {log_path.read_text()[-3000:]}")
            if first is None:
                first = time.perf_counter() - started
            lines += chunk.count(b"\n")
            # the marker may straddle two blocks: look at the joint as well
            joined = tail + chunk
            reads += joined.count(READ_MARK)
            tail = joined[-(len(READ_MARK) - 1):]   # too short to hold a whole marker
        elapsed = time.perf_counter() - started
        hwm = watch.vm_hwm()
        supervisor = psutil.Process(proc.pid)
        cpu = cpu_seconds(supervisor)
    finally:
        watch.halt.set()
        watch.join()
        # keep reading so that nothing blocks on a full pipe while stopping
        drain = threading.Thread(target=lambda: proc.stdout.read(), daemon=True)
        drain.start()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        drain.join(5)
        source.after_run()
    return {"elapsed": elapsed, "first": first, "lines": lines, "reads": reads,
            "max_rss": watch.max_rss, "vm_hwm": hwm, "cpu": cpu}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", choices=sorted(SOURCES), default="postgresql")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--chunk-rows", type=int, default=5000,
                        help="snapshot_chunk_rows of the backend (default 5000)")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds one Lapidus snapshot may take before the run fails")
    parser.add_argument("--profile", metavar="DIR",
                        help="LAPIDUS_PROFILE_DIR for the Lapidus processes (cProfile stats)")
    args = parser.parse_args()
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
    source = SOURCES[args.source]
    copy_rates, lap_rates, ratios, results, bounds = [], [], [], [], []
    try:
        t0 = time.perf_counter()
        size = source.make_table(args.rows)
        print(f"table t: {args.rows:,} rows, {size}, made in {time.perf_counter() - t0:.1f} s; "
              f"snapshot_chunk_rows = {args.chunk_rows}", flush=True)
        for run in range(args.runs):
            copy = source.run_client()
            with tempfile.TemporaryDirectory(prefix="lapidus-bench-snapshot-") as tmp:
                lap = run_lapidus(Path(tmp), source, run, args.rows, args.chunk_rows, args.timeout,
                                  args.profile)
            copy_rate, lap_rate = args.rows / copy, args.rows / lap["elapsed"]
            copy_rates.append(copy_rate)
            lap_rates.append(lap_rate)
            ratios.append(lap_rate / copy_rate)
            results.append(lap)
            extra = ("" if lap["lines"] == lap["reads"]
                     else f" ({lap['lines'] - lap['reads']:,} other lines)")
            hwm = f"{lap['vm_hwm'] / MIB:.1f} MiB" if lap["vm_hwm"] else "?"
            print(f"run {run + 1}: {source.client} {copy_rate:,.0f} rows/s ({copy:.2f} s), "
                  f"lapidus {lap_rate:,.0f} rows/s ({lap['elapsed']:.2f} s, first read event "
                  f"after {lap['first']:.2f} s){extra}, ratio {lap_rate / copy_rate:.3f}; "
                  f"worker peak RSS {lap['max_rss'] / MIB:.1f} MiB polled, VmHWM {hwm}",
                  flush=True)
            # Lapidus's start-up before its first chunk: the time to the first read event less
            # an average chunk's share of the run (an underestimate: that share includes the
            # waits); a snapshot whose rows cost nothing beyond the client's own time could
            # reach at most copy / (start-up + copy) of the client
            startup = max(0.0, lap["first"] - lap["elapsed"] * args.chunk_rows / args.rows)
            bounds.append(copy / (startup + copy))
            print(f"  start-up before the first chunk about {startup:.2f} s: with rows that "
                  f"cost Lapidus nothing beyond the client's {copy:.2f} s the ratio could be "
                  f"at most {bounds[-1]:.2f}", flush=True)
            print("  CPU seconds: " + ", ".join(f"{name} {value:.2f}" for name, value
                                                in sorted(lap["cpu"].items())), flush=True)
    finally:
        source.drop_database()
    if not results:
        return
    peak = max(max(r["max_rss"], r["vm_hwm"] or 0) for r in results)
    print(f"median over {args.runs} run(s) of {args.rows:,} rows "
          f"(snapshot_chunk_rows = {args.chunk_rows}):")
    print(f"  {source.client:<33}: {statistics.median(copy_rates):,.0f} rows/s")
    print(f"  {'lapidus --stdout, read events':<33}: {statistics.median(lap_rates):,.0f} rows/s")
    print(f"  ratio lapidus / client: {statistics.median(ratios):.3f} (per run "
          + " ".join(f"{r:.3f}" for r in ratios) + ")")
    print(f"  at most, with rows that cost nothing beyond the client's time: "
          f"{statistics.median(bounds):.2f} (per run " + " ".join(f"{b:.2f}" for b in bounds)
          + ")")
    print(f"  worker peak RSS: {peak / MIB:.1f} MiB ({peak / 1e6:.1f} MB), the largest of the "
          f"polled maxima and VmHWM over the runs")


if __name__ == "__main__":
    main()
