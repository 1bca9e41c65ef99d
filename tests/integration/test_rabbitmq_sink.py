"""PostgreSQL and MariaDB to RabbitMQ through the real lapidus process (the rabbitmq sink).

Needs the local RabbitMQ (guest on 127.0.0.1:5672).  Every test publishes to an exchange of its
own, with a durable queue bound to it that a background consumer reads; both are deleted
afterwards.  The outage is made from the broker's side: ``rabbitmqctl close_connection`` of the
test's own Lapidus connections only.  Every wait is on a condition with a deadline.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import uuid

import pytest

from lapidus.events import Record
from lapidus.sinks.base import UndeliverableError
from lapidus.sinks.rabbitmq import RabbitmqSink
from tests.conftest import wait_until
from tests.integration.conftest import backend_status, pg_backend
from tests.integration.rabbitmq_fixtures import (URL, close_connections_of, consume,
                                                 rabbit_exchange)
from tests.integration.sink_loads import refused
from tests.integration.test_redis_sink import EVENT_FIELDS, maria_load, pg_load

pytest_plugins = ["tests.integration.mysql_fixtures"]
from tests.integration.mysql_fixtures import DATABASE, lapidus_backend  # noqa: E402

__all__ = ["consume", "rabbit_exchange"]      # fixtures, imported for pytest

ROUTING_HEADERS = {"Lapidus-Backend", "Lapidus-Type", "Lapidus-Position"}


def plugin(exchange: str, **extra) -> dict:
    return {"rabbitmq": {"url": URL, "exchange": exchange, **extra}}


def _launch(lapidus_factory, backends, options: dict, **config):
    proc = lapidus_factory({"backends": backends, "plugins": options, **config})
    return proc.wait_streaming(len(backends))


def check_messages(seen, backend: str, schema: str, rows: int, repeats_allowed: bool) -> None:
    """Each row's events, repeats dropped by message_id, in commit order; the routing key,
    properties and headers of the contract."""
    by_key = collections.defaultdict(list)
    first = {}
    for message in seen:
        event = json.loads(message.body)
        if event["backend"] != backend:
            continue
        assert list(event) == EVENT_FIELDS
        assert message.message_id == event["id"]
        assert (message.content_type, message.delivery_mode) == ("application/json", 2)
        assert ROUTING_HEADERS <= set(message.headers)
        assert message.headers["Lapidus-Type"] == event["type"]
        assert message.headers["Lapidus-Position"] == event["position"]
        assert message.routing_key == f"{schema}.t.{event['pk']['id']}"
        if message.message_id in first:
            assert repeats_allowed, f"{message.message_id} arrived twice"
            assert first[message.message_id] == message.body
            continue
        first[message.message_id] = message.body
        by_key[event["pk"]["id"]].append((event["type"], event["item"]["v"]))
    assert sorted(by_key) == list(range(1, rows + 1))
    for key, history in by_key.items():
        expected = [("insert", 0)] + ([("update", 1), ("update", 2)] if key % 10 == 0 else [])
        assert history == expected, (key, history)


def test_10k_rows_of_postgresql_and_of_mariadb_arrive_once_each_in_commit_order(
        lapidus_factory, pg_db, sql, rabbit_exchange, consume):
    rows = 10_000
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v int)")
    sql.run("CREATE TABLE t (id INT PRIMARY KEY, v INT)")
    consumer = consume(rabbit_exchange)
    _launch(lapidus_factory, [pg_backend(pg_db), lapidus_backend("maria")],
            plugin(rabbit_exchange))
    loaders = [pg_load(pg_db.name, rows, per_tx=500), maria_load(rows, per_tx=500)]
    for loader in loaders:
        loader.join(60)
    seen = consumer.wait_unique(2 * (rows + 2 * rows // 10), timeout=90)
    check_messages(seen, "pg", "public", rows, repeats_allowed=False)
    check_messages(seen, "maria", DATABASE, rows, repeats_allowed=False)


def test_connections_closed_by_the_broker_mid_load_lose_nothing_and_keep_order_per_key(
        lapidus_factory, pg_db, rabbit_exchange, consume):
    rows = 4000
    backend = f"rq{uuid.uuid4().hex[:8]}"
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v int)")
    consumer = consume(rabbit_exchange)
    proc = _launch(lapidus_factory, [pg_backend(pg_db, name=backend)],
                   plugin(rabbit_exchange, reconnect_time_wait=0.2))
    loader = pg_load(pg_db.name, rows, per_tx=50)
    wait_until(lambda: len(consumer.seen()) >= rows // 4, 60, message="a quarter published")
    assert close_connections_of(backend) == 1
    proc.wait_log("rabbitmq connection lost; reconnecting")
    loader.join(60)
    seen = consumer.wait_unique(rows + 2 * rows // 10)
    check_messages(seen, backend, "public", rows, repeats_allowed=True)
    proc.wait_log("rabbitmq reconnected")
    wait_until(lambda: backend_status(proc.config_path, backend).get("sinks", {})
               .get("rabbitmq", {}).get("connected"), 30, message="the sink up in status")
    assert "Traceback" not in proc.log()


def test_wrong_credentials_are_one_clear_error_and_never_shown(lapidus_factory, pg_db,
                                                               rabbit_exchange):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v int)")
    proc = _launch(lapidus_factory, [pg_backend(pg_db)],
                   {"rabbitmq": {"url": "amqp://guest:wrong-secret@127.0.0.1:5672/",
                                 "exchange": rabbit_exchange}})
    pg_db.sql("INSERT INTO t VALUES (1, 0)")
    proc.wait_log("rabbitmq refuses the connection")
    state = wait_until(lambda: (lambda s: s if s.get("last_error") else None)(
        backend_status(proc.config_path).get("sinks", {}).get("rabbitmq", {})), 30,
        message="the rabbitmq sink's error in lapidusctl status")
    assert state["connected"] is False and "refused the credentials" in state["last_error"]
    log = proc.log()
    line = next(json.loads(x) for x in log.splitlines() if "rabbitmq refuses the connection" in x)
    assert "refused the credentials" in line["fix"]
    assert line["server"] == "amqp://127.0.0.1:5672"
    assert log.count("rabbitmq refuses the connection") == 1
    assert "wrong-secret" not in log and "Traceback" not in log
    # its batch can never be confirmed: a clean stop would wait out the drain timeout
    os.killpg(proc.proc.pid, signal.SIGKILL)


def test_a_wrong_url_scheme_is_one_clear_error(tmp_path, pg_db):
    out = refused(tmp_path, {"backends": [pg_backend(pg_db)], "plugins": {
        "rabbitmq": {"url": "redis://guest:pw@127.0.0.1:5672/"}}}, start_too=True)
    assert 'plugins.rabbitmq.url: has the scheme "redis"; expected amqp:// or amqps://' in out
    assert "pw@" not in out


def test_kill_9_of_the_dispatcher_mid_load_leaves_every_row(lapidus_factory, pg_db,
                                                            rabbit_exchange, consume):
    rows = 5000
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v int)")
    consumer = consume(rabbit_exchange)
    proc = _launch(lapidus_factory, [pg_backend(pg_db)], plugin(rabbit_exchange),
                   supervisor={"backoff_initial": 0.1, "max_restarts": 20})
    loader = pg_load(pg_db.name, rows, per_tx=50, updates=False)
    wait_until(lambda: len(consumer.seen()) >= rows // 4, 60, message="a quarter published")
    os.kill(proc.dispatcher_pid(), signal.SIGKILL)
    loader.join(60)
    seen = consumer.wait_unique(rows)
    keys = {json.loads(m.body)["pk"]["id"] for m in seen}
    assert keys == set(range(1, rows + 1))
    assert "Traceback" not in proc.log()


def test_mandatory_makes_an_unroutable_message_undeliverable_with_the_fix():
    exchange = f"it-unbound-{uuid.uuid4().hex[:8]}"
    record = Record("pg:0/1:0", "insert", "public", "t", ("1",), "0/1", b'{"id":1}')

    async def run():
        routed = RabbitmqSink({"url": URL, "exchange": exchange}, "pg")
        await routed.send([record])             # without mandatory: dropped by the broker, acked
        strict = RabbitmqSink({"url": URL, "exchange": exchange, "mandatory": True}, "pg")
        try:
            with pytest.raises(UndeliverableError) as info:
                await strict.send([record])
            return info.value
        finally:
            await routed.close()
            await strict.close()
            import aiormq
            connection = await aiormq.connect(URL)
            await (await connection.channel()).exchange_delete(exchange)
            await connection.close()

    error = asyncio.run(run())
    assert error.index == 0
    assert f'no queue is bound to exchange "{exchange}" for routing key "public.t.1"' \
        in error.reason
    assert "bind a queue" in error.fix
