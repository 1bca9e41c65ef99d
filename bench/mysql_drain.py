"""Drain a MariaDB binlog backlog: Lapidus to stdout beside a bare library loop and mariadb-binlog.

    .venv/bin/python bench/mysql_drain.py [--rows 100000] [--runs 3] [--per-tx 1000 1]

For each ``--per-tx`` value: position a Lapidus state directory at the binlog's end (Lapidus runs
until it has saved its checkpoint, then stops), then, with Lapidus stopped, insert ROWS rows into
a 4-column table in transactions of PER_TX rows, in a binlog file of its own.  Each run then
reads that same backlog three ways:

  * lapidus:  ``lapidus -c CONFIG --stdout`` (from a fresh copy of the positioned state) until
              ROWS lines arrived on its standard output: supervisor, worker, dispatcher, sink;
  * bare:     python-mysql-replication's ``BinLogStreamReader`` in this process, no sink
              (blocking=True, is_mariadb, GTID start, only_schemas=[DB], the event types the
              Lapidus reader asks for), touching ``event.rows``, until ROWS rows were seen;
  * mariadb-binlog: ``mariadb-binlog --read-from-remote-server -v`` over the backlog's binlog
              range (file, start and stop position), output to /dev/null.

Every figure is wall-clock time from starting the reader (process start included for lapidus and
mariadb-binlog, connection included for bare).  Prints rows/s of each (medians over the runs),
the ratios lapidus / bare and lapidus / mariadb-binlog, the CPU seconds of the Lapidus processes,
and the RSS of the supervisor, worker and dispatcher right after the drain and once idle.

Needs the local MariaDB configured by scripts/setup-local (root, no password; another port with
BENCH_MYSQL_PORT=N). Uses and then drops the database ``lapidus_bench_drain``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402
import pymysql  # noqa: E402
from pymysqlreplication import BinLogStreamReader  # noqa: E402
from pymysqlreplication.event import (  # noqa: E402
    MariadbGtidEvent, QueryEvent, RotateEvent, XidEvent,
)
from pymysqlreplication.row_event import (  # noqa: E402
    DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent,
)

DB = "lapidus_bench_drain"
HOST, PORT, USER = "127.0.0.1", int(os.environ.get("BENCH_MYSQL_PORT", "3306")), "root"
BACKEND = "bench"
LAPIDUS_SERVER_ID = 4_300_001
BARE_SERVER_ID = 4_300_002


def connect() -> pymysql.connections.Connection:
    return pymysql.connect(host=HOST, port=PORT, user=USER, autocommit=True, charset="utf8mb4")


def query(conn, statement, args=None):
    with conn.cursor() as cur:
        cur.execute(statement, args)
        return cur.fetchall()


def master_status(conn):
    file, pos = query(conn, "SHOW MASTER STATUS")[0][:2]
    return str(file), int(pos)


def reset_database(conn) -> None:
    query(conn, f"DROP DATABASE IF EXISTS {DB}")
    query(conn, f"CREATE DATABASE {DB}")
    query(conn, f"CREATE TABLE {DB}.items (id INT PRIMARY KEY, name VARCHAR(32), qty INT, "
                f"price DOUBLE)")


def write_backlog(conn, rows: int, per_tx: int) -> None:
    """ROWS rows, PER_TX per transaction (one multi-row INSERT each; autocommit)."""
    with conn.cursor() as cur:
        for first in range(0, rows, per_tx):
            values = ", ".join(f"({i}, 'item-{i}', {i % 1000}, {i * 0.25})"
                               for i in range(first, min(rows, first + per_tx)))
            cur.execute(f"INSERT INTO {DB}.items VALUES {values}")


# ------------------------------------------------------------------------------ lapidus

def lapidus_config(state_dir: Path) -> dict:
    return {"state_dir": str(state_dir), "log": {"format": "json", "level": "warning"},
            "backends": [{"name": BACKEND, "type": "mysql", "host": HOST, "port": PORT,
                          "user": USER, "password": "", "database": DB,
                          "server_id": LAPIDUS_SERVER_ID}]}


def start_lapidus(workdir: Path, state_dir: Path, stdout) -> subprocess.Popen:
    path = workdir / "lapidus.json"
    path.write_text(json.dumps(lapidus_config(state_dir)))
    return subprocess.Popen([sys.executable, "-m", "lapidus", "-c", str(path), "--stdout"],
                            stdout=stdout, stderr=open(workdir / "lapidus.log", "ab"),
                            stdin=subprocess.DEVNULL, start_new_session=True)


def stop_lapidus(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


def position_lapidus(workdir: Path) -> Path:
    """Run Lapidus until it saved a checkpoint at the binlog's current end; return its state."""
    state = workdir / "positioned"
    proc = start_lapidus(workdir, state, subprocess.DEVNULL)
    checkpoint = state / BACKEND / "checkpoint.json"
    give_up = time.monotonic() + 60
    while not checkpoint.exists():
        if proc.poll() is not None or time.monotonic() > give_up:
            raise RuntimeError(f"lapidus saved no checkpoint; see {workdir / 'lapidus.log'}")
        time.sleep(0.05)
    stop_lapidus(proc)
    print(f"  lapidus positioned at {json.loads(checkpoint.read_text())['position']['gtid']}")
    return state


def drain_lapidus(workdir: Path, positioned: Path, rows: int) -> dict:
    state = workdir / "state"
    shutil.rmtree(state, ignore_errors=True)
    (state / BACKEND).mkdir(parents=True, mode=0o700)
    shutil.copy(positioned / BACKEND / "checkpoint.json", state / BACKEND / "checkpoint.json")
    started = time.perf_counter()
    proc = start_lapidus(workdir, state, subprocess.PIPE)
    seen, first_at, last = 0, None, b""
    fd = proc.stdout.fileno()
    while seen < rows:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            raise RuntimeError(f"lapidus exited early; see {workdir / 'lapidus.log'}")
        if first_at is None:
            first_at = time.perf_counter()
        seen += chunk.count(b"\n")
        last = (last + chunk)[-65536:]
    elapsed = time.perf_counter() - started
    final = json.loads(last.rstrip(b"\n").rsplit(b"\n", 1)[-1])
    assert seen == rows and final["item"]["id"] == rows - 1, (seen, final)
    sup = psutil.Process(proc.pid)
    processes = {"supervisor": sup, **{c.name(): c for c in sup.children(recursive=True)}}
    cpu = {name: sum(p.cpu_times()[:2]) for name, p in processes.items()}
    rss_busy = {name: p.memory_info().rss for name, p in processes.items()}
    time.sleep(2.0)  # idle now: resident memory once the batches are gone
    rss_idle = {name: p.memory_info().rss for name, p in processes.items()}
    stop_lapidus(proc)
    proc.stdout.close()
    return {"elapsed": elapsed, "steady": elapsed - (first_at - started), "cpu": cpu,
            "rss_busy": rss_busy, "rss_idle": rss_idle}


# --------------------------------------------------------------------------- bare loop

def drain_bare(start_gtid: str, rows: int) -> float:
    started = time.perf_counter()
    reader = BinLogStreamReader(
        connection_settings={"host": HOST, "port": PORT, "user": USER, "passwd": ""},
        # blocking=True like Lapidus: with blocking=False, MariaDB 10.11 reset the connection
        # while it caught up and the library's reconnect replayed from the first GTID.
        server_id=BARE_SERVER_ID, blocking=True, is_mariadb=True, auto_position=start_gtid,
        only_events=[MariadbGtidEvent, QueryEvent, XidEvent, RotateEvent, WriteRowsEvent,
                     UpdateRowsEvent, DeleteRowsEvent],
        only_schemas=[DB], enable_logging=False)
    seen = 0
    try:
        for event in reader:
            if isinstance(event, WriteRowsEvent):
                seen += len(event.rows)
                if seen >= rows:
                    break
    finally:
        reader.close()
    elapsed = time.perf_counter() - started
    assert seen == rows, f"bare loop saw {seen} rows, expected {rows}"
    return elapsed


# ----------------------------------------------------------------------- mariadb-binlog

def binlog_argv(file: str, start: int, stop: int) -> list:
    return ["mariadb-binlog", "--read-from-remote-server", f"--host={HOST}", f"--port={PORT}",
            f"--user={USER}", "-v", f"--start-position={start}", f"--stop-position={stop}",
            file]


def drain_mariadb_binlog(file: str, start: int, stop: int) -> float:
    started = time.perf_counter()
    subprocess.run(binlog_argv(file, start, stop), stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


def count_mariadb_binlog_rows(file: str, start: int, stop: int) -> int:
    """Once, untimed: the range really holds the backlog (rows decoded by -v)."""
    out = subprocess.run(binlog_argv(file, start, stop), stdout=subprocess.PIPE, check=True)
    return out.stdout.count(f"### INSERT INTO `{DB}`.`items`".encode())


# --------------------------------------------------------------------------------- main

def measure(conn, rows: int, per_tx: int, runs: int) -> dict:
    reset_database(conn)
    with tempfile.TemporaryDirectory(prefix="lapidus-mysql-drain-") as tmp:
        workdir = Path(tmp)
        positioned = position_lapidus(workdir)
        query(conn, "FLUSH BINARY LOGS")      # the backlog in a binlog file of its own
        file, start = master_status(conn)
        start_gtid = str(query(conn, "SELECT @@GLOBAL.gtid_binlog_pos")[0][0])
        began = time.perf_counter()
        write_backlog(conn, rows, per_tx)
        wrote = time.perf_counter() - began
        end_file, stop = master_status(conn)
        if end_file != file:
            raise RuntimeError(f"the backlog spans binlog files {file} .. {end_file}")
        print(f"  backlog: {rows:,} rows, {per_tx} per transaction, written in {wrote:.1f} s; "
              f"{file} {start}..{stop} ({(stop - start) / 2**20:.1f} MiB), GTID after "
              f"{start_gtid}")
        decoded = count_mariadb_binlog_rows(file, start, stop)
        if decoded != rows:
            raise RuntimeError(f"mariadb-binlog decoded {decoded} rows in the range, not {rows}")
        results = {"lapidus": [], "bare": [], "mariadb-binlog": [], "steady": []}
        last = None
        for run in range(runs):
            bare = drain_bare(start_gtid, rows)
            tool = drain_mariadb_binlog(file, start, stop)
            last = drain_lapidus(workdir, positioned, rows)
            results["bare"].append(rows / bare)
            results["mariadb-binlog"].append(rows / tool)
            results["lapidus"].append(rows / last["elapsed"])
            results["steady"].append(rows / last["steady"])
            print(f"  run {run + 1}: lapidus {rows / last['elapsed']:,.0f} rows/s "
                  f"({rows / last['steady']:,.0f} after its first line), bare loop "
                  f"{rows / bare:,.0f}, mariadb-binlog {rows / tool:,.0f}; lapidus CPU s: "
                  + ", ".join(f"{n} {v:.2f}" for n, v in sorted(last["cpu"].items())))
        return {"medians": {k: statistics.median(v) for k, v in results.items()},
                "last": last}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--per-tx", type=int, nargs="+", default=[1000, 1],
                        help="rows per transaction; one backlog per value (default: 1000 1)")
    args = parser.parse_args()
    conn = connect()
    summaries = []
    try:
        for per_tx in args.per_tx:
            print(f"backlog of {args.rows:,} rows in transactions of {per_tx}:")
            summaries.append((per_tx, measure(conn, args.rows, per_tx, args.runs)))
    finally:
        query(conn, f"DROP DATABASE IF EXISTS {DB}")
        conn.close()
    mib = 2 ** 20
    for per_tx, summary in summaries:
        m, last = summary["medians"], summary["last"]
        print(f"\nmedian of {args.runs} runs, {args.rows:,} rows, {per_tx} rows per transaction, "
              f"4 columns:")
        print(f"  lapidus --stdout          : {m['lapidus']:9,.0f} rows/s "
              f"({m['steady']:,.0f} rows/s after its first line)")
        print(f"  bare BinLogStreamReader   : {m['bare']:9,.0f} rows/s")
        print(f"  mariadb-binlog -v         : {m['mariadb-binlog']:9,.0f} rows/s")
        print(f"  ratio lapidus / bare loop : {m['lapidus'] / m['bare']:.2f}")
        print(f"  ratio lapidus / mariadb-binlog: {m['lapidus'] / m['mariadb-binlog']:.2f}")
        print("  RSS at the end of the drain: " + ", ".join(
            f"{n} {v / mib:.1f} MiB" for n, v in sorted(last["rss_busy"].items())))
        print("  RSS idle 2 s later        : " + ", ".join(
            f"{n} {v / mib:.1f} MiB" for n, v in sorted(last["rss_idle"].items())))


if __name__ == "__main__":
    main()
