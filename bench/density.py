"""Many tenants on one box: memory, idle CPU, start-up and latency with N backends.

    .venv/bin/python bench/density.py [--sizes 10,50,100] [--idle-seconds 60]
                                      [--rate 1000] [--duration 30] [--skip-latency]
                                      [--wait-servers-idle] [--out FILE]

For each N of ``--sizes``: one ``lapidus`` with N backends, half PostgreSQL databases and half
MariaDB databases (``lapidus_bench_density_<i>`` on each server, one table ``items``), all
publishing to NATS core through the nats plugin. Per N it reports, in one run:

* **start-up**: seconds from ``lapidus`` starting until every backend is RUNNING, and until a
  row written into every backend after that has reached the NATS subscriber (every backend
  streams);
* **memory** after the idle phase: RSS, USS and PSS of every process (supervisor, dispatcher,
  the workers' fork server and resource tracker, each worker, each ``pg_recvlogical``), the
  median and max per kind and the total PSS (what the box really spends; RSS counts pages
  shared with the fork server once per process);
* **idle CPU**: CPU seconds (user + system) of all those processes over ``--idle-seconds``
  with nothing written, as a percentage of one core (workers also per source kind), and what
  others wrote meanwhile to the servers' WAL and binlog: on a shared host those writes reach
  the idle backends too (each walsender pings its ``pg_recvlogical`` as the WAL grows, each
  binlog reader receives the whole binlog; ``--wait-servers-idle`` starts only once nobody
  else writes);
* **latency**: commit-to-NATS-subscriber p50/p99/max at ``--rate`` single-row commits/s spread
  round-robin over all backends for ``--duration`` s (the open-loop generator of
  bench/latency.py's kind: commit j is due at t0 + j/rate, whatever the commits before it did),
  and rows missing (must be 0); ``--skip-latency`` leaves this phase out (the idle figures
  alone take a few minutes less at N = 100).

Waits for a quiet machine before each N (bench/latency.py's ``wait_quiet``). ``max_connections``
of MariaDB and ``max_replication_slots`` / ``max_wal_senders`` of PostgreSQL must fit N (the
values of scripts/setup-local fit 100). Creates and drops its databases, slots and nothing else.
"""

from __future__ import annotations

import argparse
import json
import pickle
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import psutil  # noqa: E402

import latency as L  # noqa: E402

MIB = 2 ** 20
DB_PREFIX = "lapidus_bench_density_"
SUBJECT_PREFIX = "densbench"
SERVER_ID_BASE = 4_400_000
LAPIDUSCTL = str(Path(sys.executable).parent / "lapidusctl")


# ------------------------------------------------------------------------------ databases

def backend_names(n: int) -> List[str]:
    """pg0, my1, pg2, my3, ...: every other backend on each server."""
    return [("pg" if i % 2 == 0 else "my") + str(i) for i in range(n)]


def create_databases(names: List[str]) -> None:
    drop_databases(names)
    pg = L.pg_connect("postgres")
    my = L.mysql_connect()
    for name in names:
        db = DB_PREFIX + name
        if name.startswith("pg"):
            L.sql(pg, f"CREATE DATABASE {db}")
            conn = L.pg_connect(db)
            L.sql(conn, "CREATE TABLE items (id bigint PRIMARY KEY, name text, qty int, "
                        "ts timestamptz)")
            conn.close()
        else:
            L.query(my, f"CREATE DATABASE {db}")
            L.query(my, f"CREATE TABLE {db}.items (id bigint PRIMARY KEY, name text, qty int, "
                        "ts timestamp(6))")
    pg.close()
    my.close()


def drop_databases(names: List[str]) -> None:
    pg = L.pg_connect("postgres")
    my = L.mysql_connect()
    for name in names:
        db = DB_PREFIX + name
        if name.startswith("pg"):
            L.drop_pg_slot(f"densbench_{name}")
            L.sql(pg, f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        else:
            L.query(my, f"DROP DATABASE IF EXISTS {db}")
    pg.close()
    my.close()


def write_config(workdir: Path, names: List[str]) -> Path:
    backends = []
    for i, name in enumerate(names):
        common = {"name": name, "host": "127.0.0.1", "database": DB_PREFIX + name}
        if name.startswith("pg"):
            backends.append({**common, "type": "postgresql", "port": L.PG_PORT,
                             "user": "postgres", "slot": f"densbench_{name}"})
        else:
            backends.append({**common, "type": "mysql", "port": L.MYSQL_PORT, "user": "root",
                             "password": "", "server_id": SERVER_ID_BASE + i})
    config = {"state_dir": str(workdir / "state"),
              "control": {"socket": str(workdir / "lapidus.sock")},
              "log": {"format": "json", "level": "warning"},
              "backends": backends,
              "plugins": {"nats": {"servers": [L.NATS_URL], "subject_prefix": SUBJECT_PREFIX}}}
    path = workdir / "lapidus.json"
    path.write_text(json.dumps(config))
    return path


# ------------------------------------------------------------------------------ writes

def insert_rows(name: str, conn, cur, row_id: int) -> None:
    if name.startswith("pg"):
        cur.execute("INSERT INTO items VALUES (%s, 'row', 1, clock_timestamp())", (row_id,))
    else:
        cur.execute(f"INSERT INTO {DB_PREFIX}{name}.items VALUES (%s, 'row', 1, SYSDATE(6))",
                    (row_id,))
    conn.commit()


def connect(name: str):
    if name.startswith("pg"):
        import psycopg2
        conn = psycopg2.connect(host="127.0.0.1", port=L.PG_PORT, user="postgres",
                                dbname=DB_PREFIX + name)
    else:
        import pymysql
        conn = pymysql.connect(host="127.0.0.1", port=L.MYSQL_PORT, user="root",
                               autocommit=False)
    return conn, conn.cursor()


def generator_main(names_csv: str, rate: float, duration: float, threads: int, first_id: int,
                   out: str) -> None:
    """Open loop over all backends (its own process): commit j goes to backend j % N at
    t0 + j / rate. Thread k owns the connections of the backends with index % threads == k
    and takes their commits in schedule order. Pickles [(row id, committed at)] to ``out``."""
    names = names_csv.split(",")
    commits = int(rate * duration)
    records: List[list] = [[] for _ in range(threads)]
    errors: List[str] = []
    t0 = time.time() + 0.5

    def run(k: int) -> None:
        try:
            conns = {i: connect(names[i]) for i in range(k, len(names), threads)}
            mine = records[k]
            for j in range(commits):
                i = j % len(names)
                if i not in conns:
                    continue
                delay = t0 + j / rate - time.time()
                if delay > 0:
                    time.sleep(delay)
                conn, cur = conns[i]
                insert_rows(names[i], conn, cur, first_id + j)
                mine.append((first_id + j, time.time()))
            for conn, _ in conns.values():
                conn.close()
        except Exception as exc:  # reported to the parent
            errors.append(f"{type(exc).__name__}: {exc}")

    L.run_in_threads(run, threads)
    with open(out, "wb") as f:
        pickle.dump({"commits": [r for rs in records for r in rs], "errors": errors}, f)


def run_generator(names: List[str], rate: float, duration: float, first_id: int,
                  out: Path, threads: int = 4) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--generator", ",".join(names), str(rate),
                           str(duration), str(threads), str(first_id), str(out)])
    if proc.returncode != 0:
        raise RuntimeError(f"generator failed with {proc.returncode}")
    with open(out, "rb") as f:
        result = pickle.load(f)
    if result["errors"]:
        raise RuntimeError(f"generator errors: {result['errors'][:3]}")
    return result


# ------------------------------------------------------------------------------ lapidus

def status(workdir: Path) -> dict:
    proc = subprocess.run([LAPIDUSCTL, "--socket", str(workdir / "lapidus.sock"), "status",
                           "--json"], capture_output=True, text=True)
    return json.loads(proc.stdout) if proc.returncode == 0 and proc.stdout.strip() else {}


def wait_all_running(workdir: Path, n: int, lapidus: subprocess.Popen,
                     give_up: float = 300) -> None:
    end = time.monotonic() + give_up
    while time.monotonic() < end:
        if lapidus.poll() is not None:
            raise RuntimeError(f"lapidus exited with {lapidus.returncode}; see "
                               f"{workdir / 'lapidus.log'}")
        rows = status(workdir).get("backends", [])
        if len(rows) == n and all(r.get("state") == "RUNNING" for r in rows):
            return
        time.sleep(0.2)
    raise RuntimeError(f"not every backend RUNNING after {give_up:.0f} s")


def processes(lapidus: subprocess.Popen) -> Dict[str, List[psutil.Process]]:
    """Lapidus's processes by kind: supervisor, dispatcher, worker, pg_recvlogical, and the
    workers' fork server with multiprocessing's resource tracker ("forker", together)."""
    sup = psutil.Process(lapidus.pid)
    kinds: Dict[str, List[psutil.Process]] = {"supervisor": [sup], "dispatcher": [],
                                              "forker": [], "worker": [], "pg_recvlogical": []}
    for child in sup.children(recursive=True):
        try:
            name = child.name()
        except psutil.NoSuchProcess:
            continue
        if name.startswith("lapidus:dispatc"):
            kinds["dispatcher"].append(child)
        elif name == "lapidus:forker" or name.startswith("python"):
            kinds["forker"].append(child)
        elif name.startswith("lapidus:"):
            kinds["worker"].append(child)
        elif name == "pg_recvlogical":
            kinds["pg_recvlogical"].append(child)
    return kinds


def cpu_seconds(kinds: Dict[str, List[psutil.Process]]) -> Dict[str, float]:
    """CPU seconds (user + system) so far, summed per kind."""
    out = {}
    for kind, procs in kinds.items():
        out[kind] = 0.0
        for p in procs:
            try:
                t = p.cpu_times()
                out[kind] += t.user + t.system
            except psutil.NoSuchProcess:
                pass
    return out


def worker_cpu_seconds(workers: List[psutil.Process]) -> Dict[str, float]:
    """CPU seconds (user + system) so far of the PostgreSQL and of the MariaDB workers
    (process names lapidus:pg<i> and lapidus:my<i>)."""
    out = {"pg": 0.0, "my": 0.0}
    for p in workers:
        try:
            kind = p.name()[len("lapidus:"):][:2]
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        if kind in out:
            out[kind] += t.user + t.system
    return out


def server_writes() -> Dict[str, int]:
    """Bytes written so far to PostgreSQL's WAL and MariaDB's binlogs, by anyone: on a shared
    host other work's writes reach every idle walsender (whose keepalives wake each
    pg_recvlogical) and every binlog reader, so the idle figures are read with them."""
    pg = L.pg_connect("postgres")
    wal = int(L.sql(pg, "SELECT pg_current_wal_lsn() - '0/0'")[0][0])
    pg.close()
    my = L.mysql_connect()
    binlog = sum(int(row[1]) for row in L.query(my, "SHOW BINARY LOGS"))
    my.close()
    return {"wal_bytes": wal, "binlog_bytes": binlog}


def wait_servers_idle(give_up: float = 1800, window: float = 10.0) -> dict:
    """Wait until nobody writes to the servers (under 1 KiB/s of WAL and of binlog over
    ``window`` s): the idle figures of a shared host are otherwise other work's. Returns the
    last rates seen and how long it waited."""
    started = time.monotonic()
    while True:
        before = server_writes()
        time.sleep(window)
        after = server_writes()
        rates = {what: (after[what] - before[what]) / window for what in after}
        if all(rate < 1024 for rate in rates.values()) or \
                time.monotonic() - started > give_up:
            return {**rates, "waited_s": time.monotonic() - started}
        print(f"  waiting for idle servers: others write {rates['wal_bytes'] / 1024:.0f} KiB/s "
              f"of WAL, {rates['binlog_bytes'] / 1024:.0f} KiB/s of binlog", flush=True)


def memory(kinds: Dict[str, List[psutil.Process]]) -> dict:
    """RSS, USS and PSS per kind (the workers also per source kind: ``worker pg``,
    ``worker my``) and the total PSS."""
    out = {}
    total_pss = 0
    by_source: Dict[str, List[psutil.Process]] = {"worker pg": [], "worker my": []}
    for p in kinds["worker"]:
        try:
            by_source[f"worker {p.name()[len('lapidus:'):][:2]}"].append(p)
        except (psutil.NoSuchProcess, KeyError):
            continue
    for kind, procs in {**kinds, **by_source}.items():
        rows = []
        for p in procs:
            try:
                m = p.memory_full_info()
            except psutil.NoSuchProcess:
                continue
            rows.append((m.rss, m.uss, m.pss))
            if not kind.startswith("worker "):
                total_pss += m.pss
        if rows:
            out[kind] = {f"{what}_{stat}": fn([r[k] for r in rows]) / MIB
                         for k, what in enumerate(("rss", "uss", "pss"))
                         for stat, fn in (("median", statistics.median), ("max", max))}
            out[kind]["count"] = len(rows)
    out["total_pss"] = total_pss / MIB
    return out


# ------------------------------------------------------------------------------ one size

def measure(n: int, args, tmp: Path) -> dict:
    names = backend_names(n)
    create_databases(names)
    workdir = tmp / f"n{n}"
    workdir.mkdir()
    config = write_config(workdir, names)
    result: dict = {"backends": n, "quiet": L.wait_quiet(args.quiet_busy)}
    if args.wait_servers_idle:
        result["servers_idle"] = wait_servers_idle()
    started = time.monotonic()
    lapidus = subprocess.Popen([str(Path(sys.executable).parent / "lapidus"), "-c", str(config)],
                               stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                               stderr=open(workdir / "lapidus.log", "ab"),
                               start_new_session=True)
    try:
        wait_all_running(workdir, n, lapidus)
        result["startup_running_s"] = time.monotonic() - started
        # One row per backend, ids -1 .. -n: every backend streams once all n have arrived.
        warm = WarmUpWatch()
        for i, name in enumerate(names):
            conn, cur = connect(name)
            insert_rows(name, conn, cur, -(i + 1))
            conn.close()
        result["warm_up_missing"] = n - warm.wait_for(n, 120)
        result["startup_streaming_s"] = time.monotonic() - started

        kinds = processes(lapidus)
        before = cpu_seconds(kinds)
        before_workers = worker_cpu_seconds(kinds["worker"])
        writes_before = server_writes()
        time.sleep(args.idle_seconds)      # the measurement itself: nothing is written
        kinds = processes(lapidus)
        after = cpu_seconds(kinds)
        after_workers = worker_cpu_seconds(kinds["worker"])
        writes_after = server_writes()
        per_kind = {kind: 100.0 * (after[kind] - before.get(kind, 0.0)) / args.idle_seconds
                    for kind in after}
        result["idle_cpu_percent_by_kind"] = per_kind
        result["idle_cpu_percent_of_one_core"] = sum(per_kind.values())
        result["idle_worker_cpu_percent_by_source"] = {
            kind: 100.0 * (after_workers[kind] - before_workers[kind]) / args.idle_seconds
            for kind in after_workers}
        result["others_writes_per_second"] = {
            what: (writes_after[what] - writes_before[what]) / args.idle_seconds
            for what in writes_after}
        result["memory_idle"] = memory(kinds)
        if args.skip_latency:
            return result

        expected = int(args.rate * args.duration)
        sub = L.Subscriber({"1": f"{SUBJECT_PREFIX}.>"}, expected,
                           time.time() + args.duration + 120, workdir / "load.pickle")
        gen = run_generator(names, args.rate, args.duration, 1, workdir / "gen.pickle")
        records = sub.records(args.duration + 180)
        arrivals = {}
        for _sid, arrived, row_id, _payload in records:
            if row_id is not None and row_id >= 1 and row_id not in arrivals:
                arrivals[row_id] = arrived
        latencies = [(arrivals[row_id] - committed) * 1000.0
                     for row_id, committed in gen["commits"] if row_id in arrivals]
        result["latency_ms"] = L.summarize(latencies)
        # row j went to backend j % n (generator_main): the same figures per source kind
        by_kind: Dict[str, list] = {"pg": [], "my": []}
        for row_id, committed in gen["commits"]:
            if row_id in arrivals:
                by_kind[names[(row_id - 1) % n][:2]].append(
                    (arrivals[row_id] - committed) * 1000.0)
        result["latency_ms_by_kind"] = {k: L.summarize(v) for k, v in by_kind.items()}
        result["rows_written"] = len(gen["commits"])
        result["rows_missing"] = len(gen["commits"]) - len(latencies)
    finally:
        L.stop_lapidus(lapidus, timeout=60)     # a hundred workers drain and save
        drop_databases(names)
    return result


class WarmUpWatch:
    """A core NATS subscription on every subject of the run, counting warm-up rows (negative
    ids, the last subject token)."""

    def __init__(self):
        self.sock = socket.create_connection(L.NATS)
        self.sock.sendall(L.CONNECT + f"SUB {SUBJECT_PREFIX}.> 1\r\nPING\r\n".encode())
        self.buf = bytearray()
        self.ready = False
        self.ids: set = set()
        while not self.ready:
            self._read(5.0)

    def _read(self, timeout: float) -> None:
        self.sock.settimeout(timeout)
        data = self.sock.recv(1 << 16)
        if not data:
            raise RuntimeError("NATS closed the warm-up subscription")
        self.buf += data
        items, used = L.read_items(self.buf)
        for line, _headers, start, _end in items:
            if start < 0:
                self.ready = L.answer_control(self.sock, line, self.ready)
                continue
            token = line.split(b" ")[1].rsplit(b".", 1)[1]
            if token.startswith(b"-"):
                self.ids.add(int(token))
        del self.buf[:used]

    def wait_for(self, count: int, give_up: float) -> int:
        """How many distinct warm-up rows arrived, waiting up to ``give_up`` s for ``count``."""
        end = time.monotonic() + give_up
        while len(self.ids) < count and time.monotonic() < end:
            try:
                self._read(max(0.05, end - time.monotonic()))
            except socket.timeout:
                break
        self.sock.close()
        return len(self.ids)


def report(r: dict) -> None:
    print(f"N = {r['backends']}: RUNNING after {r['startup_running_s']:.1f} s, every backend "
          f"streaming after {r['startup_streaming_s']:.1f} s; idle CPU "
          f"{r['idle_cpu_percent_of_one_core']:.2f}% of one core (" + ", ".join(
              f"{kind} {pct:.2f}%" for kind, pct in r["idle_cpu_percent_by_kind"].items()) + ")")
    by_source = r["idle_worker_cpu_percent_by_source"]
    writes = r["others_writes_per_second"]
    print(f"    workers: PostgreSQL {by_source['pg']:.2f}%, MariaDB {by_source['my']:.2f}%; "
          f"meanwhile others wrote {writes['wal_bytes'] / 1024:.0f} KiB/s of WAL, "
          f"{writes['binlog_bytes'] / 1024:.0f} KiB/s of binlog")
    for kind, m in r["memory_idle"].items():
        if kind == "total_pss":
            continue
        print(f"    {kind:15} x{m['count']:<3} RSS {m['rss_median']:6.1f} (max {m['rss_max']:6.1f})"
              f"  USS {m['uss_median']:6.1f} (max {m['uss_max']:6.1f})  PSS "
              f"{m['pss_median']:6.1f} MiB")
    print(f"    total PSS {r['memory_idle']['total_pss']:.0f} MiB")
    if "latency_ms" not in r:
        return      # --skip-latency
    lat = r["latency_ms"]
    print(f"    latency at {r['rows_written']} rows: p50 {lat.get('p50', float('nan')):.2f} ms, "
          f"p99 {lat.get('p99', float('nan')):.2f} ms, max {lat.get('max', float('nan')):.2f} "
          f"ms; missing {r['rows_missing']}")
    for kind, k in r.get("latency_ms_by_kind", {}).items():
        if k:
            print(f"      {kind}: p50 {k['p50']:.2f} ms, p99 {k['p99']:.2f} ms")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--generator":
        names, rate, duration, threads, first_id, out = sys.argv[2:8]
        generator_main(names, float(rate), float(duration), int(threads), int(first_id), out)
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10,50,100")
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--quiet-busy", type=float, default=15.0)
    parser.add_argument("--skip-latency", action="store_true",
                        help="stop after the idle phase (start-up, idle CPU and memory only)")
    parser.add_argument("--wait-servers-idle", action="store_true",
                        help="before each N, wait until nobody else writes to PostgreSQL and "
                             "MariaDB (a shared host's other work wakes idle backends)")
    parser.add_argument("--out", default="/tmp/lapidus-density.json")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="lapidus-density-") as tmp:
        for n in (int(s) for s in args.sizes.split(",")):
            results.append(measure(n, args, Path(tmp)))
            report(results[-1])
            Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
