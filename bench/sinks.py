"""Drain a PostgreSQL backlog into the redis and rabbitmq sinks, each beside a bare client loop.

    .venv/bin/python bench/sinks.py [--rows 200000] [--runs 1] [--sinks redis,rabbitmq]

Per run and sink: with Lapidus stopped, insert ROWS rows (one transaction) into the 4-column
table of bench/nats_throughput.py, then start ``lapidus -c CONFIG`` with that one plugin and
time from its start to the moment the server holds ROWS events (polled every 20 ms: ``XLEN``
of the stream; the message count of a queue bound to the exchange).  In the same run a bare
client loop sends the same number of payloads of the same shape to the same server, the way the
sink does, and is timed to the same condition:
  * redis:    redis-py (asyncio, hiredis) pipelines of 1000 ``XADD`` with the same four fields
              (the backend's default batch_size), each awaited before the next;
  * rabbitmq: aiormq on a confirm channel: publish 1000 persistent messages with the same
              properties and headers, then await all their confirms, batch after batch.
Prints events/s of each and the ratio Lapidus / bare loop, from Lapidus's start and from its
first to its last event.  Needs the local PostgreSQL (127.0.0.1:5432, user postgres), Redis
(127.0.0.1:6379; BENCH_REDIS_URL) and RabbitMQ (guest on 127.0.0.1:5672; BENCH_AMQP_URL).
Uses its own stream key, exchange and queue (``lapidus-bench...``), deleted at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from nats_throughput import DB, PUBLICATION, drop_database, make_backlog, sample_payloads  # noqa
from pg_drain import PG  # noqa: E402

REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
AMQP_URL = os.environ.get("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
STREAM = "lapidus-bench"
EXCHANGE = "lapidus-bench"
QUEUE = "lapidus-bench"
BATCH = 1000


# -- what the server holds --------------------------------------------------------------------

class RedisTarget:
    name = "redis"

    def plugin(self) -> dict:
        return {"url": REDIS_URL, "stream": STREAM}

    def reset(self) -> None:
        import redis
        client = redis.Redis.from_url(REDIS_URL)
        client.delete(STREAM)
        client.close()

    def count(self) -> int:
        import redis
        client = redis.Redis.from_url(REDIS_URL)
        try:
            return client.xlen(STREAM)
        finally:
            client.close()

    async def bare(self, payloads) -> None:
        import redis.asyncio as aioredis
        client = aioredis.Redis.from_url(REDIS_URL)
        for start in range(0, len(payloads), BATCH):
            pipe = client.pipeline(transaction=False)
            for subject, data, event_id in payloads[start:start + BATCH]:
                pipe.execute_command("XADD", STREAM, "*", "id", event_id, "type", "insert",
                                     "subject", subject[len("bench."):], "event", data)
            await pipe.execute()
        await client.aclose()


class RabbitTarget:
    name = "rabbitmq"

    def plugin(self) -> dict:
        return {"url": AMQP_URL, "exchange": EXCHANGE}

    @staticmethod
    async def _channel(action):
        import aiormq
        connection = await aiormq.connect(AMQP_URL)
        try:
            return await action(await connection.channel())
        finally:
            await connection.close()

    def reset(self) -> None:
        async def run(channel):
            await channel.exchange_declare(exchange=EXCHANGE, exchange_type="topic",
                                           durable=True)
            await channel.queue_declare(QUEUE, durable=True)
            await channel.queue_bind(QUEUE, EXCHANGE, routing_key="#")
            await channel.queue_purge(QUEUE)
        asyncio.run(self._channel(run))

    def count(self) -> int:
        async def run(channel):
            return (await channel.queue_declare(QUEUE, passive=True)).message_count
        return asyncio.run(self._channel(run))

    async def bare(self, payloads) -> None:
        import aiormq
        from pamqp.commands import Basic
        connection = await aiormq.connect(AMQP_URL)
        channel = await connection.channel(publisher_confirms=True)
        for start in range(0, len(payloads), BATCH):
            confirms = []
            for subject, data, event_id in payloads[start:start + BATCH]:
                properties = Basic.Properties(
                    content_type="application/json", delivery_mode=2, message_id=event_id,
                    message_type="insert",
                    headers={"Lapidus-Backend": "bench", "Lapidus-Type": "insert",
                             "Lapidus-Position": "0/1A2B3C4D"})
                confirms.append(asyncio.ensure_future(channel.basic_publish(
                    data, exchange=EXCHANGE, routing_key=subject[len("bench."):],
                    properties=properties, wait=False)))
            await asyncio.gather(*confirms)
        await connection.close()

    def cleanup(self) -> None:
        async def run(channel):
            await channel.queue_delete(QUEUE)
            await channel.exchange_delete(EXCHANGE)
        asyncio.run(self._channel(run))


def wait_count(target, rows: int, proc=None, timeout: float = 600) -> float:
    """CLOCK_MONOTONIC time at which the server held ``rows`` events (polled)."""
    deadline = time.monotonic() + timeout
    while True:
        if target.count() >= rows:
            return time.monotonic()
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"lapidus exited with code {proc.returncode}; see its log")
        if time.monotonic() > deadline:
            raise SystemExit("the events did not all arrive in time")
        time.sleep(0.02)


def drain_lapidus(workdir: Path, rows: int, target):
    """(seconds from starting lapidus to the last event stored, and from the first one)."""
    config = {
        "state_dir": str(workdir / "state"), "log": {"format": "json", "level": "warning"},
        "backends": [{"name": "bench", "type": "postgresql", "host": "127.0.0.1",
                      "port": PG["port"], "user": "postgres", "database": DB,
                      "slot": "bench_lapidus", "publication": PUBLICATION,
                      "publication_mode": "existing"}],
        "plugins": {target.name: target.plugin()},
    }
    path = workdir / "lapidus.json"
    path.write_text(json.dumps(config))
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "lapidus", "-c", str(path)],
                            stdout=subprocess.DEVNULL, stderr=open(workdir / "lapidus.log", "ab"),
                            start_new_session=True)
    try:
        first = None
        while first is None:
            if target.count() > 0:
                first = time.monotonic()
            elif proc.poll() is not None:
                raise SystemExit(f"lapidus exited with code {proc.returncode}:\n"
                                 + (workdir / "lapidus.log").read_text()[-2000:])
            else:
                time.sleep(0.02)
        last = wait_count(target, rows, proc)
        sup = psutil.Process(proc.pid)
        cpu = {"supervisor": sum(sup.cpu_times()[:2])}
        for child in sup.children(recursive=True):
            cpu[child.name()] = sum(child.cpu_times()[:2])
        print(f"  {target.name}: CPU seconds: "
              + ", ".join(f"{n} {v:.2f}" for n, v in sorted(cpu.items())), flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    return last - started, last - first


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--sinks", default="redis,rabbitmq")
    args = parser.parse_args()
    targets = [{"redis": RedisTarget, "rabbitmq": RabbitTarget}[name]()
               for name in args.sinks.split(",")]
    payloads = sample_payloads(args.rows)
    results = {(who, t.name): [] for who in ("lapidus", "streaming", "bare") for t in targets}
    for run in range(args.runs):
        for target in targets:
            with tempfile.TemporaryDirectory(prefix="lapidus-bench-") as tmp:
                make_backlog(args.rows, "pgoutput")
                target.reset()
                lap, streaming = drain_lapidus(Path(tmp), args.rows, target)
                target.reset()
                started = time.monotonic()
                asyncio.run(target.bare(payloads))
                bare = wait_count(target, args.rows) - started
                target.reset()
            for who, seconds in (("lapidus", lap), ("streaming", streaming), ("bare", bare)):
                results[(who, target.name)].append(args.rows / seconds)
            print(f"run {run + 1} {target.name}: lapidus {args.rows / lap:,.0f} events/s from "
                  f"start ({args.rows / streaming:,.0f} first to last), bare client loop "
                  f"{args.rows / bare:,.0f} events/s", flush=True)
    drop_database()
    for target in targets:
        getattr(target, "cleanup", target.reset)()
    print(f"median over {args.runs} run(s) of {args.rows:,} rows (one transaction, pgoutput):")
    for target in targets:
        lap = statistics.median(results[("lapidus", target.name)])
        streaming = statistics.median(results[("streaming", target.name)])
        bare = statistics.median(results[("bare", target.name)])
        print(f"  {target.name:8}: PostgreSQL -> Lapidus -> {target.name} {lap:,.0f} events/s "
              f"from start ({streaming:,.0f} first to last); bare client loop {bare:,.0f} "
              f"events/s; ratio {lap / bare:.2f} ({streaming / bare:.2f})")


if __name__ == "__main__":
    main()
