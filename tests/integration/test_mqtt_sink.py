"""PostgreSQL and MariaDB to MQTT through the real lapidus process, against a private
Mosquitto per test (tests/integration/mqtt_fixtures.py), observed by a paho subscriber.

Waiting is always on a condition with a deadline; the one fixed wait is the length of an
outage (the broker stopped for three seconds), which is what is being tested.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from lapidus.sinks.mqtt.topics import decode_key, decode_level
from tests.conftest import wait_until
from tests.integration.conftest import pg_backend, status
from tests.integration.mqtt_fixtures import broker, subscribe
from tests.integration.tls_fixtures import make_pki, one_untrusted_error

pytest_plugins = ["tests.integration.mysql_fixtures"]
from tests.integration.mysql_fixtures import lapidus_backend  # noqa: E402
from tests.integration.sink_loads import (  # noqa: E402
    check_rows, expected_count, finish, mariadb_load, mariadb_table, pg_load, refused,
)

__all__ = ["broker", "subscribe"]      # fixtures, imported for pytest

pytestmark = pytest.mark.integration


def start(lapidus_factory, backends, plugin: dict, wait_streaming=True):
    proc = lapidus_factory({"backends": backends, "plugins": {"mqtt": plugin}})
    return proc.wait_streaming(len(backends)) if wait_streaming else proc


def sinks_of(proc) -> dict:
    return {name: row.get("sinks", {}).get("mqtt", {})
            for name, row in status(proc.config_path).items()}


def test_pg_and_mariadb_rows_arrive_once_in_commit_order(lapidus_factory, pg_db, sql, broker,
                                                         subscribe):
    mosquitto = broker()
    sub = subscribe(mosquitto.port, "it/#")
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v int)")
    mariadb_table(sql)
    # a short ack_timeout: a broker that confirms as it should never trips it
    proc = start(lapidus_factory, [pg_backend(pg_db), lapidus_backend("crm")],
                 {"url": mosquitto.url, "topic_prefix": "it", "ack_timeout": 5})
    loads = [pg_load(pg_db.name), mariadb_load()]
    for load in loads:
        finish(load)
    seen = sub.wait_distinct(2 * expected_count())
    events = [m.event for m in seen]
    check_rows(events, "pg")
    check_rows(events, "crm")
    assert len(seen) == 2 * expected_count()        # no outage: each exactly once
    for message in seen[:50] + seen[-50:]:
        event = message.event
        levels = message.topic.split("/")
        assert levels[0] == "it"
        assert (decode_level(levels[1]), decode_level(levels[2])) == (event["schema"], "t")
        assert decode_key(levels[3:]) == (str(event["pk"]["id"]),)
        # MQTT 5 user properties (Mosquitto 2 speaks 5)
        assert message.properties == {"Lapidus-Id": event["id"],
                                      "Lapidus-Backend": event["backend"],
                                      "Lapidus-Type": event["type"],
                                      "Lapidus-Position": event["position"]}
    health = sinks_of(proc)
    assert health["pg"]["connected"] and health["crm"]["connected"]
    assert health["pg"]["protocol"] == "5"
    assert "Traceback" not in proc.log()
    assert "no PUBACK" not in proc.log() and "disconnected" not in proc.log()


def test_awkward_keys_become_escaped_levels(lapidus_factory, pg_db, broker, subscribe):
    mosquitto = broker()
    sub = subscribe(mosquitto.port, "lapidus/#")
    pg_db.sql("CREATE TABLE \"we/ird\" (a text, b int, PRIMARY KEY (a, b))")
    start(lapidus_factory, [pg_backend(pg_db)], {"url": mosquitto.url})
    pg_db.sql("INSERT INTO \"we/ird\" VALUES ('x/y+z#', 1), ('_', 2), ('', 3), ('%', 4)")
    seen = wait_until(lambda: (lambda m: m if len(m) >= 4 else None)(sub.seen()), 30,
                      message="4 messages")
    assert [m.topic for m in seen] == [
        "lapidus/public/we%2Fird/x%2Fy%2Bz%23/1", "lapidus/public/we%2Fird/%5F/2",
        "lapidus/public/we%2Fird/%/3", "lapidus/public/we%2Fird/%25/4"]
    for message in seen:
        assert decode_key(message.topic.split("/")[3:]) == tuple(
            str(v) for v in message.event["pk"].values())


def test_broker_outage_then_kill_9_of_the_dispatcher_mid_load_lose_nothing(
        lapidus_factory, pg_db, sql, broker, subscribe):
    """The broker stops (TERM: it saves its persistence file) while both backends stream,
    stays down for three seconds while the load goes on, and comes back on its port; then,
    the load still going, the dispatcher is killed with SIGKILL.  Every row arrives, in order
    per key (repeats, by id, allowed).  One test for both, to keep to one load of 2 x 10,000
    rows: on a shared 2-core machine each load costs 10-25 s."""
    mosquitto = broker()
    sub = subscribe(mosquitto.port, "it/#")
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v int)")
    mariadb_table(sql)
    proc = start(lapidus_factory, [pg_backend(pg_db), lapidus_backend("crm")],
                 {"url": mosquitto.url, "topic_prefix": "it"})
    loads = [pg_load(pg_db.name), mariadb_load()]
    wait_until(lambda: len(sub.seen()) >= 2000, 30, message="2000 messages before the outage")
    mosquitto.stop()
    wait_until(lambda: all(not s.get("connected", True) for s in sinks_of(proc).values()), 15,
               message="mqtt down in lapidusctl status")
    down = sinks_of(proc)["pg"]
    assert down["server"] == mosquitto.url and down["down_seconds"] is not None
    outage_ends = time.monotonic() + 3
    while time.monotonic() < outage_ends:        # the outage's length, not a condition
        time.sleep(0.1)
    mosquitto.start()                            # the same port and persistence file
    wait_until(lambda: all(s.get("connected") for s in sinks_of(proc).values()), 15,
               message="mqtt up again in lapidusctl status")
    at_kill = len(sub.seen())
    victim = proc.dispatcher_pid()
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: proc.dispatcher_pid() != victim, 30, message="a new dispatcher")
    for load in loads:
        finish(load)
    seen = sub.wait_distinct(2 * expected_count(), 60)
    assert at_kill < 2 * expected_count(), "the load was over before the kill"
    check_rows([m.event for m in seen], "pg")
    check_rows([m.event for m in seen], "crm")
    log = proc.log()
    assert "mqtt disconnected; reconnecting" in log and "mqtt connected" in log
    assert "Traceback" not in log


def test_wrong_credentials_are_one_clear_error_and_the_backend_waits(lapidus_factory, pg_db,
                                                                     broker):
    mosquitto = broker(users={"lapidus": "right"})
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v int)")
    url = f"mqtt://lapidus:wrong-pass@127.0.0.1:{mosquitto.port}"
    proc = start(lapidus_factory, [pg_backend(pg_db)], {"url": url})
    pg_db.sql("INSERT INTO t VALUES (1, 0)")
    wait_until(lambda: "refuses the sink's settings" in proc.log(), 20,
               message="the credentials error in the log")
    wait_until(lambda: sinks_of(proc)["pg"].get("last_error"), 10,
               message="the error in lapidusctl status")
    lines = [json.loads(line) for line in proc.log().splitlines()
             if "refuses the sink's settings" in line]
    assert len(lines) == 1, lines
    assert "password" in lines[0]["error"].lower() or "authori" in lines[0]["error"].lower()
    assert "url" in lines[0]["fix"]
    assert not sinks_of(proc)["pg"]["connected"]
    assert "wrong-pass" not in proc.log() and "Traceback" not in proc.log()


def test_mqtts_with_a_private_ca_delivers_every_row(lapidus_factory, pg_db, broker, subscribe,
                                                   tmp_path):
    pki = make_pki(tmp_path / "pki")
    mosquitto = broker(tls=pki)
    seen = subscribe(mosquitto.port, "lapidus/#")      # on the plain listener
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v int)")
    proc = start(lapidus_factory, [pg_backend(pg_db)],
                 {"url": mosquitto.tls_url, "tls_ca_file": str(pki.ca)})
    pg_db.sql("INSERT INTO t SELECT g, g FROM generate_series(1, 500) g")
    messages = seen.wait_distinct(500)
    assert sorted({m.event["pk"]["id"] for m in messages}) == list(range(1, 501))
    wait_until(lambda: sinks_of(proc)["pg"].get("connected") is True, 10,
               message="mqtt connected in lapidusctl status")
    assert "Traceback" not in proc.log()


def test_a_broker_certificate_of_another_ca_is_one_clear_error_and_nothing_is_sent(
        lapidus_factory, pg_db, broker, subscribe, tmp_path):
    pki = make_pki(tmp_path / "pki")
    mosquitto = broker(tls=pki)
    seen = subscribe(mosquitto.port, "lapidus/#")
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v int)")
    proc = start(lapidus_factory, [pg_backend(pg_db)],
                 {"url": mosquitto.tls_url, "tls_ca_file": str(pki.wrong_ca)})
    pg_db.sql("INSERT INTO t VALUES (1, 0)")
    message = "the mqtt broker's TLS certificate is not trusted"
    wait_until(lambda: message in proc.log(), 30, message="the certificate error in the log")
    state = wait_until(lambda: (lambda s: s if s.get("last_error") else None)(
        sinks_of(proc)["pg"]), 10, message="the error in lapidusctl status")
    assert state["connected"] is False
    assert "certificate verify failed" in state["last_error"]
    one_untrusted_error(proc.log(), message, "mqtt")
    assert seen.seen() == []


def test_a_topic_the_broker_refuses_goes_to_the_dead_letters_the_rest_streams_on(
        lapidus_factory, pg_db, broker, subscribe):
    """MQTT 5: the broker's ACL refuses one table's topics in its PUBACK (Not authorized);
    with on_undeliverable = "dead_letter" that event is moved aside and the rest arrives."""
    mosquitto = broker(users={"lapidus": "pw", "reader": "pw"},
                       acl="user lapidus\ntopic write lapidus/public/t/#\n"
                           "user reader\ntopic read lapidus/#\n")
    sub = subscribe(mosquitto.port, "lapidus/#", username="reader", password="pw")
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v int)",
              "CREATE TABLE secret (id int PRIMARY KEY, v int)")
    proc = start(lapidus_factory, [pg_backend(pg_db, on_undeliverable="dead_letter")],
                 {"url": f"mqtt://lapidus:pw@127.0.0.1:{mosquitto.port}"})
    pg_db.sql("INSERT INTO t VALUES (1, 0), (2, 0)", "INSERT INTO secret VALUES (1, 0)",
              "INSERT INTO t VALUES (3, 0)")
    seen = wait_until(lambda: (lambda m: m if len({x.topic for x in m}) >= 3 else None)(
        sub.seen()), 30, message="the three rows of t")
    # the events before the refused one are sent again with the rest (same ids): at least once
    topics = list(dict.fromkeys(m.topic for m in seen))
    assert topics == [f"lapidus/public/t/{i}" for i in (1, 2, 3)]
    row = wait_until(lambda: (lambda r: r if r.get("dead_letters") == 1 else None)(
        status(proc.config_path)["pg"]), 10, message="one dead letter")
    assert row["state"] == "RUNNING"
    assert "Not authorized" in proc.log() and "lapidus/public/secret/1" in proc.log()


def test_a_wrong_url_scheme_is_one_clear_error_of_lapidus_t(tmp_path):
    out = refused(tmp_path, {
        "backends": [{"name": "pg", "type": "postgresql", "database": "x"}],
        "plugins": {"mqtt": {"url": "http://user:pw@127.0.0.1:1883", "qos": 2}}})
    assert 'plugins.mqtt.url: has the scheme "http"; expected mqtt:// or mqtts://' in out
    assert "plugins.mqtt.qos: expected one of 0, 1" in out
    assert "pw" not in out
