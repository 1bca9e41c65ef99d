"""Stopping Lapidus while a sink is down: the worker does not wait for acks that cannot come
(the dispatcher tells it the sink is failing), and nothing of what was held is lost: the next
start sends it again, with the same ids, once the sink is back.

Real supervisor, PostgreSQL and a private nats-server that is down, then started.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import wait_until
from tests.integration.conftest import backend_status, pg_backend
from tests.integration.nats_fixtures import (create_stream, private_nats, stream_count,
                                             stream_messages)

__all__ = ["private_nats"]   # fixture, imported for pytest

pytestmark = pytest.mark.integration


def test_a_stop_while_the_sink_is_down_does_not_wait_for_acks_and_loses_nothing(
        lapidus_factory, pg_db, private_nats):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v text)")
    config = {
        "backends": [pg_backend(pg_db, decoder="pgoutput")],
        "plugins": {"nats": {"server": private_nats.url, "jetstream": True,
                             "subject_prefix": "down", "reconnect_time_wait": 0.3}}}
    proc = lapidus_factory(config)
    proc.wait_streaming(1)
    pg_db.sql("INSERT INTO t SELECT g, 'r' || g FROM generate_series(1, 50) g")
    wait_until(lambda: backend_status(proc.config_path, "pg").get("inflight", 0) >= 1, 30,
               message="a batch held by the sink that is down")

    assert proc.terminate(30) == 0
    worker = [r for r in proc.records() if r.get("process") == "worker"]
    told = [r for r in worker if r["event"] == "not waiting for the acks of the batches in "
                                              "flight: a sink holds them"]
    assert told and told[0]["sinks"] == ["nats"]
    assert any(r["event"] == "unconfirmed batches left; they will be sent again"
               for r in worker)
    assert "Traceback" not in proc.log()

    # the sink is back: the next start sends everything again, once
    private_nats.start()
    create_stream("DOWN", ["down.>"], url=private_nats.url)
    again = lapidus_factory(config)
    again.wait_streaming(1)
    pg_db.sql("INSERT INTO t VALUES (-1, 'sentinel')")
    wait_until(lambda: stream_count("DOWN", private_nats.url) >= 51, 60,
               message="the 50 rows and the sentinel in the stream")
    events = [json.loads(m.data) for m in stream_messages("DOWN", private_nats.url)]
    assert [e["pk"]["id"] for e in events] == list(range(1, 51)) + [-1]
