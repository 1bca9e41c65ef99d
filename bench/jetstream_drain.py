"""Backlog drains into JetStream against the bare readers, same backlog, same run.

    .venv/bin/python bench/jetstream_drain.py [--backends pg,mysql] [--pg-rows 200000]
                                              [--mysql-rows 100000] [--per-tx 1000] [--runs 3]

The project's throughput targets: PostgreSQL to JetStream at 0.8x of the pg_recvlogical drain
or better; MariaDB to JetStream at 0.9x of the bare library loop or better. Per run:

* PostgreSQL (set-up of bench/pg_decoders.py: the 4-column table, a publication, slots made
  before the backlog; ROWS rows in one transaction, or PER_TX rows per transaction with
  ``--pg-per-tx``):
  - baseline: ``pg_recvlogical --start --endpos=<LSN> -f FILE`` with pgoutput (Lapidus's
    default decoder) until it exits;
  - lapidus: ``lapidus -c CONFIG`` (decoder pgoutput, nats plugin with ``jetstream = true``)
    from its start until a subscriber (bench/nats_throughput.py's) saw ROWS messages on the
    stream's subjects and the stream holds them.
* MariaDB (set-up of bench/mysql_drain.py: Lapidus positioned at the binlog's end, a new binlog
  file, then ROWS rows in transactions of PER_TX):
  - baseline: the bare ``BinLogStreamReader`` loop of bench/mysql_drain.py;
  - lapidus: as above, with the mysql backend.

Prints rows/s of each, the ratio lapidus / baseline per run and the medians. Creates and drops
the benchmarks' databases, slots, publication and the JetStream streams ``JSDRAIN_*``.
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
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import psutil  # noqa: E402

import latency as L  # noqa: E402
import mysql_drain as M  # noqa: E402
import pg_drain as P  # noqa: E402
from nats_throughput import Subscriber, delete_stream, stream_messages  # noqa: E402
from pg_decoders import PUBLICATION, drain_pg_recvlogical  # noqa: E402

SUBJECT_PREFIX = "jsdrain"


def create_stream(name: str) -> None:
    from nats.js.api import StreamConfig

    async def run(nc, js):
        await js.add_stream(StreamConfig(name=name, subjects=[f"{SUBJECT_PREFIX}.>"],
                                         duplicate_window=120))
    L.asyncio.run(L._nats(run))


def lapidus_to_jetstream(workdir: Path, backend: dict, rows: int) -> dict:
    stream = f"JSDRAIN_{uuid.uuid4().hex[:8].upper()}"
    create_stream(stream)
    config = {"state_dir": str(workdir / "state"), "log": {"format": "json", "level": "warning"},
              "backends": [backend],
              "plugins": {"nats": {"server": L.NATS_URL, "subject_prefix": SUBJECT_PREFIX,
                                   "jetstream": True, "stream": stream}}}
    path = workdir / "lapidus-js.json"
    path.write_text(json.dumps(config))
    subscriber = Subscriber(f"{SUBJECT_PREFIX}.>", rows)
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "lapidus", "-c", str(path)],
                            stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                            stderr=open(workdir / "lapidus.log", "ab"), start_new_session=True)
    try:
        last, first = subscriber.wait()
        sup = psutil.Process(proc.pid)
        cpu = {"supervisor": sum(sup.cpu_times()[:2])}
        for child in sup.children(recursive=True):
            cpu[child.name()] = sum(child.cpu_times()[:2])
        stored = L.asyncio.run(stream_messages(stream, rows))
        if stored < rows:
            raise RuntimeError(f"stream holds {stored} messages, expected {rows}")
    finally:
        subscriber.stop()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        L.keep_log(workdir, "jetstream-drain")
        L.asyncio.run(delete_stream(stream))
    return {"seconds": last - started, "first_to_last": last - first, "cpu": cpu}


def pg_run(rows: int, per_tx: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="lapidus-jsdrain-") as tmp:
        workdir = Path(tmp)
        conn = P.reset_database()
        try:
            P.sql(conn, f"CREATE PUBLICATION {PUBLICATION} FOR ALL TABLES")
            P.sql(conn, "SELECT pg_create_logical_replication_slot('bench_base_pgoutput', "
                        "'pgoutput')")
            P.sql(conn, "SELECT pg_create_logical_replication_slot('bench_lap_js', 'pgoutput')")
            end_lsn = P.make_backlog(conn, rows, per_tx)
            base = drain_pg_recvlogical(workdir, "pgoutput", end_lsn)["seconds"]
            lap = lapidus_to_jetstream(workdir, {
                "name": "bench", "type": "postgresql", "host": "127.0.0.1",
                "port": P.PG["port"], "user": "postgres",
                "database": P.DB, "slot": "bench_lap_js", "decoder": "pgoutput",
                "publication": PUBLICATION, "publication_mode": "existing"}, rows)
        finally:
            conn.close()
            P.reset_database().close()
    return {"baseline": rows / base, "lapidus": rows / lap["seconds"],
            "lapidus_first_to_last": rows / lap["first_to_last"], "cpu": lap["cpu"]}


def mysql_run(conn, rows: int, per_tx: int) -> dict:
    M.reset_database(conn)
    with tempfile.TemporaryDirectory(prefix="lapidus-jsdrain-") as tmp:
        workdir = Path(tmp)
        positioned = M.position_lapidus(workdir)
        # as bench/mysql_drain.py: the backlog in a binlog file of its own, so neither reader
        # starts by scanning an earlier (possibly huge) file for the GTID
        M.query(conn, "FLUSH BINARY LOGS")
        start_gtid = str(M.query(conn, "SELECT @@GLOBAL.gtid_binlog_pos")[0][0])
        M.write_backlog(conn, rows, per_tx)
        base = M.drain_bare(start_gtid, rows)
        state = workdir / "state"
        (state / M.BACKEND).mkdir(parents=True, mode=0o700)
        (state / M.BACKEND / "checkpoint.json").write_bytes(
            (positioned / M.BACKEND / "checkpoint.json").read_bytes())
        backend = M.lapidus_config(state)["backends"][0]
        lap = lapidus_to_jetstream(workdir, backend, rows)
    return {"baseline": rows / base, "lapidus": rows / lap["seconds"],
            "lapidus_first_to_last": rows / lap["first_to_last"], "cpu": lap["cpu"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="pg,mysql")
    parser.add_argument("--pg-rows", type=int, default=200_000)
    parser.add_argument("--pg-per-tx", type=int, default=0, help="0: one transaction")
    parser.add_argument("--mysql-rows", type=int, default=100_000)
    parser.add_argument("--per-tx", type=int, default=1000, help="MariaDB rows per transaction")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-wait", action="store_true")
    parser.add_argument("--out", default="/tmp/lapidus-jetstream-drain.json")
    args = parser.parse_args()
    backends = args.backends.split(",")
    results = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
               "argv": sys.argv[1:], "runs": {b: [] for b in backends}}
    mconn = M.connect() if "mysql" in backends else None
    try:
        for run in range(args.runs):
            for backend in backends:
                first = run == 0 and backend == backends[0]
                quiet = None if args.no_wait else L.wait_quiet(
                    30.0, max_load=1.0 if first else None)
                if backend == "pg":
                    r = pg_run(args.pg_rows, args.pg_per_tx)
                else:
                    r = mysql_run(mconn, args.mysql_rows, args.per_tx)
                r["quiet"] = quiet
                results["runs"][backend].append(r)
                print(f"run {run + 1} {backend}: lapidus -> JetStream {r['lapidus']:,.0f} rows/s "
                      f"({r['lapidus_first_to_last']:,.0f} first to last message), baseline "
                      f"{r['baseline']:,.0f} rows/s, ratio {r['lapidus'] / r['baseline']:.2f}; "
                      f"CPU s: " + ", ".join(f"{n} {v:.2f}" for n, v in sorted(r["cpu"].items())),
                      flush=True)
                Path(args.out).write_text(json.dumps(results, indent=1))
    finally:
        if mconn is not None:
            M.query(mconn, f"DROP DATABASE IF EXISTS {M.DB}")
            mconn.close()
        if "pg" in backends:
            admin = P.connect()
            for (slot,) in P.sql(admin, "SELECT slot_name FROM pg_replication_slots "
                                        "WHERE database = %s", (P.DB,)):
                P.sql(admin, "SELECT pg_drop_replication_slot(%s)", (slot,))
            P.sql(admin, f"DROP DATABASE IF EXISTS {P.DB} WITH (FORCE)")
    names = {"pg": "PostgreSQL (baseline pg_recvlogical pgoutput -> file)",
             "mysql": "MariaDB (baseline bare BinLogStreamReader loop)"}
    print(f"\nmedians over {args.runs} runs:")
    for backend, runs in results["runs"].items():
        if not runs:
            continue
        lap = statistics.median(r["lapidus"] for r in runs)
        base = statistics.median(r["baseline"] for r in runs)
        ratios = [r["lapidus"] / r["baseline"] for r in runs]
        print(f"  {names[backend]}: lapidus {lap:,.0f} rows/s, baseline {base:,.0f} rows/s, "
              f"median ratio {statistics.median(ratios):.2f} (runs "
              + " ".join(f"{x:.2f}" for x in ratios) + ")")


if __name__ == "__main__":
    main()
