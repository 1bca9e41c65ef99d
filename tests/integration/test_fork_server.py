"""The workers' fork server through the real supervisor (lapidus/workers/forkserver.py): the
workers are its children and carry neither asyncio nor the supervisor's parts; its death or
freeze costs the workers a restart, and no row."""

from __future__ import annotations

import os
import signal

import psutil

from tests.conftest import wait_until
from tests.integration.conftest import ctl, pg_backend, running
from tests.integration.test_supervisor_lifecycle import ids_of, replaced


def fork_server(proc) -> psutil.Process:
    def find():
        for child in proc.children():
            try:
                if child.name() == "lapidus:forker":
                    return child
            except psutil.NoSuchProcess:
                pass
        return None
    return wait_until(find, 20, message="the workers' fork server")


def mapped_files(pid: int) -> str:
    with open(f"/proc/{pid}/maps") as f:
        return f.read()


def streaming_pg(lapidus_factory, pg_db, **supervisor):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY)")
    proc = lapidus_factory({"backends": [pg_backend(pg_db)], "plugins": {"stdout": {}},
                            "supervisor": supervisor})
    first = wait_until(lambda: running(proc.config_path, "pg"), 30)
    pg_db.sql("INSERT INTO t VALUES (1)")
    proc.wait_events(1)
    return proc, first


def test_workers_are_forked_by_the_fork_server_and_carry_no_asyncio(lapidus_factory, pg_db):
    proc, first = streaming_pg(lapidus_factory, pg_db)
    worker = psutil.Process(first["pid"])
    server = fork_server(proc)
    assert worker.ppid() == server.pid and server.ppid() == proc.proc.pid
    # asyncio's C part is mapped by the process that imports asyncio: the dispatcher does,
    # a worker and the supervisor (structlog's import of it deferred) do not
    assert "/_asyncio." in mapped_files(proc.dispatcher_pid())
    assert "/_asyncio." not in mapped_files(worker.pid)
    assert "/_asyncio." not in mapped_files(proc.proc.pid)


def test_a_killed_fork_server_restarts_its_workers_and_loses_nothing(lapidus_factory, pg_db):
    proc, first = streaming_pg(lapidus_factory, pg_db)
    server = fork_server(proc)
    server.send_signal(signal.SIGKILL)
    pg_db.sql("INSERT INTO t VALUES (2)", "INSERT INTO t VALUES (3)")
    again = wait_until(lambda: replaced(proc.config_path, "pg", first["pid"]), 30,
                       message=f"a new worker; log:\n{proc.log()[-3000:]}")
    assert fork_server(proc).pid != server.pid
    assert set(ids_of(proc.wait_events(3))) == {1, 2, 3}
    assert "lost its fork server" in proc.log()
    assert again["restarts"] == 0 and "fork server died" in again["last_error"]


def test_a_frozen_fork_server_is_replaced_and_the_restart_it_held_goes_on(
        lapidus_factory, pg_db):
    proc, first = streaming_pg(lapidus_factory, pg_db, stop_timeout=2)
    server = fork_server(proc)
    server.send_signal(signal.SIGSTOP)
    try:
        # the worker exits, but only its frozen parent could report it: the restart's stop
        # runs out, and the supervisor, finding the server frozen, kills it
        assert ctl(proc.config_path, "restart", "pg")[0] == 0
        pg_db.sql("INSERT INTO t VALUES (2)")
        wait_until(lambda: replaced(proc.config_path, "pg", first["pid"]), 30,
                   message=f"a new worker; log:\n{proc.log()[-3000:]}")
    finally:
        if psutil.pid_exists(server.pid):
            os.kill(server.pid, signal.SIGCONT)
    assert fork_server(proc).pid != server.pid
    pg_db.sql("INSERT INTO t VALUES (3)")
    assert set(ids_of(proc.wait_events(3))) == {1, 2, 3}
    assert "fork server is stopped" in proc.log()


def test_a_worker_killed_under_a_frozen_fork_server_is_replaced_without_waiting_for_its_heartbeat(
        lapidus_factory, pg_db):
    proc, first = streaming_pg(lapidus_factory, pg_db)     # heartbeat_timeout: 60 s
    server = fork_server(proc)
    server.send_signal(signal.SIGSTOP)
    try:
        # only the frozen server could report this exit; the worker's closed status pipe
        # tells the supervisor to look at the server
        os.kill(first["pid"], signal.SIGKILL)
        pg_db.sql("INSERT INTO t VALUES (2)")
        wait_until(lambda: replaced(proc.config_path, "pg", first["pid"]), 20,
                   message=f"a new worker well before the heartbeat timeout; log:\n"
                           f"{proc.log()[-3000:]}")
    finally:
        if psutil.pid_exists(server.pid):
            os.kill(server.pid, signal.SIGCONT)
    assert "no heartbeat" not in proc.log() and "fork server is stopped" in proc.log()
    assert set(ids_of(proc.wait_events(2))) == {1, 2}


def test_a_kill_9_of_the_supervisor_ends_the_fork_server_and_a_frozen_worker(
        lapidus_factory, pg_db):
    """The server exits once nothing holds its "alive" pipe: the supervisor and the processes
    forked from it.  A worker lets go of its copy at start, so even a worker that cannot
    notice anything (frozen) goes with the server (PR_SET_PDEATHSIG: SIGKILL), with its
    pg_recvlogical, and the slot is free again."""
    proc, first = streaming_pg(lapidus_factory, pg_db)
    worker = psutil.Process(first["pid"])
    left = [fork_server(proc), worker, psutil.Process(proc.recvlogical_pid())]
    worker.send_signal(signal.SIGSTOP)
    proc.kill()
    gone, alive = psutil.wait_procs(left, timeout=10)
    alive = [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]   # dead, not yet reaped
    assert not alive, f"left behind after kill -9 of the supervisor: {alive}"
    wait_until(lambda: pg_db.slot(f"{pg_db.name}_pg")[0] is False, 10,
               message="the slot free again")
