"""Lifecycle paths of the real supervisor: frozen and killed children, reloads that add, remove
and change backends and sink options, a dispatcher that keeps dying, restarts of a child that
ignores SIGTERM.  Each checks that the rows written meanwhile arrive."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys

import psutil

from bench.chaos.lapidus import stop_group
from tests.conftest import wait_until
from tests.integration.conftest import ctl, pg_backend, running, status


def reload_with(proc, config: dict) -> None:
    proc.config_path.write_text(json.dumps(config))
    reloads = proc.log().count("configuration reloaded")
    proc.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: proc.log().count("configuration reloaded") > reloads, 20,
               message=f"a reload; log:\n{proc.log()[-3000:]}")


def ids_of(events, table="t"):
    return sorted(e["item"]["id"] for e in events if e["table"] == table)


def replaced(path, name, old_pid):
    row = running(path, name)
    return row if row and row["pid"] != old_pid else None



def test_a_frozen_worker_is_killed_and_replaced_and_nothing_is_lost(lapidus_factory, pg_db):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY)")
    proc = lapidus_factory({"backends": [pg_backend(pg_db)], "plugins": {"stdout": {}},
                            "supervisor": {"heartbeat_timeout": 3}})
    path = proc.config_path
    first = wait_until(lambda: running(path, "pg"), 30)
    pg_db.sql("INSERT INTO t VALUES (1)")
    proc.wait_events(1)

    os.kill(first["pid"], signal.SIGSTOP)
    pg_db.sql("INSERT INTO t VALUES (2)", "INSERT INTO t VALUES (3)")
    wait_until(lambda: replaced(path, "pg", first["pid"]), 40,
               message=f"a new worker; log:\n{proc.log()[-3000:]}")
    assert not psutil.pid_exists(first["pid"]) or \
        psutil.Process(first["pid"]).status() == psutil.STATUS_ZOMBIE
    events = proc.wait_events(3)
    assert set(ids_of(events)) == {1, 2, 3}
    assert "no heartbeat" in proc.log()


def test_restart_of_a_worker_that_ignores_sigterm_kills_it_after_stop_timeout(
        lapidus_factory, pg_db):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY)")
    proc = lapidus_factory({"backends": [pg_backend(pg_db)], "plugins": {"stdout": {}},
                            "supervisor": {"stop_timeout": 3}})
    path = proc.config_path
    first = wait_until(lambda: running(path, "pg"), 30)
    os.kill(first["pid"], signal.SIGSTOP)     # SIGTERM stays pending: it cannot stop
    pg_db.sql("INSERT INTO t VALUES (1)")
    assert ctl(path, "restart", "pg")[0] == 0
    wait_until(lambda: replaced(path, "pg", first["pid"]), 40,
               message=f"a new worker; log:\n{proc.log()[-3000:]}")
    assert ids_of(proc.wait_events(1)) == [1]
    assert "did not stop within stop_timeout" in proc.log()


def test_reload_adds_removes_renames_and_enables_backends_while_others_stream(
        lapidus_factory, pg_db):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY)")
    config = {"backends": [pg_backend(pg_db, name="one"),
                           pg_backend(pg_db, name="two", enabled=False)],
              "plugins": {"stdout": {}}}
    proc = lapidus_factory(config)
    path = proc.config_path
    one = wait_until(lambda: running(path, "one"), 30)
    assert "two" not in status(path)

    # enable "two", add "three"
    config["backends"][1]["enabled"] = True
    config["backends"].append(pg_backend(pg_db, name="three"))
    reload_with(proc, config)
    wait_until(lambda: running(path, "two") and running(path, "three"), 30,
               message=f"two and three running; log:\n{proc.log()[-3000:]}")
    pg_db.sql("INSERT INTO t VALUES (1)")
    events = proc.wait_events(3)
    assert sorted(e["backend"] for e in events) == ["one", "three", "two"]

    # remove "two", rename "three" to "four" (a new backend with its own slot)
    config["backends"] = [config["backends"][0], pg_backend(pg_db, name="four")]
    reload_with(proc, config)
    wait_until(lambda: running(path, "four") and set(status(path)) == {"one", "four"}, 30,
               message=f"one and four only; log:\n{proc.log()[-3000:]}")
    pg_db.sql("INSERT INTO t VALUES (2)")
    events = proc.wait_events(5)
    second = sorted(e["backend"] for e in events if e["item"]["id"] == 2)
    assert second == ["four", "one"]
    assert status(path)["one"]["pid"] == one["pid"]   # never touched by the reloads
    assert status(path)["one"]["restarts"] == 0


def test_reload_that_changes_a_global_plugin_option_keeps_every_backend_streaming(
        lapidus_factory, pg_db, tmp_path):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY)")
    first_file, second_file = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    config = {"backends": [pg_backend(pg_db)],
              "plugins": {"exec": {"command": ["sh", "-c", f"cat >> {first_file}"]}}}
    proc = lapidus_factory(config)
    path = proc.config_path
    first = wait_until(lambda: running(path, "pg"), 30)
    dispatcher = proc.dispatcher_pid()
    pg_db.sql("INSERT INTO t VALUES (1)")
    wait_until(lambda: first_file.exists() and first_file.read_text().count("\n") == 1, 30)

    config["plugins"]["exec"]["command"] = ["sh", "-c", f"cat >> {second_file}"]
    reload_with(proc, config)
    # the backend uses those plugins, so it restarts (a row it read before that goes to the
    # old command, as it should)
    wait_until(lambda: replaced(path, "pg", first["pid"]), 30)
    pg_db.sql("INSERT INTO t VALUES (2)")
    wait_until(lambda: second_file.exists() and '"id":2' in second_file.read_text(), 30,
               message=f"row 2 in the new command's file; log:\n{proc.log()[-3000:]}")
    assert proc.dispatcher_pid() == dispatcher       # no dispatcher restart was needed
    assert running(path, "pg")


def test_a_dispatcher_that_keeps_dying_backs_off_and_no_backend_goes_fatal(
        lapidus_factory, pg_db):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY)")
    proc = lapidus_factory({"backends": [pg_backend(pg_db)], "plugins": {"stdout": {}},
                            "supervisor": {"max_restarts": 2, "restart_window": 120}})
    path = proc.config_path
    wait_until(lambda: running(path, "pg"), 30)
    for n in range(6):   # more deaths than max_restarts allows a worker
        victim = proc.dispatcher_pid()
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda: proc.dispatcher_pid() != victim, 30)
    pg_db.sql("INSERT INTO t VALUES (1)")
    row = wait_until(lambda: running(path, "pg"), 60,
                     message=f"pg running again; log:\n{proc.log()[-3000:]}")
    assert ids_of(proc.wait_events(1)) == [1]
    assert row["restarts"] == 0          # its dispatcher's deaths are not its crashes
    assert proc.proc.poll() is None
    assert "dispatcher died; restarting it after backoff" in proc.log()
    assert "FATAL" not in proc.log()


def test_reload_names_the_settings_it_cannot_apply(lapidus_factory, pg_db, tmp_path):
    config = {"backends": [pg_backend(pg_db)], "plugins": {"stdout": {}}}
    proc = lapidus_factory(config)
    wait_until(lambda: running(proc.config_path, "pg"), 30)
    config["state_dir"] = str(tmp_path / "elsewhere")
    config["http"] = {"listen": "127.0.0.1:0"}
    reload_with(proc, config)
    log = proc.log()
    assert "changes only when lapidus restarts" in log
    assert '"setting": "state_dir"' in log and '"setting": "http.listen"' in log


def test_every_file_under_the_state_dir_is_private(lapidus_factory, pg_db, tmp_path):
    state = tmp_path / "state"
    (state / "pg").mkdir(parents=True)
    (state / "pg" / "left-by-an-old-version").write_text("x")
    os.chmod(state / "pg" / "left-by-an-old-version", 0o644)
    os.chmod(state / "pg", 0o755)
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY)")
    proc = lapidus_factory({"backends": [pg_backend(pg_db)], "plugins": {"stdout": {}}})
    wait_until(lambda: running(proc.config_path, "pg"), 30)
    pg_db.sql("INSERT INTO t VALUES (1)")
    proc.wait_events(1)
    wait_until(lambda: (state / "pg" / "checkpoint.json").exists(), 20)
    seen = []
    for root, dirs, files in os.walk(state):
        for name, expected in [(d, 0o700) for d in dirs] + [(f, 0o600) for f in files]:
            path = os.path.join(root, name)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode) or stat.S_ISSOCK(st.st_mode):
                continue
            seen.append(name)
            assert stat.S_IMODE(st.st_mode) == expected, f"{path}: {oct(st.st_mode)}"
    assert {"checkpoint.json", "spool", "left-by-an-old-version"} <= set(seen)
    assert any(name.endswith(".seg") for name in seen)


def test_stdout_into_head_ends_lapidus_cleanly(pg_db, tmp_path):
    """``lapidus --stdout | head -1``: once head is gone, the next write fails, and Lapidus
    stops cleanly (exit 0) without restarting anything on the way."""
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY)")
    config = tmp_path / "lapidus.json"
    config.write_text(json.dumps({"state_dir": str(tmp_path / "state"),
                                  "log": {"format": "json"}, "backends": [pg_backend(pg_db)]}))
    log = open(tmp_path / "lapidus.log", "wb")
    lapidus = subprocess.Popen([sys.executable, "-m", "lapidus", "-c", str(config), "--stdout"],
                               stdout=subprocess.PIPE, stderr=log, start_new_session=True)
    head = subprocess.Popen(["head", "-1"], stdin=lapidus.stdout, stdout=subprocess.PIPE)
    lapidus.stdout.close()
    try:
        wait_until(lambda: '"event": "streaming"' in (tmp_path / "lapidus.log").read_text(), 30)
        pg_db.sql("INSERT INTO t VALUES (1)")
        assert json.loads(head.communicate(timeout=30)[0])["item"] == {"id": 1}

        def ended():
            pg_db.sql("INSERT INTO t SELECT coalesce(max(id), 0) + 1 FROM t")
            return lapidus.poll() is not None
        wait_until(ended, 30, interval=0.5, message="lapidus to end after head")
    finally:
        if lapidus.poll() is None:
            stop_group(lapidus, 15)
        log.close()
    text = (tmp_path / "lapidus.log").read_text()
    assert lapidus.returncode == 0, text[-3000:]
    assert "output closed" in text
    assert "restarting" not in text and "starting again" not in text and "Traceback" not in text
