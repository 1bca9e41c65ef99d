"""Throughput and latency of the MySQL/MariaDB source, against a bare library loop.

    .venv/bin/python bench/mysql_source.py [--rows 100000] [--per-statement 1000] [--repeat 3]

Writes a backlog of ``--rows`` rows into a 4-column table (multi-row INSERTs of
``--per-statement`` rows, one transaction each), then reads the same backlog, in the same run:

* bare:   python-mysql-replication's ``BinLogStreamReader`` (blocking, GTID start,
          ``only_events=[WriteRowsEvent]``, ``only_schemas``), touching ``event.rows``: the
          library's own decoding cost, nothing else;
* source: ``MysqlSource.read(1000, 1.0)`` until every row arrived: decoding plus value
          mapping, ids, checkpoints and Event objects;
* source+encode: the same plus ``lapidus.events.to_record`` (the JSON bytes the worker ships).

Then latency: single-row commits from another process while the source waits in ``read``;
reported from just before the client's COMMIT to the event leaving ``read``.

Needs the local MariaDB configured by scripts/setup-local (root, no password). Uses and then
drops the database ``lapidus_bench_mysql``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pymysql  # noqa: E402
import structlog  # noqa: E402
from pymysqlreplication import BinLogStreamReader  # noqa: E402
from pymysqlreplication.row_event import WriteRowsEvent  # noqa: E402

from lapidus.config import BackendConfig  # noqa: E402
from lapidus.events import to_record  # noqa: E402
from lapidus.workers.mysql import MysqlSource  # noqa: E402

DB = "lapidus_bench_mysql"
HOST, PORT, USER = "127.0.0.1", 3306, "root"


def connect() -> pymysql.connections.Connection:
    return pymysql.connect(host=HOST, port=PORT, user=USER, autocommit=True, charset="utf8mb4")


def write_backlog(rows: int, per_statement: int) -> str:
    """Create the table, write the rows; returns the GTID position before them."""
    conn = connect()
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {DB}")
        cur.execute(f"CREATE DATABASE {DB}")
        cur.execute(f"CREATE TABLE {DB}.items (id INT PRIMARY KEY, name VARCHAR(32), "
                    f"qty INT, price DOUBLE)")
        cur.execute("SELECT @@GLOBAL.gtid_binlog_pos")
        start = cur.fetchone()[0]
        for first in range(0, rows, per_statement):
            values = ", ".join(f"({i}, 'item-{i}', {i % 1000}, {i * 0.25})"
                               for i in range(first, min(rows, first + per_statement)))
            cur.execute(f"INSERT INTO {DB}.items VALUES {values}")
    conn.close()
    return start


def bare(start: str, rows: int) -> tuple:
    reader = BinLogStreamReader(
        connection_settings={"host": HOST, "port": PORT, "user": USER, "passwd": ""},
        # blocking=True like the source.  With blocking=False, MariaDB 10.11 reset the
        # connection every ~50 ms while it caught up and the library's reconnect restarted
        # from the first GTID each time: 300,000 rows read held only 4,000 distinct ones.
        server_id=4_200_001, blocking=True, is_mariadb=True, auto_position=start,
        only_events=[WriteRowsEvent], only_schemas=[DB], enable_logging=False)
    seen = 0
    began, cpu = time.perf_counter(), time.process_time()
    for event in reader:
        seen += len(event.rows)
        if seen >= rows:
            break
    elapsed, cpu = time.perf_counter() - began, time.process_time() - cpu
    reader.close()
    assert seen == rows, f"bare loop saw {seen} rows, expected {rows}"
    return elapsed, cpu


def source_loop(start: str, rows: int, encode: bool) -> tuple:
    options = {"host": HOST, "port": PORT, "user": USER, "database": DB,
               "server_id": 4_200_002}
    source = MysqlSource(BackendConfig(name="bench", type="mysql", options=options),
                         Path(tempfile.mkdtemp()), structlog.get_logger())
    checkpoint = {"v": 1, "flavor": "mariadb", "gtid": start, "file": None, "pos": None,
                  "scope": source.scope.fingerprint()}
    source.open(checkpoint)
    seen = 0
    began, cpu = time.perf_counter(), time.process_time()
    while seen < rows:
        batch = source.read(1000, 1.0)
        if encode:
            for event in batch.events:
                to_record(event)
        seen += sum(1 for e in batch.events if e.type == "insert")
    elapsed, cpu = time.perf_counter() - began, time.process_time() - cpu
    source.close()
    assert seen == rows, f"source saw {seen} rows, expected {rows}"
    return elapsed, cpu


def _writer(count: int, ready, out) -> None:
    conn = connect()
    stamps = []
    ready.wait()
    with conn.cursor() as cur:
        for i in range(count):
            time.sleep(0.01)      # let the reader go idle between commits
            before = time.time()
            cur.execute(f"INSERT INTO {DB}.items VALUES ({10_000_000 + i}, 'lat', 0, 0)")
            stamps.append(before)
    out.send(stamps)
    conn.close()


def latency(count: int) -> list:
    options = {"host": HOST, "port": PORT, "user": USER, "database": DB,
               "server_id": 4_200_003}
    source = MysqlSource(BackendConfig(name="bench", type="mysql", options=options),
                         Path(tempfile.mkdtemp()), structlog.get_logger())
    source.open(None)
    ready = multiprocessing.Event()
    receive, send = multiprocessing.Pipe(duplex=False)
    writer = multiprocessing.Process(target=_writer, args=(count, ready, send))
    writer.start()
    arrivals = []
    ready.set()
    give_up = time.monotonic() + 60
    while len(arrivals) < count and time.monotonic() < give_up:
        batch = source.read(100, 1.0)
        now = time.time()
        arrivals += [now] * len(batch.events)
    stamps = receive.recv()
    writer.join()
    source.close()
    return [(a - b) * 1000.0 for a, b in zip(arrivals, stamps)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--per-statement", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--latency-samples", type=int, default=300)
    args = parser.parse_args()

    start = write_backlog(args.rows, args.per_statement)
    print(f"backlog: {args.rows} rows, {args.per_statement} rows per INSERT transaction, "
          f"4 columns; start GTID {start}")
    results = {"bare": [], "source": [], "source+encode": []}
    for _ in range(args.repeat):
        results["bare"].append(bare(start, args.rows))
        results["source"].append(source_loop(start, args.rows, encode=False))
        results["source+encode"].append(source_loop(start, args.rows, encode=True))
    # Wall-clock rates depend on what else runs on the machine (the server shares the CPUs);
    # rows per CPU-second of the reading process compare the decoding work itself.
    for name, runs in results.items():
        rates = sorted(args.rows / wall for wall, _ in runs)
        per_cpu = statistics.median(args.rows / cpu for _, cpu in runs)
        print(f"{name:14s} median {statistics.median(rates):9,.0f} rows/s "
              f"(runs: {', '.join(f'{r:,.0f}' for r in rates)}); "
              f"{per_cpu:,.0f} rows per CPU-second")
    lat = sorted(latency(args.latency_samples))
    if lat:
        pick = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]  # noqa: E731
        print(f"latency commit->read(): n={len(lat)} median {pick(0.5):.2f} ms, "
              f"p90 {pick(0.9):.2f} ms, p99 {pick(0.99):.2f} ms, max {lat[-1]:.2f} ms")
    conn = connect()
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {DB}")
    conn.close()


if __name__ == "__main__":
    main()
