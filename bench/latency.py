"""Commit-to-subscriber latency at fixed open-loop rates: PostgreSQL and MariaDB to NATS.

    .venv/bin/python bench/latency.py [--backends pg,mysql] [--rates 100,1000,5000]
                                      [--duration 30] [--runs 3] [--core-rate 1000]
                                      [--floor-duration 15] [--out /tmp/lapidus-latency.json]

For every backend, rate and run:

* **floor** (same rate, same generator, no Lapidus): the replication stream read bare, each row
  timestamped on arrival. PostgreSQL: ``pg_recvlogical -f -`` (wal2json format 2, its own slot)
  piped into a reader process; MariaDB: python-mysql-replication's ``BinLogStreamReader`` in a
  process of its own. This is the latency a reader of the replication protocol gets at best on
  this machine; Lapidus's figure is compared with it (ratio and difference).
* **lapidus**: ``lapidus -c CONFIG`` with the nats plugin in JetStream mode (publishing into a
  stream this script creates) and a subscriber process that receives every row's event through
  an ephemeral JetStream **push consumer** (deliver policy new, no acks), and in the same
  process through a plain core subscription on the stream's subjects (what a core NATS
  subscriber sees of the same publishes). With ``--core-rate R``, one more configuration per
  backend at rate R runs the nats plugin in core mode (``jetstream = false``).

The generator is open loop: commit ``i`` is scheduled at ``t0 + i / rate`` and ``--threads``
connections (4) take the commits in turn, so one slow commit delays only the commits of its own
connection, never the schedule; every commit records its intended time, the time it started and
the time COMMIT returned. Each commit inserts one row ``(id, name, qty, ts)`` where ``ts`` is
written by the server (PostgreSQL ``clock_timestamp()``, MariaDB ``SYSDATE(6)`` into a
``TIMESTAMP(6)``).

Latency of a row = time its event reached the subscriber's socket minus

* the client's clock right after its COMMIT returned (the primary figure), and, as a cross-check,
* the row's own ``ts`` column (so it also counts the time the commit itself took).

All clocks are the same host's CLOCK_REALTIME. Reported per backend, rate and mode: p50, p99,
p99.9 and max of each run and their medians over the runs, rows missing (must be 0), the rate
the generator achieved and how late it started commits (schedule lag), plus receipts per second
over time. Results go to ``--out`` (JSON) for ``bench/report.py``, which draws the plots.

Before each run the script waits until the machine is quiet (other processes below
``--quiet-busy`` percent of the CPUs for 2 s; the 1-minute load average below 1.0 before the
first run) and records what it saw. Talks only to 127.0.0.1: PostgreSQL 5432 (postgres),
MariaDB 3306 (root), NATS 4222 with JetStream (other ports with BENCH_PG_PORT, BENCH_MYSQL_PORT,
BENCH_NATS_PORT). Creates and drops the databases
``lapidus_bench_latency`` (both servers), its slots and the JetStream streams ``LATBENCH_*``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import itertools
import json
import math
import os
import pickle
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Dict, List, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import psutil  # noqa: E402

from nats_wire import CONNECT, answer_control, read_items  # noqa: E402
from pg_drain import connect as pg_connect, sql  # noqa: E402
from mysql_drain import connect as mysql_connect, query  # noqa: E402

DB = "lapidus_bench_latency"
PG_PORT = int(os.environ.get("BENCH_PG_PORT", "5432"))
MYSQL_PORT = int(os.environ.get("BENCH_MYSQL_PORT", "3306"))
NATS = ("127.0.0.1", int(os.environ.get("BENCH_NATS_PORT", "4222")))
NATS_URL = f"nats://{NATS[0]}:{NATS[1]}"
PREFIX = "latbench"
PG_SLOT = "latbench_lapidus"
PG_FLOOR_SLOT = "latbench_floor"
MYSQL_SERVER_ID = 4_300_011
MYSQL_FLOOR_SERVER_ID = 4_300_012
BACKEND_NAMES = {"pg": "pg", "mysql": "maria"}
PERCENTILES = (("p50", 50.0), ("p99", 99.0), ("p99.9", 99.9))


# ----------------------------------------------------------------------------- quiet machine

#: other harnesses whose runs restart the database servers or load the CPUs (shared machine)
COMPETITORS = ("bench.chaos", "bench/chaos", "pytest")


def competitors() -> List[str]:
    mine = {os.getpid(), os.getppid()}
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if p.info["pid"] not in mine and any(c in cmd for c in COMPETITORS):
            found.append(cmd[:80])
    return found


def wait_quiet(max_busy: float, max_load: Optional[float] = None, give_up: float = 1800) -> dict:
    """Wait until the CPUs are mostly idle (and, if given, load average below max_load); with
    BENCH_WAIT_FOR_OTHERS=1 also until no other test harness (COMPETITORS) runs, else those are
    only recorded. Returns what was seen. Busy is measured over 2 s while none of this
    script's children run."""
    started = time.monotonic()
    while True:
        busy = psutil.cpu_percent(interval=2.0)
        load = os.getloadavg()[0]
        others = competitors()
        ok = busy <= max_busy and (max_load is None or load <= max_load) and not (
            others and os.environ.get("BENCH_WAIT_FOR_OTHERS") == "1")
        if ok or time.monotonic() - started > give_up:
            seen = {"busy_percent": busy, "load1": load, "waited_s": time.monotonic() - started,
                    "quiet": ok, "others": others}
            if not ok:
                print(f"  machine still busy after {give_up:.0f} s (busy {busy:.0f}%, load "
                      f"{load:.2f}, {others[:2]}); measuring anyway, marked noisy", flush=True)
            return seen
        print(f"  waiting for a quiet machine: busy {busy:.0f}%, load {load:.2f}"
              + (f", running: {others[0]}" if others else ""), flush=True)
        time.sleep(10)


# ------------------------------------------------------------------------------ databases

def pg_db_connect():
    return pg_connect(DB)


def setup_databases(backends) -> None:
    if "pg" in backends:
        drop_pg()
        admin = pg_connect()
        sql(admin, f"CREATE DATABASE {DB}")
        admin.close()
        conn = pg_db_connect()
        sql(conn, "CREATE TABLE items (id bigint PRIMARY KEY, name text, qty int, "
                  "ts timestamptz)")
        conn.close()
    if "mysql" in backends:
        conn = mysql_connect()
        query(conn, f"DROP DATABASE IF EXISTS {DB}")
        query(conn, f"CREATE DATABASE {DB}")
        query(conn, f"CREATE TABLE {DB}.items (id BIGINT PRIMARY KEY, name VARCHAR(32), "
                    f"qty INT, ts TIMESTAMP(6) NULL)")
        conn.close()


def drop_pg_slot(name: str) -> None:
    admin = pg_connect()
    for _ in range(50):
        rows = sql(admin, "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s",
                   (name,))
        if not rows:
            break
        if rows[0][0] is None:
            sql(admin, "SELECT pg_drop_replication_slot(%s)", (name,))
            break
        time.sleep(0.2)
    admin.close()


def drop_pg() -> None:
    admin = pg_connect()
    for (slot,) in sql(admin, "SELECT slot_name FROM pg_replication_slots WHERE database = %s",
                       (DB,)):
        drop_pg_slot(slot)
    sql(admin, f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
    admin.close()


def drop_databases(backends) -> None:
    if "pg" in backends:
        drop_pg()
    if "mysql" in backends:
        conn = mysql_connect()
        query(conn, f"DROP DATABASE IF EXISTS {DB}")
        conn.close()


def insert_one(backend: str, row_id: int) -> None:
    """A single-row commit (warm-up rows use negative ids)."""
    if backend == "pg":
        conn = pg_db_connect()
        sql(conn, "INSERT INTO items VALUES (%s, 'warm-up', 0, clock_timestamp())", (row_id,))
    else:
        conn = mysql_connect()
        query(conn, f"INSERT INTO {DB}.items VALUES (%s, 'warm-up', 0, SYSDATE(6))", (row_id,))
    conn.close()


# ------------------------------------------------------------------------------ generator

def generator_main(backend: str, rate: float, duration: float, threads: int, first_id: int,
                   rows_per_tx: int, out: str, record: bool) -> None:
    """Open-loop generator (its own process): commit j at t0 + j * rows_per_tx / rate.

    rate 0: as fast as the connections go, for ``duration`` seconds. Writes a pickle with one
    tuple (first_id, rows, intended, started, committed) per commit, or only counts."""
    commits = int(rate * duration) // rows_per_tx if rate else None
    counter = itertools.count()
    records: List[list] = [[] for _ in range(threads)]
    counts = [0] * threads
    errors: List[str] = []
    t0 = time.time() + 0.3
    end = t0 + duration

    def run(k: int) -> None:
        try:
            if backend == "pg":
                import psycopg2
                conn = psycopg2.connect(host="127.0.0.1", port=PG_PORT, user="postgres",
                                        dbname=DB)
                cur = conn.cursor()
                one = "INSERT INTO items VALUES (%s, 'row', 1, clock_timestamp())"
                many = ("INSERT INTO items SELECT g, 'row', 1, clock_timestamp() "
                        "FROM generate_series(%s, %s) g")
            else:
                import pymysql
                conn = pymysql.connect(host="127.0.0.1", port=MYSQL_PORT, user="root",
                                       autocommit=False)
                cur = conn.cursor()
                one = f"INSERT INTO {DB}.items VALUES (%s, 'row', 1, SYSDATE(6))"
                many = None
            mine = records[k]
            now = time.time()
            if now < t0:
                time.sleep(t0 - now)
            while True:
                j = next(counter)
                if commits is not None:
                    if j >= commits:
                        break
                    intended = t0 + j * rows_per_tx / rate
                    delay = intended - time.time()
                    if delay > 0:
                        time.sleep(delay)
                else:
                    intended = time.time()
                    if intended >= end:
                        break
                first = first_id + j * rows_per_tx
                started = time.time()
                if rows_per_tx == 1:
                    cur.execute(one, (first,))
                elif many:
                    cur.execute(many, (first, first + rows_per_tx - 1))
                else:
                    cur.execute(f"INSERT INTO {DB}.items VALUES " + ", ".join(
                        f"({i}, 'row', 1, SYSDATE(6))" for i in range(first, first + rows_per_tx)))
                conn.commit()
                committed = time.time()
                counts[k] += rows_per_tx
                if record:
                    mine.append((first, rows_per_tx, intended, started, committed))
            conn.close()
        except Exception as exc:  # reported to the parent
            errors.append(f"{type(exc).__name__}: {exc}")

    run_in_threads(run, threads)
    result = {"commits": sorted(itertools.chain.from_iterable(records)), "rows": sum(counts),
              "t0": t0, "finished": time.time(), "errors": errors}
    with open(out, "wb") as f:
        pickle.dump(result, f)


def run_in_threads(target, count: int) -> None:
    """``target(k)`` for k = 0 .. count-1, each in a thread of its own; returns when all did."""
    threads = [threading.Thread(target=target, args=(k,)) for k in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


class Generator:
    def __init__(self, backend: str, rate: float, duration: float, first_id: int, out: Path,
                 threads: int = 4, rows_per_tx: int = 1, record: bool = True):
        self.out = out
        argv = [sys.executable, __file__, "--generator", backend, str(rate), str(duration),
                str(threads), str(first_id), str(rows_per_tx), str(out), str(int(record))]
        self.proc = subprocess.Popen(argv)

    def result(self, timeout: float = 3600) -> dict:
        self.proc.wait(timeout)
        if self.proc.returncode != 0:
            raise RuntimeError(f"generator failed with {self.proc.returncode}")
        with open(self.out, "rb") as f:
            result = pickle.load(f)
        if result["errors"]:
            raise RuntimeError(f"generator errors: {result['errors'][:3]}")
        return result


# ------------------------------------------------------------------------------ subscriber

def subscriber_main(spec: str, expected: int, deadline: float, out: str) -> None:
    """Subscriber process: raw NATS protocol; SUBs every ``sid=subject`` of spec (comma list),
    prints "ready" after the server's PONG, then records (sid, arrival time, row id, payload)
    for every message until the first sid saw ``expected`` messages of rows >= 0 or until
    ``deadline`` (epoch seconds). Arrival = CLOCK_REALTIME right after recv() returned."""
    subs = [item.split("=", 1) for item in spec.split(",")]
    primary = subs[0][0].encode()
    sock = socket.create_connection(NATS)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(CONNECT
                 + b"".join(f"SUB {subject} {sid}\r\n".encode() for sid, subject in subs)
                 + b"PING\r\n")
    sock.settimeout(0.5)
    buf = bytearray()
    records = []
    seen, ready = 0, False
    # give up `deadline` seconds after the start, or after 'go' + deadline (see below)
    while seen < expected and time.time() < deadline:
        try:
            data = sock.recv(1 << 20)
        except socket.timeout:
            continue
        now = time.time()
        if not data:
            break
        buf += data
        items, used = read_items(buf)
        for line, headers, start, end in items:
            if start < 0:
                ready = answer_control(sock, line, ready)
                continue
            parts = line.split(b" ")
            payload = bytes(buf[start + headers:end])
            sid = parts[2]
            try:
                row_id = int(parts[1].rsplit(b".", 1)[1])
            except ValueError:
                row_id = None
            records.append((sid.decode(), now, row_id, payload))
            if sid == primary and row_id is not None and row_id >= 0:
                seen += 1
        del buf[:used]
    with open(out, "wb") as f:
        pickle.dump(records, f)
    print("done", flush=True)


class RecordingProcess:
    """This script run as a helper process that pickles its records into ``out`` and prints
    "done" when it has them all."""

    def __init__(self, args: List[str], out: Path):
        self.out = out
        self.proc = subprocess.Popen([sys.executable, __file__, *args, str(out)],
                                     stdout=subprocess.PIPE, text=True)

    def records(self, timeout: float) -> list:
        self.proc.stdout.readline()
        self.proc.wait(timeout)
        with open(self.out, "rb") as f:
            return pickle.load(f)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Subscriber(RecordingProcess):
    def __init__(self, subs: Dict[str, str], expected: int, deadline: float, out: Path):
        spec = ",".join(f"{sid}={subject}" for sid, subject in subs.items())
        super().__init__(["--subscriber", spec, str(expected), str(deadline)], out)
        line = self.proc.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError(f"subscriber did not start: {line!r}")


# ----------------------------------------------------------------------------- floor readers

def floor_main(backend: str, expected: int, deadline: float, out: str) -> None:
    """The bare replication stream, each row timestamped on arrival; prints "ready" when a
    warm-up row (negative id) arrived, then records (arrival, id, ts) of rows >= 0."""
    records = []
    ready = False
    if backend == "pg":
        import orjson
        argv = ["pg_recvlogical", "--start", "--no-loop", "-d",
                f"host=127.0.0.1 port={PG_PORT} user=postgres dbname={DB}", "--slot",
                PG_FLOOR_SLOT,
                "-f", "-", "--fsync-interval=1", "-s", "1",
                "-o", "format-version=2", "-o", "include-timestamp=1"]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        fd = proc.stdout.fileno()
        buf = b""
        try:
            while len(records) < expected and time.time() < deadline:
                chunk = os.read(fd, 1 << 20)
                now = time.time()
                if not chunk:
                    break
                buf += chunk
                lines = buf.split(b"\n")
                buf = lines.pop()
                for line in lines:
                    if b'"action":"I"' not in line:
                        continue
                    change = orjson.loads(line)
                    values = {c["name"]: c["value"] for c in change["columns"]}
                    if values["id"] < 0:
                        if not ready:
                            ready = True
                            print("ready", flush=True)
                        continue
                    records.append((now, values["id"], values["ts"]))
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(10)
    else:
        from pymysqlreplication import BinLogStreamReader
        from pymysqlreplication.row_event import WriteRowsEvent
        conn = mysql_connect()
        gtid = str(query(conn, "SELECT @@GLOBAL.gtid_binlog_pos")[0][0])
        conn.close()
        reader = BinLogStreamReader(
            connection_settings={"host": "127.0.0.1", "port": MYSQL_PORT, "user": "root",
                                 "passwd": ""},
            server_id=MYSQL_FLOOR_SERVER_ID, blocking=True, is_mariadb=True,
            auto_position=gtid, only_events=[WriteRowsEvent], only_schemas=[DB],
            enable_logging=False)
        # blocking=True never returns without an event: a timer closes the reader at deadline
        threading.Timer(max(0.0, deadline - time.time()), reader.close).start()
        try:
            for event in reader:
                now = time.time()
                for row in event.rows:
                    values = row["values"]
                    if values["id"] < 0:
                        if not ready:
                            ready = True
                            print("ready", flush=True)
                        continue
                    records.append((now, values["id"], values["ts"]))
                if len(records) >= expected or now > deadline:
                    break
        except Exception:
            pass          # closed by the timer
        finally:
            reader.close()
    with open(out, "wb") as f:
        pickle.dump(records, f)
    print("done", flush=True)
    os._exit(0)


class Floor(RecordingProcess):
    def __init__(self, backend: str, expected: int, deadline: float, out: Path):
        super().__init__(["--floor", backend, str(expected), str(deadline)], out)


_WARM_UP_IDS = itertools.count(1)


def warm_up(backend: str, is_ready, give_up: float = 90) -> None:
    """Insert warm-up rows (negative ids) until ``is_ready(timeout)`` says one arrived."""
    deadline = time.monotonic() + give_up
    while time.monotonic() < deadline:
        insert_one(backend, -next(_WARM_UP_IDS))
        if is_ready(0.5):
            return
    raise RuntimeError("nothing arrived from the warm-up rows")


def line_ready(proc):
    import select

    def check(timeout: float) -> bool:
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        if ready:
            line = proc.stdout.readline().strip()
            if line == "ready":
                return True
            raise RuntimeError(f"reader said {line!r}")
        if proc.poll() is not None:
            raise RuntimeError("reader exited")
        return False
    return check


# ------------------------------------------------------------------------------ lapidus

def lapidus_config(workdir: Path, backends, mode: str, stream: Optional[str],
                   batch_size: int = 0) -> Path:
    blist = []
    for backend in backends:
        if backend == "pg":
            b = {"name": BACKEND_NAMES["pg"], "type": "postgresql", "host": "127.0.0.1",
                 "port": PG_PORT, "user": "postgres", "database": DB, "slot": PG_SLOT}
        else:
            b = {"name": BACKEND_NAMES["mysql"], "type": "mysql", "host": "127.0.0.1",
                 "port": MYSQL_PORT, "user": "root", "password": "", "database": DB,
                 "server_id": MYSQL_SERVER_ID}
        if batch_size:
            b["batch_size"] = batch_size
        blist.append(b)
    plugin = {"server": NATS_URL, "subject_prefix": PREFIX}
    if mode == "jetstream":
        plugin.update(jetstream=True, stream=stream, subjects=[f"{PREFIX}.>"])
    config = {"state_dir": str(workdir / "state"), "log": {"format": "json", "level": "warning"},
              "backends": blist, "plugins": {"nats": plugin}}
    path = workdir / "lapidus.json"
    path.write_text(json.dumps(config))
    return path


def start_lapidus(workdir: Path, config: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "lapidus", "-c", str(config)],
                            stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                            stderr=open(workdir / "lapidus.log", "ab"), start_new_session=True)


def stop_lapidus(proc: subprocess.Popen, timeout: float = 20) -> None:
    """SIGTERM, and SIGKILL of the whole group if it is not gone within ``timeout`` s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


LOG_DIR = Path("/tmp/lapidus-bench-logs")


def keep_log(workdir: Path, label: str) -> None:
    """Keep Lapidus's log of a run (the working directory is temporary)."""
    log = workdir / "lapidus.log"
    if log.exists():
        LOG_DIR.mkdir(exist_ok=True)
        dest = LOG_DIR / f"{time.strftime('%H%M%S')}-{label}.log"
        dest.write_bytes(log.read_bytes())


def lapidus_processes(proc: subprocess.Popen) -> Dict[str, psutil.Process]:
    """supervisor, dispatcher, each worker (by backend name) and pg_recvlogical."""
    sup = psutil.Process(proc.pid)
    out = {"supervisor": sup}
    for child in sup.children(recursive=True):
        try:
            name = child.name()
        except psutil.NoSuchProcess:
            continue
        if name.startswith("lapidus:dispatc"):
            out["dispatcher"] = child
        elif name.startswith("lapidus:"):
            out["worker " + name.split(":", 1)[1]] = child
        elif name == "pg_recvlogical":
            out["pg_recvlogical"] = child
        else:
            out[name] = child
    return out


async def _nats(fn):
    import nats
    nc = await nats.connect(NATS_URL)
    try:
        return await fn(nc, nc.jetstream())
    finally:
        await nc.close()


def create_stream(name: str, max_bytes: int = 1 << 30) -> None:
    from nats.js.api import StreamConfig

    async def run(nc, js):
        await js.add_stream(StreamConfig(name=name, subjects=[f"{PREFIX}.>"],
                                         duplicate_window=120, max_bytes=max_bytes))
    asyncio.run(_nats(run))


def delete_stream(name: str) -> None:
    import nats.js.errors

    async def run(nc, js):
        try:
            await js.delete_stream(name)
        except nats.js.errors.NotFoundError:
            pass
    asyncio.run(_nats(run))


def delete_bench_streams() -> None:
    """Streams left by an interrupted earlier run of this script."""
    async def run(nc, js):
        for info in await js.streams_info():
            if info.config.name.startswith("LATBENCH_"):
                await js.delete_stream(info.config.name)
    asyncio.run(_nats(run))


def stream_last_seq(name: str) -> int:
    async def run(nc, js):
        return (await js.stream_info(name)).state.last_seq
    return asyncio.run(_nats(run))


def create_push_consumer(stream: str, deliver: str) -> None:
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    async def run(nc, js):
        await js.add_consumer(stream, ConsumerConfig(
            deliver_subject=deliver, deliver_policy=DeliverPolicy.NEW,
            ack_policy=AckPolicy.NONE, max_ack_pending=-1))
    asyncio.run(_nats(run))


def nats_seen(subject: str):
    """is_ready(timeout) for warm_up: a core subscription got a message on ``subject``."""
    sock = socket.create_connection(NATS)
    sock.sendall(f'CONNECT {{"verbose":false,"headers":true}}\r\nSUB {subject} 1\r\n'.encode())
    sock.setblocking(False)
    buf = bytearray()

    def check(timeout: float) -> bool:
        import select
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return False
            r, _, _ = select.select([sock], [], [], left)
            if r:
                data = sock.recv(1 << 16)
                buf.extend(data)
                if b"MSG " in buf:
                    sock.close()
                    return True
                if b"PING\r\n" in buf:
                    sock.sendall(b"PONG\r\n")
                    buf.clear()
    return check


# ------------------------------------------------------------------------------ analysis

def parse_ts(value) -> float:
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value)
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    if " " in text and "T" not in text:
        text = text.replace(" ", "T", 1)
    dt = datetime.datetime.fromisoformat(text)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=datetime.timezone.utc)
    return dt.timestamp()


def summarize(values_ms) -> dict:
    import numpy as np
    if len(values_ms) == 0:
        return {}
    a = np.asarray(values_ms, dtype=float)
    out = {name: float(np.percentile(a, q)) for name, q in PERCENTILES}
    out.update(max=float(a.max()), mean=float(a.mean()), n=int(a.size))
    return out


def quantile_curve(values_ms) -> list:
    """Quantiles for CDF plots: a linear grid plus a fine grid in the tail."""
    import numpy as np
    if len(values_ms) == 0:
        return []
    qs = np.unique(np.concatenate([np.linspace(0, 1, 401),
                                   1 - np.logspace(-5, -1, 200)]))
    return [[float(q), float(v)] for q, v in zip(qs, np.quantile(np.asarray(values_ms), qs))]


def per_second(times, origin: float, seconds: int) -> list:
    counts = [0] * max(1, seconds)
    for t in times:
        i = int(t - origin)
        if 0 <= i < len(counts):
            counts[i] += 1
    return counts


def analyse(gen: dict, arrivals: Dict[int, tuple], duration: float) -> dict:
    """arrivals: id -> (arrival, ts column value) for the primary view."""
    commit_of = {}
    lag = []
    for first, rows, intended, started, committed in gen["commits"]:
        for i in range(first, first + rows):
            commit_of[i] = committed
        lag.append((started - intended) * 1000.0)
    from_commit, from_column, arrival_times = [], [], []
    for row_id, committed in commit_of.items():
        got = arrivals.get(row_id)
        if got is None:
            continue
        arrival, ts = got
        arrival_times.append(arrival)
        from_commit.append((arrival - committed) * 1000.0)
        if ts is not None:
            from_column.append((arrival - parse_ts(ts)) * 1000.0)
    commits = [c[4] for c in gen["commits"]]
    last = max(arrival_times, default=gen["t0"])
    span = int(math.ceil(max(duration, last - gen["t0"]))) + 3     # the whole catch-up too
    achieved = (gen["rows"] / (max(commits) - gen["t0"])) if commits else 0.0
    return {
        "rows": len(commit_of), "received": len(from_commit),
        "missing": len(commit_of) - len(from_commit),
        "achieved_rate": achieved,
        "from_commit": summarize(from_commit), "from_column": summarize(from_column),
        "schedule_lag": summarize(lag),
        "commit_duration": summarize([(c[4] - c[3]) * 1000.0 for c in gen["commits"]]),
        "curve": quantile_curve(from_commit),
        "throughput": {"commits": per_second(commits, gen["t0"], span),
                       "received": per_second(arrival_times, gen["t0"], span)},
        "_raw": from_commit,
    }


# ------------------------------------------------------------------------------ runs

def run_floor(backend: str, rate: float, duration: float, first_id: int, tmp: Path) -> dict:
    if backend == "pg":
        conn = pg_db_connect()
        drop_pg_slot(PG_FLOOR_SLOT)
        sql(conn, "SELECT pg_create_logical_replication_slot(%s, 'wal2json')", (PG_FLOOR_SLOT,))
        conn.close()
    expected = int(rate * duration)
    deadline = time.time() + 90 + duration + 30
    floor = Floor(backend, expected, deadline, tmp / "floor.pkl")
    try:
        warm_up(backend, line_ready(floor.proc))
        gen = Generator(backend, rate, duration, first_id, tmp / "gen.pkl").result()
        records = floor.records(timeout=deadline - time.time() + 30)
    finally:
        floor.stop()
        if backend == "pg":
            drop_pg_slot(PG_FLOOR_SLOT)
    arrivals = {row_id: (t, ts) for t, row_id, ts in records}
    return analyse(gen, arrivals, duration)


def run_lapidus(backend: str, mode: str, rate: float, duration: float, first_id: int,
                tmp: Path) -> dict:
    stream = f"LATBENCH_{uuid.uuid4().hex[:8].upper()}" if mode == "jetstream" else None
    if stream:
        create_stream(stream)
    config = lapidus_config(tmp, [backend], mode, stream)
    proc = start_lapidus(tmp, config)
    subscriber = None
    try:
        warm_up(backend, nats_seen(f"{PREFIX}.>"))
        expected = int(rate * duration)
        deadline = time.time() + duration + 60
        subs = {"core": f"{PREFIX}.>"}
        deliver = None
        if stream:
            deliver = f"_latbench_deliver.{uuid.uuid4().hex[:8]}"
            subs = {"js": deliver, "core": f"{PREFIX}.>"}
        subscriber = Subscriber(subs, expected, deadline, tmp / "sub.pkl")
        if stream:
            create_push_consumer(stream, deliver)
        time.sleep(0.3)
        gen = Generator(backend, rate, duration, first_id, tmp / "gen.pkl").result()
        records = subscriber.records(timeout=deadline - time.time() + 30)
        processes = lapidus_processes(proc)
        cpu = {}
        for name, p in processes.items():
            try:
                t = p.cpu_times()
                cpu[name] = t.user + t.system
            except psutil.NoSuchProcess:
                pass
    finally:
        if subscriber:
            subscriber.stop()
        stop_lapidus(proc)
        keep_log(tmp, f"{backend}-{mode}-{rate:.0f}")
        if stream:
            delete_stream(stream)
        if backend == "pg":
            drop_pg_slot(PG_SLOT)
    views = {}
    for sid, t, row_id, payload in records:
        if row_id is None or row_id < 0:
            continue
        views.setdefault(sid, {})
        if row_id not in views[sid]:
            views[sid][row_id] = (t, payload)
    import orjson

    def with_ts(view):
        return {row_id: (t, orjson.loads(p)["item"]["ts"]) for row_id, (t, p) in view.items()}
    primary = "js" if stream else "core"
    result = analyse(gen, with_ts(views.get(primary, {})), duration)
    if stream and "core" in views:
        result["core_view"] = analyse(gen, with_ts(views["core"]), duration)
        result["core_view"].pop("curve", None)
        result["core_view"].pop("throughput", None)
        result["core_view"].pop("_raw", None)
    result["cpu_seconds"] = cpu
    if (tmp / "lapidus.log").exists():
        log = (tmp / "lapidus.log").read_text(errors="replace").strip().splitlines()
        result["log_tail"] = log[-5:]
    return result


def fmt(summary: dict) -> str:
    if not summary:
        return "no data"
    return (f"p50 {summary['p50']:.2f} p99 {summary['p99']:.2f} p99.9 {summary['p99.9']:.2f} "
            f"max {summary['max']:.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="pg,mysql")
    parser.add_argument("--rates", default="100,1000,5000")
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--modes", default="jetstream", help="nats modes at every rate")
    parser.add_argument("--core-rate", type=float, default=1000.0,
                        help="also run core NATS at this rate (0: no)")
    parser.add_argument("--floor-duration", type=float, default=15.0,
                        help="seconds of the bare-stream floor pass (0: none)")
    parser.add_argument("--quiet-busy", type=float, default=30.0)
    parser.add_argument("--no-wait", action="store_true", help="do not wait for a quiet machine")
    parser.add_argument("--out", default="/tmp/lapidus-latency.json")
    parser.add_argument("--generator", nargs=8, help=argparse.SUPPRESS)
    parser.add_argument("--subscriber", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--floor", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.generator:
        b, rate, dur, threads, first, per_tx, out, record = args.generator
        generator_main(b, float(rate), float(dur), int(threads), int(first), int(per_tx), out,
                       bool(int(record)))
        return
    if args.subscriber:
        spec, expected, deadline, out = args.subscriber
        subscriber_main(spec, int(expected), float(deadline), out)
        return
    if args.floor:
        b, expected, deadline, out = args.floor
        floor_main(b, int(expected), float(deadline), out)
        return

    backends = args.backends.split(",")
    rates = [float(r) for r in args.rates.split(",")]
    modes = args.modes.split(",")
    configs = [(b, m, r) for b in backends for r in rates for m in modes]
    if args.core_rate and "core" not in modes:
        configs += [(b, "core", args.core_rate) for b in backends]
    results = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
               "argv": sys.argv[1:], "duration": args.duration, "runs": []}
    delete_bench_streams()
    setup_databases(backends)
    first_id = 0
    if not args.no_wait:
        results["quiet_at_start"] = wait_quiet(args.quiet_busy, max_load=1.0)
    try:
        for run in range(args.runs):
            for backend, mode, rate in configs:
                with tempfile.TemporaryDirectory(prefix="lapidus-latency-") as tmpdir:
                    tmp = Path(tmpdir)
                    quiet = None if args.no_wait else wait_quiet(args.quiet_busy)
                    entry = {"backend": backend, "mode": mode, "rate": rate, "run": run + 1,
                             "quiet": quiet}
                    if args.floor_duration and mode == modes[0]:
                        first_id += 10_000_000
                        try:
                            entry["floor"] = run_floor(backend, rate, args.floor_duration,
                                                       first_id, tmp)
                        except Exception as exc:
                            print(f"  floor run failed ({type(exc).__name__}: {exc})",
                                  flush=True)
                            entry.setdefault("failures", []).append(f"floor: {exc}")
                    first_id += 10_000_000
                    for attempt in (1, 2):
                        try:
                            entry["lapidus"] = run_lapidus(backend, mode, rate, args.duration,
                                                           first_id, tmp)
                            break
                        except Exception as exc:   # a server restarted under us, say
                            print(f"  run failed ({type(exc).__name__}: {exc}); "
                                  f"{'retrying' if attempt == 1 else 'giving up'}", flush=True)
                            entry.setdefault("failures", []).append(str(exc))
                            if attempt == 2:
                                break
                            first_id += 10_000_000
                            if not args.no_wait:
                                wait_quiet(args.quiet_busy)
                    entry["others_after"] = competitors()
                    if "lapidus" not in entry:
                        results["runs"].append(entry)
                        continue
                    if entry["others_after"]:
                        print(f"  another harness started during the run: "
                              f"{entry['others_after'][0]}", flush=True)
                    lap = entry["lapidus"]
                    print(f"run {run + 1} {backend} {mode} {rate:,.0f} rows/s: lapidus "
                          f"{fmt(lap['from_commit'])} (column: {fmt(lap['from_column'])}); "
                          f"received {lap['received']}/{lap['rows']}, achieved "
                          f"{lap['achieved_rate']:,.0f} rows/s, schedule lag p99 "
                          f"{lap['schedule_lag'].get('p99', 0):.2f} ms", flush=True)
                    if "core_view" in lap:
                        print(f"      core subscription of the same publishes: "
                              f"{fmt(lap['core_view']['from_commit'])}", flush=True)
                    if "floor" in entry:
                        print(f"      floor (bare stream): {fmt(entry['floor']['from_commit'])}"
                              f"; received {entry['floor']['received']}/"
                              f"{entry['floor']['rows']}", flush=True)
                    for part in ("floor", "lapidus"):
                        if part in entry:
                            entry[part].pop("_raw", None)
                    results["runs"].append(entry)
                    Path(args.out).write_text(json.dumps(results, indent=1))
    finally:
        drop_databases(backends)
        delete_bench_streams()
    print_summary(results)


def print_summary(results: dict) -> None:
    groups: Dict[tuple, list] = {}
    for entry in results["runs"]:
        if "lapidus" in entry:
            groups.setdefault((entry["backend"], entry["mode"], entry["rate"]), []).append(entry)
    print("\nmedians over the runs (ms, from the client's COMMIT returning to the subscriber):")
    print(f"  {'backend':8} {'mode':9} {'rows/s':>7} {'p50':>7} {'p99':>7} {'p99.9':>7} "
          f"{'max':>8}   floor p50/p99   {'col p50':>8} {'col p99':>8}  missing")
    for (backend, mode, rate), entries in groups.items():
        def med(part, key, stat):
            vals = [e[part][key][stat] for e in entries if part in e and e[part][key]]
            return statistics.median(vals) if vals else float("nan")
        print(f"  {backend:8} {mode:9} {rate:>7,.0f} {med('lapidus', 'from_commit', 'p50'):7.2f} "
              f"{med('lapidus', 'from_commit', 'p99'):7.2f} "
              f"{med('lapidus', 'from_commit', 'p99.9'):7.2f} "
              f"{med('lapidus', 'from_commit', 'max'):8.2f}   "
              f"{med('floor', 'from_commit', 'p50'):6.2f}/{med('floor', 'from_commit', 'p99'):6.2f}"
              f"   {med('lapidus', 'from_column', 'p50'):8.2f} "
              f"{med('lapidus', 'from_column', 'p99'):8.2f}  "
              f"{sum(e['lapidus']['missing'] for e in entries)}")


if __name__ == "__main__":
    main()
