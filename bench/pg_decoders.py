"""pgoutput against wal2json on one backlog: Lapidus and pg_recvlogical, rows/s and server CPU.

    .venv/bin/python bench/pg_decoders.py [--rows 200000] [--runs 3] [--per-tx 0]

For each run: create a publication FOR ALL TABLES and four slots (before any change, so every
slot sees the same backlog), insert ROWS rows (one transaction, or PER_TX rows per transaction)
into the 4-column table of bench/pg_drain.py, then drain that one backlog four times:

  * ``pg_recvlogical --start --endpos=<LSN> -f FILE`` with wal2json (Lapidus's options), then
    with pgoutput (proto_version=1, the publication): the floor a decoder cannot beat;
  * ``lapidus -c CONFIG --stdout`` with ``decoder = "wal2json"``, then ``"pgoutput"``, until
    ROWS lines arrived on its standard output.

Beside rows/s it reports the CPU seconds of the database server's walsender that decoded each
drain (the slot's ``active_pid``, sampled with psutil until the drain ends: decoding cost on the
server, including the sends to the client; the part spent in the kernel is shown beside
it), and for Lapidus the CPU seconds of its pg_recvlogical, worker, dispatcher and supervisor.
Prints each run and the medians.  Talks only to the local PostgreSQL (127.0.0.1:5432, user
postgres; another port with BENCH_PG_PORT=N) and must run on the database host (psutil reads
the walsender's CPU time).
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
import threading
import time
from pathlib import Path
from typing import Dict, Optional

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pg_drain import DB, PG, connect, make_backlog, reset_database, sql  # noqa: E402

from lapidus.workers.postgresql.pgoutput import PgOutputDecoder  # noqa: E402
from lapidus.workers.postgresql.recvlogical import find_pg_recvlogical  # noqa: E402
from lapidus.workers.postgresql.wal2json import Wal2JsonDecoder  # noqa: E402

PUBLICATION = "bench_pub"
DECODERS = ("wal2json", "pgoutput")


def plugin_options(decoder: str, publication: str = PUBLICATION):
    """The ``-o`` options Lapidus gives pg_recvlogical for ``decoder``."""
    if decoder == "wal2json":
        return Wal2JsonDecoder(None, None).plugin_options()
    return PgOutputDecoder(None, None, publication).plugin_options()


class WalsenderCpu:
    """Samples the CPU time of the walsender serving ``slot`` until it exits or is read.

    The walsender of a pg_recvlogical that reached --endpos exits with it, so its last CPU
    time can only be sampled while it runs (every 10 ms: the error is at most that)."""

    def __init__(self, slot: str):
        self.slot = slot
        self.seconds = 0.0
        self.system = 0.0       # the part spent in the kernel: sends to the client, WAL reads
        self.pid: Optional[int] = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        conn = connect(DB)
        process = None
        while not self._stop.is_set():
            if process is None:
                row = sql(conn, "SELECT active_pid FROM pg_replication_slots "
                                "WHERE slot_name = %s", (self.slot,))
                if row and row[0][0]:
                    self.pid = row[0][0]
                    process = psutil.Process(self.pid)
            if process is not None:
                try:
                    times = process.cpu_times()
                    self.seconds = times.user + times.system
                    self.system = times.system
                except psutil.NoSuchProcess:
                    break
            time.sleep(0.01)
        conn.close()

    def stop(self) -> float:
        self._stop.set()
        self._thread.join(5)
        return self.seconds


def drain_pg_recvlogical(workdir: Path, decoder: str, end_lsn: str) -> Dict[str, float]:
    out = workdir / f"baseline-{decoder}.out"
    slot = f"bench_base_{decoder}"
    argv = [find_pg_recvlogical(), "--start", "--no-loop", "-d",
            f"host=127.0.0.1 port={PG['port']} user=postgres dbname={DB} "
            f"application_name=bench_base_{decoder}",
            "--slot", slot, "-f", str(out), f"--endpos={end_lsn}", "--fsync-interval=1"]
    for opt in plugin_options(decoder):
        argv += ["-o", opt]
    env = dict(os.environ, PGOPTIONS="-c timezone=UTC -c extra_float_digits=3")
    cpu = WalsenderCpu(slot)
    started = time.perf_counter()
    subprocess.run(argv, check=True, env=env)
    elapsed = time.perf_counter() - started
    result = {"seconds": elapsed, "walsender_cpu": cpu.stop(), "walsender_system": cpu.system,
              "bytes": out.stat().st_size}
    out.unlink()
    return result


def drain_lapidus(workdir: Path, decoder: str, rows: int) -> Dict[str, float]:
    slot = f"bench_lap_{decoder}"
    config = {
        "state_dir": str(workdir / f"state-{decoder}"),
        "log": {"format": "json", "level": "warning"},
        "backends": [{"name": f"bench_{decoder}", "type": "postgresql", "host": "127.0.0.1",
                      "port": PG["port"], "user": "postgres", "database": DB, "slot": slot,
                      "decoder": decoder,
                      "publication": PUBLICATION, "publication_mode": "existing"}],
    }
    path = workdir / f"lapidus-{decoder}.json"
    path.write_text(json.dumps(config))
    cpu = WalsenderCpu(slot)
    started = time.perf_counter()
    with open(workdir / f"lapidus-{decoder}.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "lapidus", "-c", str(path), "--stdout"],
                                stdout=subprocess.PIPE, stderr=log, start_new_session=True)
    seen = 0
    fd = proc.stdout.fileno()
    try:
        while seen < rows:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise RuntimeError(f"lapidus exited early; see {workdir}/lapidus-{decoder}.log")
            seen += chunk.count(b"\n")
        elapsed = time.perf_counter() - started
        result = {"seconds": elapsed, "walsender_cpu": cpu.stop(),
                  "walsender_system": cpu.system}
        supervisor = psutil.Process(proc.pid)
        times = supervisor.cpu_times()
        result["supervisor_cpu"] = times.user + times.system
        for child in supervisor.children(recursive=True):
            times = child.cpu_times()
            name = child.name()
            key = ("recvlogical_cpu" if name == "pg_recvlogical" else
                   "dispatcher_cpu" if name.startswith("lapidus:dispatc") else
                   "worker_cpu" if name.startswith("lapidus:bench") else None)
            if key:
                result[key] = times.user + times.system
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return result


def one_run(rows: int, per_tx: int) -> Dict[str, Dict[str, float]]:
    with tempfile.TemporaryDirectory(prefix="lapidus-bench-") as tmp:
        workdir = Path(tmp)
        conn = reset_database()
        # The publication first: pgoutput reads it as of each change (docs/postgresql.md).
        sql(conn, f"CREATE PUBLICATION {PUBLICATION} FOR ALL TABLES")
        for decoder in DECODERS:
            for kind in ("base", "lap"):
                sql(conn, "SELECT pg_create_logical_replication_slot(%s, %s)",
                    (f"bench_{kind}_{decoder}", decoder))
        end_lsn = make_backlog(conn, rows, per_tx)
        results = {}
        for decoder in DECODERS:
            results[f"pg_recvlogical {decoder}"] = drain_pg_recvlogical(workdir, decoder,
                                                                        end_lsn)
        for decoder in DECODERS:
            results[f"lapidus {decoder}"] = drain_lapidus(workdir, decoder, rows)
        conn.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--per-tx", type=int, default=0, help="rows per transaction (0: one)")
    args = parser.parse_args()
    runs = []
    try:
        for run in range(args.runs):
            results = one_run(args.rows, args.per_tx)
            runs.append(results)
            print(f"run {run + 1}: " + "; ".join(
                f"{name} {args.rows / r['seconds']:,.0f} rows/s "
                f"(walsender {r['walsender_cpu']:.2f} s CPU)" for name, r in results.items()),
                flush=True)
    finally:
        admin = connect()
        for (slot,) in sql(admin, "SELECT slot_name FROM pg_replication_slots "
                                  "WHERE database = %s", (DB,)):
            sql(admin, "SELECT pg_drop_replication_slot(%s)", (slot,))
        sql(admin, f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
    shape = "one transaction" if not args.per_tx else f"{args.per_tx} rows per transaction"
    print(f"\nmedians over {args.runs} run(s) of {args.rows:,} rows ({shape}), same backlog "
          f"for every drain of a run:")
    for r in runs:
        for drain in r.values():
            drain["walsender_user"] = drain["walsender_cpu"] - drain["walsender_system"]
    columns = (("walsender_cpu", "walsender"), ("walsender_user", "(user"),
               ("walsender_system", "kernel)"), ("recvlogical_cpu", "pg_recvlogical"),
               ("worker_cpu", "worker"), ("dispatcher_cpu", "dispatcher"),
               ("supervisor_cpu", "supervisor"))
    print(f"  {'drain':<24} {'rows/s':>9}   CPU seconds: " +
          " ".join(f"{title:>14}" for _, title in columns))
    for name in runs[0]:
        def median(key):
            values = [r[name][key] for r in runs if key in r[name]]
            return f"{statistics.median(values):.2f}" if values else ""
        rate = statistics.median(args.rows / r[name]["seconds"] for r in runs)
        print(f"  {name:<24} {rate:>9,.0f}                " +
              " ".join(f"{median(key):>14}" for key, _ in columns))
    print("  walsender user time is the plugin's decoding; its kernel time (WAL reads, sends to "
          "the client)\n  varies with how the client reads and with the machine's load")
    base = {d: statistics.median(args.rows / r[f"pg_recvlogical {d}"]["seconds"] for r in runs)
            for d in DECODERS}
    lap = {d: statistics.median(args.rows / r[f"lapidus {d}"]["seconds"] for r in runs)
           for d in DECODERS}
    for d in DECODERS:
        print(f"  lapidus / pg_recvlogical with {d}: {lap[d] / base[d]:.2f}")
    print(f"  lapidus pgoutput / lapidus wal2json: {lap['pgoutput'] / lap['wal2json']:.2f}")


if __name__ == "__main__":
    main()
