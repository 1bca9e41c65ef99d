"""Lapidus beside sysbench's OLTP workload: Lapidus's CPU as a share of the database server's.

    .venv/bin/python bench/sysbench_oltp.py [--dbs mariadb,pg] [--sinks stdout,jetstream]
                                            [--tables 4] [--table-size 20000] [--threads 4]
                                            [--time 40] [--baseline DIR]
                                            [--out /tmp/lapidus-sysbench.json]

For every database and sink: sysbench's ``oltp_read_write`` (Debian's sysbench, installed with
apt-get where missing) prepares ``--tables`` tables of ``--table-size`` rows in the database
``lapidus_bench_sysbench``; Lapidus starts with one backend on that database,
``snapshot = "initial"``, streaming to stdout (read by this script) or to a JetStream stream;
sysbench runs ``--threads`` threads for ``--time`` seconds while the snapshot is taken and the
changes stream. Over the window of the sysbench run:

* CPU seconds of all Lapidus processes (``pg_recvlogical`` included) and of the database server
  (PostgreSQL: every server process, the walsender and sysbench's backends included, reaped ones
  too; MariaDB: ``mariadbd``), and their ratio: **Lapidus CPU / database CPU**;
* the transactions sysbench made (its own count), and Lapidus's CPU per transaction.

Then a sentinel row is written; once its event arrived, the stream is folded (read, insert and
update set a row, delete removes it, by table and key) and compared with ``SELECT *`` of every
table: rows missing, extra or different must be 0. Talks to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Dict, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import orjson  # noqa: E402

import latency as lat  # noqa: E402
from mysql_drain import connect as mysql_connect, query  # noqa: E402
from pg_drain import connect as pg_connect, sql  # noqa: E402
from txcost import lapidus_cpu, server_cpu, start_lapidus  # noqa: E402

DB = "lapidus_bench_sysbench"
SLOT = "sysbench_lapidus"
SENTINEL_TABLE = "lapidus_sentinel"
TRANSACTIONS = re.compile(r"transactions:\s+(\d+)")


def ensure_sysbench() -> str:
    """The sysbench binary; installed from Debian's packages where missing."""
    found = shutil.which("sysbench")
    if found:
        return found
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    if subprocess.run(["apt-get", "install", "-y", "-qq", "sysbench"], env=env).returncode:
        subprocess.run(["apt-get", "update", "-qq"], env=env, check=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", "sysbench"], env=env, check=True)
    return shutil.which("sysbench") or "sysbench"


def sysbench_args(db: str, args) -> List[str]:
    common = [f"--tables={args.tables}", f"--table-size={args.table_size}",
              f"--threads={args.threads}"]
    if db == "pg":
        return ["--db-driver=pgsql", "--pgsql-host=127.0.0.1", f"--pgsql-port={lat.PG_PORT}",
                "--pgsql-user=postgres", f"--pgsql-db={DB}"] + common
    return ["--db-driver=mysql", "--mysql-host=127.0.0.1", f"--mysql-port={lat.MYSQL_PORT}",
            "--mysql-user=root", f"--mysql-db={DB}", "--mysql-ssl=off"] + common


def reset(db: str) -> None:
    if db == "pg":
        admin = pg_connect()
        for (slot,) in sql(admin, "SELECT slot_name FROM pg_replication_slots "
                                  "WHERE database = %s", (DB,)):
            lat.drop_pg_slot(slot)
        sql(admin, f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        sql(admin, f"CREATE DATABASE {DB}")
        admin.close()
        conn = pg_connect(DB)
        sql(conn, f"CREATE TABLE {SENTINEL_TABLE} (id int PRIMARY KEY, v int)")
        conn.close()
    else:
        conn = mysql_connect()
        query(conn, f"DROP DATABASE IF EXISTS {DB}")
        query(conn, f"CREATE DATABASE {DB}")
        query(conn, f"CREATE TABLE {DB}.{SENTINEL_TABLE} (id INT PRIMARY KEY, v INT)")
        conn.close()


def drop(db: str) -> None:
    if db == "pg":
        lat.drop_pg_slot(SLOT)
        admin = pg_connect()
        sql(admin, f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        admin.close()
    else:
        conn = mysql_connect()
        query(conn, f"DROP DATABASE IF EXISTS {DB}")
        conn.close()


def write_sentinel(db: str) -> None:
    if db == "pg":
        conn = pg_connect(DB)
        sql(conn, f"INSERT INTO {SENTINEL_TABLE} VALUES (1, 1)")
    else:
        conn = mysql_connect()
        query(conn, f"INSERT INTO {DB}.{SENTINEL_TABLE} VALUES (1, 1)")
    conn.close()


def table_rows(db: str, tables: int) -> Dict[Tuple[str, tuple], dict]:
    """Every row of the sysbench tables, by (table, key), values as the fold keeps them."""
    out = {}
    if db == "pg":
        import psycopg2.extras
        conn = pg_connect(DB)
        for n in range(1, tables + 1):
            with conn.cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cur:
                cur.execute(f"SELECT * FROM sbtest{n}")
                for row in cur.fetchall():
                    out[(f"sbtest{n}", (str(row["id"]),))] = normalized(dict(row))
    else:
        import pymysql.cursors
        conn = mysql_connect()
        for n in range(1, tables + 1):
            with conn.cursor(pymysql.cursors.DictCursor) as cur:
                cur.execute(f"SELECT * FROM {DB}.sbtest{n}")
                for row in cur.fetchall():
                    out[(f"sbtest{n}", (str(row["id"]),))] = normalized(row)
    conn.close()
    return out


def normalized(row: dict) -> dict:
    """Values compared as text, CHAR padding aside (PostgreSQL keeps it, MariaDB strips it)."""
    return {k: (str(v).rstrip(" ") if v is not None else None) for k, v in row.items()}


class Fold:
    """The stream folded into rows by (table, key); the sentinel's arrival is an event."""

    def __init__(self):
        self.rows: Dict[Tuple[str, tuple], dict] = {}
        self.events = 0
        self.sentinel = threading.Event()

    def add(self, event: dict) -> None:
        table = event.get("table")
        if table == SENTINEL_TABLE:
            self.sentinel.set()
            return
        if not table or not event.get("pk"):
            return
        self.events += 1
        key = (table, tuple(str(v) for v in event["pk"].values()))
        if event["type"] == "delete":
            self.rows.pop(key, None)
        elif event["type"] in ("insert", "update", "read"):
            self.rows[key] = normalized(event["item"])

    def compare(self, expected: Dict[Tuple[str, tuple], dict]) -> dict:
        missing = [k for k in expected if k not in self.rows]
        extra = [k for k in self.rows if k not in expected]
        different = [k for k, v in expected.items() if k in self.rows and self.rows[k] != v]
        return {"rows": len(expected), "missing": len(missing), "extra": len(extra),
                "different": len(different), "examples": [str(k) for k in
                                                          (missing + extra + different)[:3]]}


def read_stdout(proc: subprocess.Popen, fold: Fold) -> None:
    for line in proc.stdout:
        try:
            fold.add(orjson.loads(line))
        except orjson.JSONDecodeError:
            continue


def fold_stream(stream: str, fold: Fold) -> None:
    """Every message of the JetStream stream, in order, into ``fold``."""
    async def run():
        import nats
        nc = await nats.connect(lat.NATS_URL)
        js = nc.jetstream()
        last = (await js.stream_info(stream)).state.last_seq
        sub = await js.subscribe(f"{lat.PREFIX}.>", stream=stream, ordered_consumer=True)
        seen = 0
        while seen < last:
            msg = await sub.next_msg(timeout=30)
            seen = msg.metadata.sequence.stream
            fold.add(orjson.loads(msg.data))
        await nc.close()
    asyncio.run(run())


def config(workdir: Path, db: str, sink: str, stream: Optional[str]) -> Path:
    if db == "pg":
        backend = {"name": "sb", "type": "postgresql", "host": "127.0.0.1", "port": lat.PG_PORT,
                   "user": "postgres", "database": DB, "slot": SLOT}
    else:
        backend = {"name": "sb", "type": "mysql", "host": "127.0.0.1", "port": lat.MYSQL_PORT,
                   "user": "root", "password": "", "database": DB, "server_id": 4_300_021}
    backend["snapshot"] = "initial"
    plugins = {}
    if sink == "jetstream":
        plugins["nats"] = {"server": lat.NATS_URL, "subject_prefix": lat.PREFIX,
                           "jetstream": True, "stream": stream,
                           "subjects": [f"{lat.PREFIX}.>"]}
    conf = {"state_dir": str(workdir / "state"), "log": {"format": "json", "level": "warning"},
            "backends": [backend], "plugins": plugins}
    path = workdir / "lapidus.json"
    path.write_text(json.dumps(conf))
    return path


def sentinel_seen(db: str, sink: str, fold: Fold, stream: Optional[str],
                  give_up: float = 300) -> bool:
    write_sentinel(db)
    if sink == "stdout":
        return fold.sentinel.wait(give_up)
    deadline = time.monotonic() + give_up
    while time.monotonic() < deadline:
        probe = Fold()
        try:
            fold_stream(stream, probe)
        except Exception:
            pass
        if probe.sentinel.is_set():
            fold.__dict__.update(probe.__dict__)
            return True
        time.sleep(1)
    return False


def run_one(sysbench: str, db: str, sink: str, args, tmp: Path,
            code: Optional[str] = None) -> dict:
    reset(db)
    base = [sysbench, "oltp_read_write"] + sysbench_args(db, args)
    subprocess.run(base + ["prepare"], check=True, stdout=subprocess.DEVNULL)
    stream = f"LATBENCH_{uuid.uuid4().hex[:8].upper()}" if sink == "jetstream" else None
    if stream:
        lat.create_stream(stream)
    proc = start_lapidus(config(tmp, db, sink, stream), tmp / "lapidus.log",
                         to_stdout=sink == "stdout", code=code)
    fold = Fold()
    try:
        if sink == "stdout":
            threading.Thread(target=read_stdout, args=(proc, fold), daemon=True).start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "worker sb" not in lat.lapidus_processes(proc):
            time.sleep(0.1)
        cpu0, server0, t0 = lapidus_cpu(proc), server_cpu(db), time.monotonic()
        run = subprocess.run(base + [f"--time={args.time}", "--report-interval=0", "run"],
                             check=True, capture_output=True, text=True)
        cpu1, t1 = lapidus_cpu(proc), time.monotonic()
        # sysbench's PostgreSQL backends count once the postmaster reaped them
        time.sleep(1.0)
        server1 = server_cpu(db)
        seen = sentinel_seen(db, sink, fold, stream)
    finally:
        lat.stop_lapidus(proc)
        if stream:
            lat.delete_stream(stream)
    check = fold.compare(table_rows(db, args.tables)) if seen else {"sentinel": "never seen"}
    drop(db)
    transactions = int(TRANSACTIONS.search(run.stdout).group(1))
    lapidus = sum(cpu1.get(k, 0.0) - cpu0.get(k, 0.0) for k in cpu1)
    server = server1 - server0
    return {"db": db, "sink": sink, "code": code or "this checkout", "window_s": t1 - t0,
            "transactions": transactions,
            "tps": transactions / (t1 - t0),
            "lapidus_cpu_s": {k: cpu1.get(k, 0.0) - cpu0.get(k, 0.0) for k in cpu1},
            "lapidus_cpu_total_s": lapidus, "server_cpu_s": server,
            "ratio": lapidus / server if server else None,
            "lapidus_us_per_tx": lapidus / transactions * 1e6, "fold": check}


def report(r: dict) -> None:
    fold = r["fold"]
    print(f"[{r['code']}] {r['db']:7} {r['sink']:9} {r['tps']:.0f} tps: Lapidus "
          f"{r['lapidus_cpu_total_s']:.2f} CPU-s, server {r['server_cpu_s']:.2f} CPU-s, "
          f"ratio {r['ratio']:.3f}; "
          f"{r['lapidus_us_per_tx']:.0f} µs/tx; fold {fold}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dbs", default="mariadb,pg")
    parser.add_argument("--sinks", default="stdout,jetstream")
    parser.add_argument("--tables", type=int, default=4)
    parser.add_argument("--table-size", type=int, default=20000)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--time", type=int, default=40)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--baseline", default="",
                        help="another checkout (see bench/txcost.py) run before each run of "
                             "this one under the same load")
    parser.add_argument("--out", default="/tmp/lapidus-sysbench.json")
    args = parser.parse_args()
    sysbench = ensure_sysbench()
    results = []
    for _ in range(args.runs):
        for db in args.dbs.split(","):
            for sink in args.sinks.split(","):
                for code in ([args.baseline] if args.baseline else []) + [None]:
                    with tempfile.TemporaryDirectory(prefix="lapidus-sysbench-") as tmp:
                        r = run_one(sysbench, db, sink, args, Path(tmp), code)
                    report(r)
                    results.append(r)
    Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
