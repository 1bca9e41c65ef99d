"""Drain a PostgreSQL backlog: Lapidus to stdout beside pg_recvlogical to a file, same run.

    .venv/bin/python bench/pg_drain.py [--rows 200000] [--runs 3] [--per-tx 0]

For each run: with Lapidus stopped, insert ROWS rows (one transaction, or PER_TX rows per
transaction) into a 4-column table; then time
  * baseline: ``pg_recvlogical --start --endpos=<LSN> -f FILE`` (wal2json, same options) until it exits;
  * Lapidus:  ``lapidus -c CONFIG --stdout`` until ROWS lines arrived on its standard output.
Both read the same backlog through their own slot.  Prints rows/s of each, the ratio (Lapidus /
pg_recvlogical, medians over the runs), and the RSS of the supervisor and of the idle worker.
Talks only to the local PostgreSQL (127.0.0.1:5432, user postgres; another port with
BENCH_PG_PORT=N).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import psycopg2

from lapidus.workers.postgresql.recvlogical import find_pg_recvlogical
from lapidus.workers.postgresql.wal2json import Wal2JsonDecoder

DB = "lapidus_bench"
PG = dict(host="127.0.0.1", port=int(os.environ.get("BENCH_PG_PORT", "5432")), user="postgres")


def connect(dbname="postgres"):
    conn = psycopg2.connect(dbname=dbname, **PG)
    conn.autocommit = True
    return conn


def sql(conn, statement, args=None):
    with conn.cursor() as cur:
        cur.execute(statement, args)
        return cur.fetchall() if cur.description else None


def reset_database():
    admin = connect()
    for (slot,) in sql(admin, "SELECT slot_name FROM pg_replication_slots WHERE database = %s",
                       (DB,)):
        sql(admin, "SELECT pg_drop_replication_slot(%s)", (slot,))
    sql(admin, f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
    sql(admin, f"CREATE DATABASE {DB}")
    admin.close()
    conn = connect(DB)
    sql(conn, "CREATE TABLE items (id int PRIMARY KEY, name text, price numeric(10,2), "
              "updated_at timestamptz)")
    return conn


def make_backlog(conn, rows: int, per_tx: int) -> str:
    step = per_tx or rows
    for start in range(1, rows + 1, step):
        sql(conn, "INSERT INTO items SELECT g, 'item ' || g, g / 100.0, now() "
                  "FROM generate_series(%s, %s) g", (start, min(rows, start + step - 1)))
    return sql(conn, "SELECT pg_current_wal_lsn()::text")[0][0]


def drain_pg_recvlogical(workdir: Path, end_lsn: str) -> float:
    out = workdir / "baseline.out"
    plugin_options = Wal2JsonDecoder(None, None).plugin_options()
    argv = [find_pg_recvlogical(), "--start", "--no-loop", "-d",
            f"host=127.0.0.1 port={PG['port']} user=postgres dbname={DB}", "--slot",
            "pg_drain_baseline",
            "-f", str(out), f"--endpos={end_lsn}", "--fsync-interval=1"]
    for opt in plugin_options:
        argv += ["-o", opt]
    started = time.perf_counter()
    subprocess.run(argv, check=True)
    elapsed = time.perf_counter() - started
    out.unlink()
    return elapsed


def drain_lapidus(workdir: Path, rows: int):
    config = {
        "state_dir": str(workdir / "state"), "log": {"format": "json", "level": "warning"},
        "backends": [{"name": "bench", "type": "postgresql", "host": "127.0.0.1",
                      "port": PG["port"], "user": "postgres", "database": DB,
                      "slot": "pg_drain_lapidus"}],
    }
    path = workdir / "lapidus.json"
    path.write_text(json.dumps(config))
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "lapidus", "-c", str(path), "--stdout"],
                            stdout=subprocess.PIPE, stderr=open(workdir / "lapidus.log", "ab"),
                            start_new_session=True)
    seen = 0
    fd = proc.stdout.fileno()
    while seen < rows:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            raise RuntimeError(f"lapidus exited early; see {workdir / 'lapidus.log'}")
        seen += chunk.count(b"\n")
    elapsed = time.perf_counter() - started
    sup = psutil.Process(proc.pid)
    cpu = {"supervisor": sum(sup.cpu_times()[:2])}
    for child in sup.children(recursive=True):
        cpu[child.name()] = sum(child.cpu_times()[:2])
    print("  CPU seconds during the drain: " + ", ".join(
        f"{name} {value:.2f}" for name, value in sorted(cpu.items())))
    time.sleep(2.0)  # idle now: measure resident memory
    rss = {"supervisor": sup.memory_info().rss}
    for child in sup.children(recursive=True):      # workers are the fork server's children
        rss[child.name()] = child.memory_info().rss
    proc.send_signal(signal.SIGTERM)
    proc.wait(15)
    return elapsed, rss


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--per-tx", type=int, default=0, help="rows per transaction (0: one)")
    args = parser.parse_args()
    base_rates, lap_rates, rss = [], [], {}
    for run in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="lapidus-bench-") as tmp:
            workdir = Path(tmp)
            conn = reset_database()
            sql(conn, "SELECT pg_create_logical_replication_slot('pg_drain_baseline', 'wal2json')")
            sql(conn, "SELECT pg_create_logical_replication_slot('pg_drain_lapidus', 'wal2json')")
            end_lsn = make_backlog(conn, args.rows, args.per_tx)
            base = drain_pg_recvlogical(workdir, end_lsn)
            lap, rss = drain_lapidus(workdir, args.rows)
            base_rates.append(args.rows / base)
            lap_rates.append(args.rows / lap)
            print(f"run {run + 1}: pg_recvlogical {args.rows / base:,.0f} rows/s, "
                  f"lapidus {args.rows / lap:,.0f} rows/s, ratio {base / lap:.2f}")
            conn.close()
    reset_database().close()
    b, lp = statistics.median(base_rates), statistics.median(lap_rates)
    print(f"median over {args.runs} runs of {args.rows:,} rows "
          f"({'one transaction' if not args.per_tx else f'{args.per_tx} rows per transaction'}):")
    print(f"  pg_recvlogical -> file : {b:,.0f} rows/s")
    print(f"  lapidus --stdout       : {lp:,.0f} rows/s")
    print(f"  ratio lapidus / pg_recvlogical: {lp / b:.2f}")
    print("  RSS after the drain (idle): " + ", ".join(
        f"{name} {value / 2**20:.1f} MiB" for name, value in sorted(rss.items())))
    admin = connect()
    sql(admin, f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")


if __name__ == "__main__":
    main()
