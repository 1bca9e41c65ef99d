"""PostgreSQL and MariaDB to a webhook through the real lapidus process.

The webhook is :class:`tests.integration.webhook_fixtures.Receiver`, an aiohttp server in this
test process that checks every request's signature and can be told to answer 503, 422 ....
Waiting is always on a condition with a deadline; the one fixed wait is the length of an
outage (ten seconds of 503), which is what is being tested.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from tests.conftest import wait_until
from tests.integration.conftest import pg_backend, status
from tests.integration.tls_fixtures import make_pki, one_untrusted_error
from tests.integration.webhook_fixtures import receiver

pytest_plugins = ["tests.integration.mysql_fixtures"]
from tests.integration.mysql_fixtures import lapidus_backend  # noqa: E402
from tests.integration.sink_loads import (  # noqa: E402
    check_rows, expected_count, finish, mariadb_load, mariadb_table, pg_load, refused,
)

__all__ = ["receiver"]      # a fixture, imported for pytest

pytestmark = pytest.mark.integration

SECRET = "s3cret-of-the-test"


def start(lapidus_factory, backends, plugin: dict, **config):
    proc = lapidus_factory({"backends": backends, "plugins": {"webhook": plugin}, **config})
    return proc.wait_streaming(len(backends))


# --------------------------------------------------------------------------------------------

def test_pg_and_mariadb_rows_arrive_once_in_commit_order_signed(lapidus_factory, pg_db, sql,
                                                                 receiver):
    webhook = receiver(secret=SECRET)
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v int)")
    mariadb_table(sql)
    proc = start(lapidus_factory, [pg_backend(pg_db), lapidus_backend("crm")],
                 {"url": webhook.url, "secret": SECRET, "batch_size": 200})
    loads = [pg_load(pg_db.name), mariadb_load()]
    for load in loads:
        finish(load)
    wait_until(lambda: len(webhook.events()) >= 2 * expected_count(), 60,
               message=f"{2 * expected_count()} events at the webhook")
    events = webhook.events()
    check_rows(events, "pg")
    check_rows(events, "crm")
    # without a crash or an outage, each event came exactly once
    assert len(events) == len({e["id"] for e in events}) == 2 * expected_count()
    assert webhook.bad_signatures == 0 and webhook.answered == {}
    for taken in webhook.requests():
        headers = taken.headers
        assert headers["Lapidus-Signature"].startswith("sha256=")
        assert headers["Idempotency-Key"] == f"{taken.events[0]['id']}..{taken.events[-1]['id']}"
        assert headers["Lapidus-Backend"] == taken.events[0]["backend"]
        assert int(headers["Lapidus-Events"]) == len(taken.events) <= 200
        assert headers["Content-Type"] == "application/json"
    health = status(proc.config_path)
    assert health["pg"]["sinks"]["webhook"]["connected"] is True
    assert health["crm"]["sinks"]["webhook"]["connected"] is True
    assert "Traceback" not in proc.log()


def test_a_webhook_answering_503_for_10_s_holds_the_load_and_loses_nothing(lapidus_factory,
                                                                           pg_db, sql,
                                                                           receiver):
    webhook = receiver()
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v int)")
    mariadb_table(sql)
    proc = start(lapidus_factory, [pg_backend(pg_db), lapidus_backend("crm")],
                 {"url": webhook.url, "batch_size": 100, "retry_max": 1})
    loads = [pg_load(pg_db.name), mariadb_load()]
    wait_until(lambda: len(webhook.events()) >= 2000, 30, message="2000 events before the outage")
    webhook.answer = lambda events: (503, {"Retry-After": "1"})
    outage_ends = time.monotonic() + 10
    taken_at_outage = len(webhook.events())
    # the outage shows: both backends' webhook down in lapidusctl status
    wait_until(lambda: all(not row.get("sinks", {}).get("webhook", {}).get("connected", True)
                           for row in status(proc.config_path).values()), 15,
               message="webhook down in lapidusctl status")
    while time.monotonic() < outage_ends:       # the outage's length, not a condition
        time.sleep(0.1)
    assert len(webhook.events()) == taken_at_outage
    assert webhook.answered.get(503, 0) >= 2
    webhook.answer = None
    for load in loads:
        finish(load)
    wait_until(lambda: len({e["id"] for e in webhook.events()}) >= 2 * expected_count(), 60,
               message="every event after the outage")
    events = webhook.events()
    check_rows(events, "pg")
    check_rows(events, "crm")
    wait_until(lambda: all(row["sinks"]["webhook"]["connected"]
                           for row in status(proc.config_path).values()), 10,
               message="webhook up again in lapidusctl status")
    log = proc.log()
    assert "webhook unavailable" in log and "webhook answering again" in log
    # an outage is one line when it starts (and one per 30 s), not one per retry
    assert log.count("webhook unavailable") <= 4
    assert "Traceback" not in log


def test_a_refused_event_goes_to_the_dead_letters_the_rest_streams_on(lapidus_factory, pg_db,
                                                                      receiver):
    webhook = receiver()
    webhook.answer = lambda events: 422 if any(e["pk"] == {"id": 7} for e in events) else 200
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v int)")
    proc = start(lapidus_factory, [pg_backend(pg_db, on_undeliverable="dead_letter")],
                 {"url": webhook.url})
    pg_db.sql("INSERT INTO t SELECT g, 0 FROM generate_series(1, 20) g")
    pg_db.sql("INSERT INTO t VALUES (21, 0)")
    wait_until(lambda: {e["pk"]["id"] for e in webhook.events()} >= set(range(1, 22)) - {7},
               30, message="every row but the refused one")
    row = wait_until(lambda: (lambda r: r if r.get("dead_letters") == 1 else None)(
        status(proc.config_path)["pg"]), 10, message="one dead letter")
    assert 7 not in {e["pk"]["id"] for e in webhook.events()}
    # the refused request of 20 events was narrowed down to the one event, in order
    singles = [t.events[0]["pk"]["id"] for t in webhook.requests() if len(t.events) == 1]
    assert singles[:6] == [1, 2, 3, 4, 5, 6]
    dead = (proc.workdir / "state" / "pg").glob("dead*")
    text = "".join(p.read_text() for p in dead if p.is_file())
    assert '"id": 7' in text or '"id":7' in text
    assert "HTTP 422" in proc.log()
    assert row["state"] == "RUNNING"


def test_a_refused_event_holds_the_backend_by_default_and_is_shown(lapidus_factory, pg_db,
                                                                   receiver):
    webhook = receiver()
    webhook.answer = lambda events: 400 if any(e["pk"] == {"id": 3} for e in events) else 200
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v int)")
    proc = start(lapidus_factory, [pg_backend(pg_db)], {"url": webhook.url})
    pg_db.sql("INSERT INTO t SELECT g, 0 FROM generate_series(1, 5) g")
    held = wait_until(lambda: status(proc.config_path)["pg"].get("undeliverable"), 30,
                      message="the backend held at the refused event")
    assert "HTTP 400" in held["webhook"]["error"] and held["webhook"]["fix"]
    assert sorted({e["pk"]["id"] for e in webhook.events()}) == [1, 2]
    webhook.answer = None         # the receiver is fixed: the held event goes through
    wait_until(lambda: {e["pk"]["id"] for e in webhook.events()} >= {1, 2, 3, 4, 5}, 90,
               message="the held events once the receiver takes them")


def test_wrong_credentials_are_one_clear_error_and_the_backend_waits(lapidus_factory, pg_db,
                                                                     receiver):
    webhook = receiver(secret=SECRET)
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v int)")
    proc = start(lapidus_factory, [pg_backend(pg_db)], {"url": webhook.url, "secret": "wrong"})
    pg_db.sql("INSERT INTO t VALUES (1, 0)")
    wait_until(lambda: "refuses the sink's settings" in proc.log(), 20,
               message="the credentials error in the log")
    wait_until(lambda: not status(proc.config_path)["pg"]["sinks"]["webhook"]["connected"], 10,
               message="webhook down in lapidusctl status")
    lines = [json.loads(line) for line in proc.log().splitlines()
             if "refuses the sink's settings" in line]
    assert len(lines) == 1
    assert "HTTP 401" in lines[0]["error"] and "Authorization" in lines[0]["fix"]
    assert "wrong" not in proc.log() and SECRET not in proc.log()
    assert "Traceback" not in proc.log()
    assert webhook.events() == [] and webhook.bad_signatures >= 1


def test_a_wrong_url_scheme_is_one_clear_error_of_lapidus_t(tmp_path):
    out = refused(tmp_path, {"backends": [{
        "name": "pg", "type": "postgresql", "database": "x",
        "plugins": {"webhook": {"url": "ftp://user:pw@example.test/hook"}}}]})
    assert 'backends[0].plugins.webhook.url: has the scheme "ftp"' in out, out
    assert "pw" not in out


def test_https_with_a_private_ca_delivers_every_row(lapidus_factory, pg_db, receiver,
                                                   tmp_path):
    pki = make_pki(tmp_path / "pki")
    webhook = receiver(secret=SECRET, tls=pki)
    assert webhook.url.startswith("https://")
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v int)")
    proc = start(lapidus_factory, [pg_backend(pg_db)],
                 {"url": webhook.url, "secret": SECRET, "tls_ca_file": str(pki.ca),
                  "batch_size": 50})
    pg_db.sql("INSERT INTO t SELECT g, g FROM generate_series(1, 500) g")
    events = webhook.wait_count(500)
    assert sorted(e["pk"]["id"] for e in events) == list(range(1, 501))
    assert webhook.bad_signatures == 0
    wait_until(lambda: status(proc.config_path)["pg"]["sinks"]["webhook"]["connected"], 10,
               message="webhook up in lapidusctl status")
    assert "Traceback" not in proc.log()


def test_a_server_certificate_of_another_ca_is_one_clear_error_and_nothing_is_sent(
        lapidus_factory, pg_db, receiver, tmp_path):
    pki = make_pki(tmp_path / "pki")
    webhook = receiver(secret=SECRET, tls=pki)
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v int)")
    proc = start(lapidus_factory, [pg_backend(pg_db)],
                 {"url": webhook.url, "secret": SECRET, "tls_ca_file": str(pki.wrong_ca)})
    pg_db.sql("INSERT INTO t VALUES (1, 0)")
    message = "the webhook's TLS certificate is not trusted"
    wait_until(lambda: message in proc.log(), 30, message="the certificate error in the log")
    state = wait_until(lambda: (lambda s: s if not s["connected"] else None)(
        status(proc.config_path)["pg"]["sinks"]["webhook"]), 10,
        message="webhook down in lapidusctl status")
    assert "certificate verify failed" in state["last_error"]
    one_untrusted_error(proc.log(), message, "webhook")
    assert webhook.events() == []



def test_kill_9_of_the_dispatcher_mid_load_loses_no_row(lapidus_factory, pg_db, sql, receiver):
    webhook = receiver(secret=SECRET)
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v int)")
    mariadb_table(sql)
    proc = start(lapidus_factory, [pg_backend(pg_db), lapidus_backend("crm")],
                 {"url": webhook.url, "secret": SECRET})
    loads = [pg_load(pg_db.name), mariadb_load()]
    # both backends well into their loads (so each has confirmed, checkpointed batches)
    wait_until(lambda: all(sum(1 for e in webhook.events() if e["backend"] == name) >= 1500
                           for name in ("pg", "crm")), 30,
               message="1500 events of each backend before the kill")
    victim = proc.dispatcher_pid()
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: proc.dispatcher_pid() != victim, 30, message="a new dispatcher")
    for load in loads:
        finish(load)
    wait_until(lambda: len({e["id"] for e in webhook.events()}) >= 2 * expected_count(), 60,
               message="every event after the dispatcher's restart")
    events = webhook.events()
    check_rows(events, "pg")
    check_rows(events, "crm")
    assert webhook.bad_signatures == 0
