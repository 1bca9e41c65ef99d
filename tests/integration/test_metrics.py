"""/metrics (parsed by prometheus_client's own parser) and /healthz."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import wait_until
from tests.integration.conftest import pg_backend


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str):
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except (ConnectionError, urllib.error.URLError):
        return None, ""


def samples(text: str) -> dict:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_metrics_count_events_by_table_and_type_and_healthz_follows_backends(
        lapidus_factory, pg_db):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    pg_db.sql("CREATE TABLE a (id int PRIMARY KEY)", "CREATE TABLE b (id int PRIMARY KEY)")
    proc = lapidus_factory({"http": {"listen": f"127.0.0.1:{port}"},
                            "backends": [pg_backend(pg_db, name="good")],
                            "plugins": {"stdout": {}}})
    wait_until(lambda: get(base + "/healthz")[0] == 200, 30, message="healthz 200")
    pg_db.sql("INSERT INTO a SELECT generate_series(1, 3)", "UPDATE a SET id = id + 10",
              "INSERT INTO b VALUES (1)")
    proc.wait_events(7)

    def counter(found, table, kind):
        return found.get(("lapidus_events_total",
                          (("backend", "good"), ("table", table), ("type", kind))))

    def counted():
        # workers report once a second: wait until the report covers all seven events
        found = samples(get(base + "/metrics")[1])
        return found if counter(found, "public.b", "insert") == 1 else None

    found = wait_until(counted, 15, message="per-table counters")
    assert counter(found, "public.a", "insert") == 3
    assert counter(found, "public.a", "update") == 3
    assert found[("lapidus_backend_up", (("backend", "good"),))] == 1
    assert ("lapidus_pg_slot_retained_wal_bytes",
            (("backend", "good"), ("slot", f"{pg_db.name}_good"))) in found
    assert get(base + "/nope")[0] == 404


def test_healthz_is_503_while_a_backend_is_not_streaming(lapidus_factory, pg_db):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    lapidus_factory({"http": {"listen": f"127.0.0.1:{port}"},
                     "backends": [pg_backend(pg_db, name="good"),
                                  pg_backend(pg_db, name="bad", database="missing_db")],
                     "plugins": {"stdout": {}}})

    def only_bad_down():
        code, body = get(base + "/healthz")
        return (code, body) if '"not_streaming": ["bad"]' in body else None

    code, body = wait_until(only_bad_down, 30, message="healthz naming only the bad backend")
    assert code == 503
