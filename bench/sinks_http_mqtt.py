"""Drain a PostgreSQL backlog into the webhook and mqtt sinks, beside bare client loops.

    .venv/bin/python bench/sinks_http_mqtt.py [--rows 200000] [--sinks webhook,mqtt]
                                              [--batch-size 100] [--runs 1]

RUNS rounds per sink, each the bare loop then Lapidus against the same receiver, and the
median of the rounds' ratios.  With Lapidus stopped, insert ROWS rows (one transaction per
10,000) into a 4-column table; then start ``lapidus -c CONFIG`` with only that sink and time
until the receiver has every event:
  * webhook: the receiver is an aiohttp server in a process of its own (this script with
    ``--serve-webhook``) that answers 200 and counts the events of each body; the bare loop is
    one aiohttp session POSTing the same number of events, cut in the same requests (same
    ``batch_size``, same headers, signed with the same secret), one request after the other
    (as the sink does: per-key order), against the same receiver;
  * mqtt: a private mosquitto on a free loopback port, and ``mosquitto_sub`` (QoS 1) writing
    a timestamp per message on ``bench/#``; the bare loop publishes the same
    payloads, QoS 1, MQTT 5 with the same user property, through aiomqtt with the same window
    of unacknowledged publishes as the sink, until every PUBACK came.
Both figures are events/s from the first event the receiver saw to the last, so the start-up of
Lapidus and PostgreSQL's decoding of the first transaction are not counted against the sink;
the time from Lapidus's start is printed as well.  For the webhook each round also prints the
requests and body bytes the receiver took from each side (the same cut shows as the same
count) and the CPU per event of the bare loop's process and of Lapidus's dispatcher (from the
first event seen to the last), which the host's load moves far less than the wall time.
After Lapidus, each webhook round also drains the same backlog with ``pg_recvlogical`` alone
(pgoutput, a slot of its own, into a pipe; events/s from its first block to its exit): the
rate at which PostgreSQL itself decodes the backlog, which no sink fed from it can exceed.
The payloads of the bare loops are events of the same table encoded by Lapidus's own encoder,
so they have the same size.

Needs the local PostgreSQL (127.0.0.1:5432, user postgres; BENCH_PG_PORT=N) and
/usr/sbin/mosquitto.  The host's cores are shared by PostgreSQL, the worker, the dispatcher,
the receiver and (for mqtt) mosquitto: compare the ratio, not the absolute figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pg_drain import PG, connect, sql  # noqa: E402  (the sibling script: same server helpers)

from lapidus.events import Event, encode  # noqa: E402

DB = "lapidus_bench_sinks"
SECRET = "bench-secret"
MOSQUITTO = "/usr/sbin/mosquitto"
CEILING_SLOT = "bench_sinks_source"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


# -- the backlog ------------------------------------------------------------------------------

def make_backlog(rows: int) -> None:
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
    sql(conn, "SELECT pg_create_logical_replication_slot('bench_sinks', 'pgoutput')")
    # the same backlog once more, for PostgreSQL's own decoding of it (source_ceiling)
    sql(conn, f"SELECT pg_create_logical_replication_slot('{CEILING_SLOT}', 'pgoutput')")
    sql(conn, "CREATE PUBLICATION bench_sinks FOR ALL TABLES")
    for start in range(1, rows + 1, 10_000):
        sql(conn, "INSERT INTO items SELECT g, 'item ' || g, g / 100.0, now() "
                  "FROM generate_series(%s, %s) g", (start, min(rows, start + 9_999)))
    conn.close()


def drop_database() -> None:
    admin = connect()
    for (slot,) in sql(admin, "SELECT slot_name FROM pg_replication_slots WHERE database = %s",
                       (DB,)):
        sql(admin, "SELECT pg_drop_replication_slot(%s)", (slot,))
    sql(admin, f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
    admin.close()


def source_ceiling(rows: int) -> float:
    """Events/s of PostgreSQL's own decoding of the backlog, nothing of Lapidus running:
    ``pg_recvlogical`` (pgoutput, the publication Lapidus reads) on a slot of its own into a
    pipe this process empties, from its first block to its exit at the backlog's end.  No
    sink fed from this backlog can take events faster than the walsender sends them."""
    from lapidus.workers.postgresql.recvlogical import find_pg_recvlogical
    conn = connect(DB)
    (end_lsn,), = sql(conn, "SELECT pg_current_wal_lsn()::text")
    conn.close()
    proc = subprocess.Popen(
        [find_pg_recvlogical(), "--start", "--no-loop", "-d",
         f"host=127.0.0.1 port={PG['port']} user=postgres dbname={DB}", "--slot", CEILING_SLOT,
         "-f", "-", f"--endpos={end_lsn}", "-o", "proto_version=1",
         "-o", "publication_names=bench_sinks"], stdout=subprocess.PIPE)
    first = None
    while proc.stdout.read1(1 << 20):
        if first is None:
            first = time.perf_counter()
    ended = time.perf_counter()
    if proc.wait() != 0 or first is None:
        raise RuntimeError("pg_recvlogical failed on the backlog")
    return rows / (ended - first)


def sample_events(rows: int) -> list:
    """Encoded events shaped like the backlog's: the bare loops send these."""
    out = []
    for i in range(1, rows + 1):
        item = {"id": i, "name": f"item {i}", "price": f"{i / 100:.2f}",
                "updated_at": "2026-12-03T11:00:00.123456Z"}
        position = f"0/{0x1A000000 + i * 120:X}"
        out.append((f"bench:{position}:{i % 10_000}", i,
                    encode(Event(f"bench:{position}:{i % 10_000}", "insert", "bench", "public",
                                 "items", {"id": i}, item, None, position, "733",
                                 "2026-12-03T11:00:00.123456Z"))))
    return out


def dispatcher_cpu(lapidus_pid: int) -> float:
    """CPU seconds the dispatcher (a child of the supervisor named lapidus:dispatch) used."""
    import psutil
    for child in psutil.Process(lapidus_pid).children():
        if child.name() == "lapidus:dispatc":
            times = child.cpu_times()
            return times.user + times.system
    raise RuntimeError("no dispatcher process")


def run_lapidus(workdir: Path, plugins: dict, seen, rows: int, poll: float = 0.1) -> tuple:
    """Start Lapidus on the backlog; ``seen()`` is the count of events the receiver has.
    Returns the seconds from its start until ``seen() >= rows`` and the dispatcher's CPU
    seconds from the first event seen to the last (start-up left out; polled every ``poll``
    seconds, each poll being a request to the receiver too)."""
    config = {"state_dir": str(workdir / "state"), "log": {"format": "json", "level": "warning"},
              "backends": [{"name": "bench", "type": "postgresql", "host": "127.0.0.1",
                            "port": PG["port"], "user": "postgres", "database": DB,
                            "slot": "bench_sinks", "publication": "bench_sinks"}],
              "plugins": plugins}
    path = workdir / "lapidus.json"
    path.write_text(json.dumps(config))
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "lapidus", "-c", str(path)],
                            stdout=subprocess.DEVNULL,
                            stderr=open(workdir / "lapidus.log", "ab"), start_new_session=True)
    cpu_at_first = None
    try:
        while True:
            count = seen()
            if count and cpu_at_first is None:
                cpu_at_first = dispatcher_cpu(proc.pid)
            if count >= rows:
                return time.perf_counter() - started, dispatcher_cpu(proc.pid) - cpu_at_first
            if proc.poll() is not None:
                raise RuntimeError(f"lapidus exited; see {workdir / 'lapidus.log'}")
            time.sleep(poll)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


# -- webhook ----------------------------------------------------------------------------------

def serve_webhook(port: int) -> None:
    """The receiver process: 200 to every POST, counts events, ``GET /stats``."""
    from aiohttp import web
    stats = {"events": 0, "requests": 0, "bytes": 0, "first": None, "last": None}

    async def take(request):
        body = await request.read()
        count = int(request.headers.get("Lapidus-Events", "0"))
        now = time.time()
        if stats["first"] is None:
            stats["first"] = now
        stats["events"] += count
        stats["requests"] += 1
        stats["bytes"] += len(body)
        stats["last"] = now
        return web.Response(status=200)

    async def report(request):
        return web.json_response(stats)

    async def reset(request):
        stats.update(events=0, requests=0, bytes=0, first=None, last=None)
        return web.json_response(stats)

    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/hook", take)
    app.router.add_get("/stats", report)
    app.router.add_post("/reset", reset)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


def webhook_stats(port: int) -> dict:
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=5) as answer:
        return json.loads(answer.read())


def webhook_reset(port: int) -> None:
    import urllib.request
    urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/reset",
                                                  method="POST"), timeout=5).read()


async def bare_webhook(url: str, events: list, batch_size: int) -> None:
    """What the sink does, without Lapidus: sequential signed POSTs of batch_size events."""
    import aiohttp

    from lapidus.sinks.webhook.requests import body_of, idempotency_key, signature
    from lapidus.events import Record
    records = [Record(eid, "insert", "public", "items", (str(key),), "0/0", data)
               for eid, key, data in events]
    async with aiohttp.ClientSession(headers={"Content-Type": "application/json"}) as session:
        for i in range(0, len(records), batch_size):
            chunk = records[i:i + batch_size]
            body = body_of(chunk)
            headers = {"Idempotency-Key": idempotency_key(chunk), "Lapidus-Backend": "bench",
                       "Lapidus-Events": str(len(chunk)),
                       "Lapidus-Signature": signature(SECRET, body)}
            async with session.post(url, data=body, headers=headers) as answer:
                await answer.read()
                assert answer.status == 200


def bench_webhook(rows: int, batch_size: int, events: list, runs: int) -> dict:
    """``runs`` rounds of the bare loop then Lapidus, against one receiver process; lists of
    each round's figures.  The receiver's request and byte counts show both sides sent the
    same requests."""
    port = free_port()
    server = subprocess.Popen([sys.executable, __file__, "--serve-webhook", str(port)])
    out: dict = {key: [] for key in ("bare", "bare_wall", "lapidus", "from_start", "source",
                                     "bare_cpu", "lapidus_cpu",
                                     "bare_requests", "lapidus_requests", "bare_bytes",
                                     "lapidus_bytes")}
    try:
        wait_port(port)
        url = f"http://127.0.0.1:{port}/hook"
        for _ in range(runs):
            webhook_reset(port)
            started, cpu_started = time.perf_counter(), time.process_time()
            asyncio.run(bare_webhook(url, events, batch_size))
            out["bare_wall"].append(rows / (time.perf_counter() - started))
            out["bare_cpu"].append((time.process_time() - cpu_started) / rows * 1e6)
            stats = webhook_stats(port)
            out["bare"].append(rows / (stats["last"] - stats["first"]))
            out["bare_requests"].append(stats["requests"])
            out["bare_bytes"].append(stats["bytes"])
            webhook_reset(port)
            make_backlog(rows)
            with tempfile.TemporaryDirectory(prefix="lapidus-bench-") as tmp:
                wall, cpu = run_lapidus(Path(tmp), {"webhook": {"url": url, "secret": SECRET,
                                                                "batch_size": batch_size}},
                                        lambda: webhook_stats(port)["events"], rows)
            stats = webhook_stats(port)
            out["lapidus"].append(rows / (stats["last"] - stats["first"]))
            out["from_start"].append(rows / wall)
            out["lapidus_cpu"].append(cpu / rows * 1e6)
            out["lapidus_requests"].append(stats["requests"])
            out["lapidus_bytes"].append(stats["bytes"])
            out["source"].append(source_ceiling(rows))
            print(f"  run {len(out['bare'])}: bare {out['bare'][-1]:,.0f}, lapidus "
                  f"{out['lapidus'][-1]:,.0f} events/s, ratio "
                  f"{out['lapidus'][-1] / out['bare'][-1]:.2f}; PostgreSQL's decoding alone "
                  f"{out['source'][-1]:,.0f} events/s ({out['source'][-1] / out['bare'][-1]:.2f}"
                  f" of the bare loop); requests "
                  f"{out['bare_requests'][-1]} / {out['lapidus_requests'][-1]}, body bytes "
                  f"{out['bare_bytes'][-1]:,} / {out['lapidus_bytes'][-1]:,}; CPU per event "
                  f"{out['bare_cpu'][-1]:.1f} / {out['lapidus_cpu'][-1]:.1f} us (bare loop / "
                  f"dispatcher)", flush=True)
        return out
    finally:
        server.terminate()
        server.wait(10)


# -- mqtt -------------------------------------------------------------------------------------

def start_counter(port: int, out: Path) -> subprocess.Popen:
    """``mosquitto_sub`` (C, QoS 1, MQTT 5) writing ``<unix time> <topic>`` per message: a
    Python subscriber would be slower than the sink and measure itself.  Returns once it is
    subscribed (a warm-up message on bench/_warmup came through)."""
    counter = subprocess.Popen(["mosquitto_sub", "-h", "127.0.0.1", "-p", str(port), "-V", "5",
                                "-q", "1", "-t", "bench/#", "-F", "%U %t"],
                               stdout=open(out, "wb"))
    deadline = time.monotonic() + 20
    while b"_warmup" not in out.read_bytes():
        if time.monotonic() > deadline:
            raise RuntimeError("mosquitto_sub did not subscribe")
        subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(port), "-q", "1",
                        "-t", "bench/_warmup", "-m", "x"], check=True)
        time.sleep(0.1)
    return counter


def mqtt_stats(path: Path) -> dict:
    data = path.read_bytes()
    lines = [line for line in data[:data.rfind(b"\n") + 1].splitlines()
             if not line.endswith(b"_warmup")]
    if not lines:
        return {"n": 0, "first": None, "last": None}
    return {"n": len(lines), "first": float(lines[0].split()[0]),
            "last": float(lines[-1].split()[0])}


def bare_properties(events: list) -> list:
    """paho ``Properties`` of each message, made before the clock starts: building them
    (0.4 ms each) would otherwise be most of what the bare loop measures."""
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties
    out = []
    for eid, key, data in events:
        props = Properties(PacketTypes.PUBLISH)
        props.UserProperty = [("Lapidus-Id", eid), ("Lapidus-Backend", "bench"),
                              ("Lapidus-Type", "insert"), ("Lapidus-Position", "0/0")]
        out.append(props)
    return out


async def bare_mqtt(port: int, events: list, properties: list, window: int) -> None:
    """aiomqtt as a user would drive it for throughput: ``publish`` awaited per message,
    ``window`` of them at a time, paho's own in-flight limit off (with one, paho rescans every
    unacknowledged message on each PUBACK)."""
    import logging

    import aiomqtt
    quiet = logging.getLogger("bench.aiomqtt")
    quiet.addHandler(logging.NullHandler())
    quiet.propagate = False
    async with aiomqtt.Client("127.0.0.1", port, protocol=aiomqtt.ProtocolVersion.V5,
                              max_inflight_messages=0, max_queued_outgoing_messages=0,
                              logger=quiet) as client:
        client.pending_calls_threshold = window + 1
        pending = set()
        for (eid, key, data), props in zip(events, properties):
            pending.add(asyncio.ensure_future(client.publish(
                f"bench/public/items/{key}", data, qos=1, properties=props)))
            if len(pending) >= window:
                finished, pending = await asyncio.wait(pending,
                                                       return_when=asyncio.FIRST_COMPLETED)
                for task in finished:
                    task.result()
        await asyncio.gather(*pending)


def bench_mqtt(rows: int, events: list) -> dict:
    from lapidus.sinks.mqtt.options import OPTIONS
    window = OPTIONS["max_inflight"].default
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="lapidus-bench-mqtt-")
    conf = Path(tmp) / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\n"
                    f"max_inflight_messages 0\nmax_queued_messages 0\n")
    broker = subprocess.Popen([MOSQUITTO, "-c", str(conf)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    counters = []
    try:
        wait_port(port)
        results = {}
        for side in ("bare", "lapidus"):
            out = Path(tmp) / f"{side}.txt"
            counter = start_counter(port, out)
            counters.append(counter)
            if side == "bare":
                properties = bare_properties(events)
                started = time.perf_counter()
                asyncio.run(bare_mqtt(port, events, properties, window))
                results["bare_wall"] = rows / (time.perf_counter() - started)
                while mqtt_stats(out)["n"] < rows:
                    time.sleep(0.2)
            else:
                make_backlog(rows)
                with tempfile.TemporaryDirectory(prefix="lapidus-bench-") as work:
                    wall, _ = run_lapidus(Path(work), {"mqtt": {
                        "url": f"mqtt://127.0.0.1:{port}", "topic_prefix": "bench"}},
                        lambda: mqtt_stats(out)["n"], rows, poll=0.2)
                results["from_start"] = rows / wall
            stats = mqtt_stats(out)
            results[side] = rows / (stats["last"] - stats["first"])
            counter.terminate()
            counter.wait(10)
        return results
    finally:
        for counter in counters:
            if counter.poll() is None:
                counter.kill()
        broker.terminate()
        broker.wait(10)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve-webhook":
        serve_webhook(int(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--sinks", default="webhook,mqtt")
    parser.add_argument("--batch-size", type=int, default=100, help="webhook batch_size")
    parser.add_argument("--runs", type=int, default=1,
                        help="rounds of bare loop then Lapidus; medians are reported")
    args = parser.parse_args()
    events = sample_events(args.rows)
    size = sum(len(data) for _, _, data in events) / len(events)
    print(f"{args.rows:,} events of {size:.0f} bytes of JSON each, {args.runs} run(s) per sink")
    try:
        for sink in args.sinks.split(","):
            if sink == "webhook":
                label = f"webhook (batch_size {args.batch_size})"
                print(f"{label}:", flush=True)
                r = bench_webhook(args.rows, args.batch_size, events, args.runs)
            elif sink == "mqtt":
                label = "mqtt (QoS 1, MQTT 5)"
                print(f"{label}:", flush=True)
                r = {}
                for _ in range(args.runs):
                    for key, value in bench_mqtt(args.rows, events).items():
                        r.setdefault(key, []).append(value)
                    print(f"  run {len(r['bare'])}: bare {r['bare'][-1]:,.0f}, lapidus "
                          f"{r['lapidus'][-1]:,.0f} events/s, ratio "
                          f"{r['lapidus'][-1] / r['bare'][-1]:.2f}", flush=True)
            else:
                raise SystemExit(f"unknown sink {sink!r}")
            median = statistics.median
            ratios = [lap / bare for lap, bare in zip(r["lapidus"], r["bare"])]
            print(f"  median of {args.runs}:")
            print(f"  bare client loop : {median(r['bare']):,.0f} events/s at the receiver "
                  f"({median(r['bare_wall']):,.0f} events/s wall)")
            print(f"  lapidus          : {median(r['lapidus']):,.0f} events/s at the receiver "
                  f"({median(r['from_start']):,.0f} events/s from lapidus's start)")
            if "source" in r:
                ceilings = [source / bare for source, bare in zip(r["source"], r["bare"])]
                print(f"  PostgreSQL alone : {median(r['source']):,.0f} events/s "
                      f"(pg_recvlogical into a pipe, nothing of Lapidus running): the most "
                      f"any sink fed by this backlog can take, {median(ceilings):.2f} of the "
                      f"bare loop (runs: {', '.join(f'{x:.2f}' for x in ceilings)})")
            if "lapidus_cpu" in r:
                print(f"  CPU per event    : bare loop {median(r['bare_cpu']):.1f} us, "
                      f"dispatcher {median(r['lapidus_cpu']):.1f} us (first to last event)")
            print(f"  ratio lapidus / bare loop, median of the runs' ratios: "
                  f"{median(ratios):.2f} (runs: {', '.join(f'{x:.2f}' for x in ratios)})")
    finally:
        drop_database()


if __name__ == "__main__":
    main()
