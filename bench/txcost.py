"""Lapidus's CPU per small transaction, by process, beside the database server's CPU.

    .venv/bin/python bench/txcost.py [--backends pg,mysql] [--sinks stdout,jetstream]
                                     [--rate 1000] [--duration 15] [--runs 1]
                                     [--lingers 0,2] [--baseline DIR]
                                     [--out /tmp/lapidus-txcost.json]

For every backend, sink and run: one ``lapidus`` with one backend (the databases and generator
of ``bench/latency.py``), warmed up, then ``--rate`` single-row transactions a second for
``--duration`` seconds from the open-loop generator (4 connections). Measured over the window
from the generator's start until the last row arrived:

* CPU seconds of each Lapidus process (supervisor, dispatcher, worker, ``pg_recvlogical``,
  the fork server), divided by the transactions: **µs of Lapidus CPU a transaction**;
* CPU of the database server in the same window (PostgreSQL: every server process, the
  walsender and the generator's backends included, the postmaster's reaped children too;
  MariaDB: ``mariadbd``): Lapidus's CPU as a ratio of it;
* commit-to-output latency: ``stdout``, the time a reader of Lapidus's standard output got the
  row's line; ``jetstream``, the time a push consumer of the stream got it (the subscriber of
  ``bench/latency.py``). Rows missing must be 0.

With ``--baseline DIR`` (another checkout, e.g. ``git worktree add /tmp/base <commit>`` with the
compiled modules of ``lapidus/`` copied in), every run of this checkout follows a run of that
code under the same conditions, and the ratio of the two is printed (its own settings: no
``--lingers``).

Talks to 127.0.0.1 only; creates and drops ``lapidus_bench_latency`` (both servers), its slot
and the streams ``LATBENCH_*``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Dict, List

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import psutil  # noqa: E402

import latency as lat  # noqa: E402

ROW_ID = re.compile(rb'"item":\{"id":(-?\d+)')


def config(workdir: Path, backend: str, sink: str, stream: str | None,
           linger: float | None = None) -> Path:
    """One backend; the nats plugin in JetStream mode, or no plugin (``--stdout`` adds it);
    ``linger``: the backend's ``batch_linger`` (None: Lapidus's default)."""
    path = lat.lapidus_config(workdir, [backend], "jetstream", stream)
    conf = json.loads(path.read_text())
    if linger is not None:
        conf["backends"][0]["batch_linger"] = linger
    if sink == "stdout":
        conf["plugins"] = {}
    path.write_text(json.dumps(conf))
    return path


class StdoutReader:
    """Reads Lapidus's standard output in a thread: arrival time of every row's line."""

    def __init__(self, proc: subprocess.Popen):
        self.arrivals: Dict[int, tuple] = {}
        self.first = threading.Event()
        self.thread = threading.Thread(target=self._read, args=(proc.stdout,), daemon=True)
        self.thread.start()

    def _read(self, pipe) -> None:
        fd = pipe.fileno()
        rest = b""
        while True:
            data = os.read(fd, 1 << 20)
            now = time.time()
            if not data:
                return
            lines = (rest + data).split(b"\n")
            rest = lines.pop()
            for line in lines:
                match = ROW_ID.search(line)
                if match is None:
                    continue
                row_id = int(match.group(1))
                if row_id < 0:
                    self.first.set()
                else:
                    self.arrivals.setdefault(row_id, (now, None))

    def ready(self, timeout: float) -> bool:
        return self.first.wait(timeout)


def server_cpu(backend: str) -> float:
    """CPU seconds the database server used so far (live processes and reaped children)."""
    total = 0.0
    names = ("postgres",) if backend == "pg" else ("mariadbd", "mysqld")
    for p in psutil.process_iter(["name"]):
        if p.info["name"] not in names:
            continue
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
        try:
            parent = p.parent()
        except psutil.NoSuchProcess:
            parent = None
        if parent is None or parent.name() not in names:       # the postmaster
            total += t.children_user + t.children_system
    return total


def lapidus_cpu(proc: subprocess.Popen) -> Dict[str, float]:
    out = {}
    for name, p in lat.lapidus_processes(proc).items():
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        kind = "fork server" if name == "worker forker" else \
            "worker" if name.startswith("worker ") else name
        out[kind] = out.get(kind, 0.0) + t.user + t.system
    return out


def start_lapidus(config: Path, log: Path, *, to_stdout: bool,
                  code: str | None = None) -> subprocess.Popen:
    """``lapidus -c config`` (``--stdout`` with ``to_stdout``, its standard output a pipe),
    logging to ``log``; ``code``: another checkout's directory, whose Lapidus runs instead
    (from that directory: ``-m`` puts the working directory first on the path)."""
    argv = [sys.executable, "-m", "lapidus", "-c", str(config)]
    if to_stdout:
        argv.append("--stdout")
    env = dict(os.environ, PYTHONPATH=code) if code else None
    return subprocess.Popen(argv, stdout=subprocess.PIPE if to_stdout else subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL, env=env, cwd=code,
                            stderr=open(log, "ab"), start_new_session=True)


def run_one(backend: str, sink: str, rate: float, duration: float, first_id: int,
            tmp: Path, linger: float | None = None, code: str | None = None) -> dict:
    lat.setup_databases([backend])
    stream = f"LATBENCH_{uuid.uuid4().hex[:8].upper()}" if sink == "jetstream" else None
    if stream:
        lat.create_stream(stream)
    path = config(tmp, backend, sink, stream, linger)
    proc = start_lapidus(path, tmp / "lapidus.log", to_stdout=sink == "stdout", code=code)
    subscriber = reader = None
    try:
        if sink == "stdout":
            reader = StdoutReader(proc)
            lat.warm_up(backend, reader.ready)
        else:
            lat.warm_up(backend, lat.nats_seen(f"{lat.PREFIX}.>"))
            deliver = f"_latbench_deliver.{uuid.uuid4().hex[:8]}"
            subscriber = lat.Subscriber({"js": deliver}, int(rate * duration),
                                        time.time() + duration + 90, tmp / "sub.pkl")
            lat.create_push_consumer(stream, deliver)
        time.sleep(1.0)          # the warm-up's acks and checkpoint settle
        cpu0, server0, t0 = lapidus_cpu(proc), server_cpu(backend), time.monotonic()
        gen = lat.Generator(backend, rate, duration, first_id, tmp / "gen.pkl").result()
        expected = gen["rows"]
        if reader is not None:
            deadline = time.monotonic() + 60
            while len(reader.arrivals) < expected and time.monotonic() < deadline:
                time.sleep(0.05)
            arrivals = dict(reader.arrivals)
        else:
            records = subscriber.records(timeout=120)
            import orjson
            arrivals = {}
            for _sid, t, row_id, payload in records:
                if row_id is not None and row_id >= 0 and row_id not in arrivals:
                    arrivals[row_id] = (t, orjson.loads(payload)["item"]["ts"])
        cpu1, server1, t1 = lapidus_cpu(proc), server_cpu(backend), time.monotonic()
    finally:
        if subscriber is not None:
            subscriber.stop()
        lat.stop_lapidus(proc)
        if stream:
            lat.delete_stream(stream)
        if backend == "pg":
            lat.drop_pg_slot(lat.PG_SLOT)
    commits = len(gen["commits"])
    per_process = {k: cpu1.get(k, 0.0) - cpu0.get(k, 0.0) for k in cpu1}
    lapidus_total = sum(per_process.values())
    server = server1 - server0
    result = lat.analyse(gen, arrivals, duration)
    for key in ("curve", "throughput", "_raw"):
        result.pop(key, None)
    result.update(
        backend=backend, sink=sink, rate=rate, linger=linger, code=code or "this checkout",
        commits=commits, window_s=t1 - t0,
        us_per_tx={k: v / commits * 1e6 for k, v in per_process.items()},
        lapidus_us_per_tx=lapidus_total / commits * 1e6,
        lapidus_cores=lapidus_total / (t1 - t0),
        server_cpu_s=server, lapidus_over_server=lapidus_total / server if server else None)
    return result


def report(r: dict) -> None:
    parts = ", ".join(f"{k} {v:.0f}" for k, v in sorted(r["us_per_tx"].items()))
    lat_ms = r["from_commit"]
    linger = "default" if r["linger"] is None else f"{r['linger'] * 1000:g} ms"
    print(f"[{r['code']}] {r['backend']:5} {r['sink']:9} linger {linger:7} {r['commits']} tx: "
          f"Lapidus "
          f"{r['lapidus_us_per_tx']:.0f} µs/tx ({parts}); {r['lapidus_cores']:.3f} cores; "
          f"/ server CPU {r['lapidus_over_server']:.3f}; latency p50 "
          f"{lat_ms.get('p50', float('nan')):.2f} p99 {lat_ms.get('p99', float('nan')):.2f} ms; "
          f"missing {r['missing']}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="pg,mysql")
    parser.add_argument("--sinks", default="stdout,jetstream")
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--duration", type=float, default=15.0)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--lingers", default="",
                        help="comma-separated batch_linger values in ms to compare "
                             "(default: Lapidus's default only)")
    parser.add_argument("--baseline", default="",
                        help="a checkout of other Lapidus code (git worktree, its compiled "
                             "modules copied in) run before each run of this one, for ratios")
    parser.add_argument("--out", default="/tmp/lapidus-txcost.json")
    args = parser.parse_args()
    results: List[dict] = []
    first_id = 1
    lingers = [float(ms) / 1000 for ms in args.lingers.split(",")] if args.lingers else [None]
    codes = [args.baseline, None] if args.baseline else [None]
    if args.baseline:
        lingers = lingers[:1] if lingers == [None] else lingers
    try:
        for _ in range(args.runs):
            for backend in args.backends.split(","):
                for sink in args.sinks.split(","):
                    for linger, code in itertools.product(lingers, codes):
                        with tempfile.TemporaryDirectory(prefix="lapidus-txcost-") as tmp:
                            r = run_one(backend, sink, args.rate, args.duration, first_id,
                                        Path(tmp), linger if code is None else None, code)
                        first_id += int(args.rate * args.duration) + 10
                        report(r)
                        if code is None and args.baseline:
                            base = results[-1]["lapidus_us_per_tx"]
                            print(f"  ratio to the baseline run before it: "
                                  f"{r['lapidus_us_per_tx'] / base:.2f}", flush=True)
                        results.append(r)
    finally:
        lat.drop_databases(args.backends.split(","))
    Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
