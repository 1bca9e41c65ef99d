"""Apply a PostgreSQL backlog to another PostgreSQL with the sync sink, beside COPY FROM of the
same rows and beside a plain executemany upsert loop.  One run.

    .venv/bin/python bench/sync.py [--rows 200000] [--per-tx 1000] [--target mysql]

With Lapidus stopped (its slot made by a first start), ROWS rows are inserted into a 5-column
table (int key, text, numeric, timestamptz, jsonb), PER_TX rows per source transaction.  Then,
each into an empty target table in another database of the same server:

* sync:       ``lapidus -c CONFIG`` with the sync sink, from its start until the target has
              ROWS rows (so Lapidus's start, about a second, is in it);
* COPY:       ``COPY t FROM STDIN`` of the rows as the source's ``COPY t TO STDOUT`` gave them;
* executemany: psycopg2 ``executemany`` of ``INSERT ... ON CONFLICT (id) DO UPDATE``, one
              commit per PER_TX rows (what a hand-written consumer does).

Prints rows/s of each.  Talks only to the local PostgreSQL (127.0.0.1:5432, user postgres).

``--target mysql``: the target is a database of the local MariaDB (127.0.0.1:3306, root)
instead, the table with the matching types (INT, LONGTEXT, DECIMAL(14,2), DATETIME(6), JSON);
COPY becomes ``LOAD DATA LOCAL INFILE`` of the same rows, the loop pymysql's ``executemany``
of ``INSERT ... ON DUPLICATE KEY UPDATE`` (which it sends as multi-row INSERTs).
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg2

PG = dict(host="127.0.0.1", port=5432, user="postgres")
MY = dict(host="127.0.0.1", port=3306, user="root", password="")
MY_TABLE = ("CREATE TABLE t (id INT PRIMARY KEY, v LONGTEXT, n DECIMAL(14,2), ts DATETIME(6), "
            "doc JSON)")
MY_UPSERT = ("INSERT INTO t VALUES (%s, %s, %s, %s, %s) ON DUPLICATE KEY UPDATE "
             "v = VALUES(v), n = VALUES(n), ts = VALUES(ts), doc = VALUES(doc)")
SRC, DST = "lapidus_bench_sync_src", "lapidus_bench_sync_dst"
TABLE = ("CREATE TABLE t (id int PRIMARY KEY, v text, n numeric(14,2), ts timestamptz, "
         "doc jsonb)")
UPSERT = ("INSERT INTO t VALUES (%s, %s, %s, %s, %s) ON CONFLICT (id) DO UPDATE SET "
          "v = EXCLUDED.v, n = EXCLUDED.n, ts = EXCLUDED.ts, doc = EXCLUDED.doc")


def connect(dbname="postgres"):
    conn = psycopg2.connect(dbname=dbname, **PG)
    conn.autocommit = True
    return conn


def reset():
    admin = connect()
    with admin.cursor() as cur:
        cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                    "WHERE database = %s", (SRC,))
        for name in (SRC, DST):
            cur.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            cur.execute(f"CREATE DATABASE {name}")
    admin.close()
    for name in (SRC, DST):
        with connect(name) as conn, conn.cursor() as cur:
            cur.execute(TABLE)
            cur.execute("CREATE TABLE flush (id int PRIMARY KEY)")


def my_connect(**extra):
    import pymysql
    return pymysql.connect(autocommit=True, charset="utf8mb4", **MY, **extra)


def my_reset():
    with my_connect() as conn, conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {DST}")
        cur.execute(f"CREATE DATABASE {DST}")
        cur.execute(f"USE {DST}")
        cur.execute(MY_TABLE)


def target_count(mysql: bool) -> int:
    if mysql:
        with my_connect(database=DST) as conn, conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM t")
            return cur.fetchone()[0]
    with connect(DST) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM t")
        return cur.fetchone()[0]


def truncate_target(mysql: bool):
    if mysql:
        with my_connect(database=DST) as conn, conn.cursor() as cur:
            cur.execute("TRUNCATE t")
        return
    with connect(DST) as conn, conn.cursor() as cur:
        cur.execute("TRUNCATE t")


def my_baselines(tuples, rows: int, per_tx: int, workdir: Path):
    """Seconds of LOAD DATA LOCAL INFILE and of the executemany loop into the MariaDB table."""
    utc = [(i, v, n, ts.astimezone(dt.timezone.utc).replace(tzinfo=None), doc)
           for i, v, n, ts, doc in tuples]
    tsv = workdir / "rows.tsv"
    tsv.write_text("".join(f"{i}\t{v}\t{n}\t{ts.isoformat(' ')}\t{doc}\n"
                           for i, v, n, ts, doc in utc))
    truncate_target(True)
    conn = my_connect(database=DST, local_infile=True)
    conn.autocommit(False)
    with conn.cursor() as cur:
        began = time.monotonic()
        cur.execute(f"LOAD DATA LOCAL INFILE '{tsv}' INTO TABLE t")
        conn.commit()
        copy_seconds = time.monotonic() - began
    truncate_target(True)
    with conn.cursor() as cur:
        began = time.monotonic()
        for start in range(0, rows, per_tx):
            cur.executemany(MY_UPSERT, utc[start:start + per_tx])
            conn.commit()
        loop_seconds = time.monotonic() - began
    conn.close()
    return copy_seconds, loop_seconds


def lapidus(workdir: Path, mysql: bool = False):
    config = {"state_dir": str(workdir / "state"), "log": {"format": "json", "level": "info"},
              "backends": [{"name": "bench", "type": "postgresql", "host": "127.0.0.1",
                            "port": 5432, "user": "postgres", "database": SRC,
                            "decoder": "pgoutput", "slot": "bench_sync"}],
              "plugins": {"sync": {"dsn": f"host=127.0.0.1 user=postgres dbname={DST}"}}}
    if mysql:
        config["plugins"] = {"sync": {"dsn": f"mysql://root@127.0.0.1:3306/{DST}",
                                      "schema": DST}}
    path = workdir / "lapidus.json"
    path.write_text(json.dumps(config))
    return subprocess.Popen([sys.executable, "-m", "lapidus", "-c", str(path)],
                            stdout=subprocess.DEVNULL, stderr=open(workdir / "lapidus.log", "ab"),
                            start_new_session=True)


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--per-tx", type=int, default=1000)
    parser.add_argument("--target", choices=("postgresql", "mysql"), default="postgresql")
    args = parser.parse_args()
    rows, per_tx, mysql = args.rows, args.per_tx, args.target == "mysql"
    reset()
    if mysql:
        my_reset()
    workdir = Path(tempfile.mkdtemp(prefix="bench-sync-"))
    proc = lapidus(workdir)            # the first start makes the slot
    deadline = time.monotonic() + 30
    with connect(SRC) as conn, conn.cursor() as cur:
        while True:
            cur.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'bench_sync'")
            if cur.fetchone()[0]:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"no slot after 30 s; see {workdir / 'lapidus.log'}")
            time.sleep(0.1)
    time.sleep(1.0)                    # let it reach "streaming" before it is stopped
    stop(proc)

    src = connect(SRC)
    src.autocommit = False
    with src.cursor() as cur:
        for start in range(1, rows + 1, per_tx):
            cur.execute("INSERT INTO t SELECT g, 'row ' || g, g * 1.25, "
                        "'2026-11-30 11:33:35.295384+00'::timestamptz + g * interval '1 s', "
                        "jsonb_build_object('g', g, 'tags', jsonb_build_array('a', 'b')) "
                        "FROM generate_series(%s, %s) g", (start, min(rows, start + per_tx - 1)))
            src.commit()
        cur.execute("INSERT INTO flush VALUES (1)")   # shows the last transaction complete
        src.commit()
        buffer = io.StringIO()
        cur.copy_expert("COPY t TO STDOUT", buffer)
        cur.execute("SELECT id, v, n, ts, doc::text FROM t ORDER BY id")
        tuples = cur.fetchall()
    src.close()

    began = time.monotonic()
    proc = lapidus(workdir, mysql)
    while target_count(mysql) < rows:
        if proc.poll() is not None:
            raise SystemExit(f"lapidus exited; see {workdir / 'lapidus.log'}")
        time.sleep(0.05)
    sync_seconds = time.monotonic() - began
    stop(proc)

    if mysql:
        copy_seconds, loop_seconds = my_baselines(tuples, rows, per_tx, workdir)
    else:
        copy_seconds, loop_seconds = pg_baselines(tuples, buffer, rows, per_tx)

    print(f"rows {rows}, {per_tx} per source transaction, into {args.target}")
    for name, seconds in (("sync sink", sync_seconds),
                          ("LOAD DATA" if mysql else "COPY FROM", copy_seconds),
                          ("executemany upsert loop", loop_seconds)):
        print(f"  {name:<24} {seconds:7.2f} s  {rows / seconds:10.0f} rows/s")
    admin = connect()
    with admin.cursor() as cur:
        cur.execute("SELECT pg_drop_replication_slot('bench_sync')")
        for name in (SRC, DST):
            cur.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    if mysql:
        with my_connect() as conn, conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {DST}")


def pg_baselines(tuples, buffer, rows: int, per_tx: int):
    """Seconds of COPY FROM and of the executemany loop into the PostgreSQL table."""
    truncate_target(False)
    dst = connect(DST)
    dst.autocommit = False
    with dst.cursor() as cur:
        buffer.seek(0)
        began = time.monotonic()
        cur.copy_expert("COPY t FROM STDIN", buffer)
        dst.commit()
        copy_seconds = time.monotonic() - began
    truncate_target(False)
    with dst.cursor() as cur:
        began = time.monotonic()
        for start in range(0, rows, per_tx):
            cur.executemany(UPSERT, tuples[start:start + per_tx])
            dst.commit()
        loop_seconds = time.monotonic() - began
    dst.close()
    return copy_seconds, loop_seconds


if __name__ == "__main__":
    main()
