"""on_undeliverable through the real supervisor, PostgreSQL and a private nats-server with a
small max_payload: "hold" keeps the backend at the refused row, visibly, until the server takes
it; "dead_letter" moves it aside, streams on, lists it, and sends it again on --resend."""

from __future__ import annotations

import json

from tests.conftest import wait_until
from tests.integration.conftest import ctl, pg_backend, running, status
from tests.integration.nats_fixtures import Watcher, private_nats

__all__ = ["private_nats"]   # fixture, imported for pytest

MAX_PAYLOAD = 4096


def start(lapidus_factory, pg_db, private_nats, tmp_path, policy: str, max_payload: int):
    (tmp_path / "nats.conf").write_text(f"max_payload: {max_payload}\n")
    private_nats.start("-c", str(tmp_path / "nats.conf"))
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, body text)")
    proc = lapidus_factory({
        "backends": [pg_backend(pg_db, on_undeliverable=policy)],
        "plugins": {"nats": {"servers": [private_nats.url], "subject_prefix": "und"}}})
    wait_until(lambda: running(proc.config_path, "pg"), 30)
    return proc


def ids(messages):
    return [json.loads(m.data)["item"]["id"] for m in messages]


def test_dead_letter_moves_the_large_row_aside_streams_on_and_resends_it(
        lapidus_factory, pg_db, private_nats, tmp_path):
    proc = start(lapidus_factory, pg_db, private_nats, tmp_path, "dead_letter", MAX_PAYLOAD)
    watcher = Watcher("und.>", url=private_nats.url)
    try:
        pg_db.sql("INSERT INTO t VALUES (1, 'small')",
                  f"INSERT INTO t VALUES (2, '{'x' * 2 * MAX_PAYLOAD}')",
                  "INSERT INTO t VALUES (3, 'small')")
        assert ids(watcher.wait_count(2)) == [1, 3]
        row = wait_until(lambda: status(proc.config_path)["pg"].get("dead_letters") == 1 and
                         status(proc.config_path)["pg"], 20)
        assert row["state"] == "RUNNING"

        code, out, err = ctl(proc.config_path, "dead-letters", "pg", "--json")
        assert code == 0, err
        (entry,) = [json.loads(line) for line in out.splitlines()]
        assert entry["table"] == "t" and entry["sink"] == "nats"
        assert "max_payload" in entry["error"] and entry["fix"]
        code, out, _ = ctl(proc.config_path, "dead-letters", "pg")
        assert code == 0 and entry["id"] in out and "--resend" in out

        # the operator raises max_payload, then sends the dead letters again
        watcher.close()
        private_nats.stop()
        (tmp_path / "nats.conf").write_text(f"max_payload: {16 * MAX_PAYLOAD}\n")
        private_nats.start("-c", str(tmp_path / "nats.conf"))
        watcher = Watcher("und.>", url=private_nats.url)
        pg_db.sql("INSERT INTO t VALUES (4, 'small')")
        assert ids(watcher.wait_count(1)) == [4]   # connected again
        code, out, err = ctl(proc.config_path, "dead-letters", "pg", "--resend")
        assert code == 0, err
        again = watcher.wait_count(2)
        assert ids(again) == [4, 2]
        assert again[1].headers["Nats-Msg-Id"] == entry["id"]   # the same id
        wait_until(lambda: status(proc.config_path)["pg"]["dead_letters"] == 0, 20)
        code, out, _ = ctl(proc.config_path, "dead-letters", "pg")
        assert code == 0 and "no dead letters" in out
    finally:
        watcher.close()


def test_hold_keeps_the_backend_at_the_large_row_and_says_why(
        lapidus_factory, pg_db, private_nats, tmp_path):
    proc = start(lapidus_factory, pg_db, private_nats, tmp_path, "hold", MAX_PAYLOAD)
    watcher = Watcher("und.>", url=private_nats.url)
    try:
        pg_db.sql("INSERT INTO t VALUES (1, 'small')",
                  f"INSERT INTO t VALUES (2, '{'x' * 2 * MAX_PAYLOAD}')",
                  "INSERT INTO t VALUES (3, 'small')")
        held = wait_until(lambda: status(proc.config_path)["pg"].get("undeliverable"), 30)
        assert "max_payload" in held["nats"]["error"] and held["nats"]["table"] == "public.t"
        code, out, _ = ctl(proc.config_path, "status")
        assert code == 0 and "held: nats refuses" in out
        assert 3 not in ids(watcher.seen())      # nothing after the refused row
        assert not (tmp_path / "state" / "pg" / "dead-letters.jsonl").exists()
    finally:
        watcher.close()
    # a stop does not wait for the ack of the held row, which cannot come
    assert proc.terminate(30) == 0
    told = [r for r in proc.records()
            if r["event"] == "not waiting for the acks of the batches in flight: a sink holds them"]
    assert told and told[0]["sinks"] == ["nats"]
