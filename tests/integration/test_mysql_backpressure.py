"""A MariaDB backend whose sink is down: the worker stops reading after its window of batches,
keeps its position, and delivers everything, once each and in order, when the sink returns."""

from __future__ import annotations

import pytest

from tests.conftest import wait_until
from tests.integration.conftest import backend_status
from tests.integration.nats_fixtures import (create_stream, private_nats,  # noqa: F401
                                             stream_count)

pytest_plugins = ["tests.integration.mysql_fixtures"]
from tests.integration.mysql_fixtures import lapidus_backend  # noqa: E402

pytestmark = pytest.mark.integration

BATCH, WINDOW, TRANSACTIONS, ROWS_PER_TX = 100, 3, 40, 50


def test_a_down_sink_stops_the_worker_after_its_window_and_nothing_is_lost(
        lapidus_factory, sql, private_nats):
    sql.run("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10))")
    proc = lapidus_factory({
        "backends": [lapidus_backend(batch_size=BATCH, max_inflight_batches=WINDOW)],
        "plugins": {"nats": {"server": private_nats.url, "jetstream": True,
                             "subject_prefix": "mbp", "reconnect_time_wait": 0.3}}})
    proc.wait_log('"streaming"')
    for tx in range(TRANSACTIONS):
        sql.run("INSERT INTO t VALUES " + ",".join(
            f"({tx * ROWS_PER_TX + i}, 'x')" for i in range(ROWS_PER_TX)))
    total = TRANSACTIONS * ROWS_PER_TX

    # The window fills and stays full: the worker reads no further while NATS is down.
    full = wait_until(lambda: (lambda s: s if s.get("inflight") == WINDOW else None)(
        backend_status(proc.config_path)), 30, message=f"{WINDOW} unconfirmed batches")
    assert full["events"] <= WINDOW * BATCH < total
    assert full["position"] is None                       # nothing confirmed, nothing saved
    # Still so once the oldest held event has aged by two seconds more.
    again = wait_until(lambda: (lambda s: s if s.get("lag_seconds", 0) >= full["lag_seconds"] + 2
                                else None)(backend_status(proc.config_path)), 30,
                       message="the delivery lag growing while NATS is down")
    assert again["events"] == full["events"] and again["inflight"] == WINDOW

    # NATS comes: every event is stored once.
    private_nats.start()
    create_stream("MBP", ["mbp.>"], url=private_nats.url)
    wait_until(lambda: stream_count("MBP", private_nats.url) == total, 60, interval=0.2,
               message=f"all {total} events stored")
    done = wait_until(lambda: (lambda s: s if s.get("inflight") == 0 and s.get("position")
                               else None)(backend_status(proc.config_path)), 30,
                      message="the position saved once everything was confirmed")
    assert done["events"] == total
