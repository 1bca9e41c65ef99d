"""Drain a PostgreSQL backlog into NATS: Lapidus (core and JetStream) beside bare nats-py loops.

    .venv/bin/python bench/nats_throughput.py [--rows 200000] [--runs 1] [--modes core,jetstream]
                                              [--batch-size N] [--decoder pgoutput|wal2json]

Per run and mode: with Lapidus stopped, insert ROWS rows (one transaction) into a 4-column
table, then start ``lapidus -c CONFIG`` with the nats plugin (and the ``--decoder``, by default
pgoutput, Lapidus's default where the server allows it) and time from its start to the
last message seen by a subscriber (a separate process counting messages on ``bench.>`` with a
minimal protocol reader, so it costs the publisher as little CPU as possible).  In JetStream
mode the stream must also hold ROWS messages; it is created before the clock starts, on both
sides.  In the same run, bare nats-py loops publish the
same number of payloads of the same shape to the same subscriber:
  * core:       ``nc.publish`` of each payload with Lapidus's headers, then ``flush()``;
  * jetstream:  the same with a reply inbox and a window of 4096 unacknowledged publishes
                (what the sink does), until every ack arrived.
Before each Lapidus run, ``pg_recvlogical`` on a second slot of the same backlog times how
long PostgreSQL itself takes to send the first change (it decodes the whole transaction
first): part of every "from start" figure that no client can avoid.
Needs the local PostgreSQL (127.0.0.1:5432, user postgres) and nats-server with JetStream
(127.0.0.1:4222); other ports with BENCH_PG_PORT=N, BENCH_NATS_PORT=N.  Prints events/s of
each and the ratio Lapidus / bare loop.

The host has 2 cores shared by PostgreSQL, pg_recvlogical, the Lapidus worker and dispatcher,
nats-server and the subscriber: anything else running at the same time (another benchmark)
shows as a run where the bare loop is slow too.  Compare the per-run ratios, not only medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import select
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil

from nats_wire import CONNECT, answer_control, read_items  # noqa: E402
from pg_decoders import plugin_options  # noqa: E402  (Lapidus's options for pg_recvlogical)
from pg_drain import PG, connect, sql  # noqa: E402  (the sibling script: same server helpers)

from lapidus.workers.postgresql.recvlogical import find_pg_recvlogical  # noqa: E402

NATS = ("127.0.0.1", int(os.environ.get("BENCH_NATS_PORT", "4222")))
NATS_URL = f"nats://{NATS[0]}:{NATS[1]}"
DB = "lapidus_bench_nats"
PUBLICATION = "bench_nats"
BACKEND_EXTRA: dict = {}


# -- the subscriber (its own process) -------------------------------------------------------

def count_messages(subject: str, expected: int) -> None:
    """Subscriber process: prints "ready", then the CLOCK_MONOTONIC time of message ``expected``
    and of the first one.  Parses the NATS protocol by hand (MSG/HMSG sizes) to stay cheap."""
    sock = socket.create_connection(NATS)
    sock.sendall(CONNECT + f"SUB {subject} 1\r\nPING\r\n".encode())
    buf = bytearray()
    seen, first, ready = 0, None, False
    while seen < expected:
        data = sock.recv(1 << 20)
        if not data:
            raise SystemExit("subscriber: connection closed")
        buf += data
        items, used = read_items(buf)
        for line, _, start, _ in items:
            if start < 0:
                ready = answer_control(sock, line, ready)
                continue
            seen += 1
            if first is None:
                first = time.monotonic()
        del buf[:used]
    print(f"done {time.monotonic():.6f} {first:.6f}", flush=True)


class Subscriber:
    def __init__(self, subject: str, expected: int):
        self.proc = subprocess.Popen([sys.executable, __file__, "--subscriber", subject,
                                      str(expected)], stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError(f"subscriber did not start: {line!r}")

    def wait(self, timeout: float = 600, publisher: "subprocess.Popen | None" = None):
        """CLOCK_MONOTONIC times at which the last and the first message arrived.  With
        ``publisher`` (Lapidus): fails as soon as that process exits before the last message
        (a FATAL backend), instead of waiting out ``timeout``."""
        deadline = time.monotonic() + timeout
        while publisher is not None:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.5)
            if ready:
                break
            if publisher.poll() is not None:
                raise RuntimeError(f"lapidus exited with code {publisher.returncode} before "
                                   f"the last message; see its log")
            if time.monotonic() > deadline:
                raise RuntimeError("no last message within the timeout")
        line = self.proc.stdout.readline().split()
        self.proc.wait(timeout)
        if not line or line[0] != "done":
            raise RuntimeError("subscriber failed")
        return float(line[1]), float(line[2])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


# -- PostgreSQL -----------------------------------------------------------------------------

def drop_database():
    admin = connect()
    for (slot,) in sql(admin, "SELECT slot_name FROM pg_replication_slots WHERE database = %s",
                       (DB,)):
        sql(admin, "SELECT pg_drop_replication_slot(%s)", (slot,))
    sql(admin, f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
    admin.close()


def make_backlog(rows: int, decoder: str) -> None:
    drop_database()
    admin = connect()
    sql(admin, f"CREATE DATABASE {DB}")
    admin.close()
    conn = connect(DB)
    sql(conn, "CREATE TABLE items (id int PRIMARY KEY, name text, price numeric(10,2), "
              "updated_at timestamptz)")
    # pgoutput reads the publication as of each change: it must exist before the slot.
    sql(conn, f"CREATE PUBLICATION {PUBLICATION} FOR ALL TABLES")
    sql(conn, "SELECT pg_create_logical_replication_slot('bench_lapidus', %s)", (decoder,))
    sql(conn, "SELECT pg_create_logical_replication_slot('bench_first', %s)", (decoder,))
    sql(conn, "INSERT INTO items SELECT g, 'item ' || g, g / 100.0, now() "
              "FROM generate_series(1, %s) g", (rows,))
    conn.close()


def first_change_delay(decoder: str) -> float:
    """Seconds from starting ``pg_recvlogical`` on a second slot of the backlog to its first
    byte: PostgreSQL decodes a whole transaction before it sends its first change, so a drain
    measured from Lapidus's start includes this wait, which a bare publish loop never pays.
    Measured before Lapidus starts; the slot is dropped."""
    options = [arg for opt in plugin_options(decoder, PUBLICATION) for arg in ("-o", opt)]
    started = time.monotonic()
    proc = subprocess.Popen(
        [find_pg_recvlogical(), "--start", "--no-loop", "-f", "-", "--slot", "bench_first",
         "-d", f"host=127.0.0.1 port={PG['port']} user=postgres dbname={DB}", *options],
        stdout=subprocess.PIPE)
    try:
        if not proc.stdout.read(1):
            raise RuntimeError("pg_recvlogical ended without output")
        return time.monotonic() - started
    finally:
        proc.kill()
        proc.wait()
        admin = connect(DB)
        sql(admin, "SELECT pg_drop_replication_slot('bench_first')")
        admin.close()


# -- runs -----------------------------------------------------------------------------------

def drain_lapidus(workdir: Path, rows: int, mode: str, stream: str):
    """(seconds from starting lapidus to the last message, seconds from first to last)."""
    plugin = {"server": NATS_URL, "subject_prefix": "bench"}
    if mode == "jetstream":
        plugin.update(jetstream=True, stream=stream, subjects=["bench.>"])
    config = {
        "state_dir": str(workdir / "state"), "log": {"format": "json", "level": "warning"},
        "backends": [{"name": "bench", "type": "postgresql", "host": "127.0.0.1",
                      "port": PG["port"], "user": "postgres", "database": DB,
                      "slot": "bench_lapidus", "publication": PUBLICATION,
                      "publication_mode": "existing", **BACKEND_EXTRA}],
        "plugins": {"nats": plugin},
    }
    path = workdir / "lapidus.json"
    path.write_text(json.dumps(config))
    if mode == "jetstream":
        # Made before the clock starts, as for the bare loop: creating a stream (about 0.3 s
        # here) is a first-start cost, not a per-drain one.  Lapidus finds it and checks it.
        asyncio.run(create_stream(stream))
    subscriber = Subscriber("bench.>", rows)
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "lapidus", "-c", str(path)],
                            stdout=subprocess.DEVNULL, stderr=open(workdir / "lapidus.log", "ab"),
                            start_new_session=True)
    try:
        try:
            last, first = subscriber.wait(publisher=proc)
        except RuntimeError as exc:
            tail = (workdir / "lapidus.log").read_text().splitlines()[-3:]
            raise SystemExit(f"{exc}:\n" + "\n".join(tail)) from None
        elapsed = last - started
        sup = psutil.Process(proc.pid)
        cpu = {"supervisor": sum(sup.cpu_times()[:2])}
        for child in sup.children(recursive=True):
            cpu[child.name()] = sum(child.cpu_times()[:2])
        print(f"  {mode}: CPU seconds: "
              + ", ".join(f"{n} {v:.2f}" for n, v in sorted(cpu.items())))
        if mode == "jetstream":
            stored = asyncio.run(stream_messages(stream, rows))
            print(f"  {mode}: stream {stream} holds {stored} messages")
    finally:
        subscriber.stop()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    return elapsed, last - first


async def stream_messages(stream: str, expected: int, timeout: float = 30) -> int:
    import nats
    nc = await nats.connect(NATS_URL)
    js = nc.jetstream()
    deadline = time.monotonic() + timeout
    while True:
        count = (await js.stream_info(stream)).state.messages
        if count >= expected or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    await nc.close()
    return count


def sample_payloads(rows: int):
    """Events shaped like the ones Lapidus sends for the benchmark table."""
    from lapidus.events import Event, encode
    out = []
    for i in range(1, rows + 1):
        event = Event(id=f"bench:0/1A2B3C4D:{i - 1}", type="insert", backend="bench",
                      schema="public", table="items", pk={"id": i},
                      item={"id": i, "name": f"item {i}", "price": f"{i / 100:.2f}",
                            "updated_at": "2026-11-30T11:33:35.295384Z"},
                      before=None, position="0/1A2B3C4D", txid="733",
                      ts="2026-11-30T11:33:35.295384Z")
        out.append((f"bench.public.items.{i}", encode(event), event.id))
    return out


async def bare_loop(payloads, mode: str, stream: str) -> float:
    import nats
    nc = await nats.connect(NATS_URL)
    subscriber = Subscriber("bench.>", len(payloads))
    headers_of = lambda msg_id: {"Nats-Msg-Id": msg_id, "Lapidus-Backend": "bench",  # noqa: E731
                                 "Lapidus-Type": "insert", "Lapidus-Position": "0/1A2B3C4D"}
    started = time.monotonic()
    if mode == "core":
        for subject, payload, msg_id in payloads:
            await nc.publish(subject, payload, headers=headers_of(msg_id))
        await nc.flush()
    else:
        inbox = nc.new_inbox() + "."
        outstanding = 0
        space, done = asyncio.Event(), asyncio.Event()
        space.set()
        remaining = len(payloads)

        async def on_ack(msg):
            nonlocal outstanding, remaining
            outstanding -= 1
            remaining -= 1
            if outstanding < 4096:
                space.set()
            if remaining == 0:
                done.set()

        await nc.subscribe(inbox + "*", cb=on_ack, pending_msgs_limit=1 << 20)
        for n, (subject, payload, msg_id) in enumerate(payloads):
            if outstanding >= 4096:
                space.clear()
                await space.wait()
            outstanding += 1
            await nc.publish(subject, payload, reply=inbox + str(n), headers=headers_of(msg_id))
        await done.wait()
    last, _ = await asyncio.get_running_loop().run_in_executor(None, subscriber.wait)
    await nc.close()
    return last - started


async def streams_capturing(subject: str) -> list:
    """Names of the JetStream streams whose subjects take ``subject`` (a stream left behind
    by an interrupted run would store the core-mode messages too and slow every run)."""
    import nats
    nc = await nats.connect(NATS_URL)
    try:
        infos = await nc.jetstream().streams_info()
    finally:
        await nc.close()
    return [i.config.name for i in infos
            if any(s in (subject, ">") for s in (i.config.subjects or []))]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--modes", default="core,jetstream")
    parser.add_argument("--batch-size", type=int, default=0,
                        help="the backend's batch_size (0: Lapidus's default)")
    parser.add_argument("--decoder", choices=("pgoutput", "wal2json"), default="pgoutput")
    parser.add_argument("--subscriber", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.subscriber:
        count_messages(args.subscriber[0], int(args.subscriber[1]))
        return
    leftover = asyncio.run(streams_capturing("bench.>"))
    if leftover:
        raise SystemExit(f"JetStream stream(s) {', '.join(leftover)} capture bench.> (left by an "
                         f"interrupted run?): delete them first, e.g. `nats stream rm NAME`")
    modes = args.modes.split(",")
    if args.batch_size:
        BACKEND_EXTRA["batch_size"] = args.batch_size
    payloads = sample_payloads(args.rows)
    results = {(who, mode): [] for who in ("lapidus", "streaming", "bare", "first")
               for mode in modes}
    for run in range(args.runs):
        for mode in modes:
            stream = f"BENCH_{uuid.uuid4().hex[:8]}"
            with tempfile.TemporaryDirectory(prefix="lapidus-bench-") as tmp:
                make_backlog(args.rows, args.decoder)
                results[("first", mode)].append(first_change_delay(args.decoder))
                try:
                    lap, streaming = drain_lapidus(Path(tmp), args.rows, mode, stream)
                finally:
                    asyncio.run(delete_stream(stream))
                bare_stream = f"BENCH_{uuid.uuid4().hex[:8]}"
                if mode == "jetstream":
                    asyncio.run(create_stream(bare_stream))
                try:
                    bare = asyncio.run(bare_loop(payloads, mode, bare_stream))
                finally:
                    asyncio.run(delete_stream(bare_stream))
            results[("lapidus", mode)].append(args.rows / lap)
            results[("streaming", mode)].append(args.rows / streaming)
            results[("bare", mode)].append(args.rows / bare)
            print(f"run {run + 1} {mode}: lapidus {args.rows / lap:,.0f} events/s from start "
                  f"({args.rows / streaming:,.0f} events/s from first to last message), "
                  f"bare nats-py loop {args.rows / bare:,.0f} events/s; PostgreSQL's first "
                  f"change came {results[('first', mode)][-1]:.3f} s after pg_recvlogical "
                  f"started", flush=True)
    drop_database()
    print(f"median over {args.runs} run(s) of {args.rows:,} rows (one transaction), decoder "
          f"{args.decoder}:")
    for mode in modes:
        lap = statistics.median(results[("lapidus", mode)])
        streaming = statistics.median(results[("streaming", mode)])
        bare = statistics.median(results[("bare", mode)])
        print(f"  {mode:9}: PostgreSQL -> Lapidus -> NATS {lap:,.0f} events/s from start "
              f"({streaming:,.0f} first to last); bare nats-py loop {bare:,.0f} events/s; "
              f"ratio {lap / bare:.2f} ({streaming / bare:.2f})")
        print(f"  {mode:9}  PostgreSQL's own wait before the first change (median): "
              f"{statistics.median(results[('first', mode)]):.3f} s")
        ratios = [lp / br for lp, br in zip(results[("lapidus", mode)], results[("bare", mode)])]
        print(f"  {mode:9}  best run: Lapidus {max(results[('lapidus', mode)]):,.0f} events/s, "
              f"bare loop {max(results[('bare', mode)]):,.0f}; per-run ratios "
              + " ".join(f"{r:.2f}" for r in ratios))


async def create_stream(name: str) -> None:
    import nats
    nc = await nats.connect(NATS_URL)
    await nc.jetstream().add_stream(name=name, subjects=["bench.>"], duplicate_window=120)
    await nc.close()


async def delete_stream(name: str) -> None:
    import nats
    import nats.js.errors
    nc = await nats.connect(NATS_URL)
    try:
        await nc.jetstream().delete_stream(name)
    except nats.js.errors.NotFoundError:
        pass
    await nc.close()


if __name__ == "__main__":
    main()
