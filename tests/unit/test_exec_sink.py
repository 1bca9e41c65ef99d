"""The exec sink with real child processes: lines in, restarts with resend, output to the log."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import textwrap

import pytest
import structlog

from lapidus.events import Record
from lapidus.sinks import registry
from lapidus.sinks.base import SinkError
from lapidus.sinks.exec import ExecSink


def recs(*numbers):
    return [Record(f"pg:0/1:{n}", "insert", "public", "t", (str(n),), "0/1",
                   f'{{"n":{n}}}'.encode()) for n in numbers]


def lines_of(path):
    return path.read_text().splitlines() if path.exists() else []


async def wait_for(predicate, timeout=10.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


def python_command(script: str):
    return [sys.executable, "-c", textwrap.dedent(script)]


def test_registered_and_per_backend():
    assert registry.load("exec") is ExecSink
    assert ExecSink.shared is False


@pytest.mark.parametrize("options,key,text", [
    ({}, "command", "missing"),
    ({"command": []}, "command", "non-empty list"),
    ({"command": "  "}, "command", "empty"),
    ({"command": ["/no/such/program"]}, "command[0]", "not an executable"),
    ({"command": "cat", "restart_backoff": 0}, "restart_backoff", "greater than 0"),
    ({"command": "cat", "comand": 1}, "comand", 'did you mean "command"'),
    ({"command": "cat", "pass_env": "HOME"}, "pass_env", "list of variable names"),
    ({"command": "cat", "pass_env": ["TZ", "1X"]}, "pass_env[1]", "not a variable name"),
    ({"command": "cat", "env": ["A=1"]}, "env", "table"),
    ({"command": "cat", "env": {"MODE": 1}}, "env.MODE", "string value"),
    ({"command": "cat", "env": {"LAPIDUS_BACKEND": "x"}}, "env.LAPIDUS_BACKEND", "set by Lapidus"),
])
def test_validation(options, key, text):
    problems = dict(ExecSink.validate(options))
    assert text in problems.get(key, ""), problems


def test_lines_reach_a_shell_command_in_order(tmp_path):
    out = tmp_path / "out.jsonl"

    async def run():
        sink = ExecSink({"command": f"cat >> {out}"}, "shop")
        await sink.start()
        await sink.send(recs(1, 2))
        await sink.send(recs(3))
        await sink.close()
    asyncio.run(run())
    assert lines_of(out) == ['{"n":1}', '{"n":2}', '{"n":3}']


def test_the_backend_name_is_in_the_environment(tmp_path):
    out = tmp_path / "env"

    async def run():
        sink = ExecSink({"command": f'echo "$LAPIDUS_BACKEND" > {out}; cat > /dev/null'}, "crm")
        await sink.send(recs(1))
        await sink.close()
    asyncio.run(run())
    assert lines_of(out) == ["crm"]


def test_a_dead_command_is_restarted_and_the_unconfirmed_batch_sent_again(tmp_path):
    out = tmp_path / "out.jsonl"
    closed = tmp_path / "closed"
    # Reads one line, records it, closes its standard input, then exits a little later: the
    # next batch meets either a broken pipe or a dead process, never a pipe nobody reads.
    # (A batch written while the process still reads is confirmed and, if the process then
    # dies without reading it, lost to it: the documented limit of this sink.)
    script = python_command(f"""
        import os, sys, time
        line = sys.stdin.readline()
        open({str(out)!r}, "a").write(line)
        os.close(0)
        open({str(closed)!r}, "a").write("x\\n")
        time.sleep(0.05)
        sys.exit(3)
    """)

    async def run():
        sink = ExecSink({"command": script, "restart_backoff": 0.01}, "shop")
        with structlog.testing.capture_logs() as logs:
            for n in range(1, 5):
                await sink.send(recs(n))
                await wait_for(lambda: len(lines_of(out)) == n and len(lines_of(closed)) == n)
            await sink.close()
        return logs
    logs = asyncio.run(run())
    assert lines_of(out) == [f'{{"n":{n}}}' for n in range(1, 5)]
    exits = [entry for entry in logs if entry["event"].startswith("exec command exited")]
    assert len(exits) == 3 and all(entry["exit_code"] == 3 for entry in exits)


def test_batch_written_while_the_command_is_down_waits_for_the_restart(tmp_path):
    out = tmp_path / "out.jsonl"
    flag = tmp_path / "crashed"
    # The first run dies at once without reading; later runs copy their input.
    script = f"if [ ! -e {flag} ]; then touch {flag}; exit 1; fi; cat >> {out}"

    async def run():
        sink = ExecSink({"command": script, "restart_backoff": 0.05}, "shop")
        await sink.send(recs(1))      # may go into the first process's pipe and be lost
        await wait_for(lambda: flag.exists())
        # The first process exits at once.  Either it is dead and not yet noticed (the next
        # send finds it so), or writing batch 1 already found it dead and started the second,
        # whose shell creates the output file.
        await wait_for(lambda: out.exists()
                       or (sink.proc is not None and sink.proc.returncode is not None))
        await sink.send(recs(2, 3))   # must reach the restarted process
        await sink.close()
    asyncio.run(run())
    assert lines_of(out)[-2:] == ['{"n":2}', '{"n":3}']


@contextlib.contextmanager
def debug_logging():
    """Debug lines reach the captured logs whatever level an earlier test configured (the
    level filter sits before capture_logs' processors)."""
    before = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
    try:
        yield
    finally:
        structlog.configure(**before)


def test_stderr_and_stdout_lines_go_to_the_log_with_the_backend(tmp_path):
    script = python_command("""
        import sys
        for line in sys.stdin:
            print("seen", line.strip(), file=sys.stderr, flush=True)
            print("out", flush=True)
    """)

    async def run():
        with debug_logging(), structlog.testing.capture_logs() as logs:
            sink = ExecSink({"command": script}, "shop")
            await sink.send(recs(7))
            # both lines: the command's stdout and stderr are read by two tasks
            await wait_for(lambda: {"seen {\"n\":7}", "out"} <= {e.get("line") for e in logs})
            await sink.close()
        return logs
    logs = asyncio.run(run())
    output = [e for e in logs if e["event"] == "exec output"]
    assert {"stream": "stderr", "line": 'seen {"n":7}'}.items() <= output[0].items() or \
        any(e["stream"] == "stderr" and e["line"] == 'seen {"n":7}' for e in output)
    assert any(e["stream"] == "stdout" and e["line"] == "out" for e in output)
    assert all(e["backend"] == "shop" for e in output)
    # the command's stdout may echo row data: debug only; its stderr stays visible
    assert {e["log_level"] for e in output if e["stream"] == "stdout"} == {"debug"}
    assert {e["log_level"] for e in output if e["stream"] == "stderr"} == {"info"}


def test_close_stops_a_command_that_ignores_end_of_input(tmp_path, monkeypatch):
    monkeypatch.setattr("lapidus.sinks.exec.STOP_GRACE", 0.3)

    async def run():
        sink = ExecSink({"command": "trap '' TERM; sleep 60"}, "shop")
        sink_task = sink.send(recs(1))
        await sink_task
        proc = sink.proc
        await asyncio.wait_for(sink.close(), 20)
        assert proc.returncode is not None
    asyncio.run(run())


def test_restart_backoff_doubles_up_to_30_s_and_resets_after_a_stable_run(monkeypatch):
    import lapidus.sinks.exec as exec_module
    clock = [1000.0]
    monkeypatch.setattr(exec_module.time, "monotonic", lambda: clock[0])
    sink = ExecSink({"command": "cat", "restart_backoff": 1.0}, "shop")

    def crash_after(ran: float) -> float:
        """The wait before the next start after a run of ``ran`` seconds."""
        sink.started_at = clock[0]
        clock[0] += ran
        sink._schedule_restart()
        return sink.next_start - clock[0]

    waits = [crash_after(0.1) for _ in range(7)]
    assert waits == pytest.approx([1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0])
    assert crash_after(exec_module.STABLE_AFTER) == pytest.approx(1.0)   # a stable run: anew
    assert crash_after(0.1) == pytest.approx(2.0)


def test_the_command_gets_only_the_environment_the_configuration_names(tmp_path, monkeypatch):
    """A secret from an EnvironmentFile (Lapidus's environment) must not reach the command."""
    out = tmp_path / "env"
    monkeypatch.setenv("PGPASSWORD", "secret-from-environment-file")
    monkeypatch.setenv("NATS_TOKEN", "another-secret")
    monkeypatch.setenv("TZ", "Europe/Vienna")
    monkeypatch.setenv("LC_TIME", "C.UTF-8")
    monkeypatch.setenv("LANG", "C.UTF-8")
    script = python_command(f"""
        import json, os, sys
        json.dump(dict(os.environ), open({str(out)!r}, "w"))
        sys.stdin.read()
    """)

    async def run():
        sink = ExecSink({"command": script, "pass_env": ["TZ", "NOT_SET_ANYWHERE"],
                         "env": {"CONSUMER_MODE": "fast"}}, "crm")
        await sink.send(recs(1))
        await wait_for(lambda: out.exists() and out.stat().st_size > 0)
        await sink.close()
    asyncio.run(run())
    import json
    env = json.loads(out.read_text())
    env.pop("LC_CTYPE", None)       # Python itself may set it for the child (PEP 538)
    assert env == {"PATH": os.environ["PATH"], "HOME": os.environ["HOME"], "LANG": "C.UTF-8",
                   "LC_TIME": "C.UTF-8", "TZ": "Europe/Vienna", "CONSUMER_MODE": "fast",
                   "LAPIDUS_BACKEND": "crm"}


def test_health_shows_a_command_that_keeps_exiting(tmp_path):
    """Down since it exited, how it ended (with its last stderr line), and the restarts."""
    script = python_command("""
        import sys
        sys.stdin.readline()
        print("consumer: database is gone", file=sys.stderr, flush=True)
        sys.exit(4)
    """)

    async def run():
        sink = ExecSink({"command": script, "restart_backoff": 0.01}, "shop")
        assert sink.health() is None                      # not started before the first batch
        await sink.send(recs(1))
        running = sink.health()
        # down; the stderr line may reach its reader task a moment after the exit is seen
        await wait_for(lambda: sink.health()["connected"] is False
                       and "last stderr" in sink.health()["last_error"])
        down = sink.health()
        await sink.send(recs(2))                          # noticed dead: restarted
        after = sink.health()
        await sink.close()
        return running, down, after
    running, down, after = asyncio.run(run())
    assert running["connected"] is True and running["down_seconds"] is None
    assert running["pid"] and running["last_error"] is None
    assert down["connected"] is False and down["down_seconds"] is not None
    assert down["last_error"] == "exited with code 4 (last stderr: consumer: database is gone)"
    assert after["restarts"] == 1 and after["last_error"].startswith("exited with code 4")


def test_health_of_a_command_that_cannot_start(monkeypatch):
    monkeypatch.setattr(ExecSink, "validate", classmethod(lambda cls, options: []))

    async def run():
        sink = ExecSink({"command": ["/no/such/program"]}, "shop")
        with pytest.raises(SinkError, match="cannot start"):
            await sink.send(recs(1))
        return sink.health()
    state = asyncio.run(run())
    assert state["connected"] is False and state["down_seconds"] is not None
    assert "cannot start '/no/such/program'" in state["last_error"]


def test_health_dicts_read_by_status_and_metrics():
    """lapidusctl's sinks column and /metrics read connected / down_seconds; "error" would
    mean that health() itself failed, so the exit goes under last_error."""
    from lapidus.ctl import sinks_text
    assert sinks_text({"exec": {"connected": True, "down_seconds": None,
                                "last_error": "exited with code 4"}}) == "exec up"
    assert sinks_text({"exec": {"connected": False, "down_seconds": 12.0,
                                "last_error": "exited with code 4"}}) == "exec down 12s"


def test_a_null_env_value_leaves_the_variable_out():
    from lapidus.sinks.exec_env import command_environment
    env = command_environment("shop", [], {"A": "1", "B": None}, source={"PATH": "/bin"})
    assert env == {"PATH": "/bin", "A": "1", "LAPIDUS_BACKEND": "shop"}
