"""Cluster failover: time from a ``kill -9`` of the node that streams a backend to the first event
the new owner stores in JetStream, beside a clean hand-over (SIGTERM of the owner) as baseline.

    .venv/bin/python bench/failover.py [--runs 10] [--lease-ttl 5]

A private three-server NATS cluster on loopback (bench/chaos/nats_cluster.py), two Lapidus
nodes (separate processes, own state directories) with one MariaDB backend and the JetStream
sink into a three-replica stream, and a writer inserting one row every 20 ms.  Each run:

* waits until one node streams the backend and the stream grows;
* kills that node's whole process group (``kill -9``: the host dies), notes the stream's last
  sequence half a second later (the dead node's last acks are in by then; the new owner cannot
  have started: a takeover takes at least ``lease_ttl``);
* measures the time until the stream's last sequence moves past that: the first event stored
  by the new owner (JetStream drops the new owner's replays of what the dead node had stored,
  by Nats-Msg-Id, so a new sequence is a new event);
* starts the killed node again (it joins and takes nothing: one backend, two nodes) and lets
  it run for ``lease_ttl`` before the next run: a node judges a lease expired only after it saw
  it unchanged for ``lease_ttl``, counted from its first look, so a node that has just started
  would add the time it has not been watching.

The baseline run is the same with SIGTERM instead of ``kill -9``: the owner saves its checkpoint
and releases the lease, so the other node starts at once; its time is Lapidus's own start-up
(worker fork, NATS and MariaDB connections, checkpoint claim).  Prints every run, the medians,
the failover median minus ``lease_ttl``, and the ratio failover / baseline.

Needs the local MariaDB of scripts/setup-local and ``nats-server`` on PATH; uses and then drops
the database ``lapidus_bench_failover``.  Figures: docs/dev/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import nats  # noqa: E402

from bench.chaos.cluster_nodes import ClusterNode, node_config  # noqa: E402
from bench.chaos.nats_cluster import NatsCluster  # noqa: E402
from bench.chaos.servers import mysql_connect  # noqa: E402
from bench.chaos.waiting import wait_for  # noqa: E402

DB = "lapidus_bench_failover"
BACKEND = "bench"
SERVER_ID = 4_310_001
SETTLE = 0.5          # seconds after the kill before the stream's sequence is read


class Stream:
    """The JetStream stream's last sequence, read over one connection in a thread's loop."""

    def __init__(self, urls: List[str], prefix: str):
        self.name = f"BENCH_{uuid.uuid4().hex[:8].upper()}"
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.nc = self._run(nats.connect(urls, reconnect_time_wait=0.2))
        self.js = self.nc.jetstream(timeout=5)
        self._run(self.js.add_stream(name=self.name, subjects=[f"{prefix}.>"], num_replicas=3,
                                     duplicate_window=120))

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def close(self) -> None:
        self._run(self.nc.close())

    def last_seq(self) -> int:
        try:
            return self._run(self.js.stream_info(self.name)).state.last_seq
        except Exception:
            return -1     # an election under way: ask again


class Writer:
    """One row every ``every`` seconds until stopped."""

    def __init__(self, every: float = 0.02):
        self.every = every
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        conn = mysql_connect(DB)
        with conn.cursor() as cur:
            while not self.stop.wait(self.every):
                cur.execute("INSERT INTO t (v) VALUES (1)")
        conn.close()


def owner(nodes: List[ClusterNode]) -> Optional[ClusterNode]:
    streaming = [n for n in nodes if n.streams(BACKEND)]
    return streaming[0] if len(streaming) == 1 else None


def one_run(nodes: List[ClusterNode], stream: Stream, kill: bool) -> float:
    current = wait_for(lambda: owner(nodes), 60, "one node streaming the backend")
    before = stream.last_seq()
    wait_for(lambda: stream.last_seq() > before, 30, "the stream growing")
    if kill:
        moment = time.monotonic()
        current.kill9()
    else:
        moment = time.monotonic()
        current.proc.send_signal(signal.SIGTERM)
    while time.monotonic() < moment + SETTLE:
        time.sleep(0.01)
    settled = stream.last_seq()
    wait_for(lambda: stream.last_seq() > settled, 120, "the new owner's first event",
             interval=0.01)
    elapsed = time.monotonic() - moment
    current.stop(30)
    current.start()
    restarted = time.monotonic()
    wait_for(lambda: time.monotonic() >= restarted + current.config["cluster"]["lease_ttl"],
             120, "the restarted node watching the lease for lease_ttl", interval=0.1)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--lease-ttl", type=float, default=5.0)
    parser.add_argument("--keep", action="store_true",
                        help="keep the nodes' logs and state (the folder is printed)")
    args = parser.parse_args()
    logging.getLogger("nats").setLevel(logging.CRITICAL)   # its reconnect noise, not results
    conn = mysql_connect()
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {DB}")
        cur.execute(f"CREATE DATABASE {DB}")
        cur.execute(f"CREATE TABLE {DB}.t (id BIGINT AUTO_INCREMENT PRIMARY KEY, v INT)")
    with tempfile.TemporaryDirectory(prefix="lapidus-failover-") as tmp:
        folder = Path(tempfile.mkdtemp(prefix="lapidus-failover-")) if args.keep else Path(tmp)
        if args.keep:
            print(f"logs and state in {folder}")
        cluster = NatsCluster(folder / "nats")
        nodes: List[ClusterNode] = []
        writer = None
        stream = None
        try:
            cluster.start()
            prefix = f"bench{uuid.uuid4().hex[:6]}"
            stream = Stream(cluster.urls, prefix)
            backend = {"name": BACKEND, "type": "mysql", "host": "127.0.0.1", "user": "root",
                       "database": DB, "server_id": SERVER_ID, "heartbeat_seconds": 1}
            plugins = {"nats": {"servers": cluster.urls, "jetstream": True,
                                "subject_prefix": prefix, "reconnect_time_wait": 0.2}}
            for name in ("n1", "n2"):
                config = node_config(name, folder / name, cluster.urls, [backend], plugins,
                                     lease_ttl=args.lease_ttl, replicas=3)
                nodes.append(ClusterNode(name, config, folder / name))
            for node in nodes:
                node.start()
            writer = Writer()
            baseline = [one_run(nodes, stream, kill=False) for _ in range(args.runs)]
            failover = [one_run(nodes, stream, kill=True) for _ in range(args.runs)]
        finally:
            if writer is not None:
                writer.stop.set()
                writer.thread.join(5)
            for node in nodes:
                node.stop(30)
            if stream is not None:
                stream.close()
            cluster.stop()
            with conn.cursor() as cur:
                cur.execute(f"DROP DATABASE IF EXISTS {DB}")
            conn.close()
    print(f"lease_ttl {args.lease_ttl:g}s, {args.runs} runs each")
    print("clean hand-over (SIGTERM of the owner), s: "
          + " ".join(f"{t:.2f}" for t in baseline))
    print("failover (kill -9 of the owner), s:        "
          + " ".join(f"{t:.2f}" for t in failover))
    base, fail = statistics.median(baseline), statistics.median(failover)
    print(f"median: hand-over {base:.2f}s, failover {fail:.2f}s = lease_ttl + "
          f"{fail - args.lease_ttl:.2f}s; failover / hand-over {fail / base:.1f}x")


if __name__ == "__main__":
    main()
