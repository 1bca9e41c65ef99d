"""lapidusctl against a running supervisor, and SIGHUP reloads."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat

from tests.conftest import wait_until
from tests.integration.conftest import ctl, pg_backend, running, status


def test_status_restart_stop_start(lapidus_factory, pg_db, tmp_path):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY)")
    proc = lapidus_factory({"backends": [pg_backend(pg_db, name="one"),
                                         pg_backend(pg_db, name="two")],
                            "plugins": {"stdout": {}}})
    path = proc.config_path
    wait_until(lambda: running(path, "one") and running(path, "two"), 30)

    code, out, _ = ctl(path, "status")
    assert code == 0
    header, *rows, summary = out.splitlines()
    assert header.split()[:3] == ["backend", "state", "pid"]
    assert [r.split()[:2] for r in rows] == [["one", "RUNNING"], ["two", "RUNNING"]]
    assert summary == "2 backends: 2 RUNNING"

    pid_one, pid_two = status(path)["one"]["pid"], status(path)["two"]["pid"]
    assert ctl(path, "restart", "one")[0] == 0
    wait_until(lambda: (lambda r: r and r["pid"] != pid_one)(running(path, "one")), 30)
    assert status(path)["two"]["pid"] == pid_two   # the other backend was not touched

    assert ctl(path, "stop", "two")[0] == 0
    wait_until(lambda: status(path)["two"]["state"] == "STOPPED", 15)
    code, out, _ = ctl(path, "status", "--state", "stopped")
    assert code == 0 and out.splitlines()[1].split()[:2] == ["two", "STOPPED"]
    assert out.splitlines()[-1] == "1 of 2 backends shown: 1 STOPPED"
    code, out, _ = ctl(path, "status", "o*", "--json")
    assert [b["name"] for b in json.loads(out)["backends"]] == ["one"]
    pg_db.sql("INSERT INTO t VALUES (1)")
    events = proc.wait_events(1)
    assert {e["backend"] for e in events} == {"one"}

    assert ctl(path, "start", "two")[0] == 0
    wait_until(lambda: running(path, "two"), 30)
    # "two" catches up on the row committed while it was stopped
    events = proc.wait_events(2)
    assert sorted(e["backend"] for e in events) == ["one", "two"]

    code, _, err = ctl(path, "stop", "three")
    assert code == 1 and 'unknown backend "three"' in err


def test_socket_is_private_and_absent_socket_exits_3(lapidus_factory, pg_db, tmp_path):
    proc = lapidus_factory({"backends": [pg_backend(pg_db)], "plugins": {"stdout": {}}})
    sock = tmp_path / "state" / "lapidus.sock"
    wait_until(sock.exists, 20)
    assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
    assert proc.terminate() == 0
    assert not sock.exists()
    code, _, err = ctl(proc.config_path, "status")
    assert code == 3
    assert "cannot reach lapidus" in err


def test_sighup_restarts_only_the_backend_whose_filters_changed(lapidus_factory, pg_db):
    pg_db.sql("CREATE TABLE a (id int PRIMARY KEY)", "CREATE TABLE b (id int PRIMARY KEY)")
    config = {"backends": [pg_backend(pg_db, name="one", include_tables=["a"]),
                           pg_backend(pg_db, name="two")],
              "plugins": {"stdout": {}}}
    proc = lapidus_factory(config)
    path = proc.config_path
    wait_until(lambda: running(path, "one") and running(path, "two"), 30)
    before = status(path)

    config["backends"][0]["include_tables"] = ["b"]
    path.write_text(json.dumps(config))
    proc.proc.send_signal(signal.SIGHUP)
    proc.wait_log("configuration reloaded")
    wait_until(lambda: (lambda r: r and r["pid"] != before["one"]["pid"])(running(path, "one")), 30)
    assert status(path)["two"]["pid"] == before["two"]["pid"]

    pg_db.sql("INSERT INTO a VALUES (1)", "INSERT INTO b VALUES (1)")
    events = proc.wait_events(3)
    seen = sorted((e["backend"], e["table"]) for e in events)
    assert seen == [("one", "b"), ("two", "a"), ("two", "b")]


def test_invalid_config_on_sighup_keeps_the_running_one(lapidus_factory, pg_db):
    proc = lapidus_factory({"backends": [pg_backend(pg_db)], "plugins": {"stdout": {}}})
    path = proc.config_path
    wait_until(lambda: running(path, "pg"), 30)
    pid = status(path)["pg"]["pid"]
    broken = json.loads(path.read_text())
    broken["backends"] = [{"type": "oracle"}]
    path.write_text(json.dumps(broken))
    proc.proc.send_signal(signal.SIGHUP)
    proc.wait_log("reload refused")
    assert status(path)["pg"]["pid"] == pid


def test_slots_lists_ours_and_drop_slot_removes_an_abandoned_one(lapidus_factory, pg_db):
    proc = lapidus_factory({"backends": [pg_backend(pg_db)], "plugins": {"stdout": {}}})
    path = proc.config_path
    wait_until(lambda: running(path, "pg"), 30)
    abandoned = f"lapidus_{pg_db.name}_old"
    pg_db.sql("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", args=(abandoned,))

    code, out, err = ctl(path, "slots", "--json")
    assert code == 0, err
    rows = {r["slot"]: r for r in json.loads(out)}
    ours = rows[f"{pg_db.name}_pg"]
    assert (ours["backend"], ours["active"], ours["abandoned"]) == ("pg", True, False)
    assert ours["retained_wal_bytes"] >= 0
    assert rows[abandoned]["abandoned"] is True

    code, _, err = ctl(path, "drop-slot", f"{pg_db.name}_pg", "--yes")
    assert code == 1 and "in use" in err           # an active slot is never dropped
    code, _, err = ctl(path, "drop-slot", abandoned)
    assert code == 2 and "--yes" in err             # no terminal: no silent drop
    code, out, err = ctl(path, "drop-slot", abandoned, "--yes")
    assert code == 0, err
    assert pg_db.slot(abandoned) is None
    code, _, err = ctl(path, "drop-slot", "lapidus_no_such_slot", "--yes")
    assert code == 1 and "no Lapidus slot" in err


def test_slots_lists_the_servers_that_answer_and_names_the_one_that_does_not(pg_db, tmp_path):
    ours = f"lapidus_{pg_db.name}_left"
    pg_db.sql("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", args=(ours,))
    with socket.socket() as closed:          # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    path = tmp_path / "lapidus.json"
    path.write_text(json.dumps({"state_dir": str(tmp_path / "state"), "backends": [
        pg_backend(pg_db), pg_backend(pg_db, name="gone", port=port, connect_timeout=3)],
        "plugins": {"stdout": {}}}))
    code, out, err = ctl(path, "slots", "--json")
    assert code == 3
    assert ours in {row["slot"] for row in json.loads(out)}
    assert err == (f'lapidusctl: backend "gone": cannot reach PostgreSQL at 127.0.0.1:{port}: '
                   f"Connection refused; check that the server runs and the host and port "
                   f"are right\n")
    # a slot on the server that answers is dropped; one that is not found there may be on
    # the other: the answer says why that one could not be looked at
    code, _, err = ctl(path, "drop-slot", ours, "--yes")
    assert code == 0, err
    assert pg_db.slot(ours) is None
    code, _, err = ctl(path, "drop-slot", ours, "--yes")
    assert code == 3 and 'backend "gone": cannot reach PostgreSQL' in err
