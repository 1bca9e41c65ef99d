"""Cluster mode with PostgreSQL backends: real nodes (separate ``lapidus`` processes), a private
three-server NATS cluster, the shared PostgreSQL 15, the JetStream sink with Nats-Msg-Id dedup.

In cluster mode a PostgreSQL worker reads its slot with lapidus-walstream, which confirms to
the server only what the bucket's checkpoint covers (what the sinks acknowledged); a new owner
drops nothing and resumes from the slot and that checkpoint (docs/cluster.md).

* a ``kill -9`` of the owning node mid-load: another node streams the backend within
  ``lease_ttl`` + 10 s, every row is in the stream once, and what the dead node had published
  past its saved checkpoint is published again by the new owner under the same ids and with
  the same content (seen on a core NATS subscription, which JetStream's dedup does not hide);
* a node cut off from NATS stops its worker before the other node starts it: asserted on the
  ownership logs and on the slot's ``active_pid`` history (polled, each walsender named by its
  node in ``application_name``);
* a clean hand-over of a PostgreSQL backend to a node that joins, nothing lost (pgoutput and
  wal2json);
* a frozen node (all its processes stopped) still holds the slot's walsender: the new owner
  terminates it after the grace and streams, every row once;
* an initial snapshot under a concurrent writer, its node killed in the middle: the next owner
  resumes it from the bucket's checkpoint (a chunk, not the start), and the stream folds to the
  table, each event stored once.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from typing import List, Optional, Tuple

import nats
import psutil
import pytest

from bench.chaos.cluster_nodes import _when, overlaps
from tests.conftest import wait_until
from tests.integration.conftest import backend_status, pg_backend, pg_connect
from tests.integration.nats_cluster import nats_cluster  # noqa: F401  (fixture)
from tests.integration.outage_proxy import OutageProxy
from tests.integration.sink_loads import expected_count, finish, pg_load
from tests.integration.snapshot_helpers import MID_SNAPSHOT_WINDOW, fold
from tests.integration.test_cluster import (LEASE_TTL, ROWS, _js,  # noqa: F401
                                            check_stream, hand_over_under_load, jetstream,
                                            nodes, owner_of, stream_events, wait_stream)
from tests.integration.test_pg_snapshot import Writer, make_table, table_content

# serial: lease renewals, hand-overs and takeovers are timed against lease_ttl; beside
# the other tests' load a hand-over became a takeover (three nats-servers and several
# nodes each)
pytestmark = [pytest.mark.integration, pytest.mark.serial]


# -- helpers -----------------------------------------------------------------------------------

@pytest.fixture
def pg_table(pg_db):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v int)")
    return pg_db


class Publications:
    """Every message published on ``<prefix>.>``, on a core NATS subscription: repeats that
    JetStream drops as duplicates are seen here, with the time they arrived."""

    def __init__(self, urls, prefix: str):
        self.seen: List[Tuple[float, dict]] = []
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._stop: Optional[asyncio.Event] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run(urls, prefix)),
                                        daemon=True)
        self._thread.start()
        assert self._ready.wait(20), "no core NATS subscription"

    async def _run(self, urls, prefix):
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        nc = await nats.connect(urls, max_reconnect_attempts=-1, reconnect_time_wait=0.2)

        async def on_message(msg):
            event = json.loads(msg.data)
            with self._lock:
                self.seen.append((time.time(), event))
        await nc.subscribe(f"{prefix}.>", cb=on_message, pending_msgs_limit=1_000_000,
                           pending_bytes_limit=1 << 30)
        await nc.flush()
        self._ready.set()
        await self._stop.wait()
        await nc.close()

    def count(self) -> int:
        with self._lock:
            return len(self.seen)

    def between(self, start: float, end: float) -> List[dict]:
        with self._lock:
            return [event for moment, event in self.seen if start <= moment < end]

    def close(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


class SlotHolders:
    """The slot's ``active_pid`` polled every 20 ms, with the ``application_name`` of that
    server process (``lapidus_<backend>@<node>`` in cluster mode): who streamed it, when."""

    def __init__(self, database: str, slot: str):
        self.samples: List[Tuple[float, Optional[int], Optional[str]]] = []
        self._stop = threading.Event()
        self._conn = pg_connect(database)
        self._slot = slot
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        with self._conn.cursor() as cur:
            while not self._stop.wait(0.02):
                cur.execute("SELECT s.active_pid, a.application_name FROM pg_replication_slots s "
                            "LEFT JOIN pg_stat_activity a ON a.pid = s.active_pid "
                            "WHERE s.slot_name = %s", (self._slot,))
                row = cur.fetchone()
                self.samples.append((time.time(),) + (tuple(row) if row else (None, None)))

    def holders(self) -> List[Tuple[str, float, float]]:
        """Runs of one holder: (node, first seen, last seen), in order."""
        runs: List[list] = []
        for moment, pid, app in list(self.samples):
            if not pid:
                continue
            node = (app or "?").rpartition("@")[2]
            if runs and runs[-1][0] == node and runs[-1][3] == pid:
                runs[-1][2] = moment
            else:
                runs.append([node, moment, moment, pid])
        return [(node, first, last) for node, first, last, _pid in runs]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._conn.close()


def lsn_of(event_id: str) -> Tuple[int, int]:
    """``<backend>:<commit LSN>:<index>`` -> (commit LSN, index)."""
    _backend, position, index = event_id.split(":")
    high, low = position.split("/")
    return (int(high, 16) << 32) | int(low, 16), int(index)


def bucket_checkpoint(urls, backend: str) -> dict:
    async def read(js):
        kv = await js.key_value("lapidus")
        return json.loads((await kv.get(f"checkpoint.{backend}")).value)
    return _js(urls, read)


def beyond(checkpoint: Optional[dict], event_id: str) -> bool:
    """The event is not covered by ``checkpoint`` (a PostgreSQL worker's position; None while
    the worker has saved none yet, as on a busy host right after its start: it covers
    nothing)."""
    if checkpoint is None:
        return True
    lsn, index = lsn_of(event_id)
    tx = checkpoint.get("tx")
    if tx and lsn == tx["lsn"]:
        return index >= tx["index"]
    return lsn > checkpoint["last_lsn"]


def freeze_with_unsaved_events(node, backend: str, published: Publications, urls) -> float:
    """SIGSTOP ``node``'s worker of ``backend`` once some event it published is not covered by
    the checkpoint in the bucket (tried again, thawed in between, while it keeps up with the
    load and everything published is saved); returns when it froze."""
    worker = node.find(f"lapidus:{backend}")
    deadline = time.monotonic() + 60
    while True:
        os.kill(worker, signal.SIGSTOP)
        frozen_at = time.time()
        until = time.monotonic() + 2
        while time.monotonic() < until:
            saved = bucket_checkpoint(urls, backend)["position"]
            if any(beyond(saved, e["id"]) for e in published.between(0, time.time())):
                return frozen_at
            time.sleep(0.1)     # polling the stream and the bucket for the condition
        assert time.monotonic() < deadline, "never an event published past the checkpoint"
        before = published.count()
        os.kill(worker, signal.SIGCONT)
        wait_until(lambda: published.count() > before, 30, message="the thawed worker sending")


# -- the tests ---------------------------------------------------------------------------------

def test_a_killed_pg_owner_is_replaced_within_the_lease_and_replays_carry_the_same_ids(
        nats_cluster, jetstream, pg_table, nodes):  # noqa: F811
    prefix, stream = jetstream
    urls = nats_cluster.urls
    backends = [pg_backend(pg_table, name="pgc")]
    published = Publications(urls, prefix)
    try:
        a = nodes("a", urls, backends, prefix=prefix, stream=stream, replicas=3)
        wait_until(lambda: owner_of([a], "pgc") is a, 30, message="node a streaming pgc")
        b = nodes("b", urls, backends, prefix=prefix, stream=stream, replicas=3)
        wait_until(lambda: any(r.get("event") == "nats connected" and r.get("process") ==
                               "cluster" for r in b.records()), 30, message="node b connected")
        load = pg_load(pg_table.name, ROWS)
        wait_stream(urls, stream, 1500)
        # Freeze a's worker (its dispatcher still publishes what it holds, no checkpoint is
        # saved any more) at a moment when events it published lie past its saved checkpoint:
        # the kill then leaves events that node b must publish again.
        frozen_at = freeze_with_unsaved_events(a, "pgc", published, urls)
        killed_at = a.kill9()
        saved = bucket_checkpoint(urls, "pgc")["position"]
        started = wait_until(lambda: b.first_start_after("pgc", killed_at), LEASE_TTL + 30,
                             message=f"node b streaming pgc; log:\n{b.log_tail()}")
        assert started - killed_at <= LEASE_TTL + 10
        finish(load)
        wait_stream(urls, stream, expected_count(ROWS))
        events = check_stream(urls, stream, ["pgc"])
        assert len(events) == expected_count(ROWS)
        assert not overlaps([a, b])

        by_a = {e["id"]: e for e in published.between(0, killed_at + 1)}
        by_b = {e["id"]: e for e in published.between(killed_at + 1, time.time() + 1)}
        assert published.between(killed_at + 1, started) == [], "published between the nodes"
        unsaved = [i for i in by_a if beyond(saved, i)]
        assert unsaved, (saved, frozen_at)
        # every event a published past the saved checkpoint is published again by b, under
        # the same id, with the same content; nothing the checkpoint covers is sent again
        missing = [i for i in unsaved if i not in by_b]
        assert not missing, missing[:5]
        assert all(by_b[i] == by_a[i] for i in unsaved)
        assert all(beyond(saved, i) for i in by_b)
    finally:
        published.close()


def test_a_pg_node_cut_off_from_nats_lets_go_of_the_slot_before_another_node_starts(
        nats_cluster, jetstream, pg_table, nodes):  # noqa: F811
    prefix, stream = jetstream
    urls = nats_cluster.urls
    backend = pg_backend(pg_table, name="pgc")
    port = int(urls[0].rsplit(":", 1)[1])
    proxy = OutageProxy(("127.0.0.1", port))
    holders = SlotHolders(pg_table.name, backend["slot"])
    try:
        through = [f"nats://{proxy.address}"]
        a = nodes("a", through, [backend], sink_servers=through, prefix=prefix, stream=stream,
                  replicas=3)
        wait_until(lambda: owner_of([a], "pgc") is a, 30, message="node a streaming pgc")
        b = nodes("b", urls, [backend], prefix=prefix, stream=stream, replicas=3)
        load = pg_load(pg_table.name, ROWS)
        wait_stream(urls, stream, 1500)
        cut_at = time.time()
        proxy.down()
        started = wait_until(lambda: b.first_start_after("pgc", cut_at), LEASE_TTL + 30,
                             message=f"node b streaming pgc; log:\n{b.log_tail()}")
        finish(load)
        wait_stream(urls, stream, expected_count(ROWS))
        wait_until(lambda: holders.holders() and holders.holders()[-1][0] == "b", 30,
                   message="node b holding the slot")
        assert not a.started("pgc"), "node a still streams pgc"
        assert not overlaps([a, b]), overlaps([a, b])
        runs = holders.holders()
        assert [node for node, _f, _l in runs][-2:] == ["a", "b"], runs
        a_last = max(last for node, _f, last in runs if node == "a")
        b_first = min(first for node, first, _l in runs if node == "b")
        # a's walsender was gone before b's worker even started, and never came back
        assert a_last < started <= b_first, (runs, started)
        assert not any(node == "a" and first > b_first for node, first, _l in runs), runs
        stops = [_when(r) for r in a.records() if r.get("event") ==
                 "cluster: stopped streaming this backend here" and _when(r) >= cut_at]
        assert stops and stops[0] < started
        assert not any("terminating it" in str(r.get("event")) for r in b.records())
        proxy.up()
        check_stream(urls, stream, ["pgc"])
    finally:
        holders.close()
        proxy.close()


@pytest.mark.parametrize("decoder", ["pgoutput", "wal2json"])
def test_a_joining_node_takes_a_pg_backend_by_hand_over_with_nothing_lost(
        nats_cluster, jetstream, pg_table, nodes, decoder):  # noqa: F811
    prefix, stream = jetstream
    hand_over_under_load(nodes, nats_cluster.urls, prefix, stream,
                         [pg_backend(pg_table, name="pg1", decoder=decoder),
                          pg_backend(pg_table, name="pg2", decoder=decoder)], ["pg1", "pg2"],
                         lambda: pg_load(pg_table.name, ROWS))


def test_a_frozen_pg_node_s_walsender_is_terminated_by_the_new_owner(
        nats_cluster, jetstream, pg_table, nodes):  # noqa: F811
    """Every process of node a stopped (SIGSTOP, its replication reader included): the server
    keeps a's walsender, the slot stays active for it; node b takes the lease after
    ``lease_ttl``, waits out the grace and terminates that walsender, then streams."""
    prefix, stream = jetstream
    urls = nats_cluster.urls
    backend = pg_backend(pg_table, name="pgc")
    holders = SlotHolders(pg_table.name, backend["slot"])
    a = nodes("a", urls, [backend], prefix=prefix, stream=stream, replicas=3)
    wait_until(lambda: owner_of([a], "pgc") is a, 30, message="node a streaming pgc")
    b = nodes("b", urls, [backend], prefix=prefix, stream=stream, replicas=3)
    load = pg_load(pg_table.name, ROWS)
    frozen: List[int] = []
    try:
        wait_stream(urls, stream, 1500)
        root = psutil.Process(a.proc.pid)
        frozen = [root.pid] + [p.pid for p in root.children(recursive=True)]
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        frozen_at = time.time()
        wait_until(lambda: b.first_start_after("pgc", frozen_at), LEASE_TTL + 30,
                   message=f"node b streaming pgc; log:\n{b.log_tail()}")
        wait_until(lambda: holders.holders() and holders.holders()[-1][0] == "b", 60,
                   message=f"node b holding the slot; log:\n{b.log_tail()}")
        taken = [r for r in b.records() if r.get("event", "").startswith(
            "the replication slot is still active for a server process of the previous owner")]
        assert taken, "node b never took the slot over"
        runs = holders.holders()
        assert [node for node, _f, _l in runs][-2:] == ["a", "b"], runs
        finish(load)
        wait_stream(urls, stream, expected_count(ROWS), timeout=180)
    finally:
        for pid in frozen:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        holders.close()
    check_stream(urls, stream, ["pgc"])


def last_event(urls, name: str) -> Optional[dict]:
    """The stream's last message (None while it is empty)."""
    async def read(js):
        info = await js.stream_info(name)
        if not info.state.messages:
            return None
        return json.loads((await js.get_msg(name, info.state.last_seq)).data)
    return _js(urls, read)


def test_a_pg_snapshot_killed_with_its_node_resumes_on_the_next_owner_and_folds(
        nats_cluster, jetstream, pg_db, nodes):  # noqa: F811
    prefix, stream = jetstream
    urls = nats_cluster.urls
    make_table(pg_db, 20_000)
    backends = [pg_backend(pg_db, name="pgc", decoder="pgoutput", snapshot="initial",
                           **MID_SNAPSHOT_WINDOW)]
    a = nodes("a", urls, backends, prefix=prefix, stream=stream, replicas=3)
    writer = Writer(pg_db, 20_000, seed=13, pause=0.005)    # a few hundred changes a second
    writer.start()
    try:
        wait_until(lambda: owner_of([a], "pgc") is a, 30, message="node a streaming pgc")
        b = nodes("b", urls, backends, prefix=prefix, stream=stream, replicas=3)
        wait_until(lambda: any(r.get("event") == "nats connected" and r.get("process") ==
                               "cluster" for r in b.records()), 30, message="node b connected")
        wait_stream(urls, stream, 4000)
        # a's dispatcher frozen, its worker is held one small batch further on, mid-snapshot,
        # until the kill of the whole node
        os.kill(a.find("lapidus:dispatc"), signal.SIGSTOP)
        assert not any(r.get("event") == "snapshot finished" for r in a.records())
        killed_at = a.kill9()
        wait_until(lambda: b.first_start_after("pgc", killed_at), LEASE_TTL + 30,
                   message=f"node b streaming pgc; log:\n{b.log_tail()}")
        wait_until(lambda: any(r.get("event") == "snapshot finished" for r in b.records()),
                   120, message=f"the snapshot finished on b; log:\n{b.log_tail()}")
        # its slot is streamed by lapidus-walstream, named so in the status (once the
        # worker's first report is in: the resumed snapshot can end before it)
        row = wait_until(lambda: (lambda r: r if r.get("walstream_pid") else None)(
            backend_status(b.config_path, "pgc")), 20, message="walstream_pid in the status")
        assert "pg_recvlogical_pid" not in row
        assert "lapidus.workers.postgresql.walstream" in \
            " ".join(psutil.Process(row["walstream_pid"]).cmdline())
    finally:
        writer.stop()
    assert writer.done > 50                  # it really wrote while the chunks were held
    pg_db.sql("INSERT INTO t VALUES (-1, 'sentinel', 0)")
    wait_until(lambda: (last_event(urls, stream) or {}).get("pk") == {"id": -1}, 60,
               message="the sentinel, last in the stream")
    resumed = [r for r in b.records() if r.get("event") == "snapshot resumed"]
    assert resumed and int(resumed[0]["rows"]) >= 1000, resumed   # from a chunk, not zero
    events = stream_events(urls, stream)
    ids = [e["id"] for e in events]
    assert len(ids) == len(set(ids)), "an event is stored twice"
    assert fold(events) == table_content(pg_db)
