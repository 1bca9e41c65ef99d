"""PostgreSQL and MariaDB to Redis Streams through the real lapidus process (the redis sink).

Needs the local Redis on 127.0.0.1:6379 (every test writes under a key prefix of its own, deleted
afterwards); the outage and credential tests run a private redis-server on a free port.  Every
wait is on a condition with a deadline.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import threading

import pytest

from lapidus.events import Record
from lapidus.sinks.redis import RedisSink
from tests.conftest import wait_until
from tests.integration.conftest import backend_status, pg_backend, pg_connect
from tests.integration.redis_fixtures import (URL, entries, free_port, private_redis,
                                              redis_prefix, stream_length, wait_length)
from tests.integration.sink_loads import refused
from tests.integration.test_metrics import get, samples

pytest_plugins = ["tests.integration.mysql_fixtures"]
from tests.integration.mysql_fixtures import DATABASE, lapidus_backend, root_connection  # noqa

__all__ = ["private_redis", "redis_prefix"]      # fixtures, imported for pytest

EVENT_FIELDS = ["id", "type", "backend", "schema", "table", "pk", "item", "before", "position",
                "txid", "ts"]


def start(lapidus_factory, backends, plugin: dict, **config):
    proc = lapidus_factory({"backends": backends, "plugins": {"redis": plugin}, **config})
    return proc.wait_streaming(len(backends))


def pg_load(database: str, rows: int, per_tx: int, updates: bool = True) -> threading.Thread:
    """Insert ``rows`` rows (v = 0) in transactions of ``per_tx``; then, with ``updates``, add
    1 to v of every tenth row, twice."""
    def run():
        conn = pg_connect(database)
        conn.autocommit = False
        with conn.cursor() as cur:
            for first in range(1, rows + 1, per_tx):
                cur.execute("INSERT INTO t SELECT g, 0 FROM generate_series(%s, %s) g",
                            (first, min(rows, first + per_tx - 1)))
                conn.commit()
            for _ in range(2 if updates else 0):
                cur.execute("UPDATE t SET v = v + 1 WHERE id % 10 = 0")
                conn.commit()
        conn.close()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def maria_load(rows: int, per_tx: int) -> threading.Thread:
    def run():
        conn = root_connection(database=DATABASE)
        with conn.cursor() as cur:
            for first in range(1, rows + 1, per_tx):
                values = ", ".join(f"({i}, 0)" for i in range(first, min(rows, first + per_tx - 1)
                                                              + 1))
                cur.execute(f"INSERT INTO t VALUES {values}")
            for _ in range(2):
                cur.execute("UPDATE t SET v = v + 1 WHERE id % 10 = 0")
        conn.close()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def check_stream(stream: str, backend: str, schema: str, rows: int, url: str = URL) -> None:
    """Each row once, its events in commit order (insert v=0, then v=1, v=2 for every tenth),
    each entry with the id, type, subject and event fields of the contract."""
    seen = entries(stream, url)
    by_key = collections.defaultdict(list)
    ids = []
    for entry in seen:
        assert set(entry) == {"_id", "id", "type", "subject", "event"}, entry
        event = json.loads(entry["event"])
        assert list(event) == EVENT_FIELDS
        assert (entry["id"], entry["type"]) == (event["id"], event["type"])
        assert event["backend"] == backend and (event["schema"], event["table"]) == (schema, "t")
        assert entry["subject"] == f"{schema}.t.{event['pk']['id']}"
        by_key[event["pk"]["id"]].append((event["type"], event["item"]["v"]))
        ids.append(entry["id"])
    assert len(ids) == len(set(ids)), "an event was added twice"
    assert sorted(by_key) == list(range(1, rows + 1))
    for key, history in by_key.items():
        expected = [("insert", 0)] + ([("update", 1), ("update", 2)] if key % 10 == 0 else [])
        assert history == expected, (key, history)


def test_10k_rows_of_postgresql_and_of_mariadb_arrive_once_each_in_commit_order(
        lapidus_factory, pg_db, sql, redis_prefix):
    rows = 10_000
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v int)")
    sql.run("CREATE TABLE t (id INT PRIMARY KEY, v INT)")
    start(lapidus_factory, [pg_backend(pg_db), lapidus_backend("maria")],
          {"url": URL, "stream": f"{redis_prefix}:{{backend}}:{{schema}}.{{table}}"})
    loaders = [pg_load(pg_db.name, rows, per_tx=500), maria_load(rows, per_tx=500)]
    for loader in loaders:
        loader.join(60)
    total = rows + 2 * rows // 10
    wait_length(f"{redis_prefix}:pg:public.t", total)
    wait_length(f"{redis_prefix}:maria:{DATABASE}.t", total)
    check_stream(f"{redis_prefix}:pg:public.t", "pg", "public", rows)
    check_stream(f"{redis_prefix}:maria:{DATABASE}.t", "maria", DATABASE, rows)


def test_a_redis_outage_mid_load_loses_nothing_and_keeps_order_per_key(
        lapidus_factory, pg_db, private_redis):
    rows = 6000
    private_redis.start()
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v int)")
    port = free_port()
    proc = start(lapidus_factory, [pg_backend(pg_db)],
                 {"url": private_redis.url, "stream": "cdc:{table}", "reconnect_time_wait": 0.2},
                 http={"listen": f"127.0.0.1:{port}"})
    stream = "cdc:t"
    up = ("lapidus_sink_up", (("backend", "pg"), ("sink", "redis")))
    down_for = ("lapidus_sink_down_seconds", (("backend", "pg"), ("sink", "redis")))
    loader = pg_load(pg_db.name, rows, per_tx=50)
    wait_length(stream, rows // 4, url=private_redis.url)
    private_redis.stop(save=True)           # what Redis acknowledged survives the outage
    down = wait_until(lambda: (lambda s: s if s.get("connected") is False else None)(
        backend_status(proc.config_path).get("sinks", {}).get("redis", {})), 30,
        message="the redis sink reported down in lapidusctl status")
    assert down["server"] == f"redis://127.0.0.1:{private_redis.port}"
    metrics = wait_until(lambda: (lambda m: m if m.get(down_for, 0) > 0 else None)(
        samples(get(f"http://127.0.0.1:{port}/metrics")[1])), 30,
        message="lapidus_sink_down_seconds counting in /metrics")
    assert metrics[up] == 0
    private_redis.start()
    loader.join(60)
    total = rows + 2 * rows // 10
    wait_length(stream, total, url=private_redis.url)
    check_stream(stream, "pg", "public", rows, url=private_redis.url)
    wait_until(lambda: backend_status(proc.config_path).get("sinks", {}).get("redis", {})
               .get("connected"), 30, message="the redis sink up again")
    assert samples(get(f"http://127.0.0.1:{port}/metrics")[1])[up] == 1
    log = proc.log()
    assert "redis connection lost; reconnecting" in log and "redis reconnected" in log
    assert "Traceback" not in log


def test_wrong_credentials_are_one_clear_error_and_never_shown(lapidus_factory, pg_db,
                                                               private_redis):
    private_redis.start(password="right-secret")
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v int)")
    proc = start(lapidus_factory, [pg_backend(pg_db)],
                 {"url": f"redis://:wrong-secret@127.0.0.1:{private_redis.port}/0"})
    pg_db.sql("INSERT INTO t VALUES (1, 0)")
    proc.wait_log("redis refuses the connection")
    state = wait_until(lambda: (lambda s: s if s.get("last_error") else None)(
        backend_status(proc.config_path).get("sinks", {}).get("redis", {})), 30,
        message="the redis sink's error in lapidusctl status")
    assert state["connected"] is False and "refused the credentials" in state["last_error"]
    log = proc.log()
    line = next(json.loads(x) for x in log.splitlines() if "redis refuses the connection" in x)
    assert "refused the credentials" in line["fix"]
    assert "invalid username-password" in line["error"]
    assert line["server"] == f"redis://127.0.0.1:{private_redis.port}"
    assert log.count("redis refuses the connection") == 1
    assert "wrong-secret" not in log and "Traceback" not in log
    assert private_redis.client().keys("*") == []          # nothing was written
    # its batch can never be confirmed: a clean stop would wait out the drain timeout
    os.killpg(proc.proc.pid, signal.SIGKILL)


def test_a_wrong_url_scheme_is_one_clear_error(tmp_path, pg_db):
    out = refused(tmp_path, {"backends": [pg_backend(pg_db)], "plugins": {
        "redis": {"url": "http://:pw@127.0.0.1:6379"}}}, start_too=True)
    assert 'plugins.redis.url: has the scheme "http"; expected redis:// or rediss://' in out
    assert "pw@" not in out


def test_kill_9_of_the_dispatcher_mid_load_leaves_every_row_once(lapidus_factory, pg_db,
                                                                 redis_prefix):
    rows = 10_000
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v int)")
    stream = f"{redis_prefix}:t"
    proc = start(lapidus_factory, [pg_backend(pg_db)],
                 {"url": URL, "stream": f"{redis_prefix}:{{table}}"},
                 supervisor={"backoff_initial": 0.1, "max_restarts": 20})
    loader = pg_load(pg_db.name, rows, per_tx=50, updates=False)
    wait_until(lambda: stream_length(stream) >= rows // 4, 60, message="a quarter added")
    os.kill(proc.dispatcher_pid(), signal.SIGKILL)
    loader.join(60)
    wait_length(stream, rows, timeout=60)
    seen = entries(stream)
    ids = [e["id"] for e in seen]
    assert len(ids) == len(set(ids)), "duplicate entries after the dispatcher was killed"
    assert sorted(json.loads(e["event"])["pk"]["id"] for e in seen) == list(range(1, rows + 1))
    assert "Traceback" not in proc.log()


def test_a_new_sink_skips_what_the_stream_already_has(redis_prefix):
    """What a second dispatcher does after the first died with batches written but not
    confirmed: the replayed head is skipped, by id in the batch or by position before it."""
    def record(n: int, index: int = 0) -> Record:
        lsn = f"0/{0x1000 + n:X}"
        return Record(f"pg:{lsn}:{index}", "insert", "public", "t", (str(n),), lsn,
                      json.dumps({"id": f"pg:{lsn}:{index}", "position": lsn}).encode())

    batches = [[record(n, i) for n in range(b * 10, b * 10 + 5) for i in range(2)]
               for b in range(3)]
    options = {"url": URL, "stream": f"{redis_prefix}:{{table}}"}

    async def run():
        first = RedisSink(options, "pg")
        await first.send(batches[0])
        await first.send(batches[1])
        await first.close()
        second = RedisSink(options, "pg")
        await second.send(batches[0])       # all before the newest entry: skipped
        await second.send(batches[1][:3])   # up to that entry... still before it
        await second.send(batches[1][3:] + batches[2])   # the rest, past it
        await second.close()
        return second.skipper.skipped

    skipped = asyncio.run(run())
    ids = [e["id"] for e in entries(f"{redis_prefix}:t")]
    assert ids == [r.id for batch in batches for r in batch]
    assert skipped == 20


def test_a_key_of_another_type_makes_its_events_undeliverable_with_the_fix(redis_prefix):
    from lapidus.sinks.base import UndeliverableError
    from tests.integration.redis_fixtures import client

    client().set(f"{redis_prefix}:t", "not a stream")
    other = Record("pg:0/1:0", "insert", "public", "ok", ("1",), "0/1", b"{}")
    refused = Record("pg:0/1:1", "insert", "public", "t", ("1",), "0/1", b"{}")

    async def run():
        sink = RedisSink({"url": URL, "stream": f"{redis_prefix}:{{table}}"}, "pg")
        try:
            with pytest.raises(UndeliverableError) as info:
                await sink.send([other, refused])
            return info.value
        finally:
            await sink.close()

    error = asyncio.run(run())
    assert error.index == 1 and "WRONGTYPE" in error.reason and "delete or rename" in error.fix
