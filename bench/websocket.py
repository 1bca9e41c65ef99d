"""Commit-to-client latency of the websocket sink with 1, 50 and 200 clients, beside the same
events to a core NATS subscriber, in one run.

    .venv/bin/python bench/websocket.py [--clients 1,50,200] [--rate 1000] [--duration 20]
                                        [--runs 1] [--out /tmp/lapidus-websocket.json]

For every client count and run, one ``lapidus`` with two sinks on one PostgreSQL backend:
``websocket`` (on a free loopback port) and ``nats`` in core mode. The generator of
bench/latency.py commits one row per transaction, open loop, at ``--rate`` rows/s; every
websocket client subscribes to everything, and the raw core NATS subscriber of bench/latency.py
receives the same events. Latency of a row at a client = the time its frame reached the
client's socket minus the time the generator's COMMIT returned (same host's CLOCK_REALTIME);
pooled over the measured clients and every row. The NATS figure of the same run is the
baseline: the websocket path is that path with the websocket sink's work instead of nats'.

The clients are raw sockets in helper processes (``--client-procs``, one per 100 clients by
default): the handshake written by hand, so that the measuring side costs the machine little.
``--measured`` of them (10) parse every frame by its length as it arrives and read the row id
from the ``pk`` bytes; the others only count the bytes they receive, which must come to the
measured clients' count (every client subscribes to everything, and the sink sends no pings
during a run): "clients short of the stream" must be 0, as "missing" must. The others read
their sockets every ``--sweep-ms`` (20) instead of at every frame: they stand for clients on
other machines, and reading at every frame made the two helper processes the host's largest
users of CPU after the dispatcher, which the measured path then waited for. The sink writes
the same either way (one write per client and round; a write wakes no reader that is not
waiting, as for a client on another machine); ``--sweep-ms 0`` reads as data arrives.

Talks to 127.0.0.1 only: PostgreSQL 5432 and NATS 4222 (BENCH_PG_PORT, BENCH_NATS_PORT);
creates and drops the database ``lapidus_bench_latency`` and its slot (shared with
bench/latency.py: do not run both at once).
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import os
import pickle
import selectors
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import latency as L  # noqa: E402

PK = b'"pk":{"id":'


# ------------------------------------------------------------------------------ clients

def handshake(host: str, port: int, path: str) -> tuple:
    sock = socket.create_connection((host, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                 f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                 f"Sec-WebSocket-Version: 13\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            raise SystemExit("websocket client: the server closed during the handshake")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 101"):
        raise SystemExit(f"websocket client: refused: {head.splitlines()[0]!r}")
    return sock, bytearray(rest)


def pong(sock: socket.socket, payload: bytes) -> None:
    """A client's frames are masked (RFC 6455 5.3); a zero mask leaves the payload as is."""
    sock.sendall(bytes([0x8A, 0x80 | len(payload)]) + b"\0\0\0\0" + payload)


def clients_main(count: int, measured: int, url: str, first_id: int, expected: int,
                 deadline: float, sweep: float, out: str) -> None:
    """``count`` clients; prints "ready" once all are connected.  Clients ``0 .. measured - 1``
    (connected spread among the others) parse every frame as it arrives and record the
    arrival time of each row ``first_id`` .. ``first_id + expected - 1``; the others only
    count the bytes they receive (the same
    stream as the measured ones, byte for byte: every client subscribes to everything), and
    read them every ``sweep`` seconds (0: as they arrive), which keeps the measuring side's
    CPU small at 200 clients."""
    import numpy as np

    host, port = url.split("/")[2].rsplit(":", 1)
    path = "/" + url.split("/", 3)[3]
    # The sink writes to its clients in the order they connected, so a client's place in a
    # round of writes adds to its latency: the measured clients connect spread evenly among
    # the others (every count/measured-th), not first.
    step = max(1, count // measured)
    conns: list = [None] * count
    unmeasured = iter(range(measured, count))
    for place in range(count):
        index = place // step if place % step == 0 and place // step < measured \
            else next(unmeasured)
        conns[index] = handshake(host, int(port), path)
    print("ready", flush=True)
    arrivals = np.full((measured, expected), np.nan)
    seen = [0] * measured
    received = [len(buf) for _, buf in conns]
    selector = selectors.DefaultSelector()
    swept = []          # the unmeasured clients read in sweeps
    for index, (sock, _) in enumerate(conns):
        sock.setblocking(False)
        if sweep and index >= measured:
            swept.append(index)
        else:
            selector.register(sock, selectors.EVENT_READ, index)
    finished = set()

    def finish(index: int) -> None:
        if index not in finished:
            finished.add(index)
            if index in swept:
                swept.remove(index)
            else:
                selector.unregister(conns[index][0])

    def count_bytes(index: int, data: bytes) -> None:
        if not data:
            finish(index)
            return
        received[index] += len(data)
        if target is not None and received[index] >= target:
            finish(index)

    target = None       # the measured clients' byte count once they have every row
    next_sweep = time.monotonic() + sweep
    while len(finished) < count and time.time() < deadline:
        if swept and time.monotonic() >= next_sweep:
            for index in list(swept):
                while index in swept:
                    try:
                        count_bytes(index, conns[index][0].recv(1 << 20))
                    except BlockingIOError:
                        break
            next_sweep = time.monotonic() + sweep
        wait = max(0.0, next_sweep - time.monotonic()) if swept else 0.5
        for key, _ in selector.select(wait):     # epoll: sleeps too with nothing registered
            index = key.data
            sock, buf = conns[index]
            try:
                data = sock.recv(1 << 20)
            except BlockingIOError:
                continue
            now = time.time()
            if index >= measured:
                count_bytes(index, data)
                continue
            if not data:
                finish(index)
                continue
            received[index] += len(data)
            buf += data
            pos, size = 0, len(buf)
            row = arrivals[index]
            while size - pos >= 2:
                length, header = buf[pos + 1] & 0x7F, 2
                if length == 126:
                    if size - pos < 4:
                        break
                    length, header = int.from_bytes(buf[pos + 2:pos + 4], "big"), 4
                elif length == 127:
                    if size - pos < 10:
                        break
                    length, header = int.from_bytes(buf[pos + 2:pos + 10], "big"), 10
                end = pos + header + length
                if end > size:
                    break
                opcode = buf[pos] & 0x0F
                if opcode == 1:
                    at = buf.find(PK, pos + header, end) + len(PK)
                    stop = buf.find(b"}", at, end)
                    row_id = int(buf[at:stop]) - first_id
                    if 0 <= row_id < expected and row[row_id] != row[row_id]:   # NaN: new
                        row[row_id] = now
                        seen[index] += 1
                elif opcode == 9:
                    pong(sock, bytes(buf[pos + header:end]))
                pos = end
            del buf[:pos]
            if seen[index] >= expected:
                finish(index)
                if all(n >= expected for n in seen):
                    target = max(received[:measured])
                    for other in range(measured, count):
                        if received[other] >= target:
                            finish(other)
    with open(out, "wb") as f:
        pickle.dump({"arrivals": arrivals, "received": received, "target": target}, f)
    print("done", flush=True)


class Clients(L.RecordingProcess):
    def __init__(self, count: int, measured: int, url: str, first_id: int, expected: int,
                 deadline: float, sweep: float, out: Path):
        self.out = out
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--clients-of", str(count), str(measured), url,
             str(first_id), str(expected), str(deadline), str(sweep), str(out)],
            stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError(f"websocket clients did not connect: {line!r}")


# ------------------------------------------------------------------------------ one run

def run(clients: int, procs: int, measured: int, rate: float, duration: float, first_id: int,
        sweep: float, tmp: Path) -> dict:
    port = _free_port()
    config = L.lapidus_config(tmp, ["pg"], "core", None)
    data = json.loads(config.read_text())
    # no pings during a run: the unmeasured clients' byte counts must be the event frames only
    data["plugins"]["websocket"] = {"listen": f"127.0.0.1:{port}", "ping_interval": 3600}
    config.write_text(json.dumps(data))
    proc = L.start_lapidus(tmp, config)
    groups: List[Clients] = []
    subscriber = None
    try:
        L.warm_up("pg", L.nats_seen(f"{L.PREFIX}.>"))
        expected = int(rate * duration)
        deadline = time.time() + duration + 90
        url = f"ws://127.0.0.1:{port}/events"
        for n in range(procs):
            share = clients // procs + (1 if n < clients % procs else 0)
            mine = measured // procs + (1 if n < measured % procs else 0)
            groups.append(Clients(share, min(share, max(1, mine)), url, first_id, expected,
                                  deadline, sweep, tmp / f"ws{n}.pkl"))
        subscriber = L.Subscriber({"core": f"{L.PREFIX}.>"}, expected, deadline,
                                  tmp / "sub.pkl")
        gen = L.Generator("pg", rate, duration, first_id, tmp / "gen.pkl").result()
        records = subscriber.records(timeout=deadline - time.time() + 30)
        parts = [g.records(timeout=deadline - time.time() + 30) for g in groups]
        cpu = {}
        for name, p in L.lapidus_processes(proc).items():
            try:
                t = p.cpu_times()
                cpu[name] = round(t.user + t.system, 2)
            except L.psutil.NoSuchProcess:
                pass
    finally:
        for group in groups:
            group.stop()
        if subscriber:
            subscriber.stop()
        L.stop_lapidus(proc)
        L.keep_log(tmp, f"websocket-{clients}")
        L.drop_pg_slot(L.PG_SLOT)
    import numpy as np
    import orjson
    arrivals = np.concatenate([part["arrivals"] for part in parts])
    target = max(part["target"] or 0 for part in parts)
    short = sum(1 for part in parts for n in part["received"] if n < target)
    committed = np.full(expected, np.nan)
    for first, rows, _, _, done in gen["commits"]:
        for i in range(first, first + rows):
            if 0 <= i - first_id < expected:
                committed[i - first_id] = done
    delays = (arrivals - committed[None, :]) * 1000.0
    got = delays[~np.isnan(delays)]
    nats = {}
    for sid, t, row_id, payload in records:
        if row_id is not None and row_id >= first_id and row_id not in nats:
            nats[row_id] = (t, orjson.loads(payload)["item"]["ts"])
    return {"clients": clients, "client_procs": procs, "measured_clients": len(arrivals),
            "sweep_seconds": sweep,
            "websocket": {**L.summarize(got.tolist()),
                          "missing": int(np.isnan(delays).sum()),
                          "clients_short_of_the_stream": short},
            "nats_core": {k: v for k, v in L.analyse(gen, nats, duration).items()
                          if k in ("from_commit", "missing", "achieved_rate")},
            "cpu_seconds": cpu}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="1,50,200")
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--client-procs", type=int, default=0,
                        help="helper processes for the clients (0: one per 100 clients)")
    parser.add_argument("--measured", type=int, default=10,
                        help="clients that time every row (the others count bytes)")
    parser.add_argument("--quiet-busy", type=float, default=30.0)
    parser.add_argument("--out", default="/tmp/lapidus-websocket.json")
    parser.add_argument("--sweep-ms", type=float, default=20.0,
                        help="the unmeasured clients read their sockets every this many ms "
                             "(0: as data arrives)")
    parser.add_argument("--clients-of", nargs=8, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.clients_of:
        count, measured, url, first, expected, deadline, sweep, out = args.clients_of
        clients_main(int(count), int(measured), url, int(first), int(expected),
                     float(deadline), float(sweep), out)
        return
    L.setup_databases(["pg"])
    results = {"argv": sys.argv[1:], "rate": args.rate, "duration": args.duration,
               "runs": []}
    first_id = 1
    try:
        for n in range(args.runs):
            for clients in [int(c) for c in args.clients.split(",")]:
                procs = args.client_procs or max(1, math.ceil(clients / 100))
                quiet = L.wait_quiet(args.quiet_busy)
                with tempfile.TemporaryDirectory(prefix="lapidus-wsbench-") as tmp:
                    result = run(clients, procs, min(clients, args.measured), args.rate,
                                 args.duration, first_id, args.sweep_ms / 1000.0,
                                 Path(tmp))
                first_id += int(args.rate * args.duration) + 1
                result.update(run_number=n, quiet=quiet)
                results["runs"].append(result)
                ws, nats = result["websocket"], result["nats_core"]
                print(f"{clients:>4} clients: websocket {L.fmt(ws)} (missing {ws['missing']}, "
                      f"clients short of the stream {ws['clients_short_of_the_stream']}); "
                      f"nats core {L.fmt(nats['from_commit'])} (missing {nats['missing']})",
                      flush=True)
    finally:
        L.drop_databases(["pg"])
        Path(args.out).write_text(json.dumps(results, indent=1))
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
