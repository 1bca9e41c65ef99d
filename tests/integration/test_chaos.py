"""The short chaos run (bench/chaos, docs/dev/chaos.md): faults mid-load, nothing lost.

Lapidus streams a PostgreSQL and a MariaDB table into a JetStream stream of a private
nats-server while a seeded fault injector kills each of its processes (worker, dispatcher,
pg_recvlogical, the supervisor itself), stops nats-server, restarts MariaDB and cuts the TCP
proxies between Lapidus and the servers: twice each.  PostgreSQL is not restarted here (other
suites share it; the long run does it).  After each fault the run waits until the stream caught
up, so the faults never overlap and the test is deterministic enough for CI.

A second short run does the same with the lifecycle faults (frozen processes, reloads, an event
too large for NATS that must go to the dead letters, slow clients), once each.  A third runs in
cluster mode: two Lapidus nodes and a three-server NATS cluster, a node killed (``kill -9`` of
its process group) and a nats-server killed, twice each; no backend may be streamed by two
nodes at once.

The checker compares the stream with the ledger of committed changes: nothing lost, per-key and
per-backend commit order, no id stored twice, no change under two ids, an oversized change in
the dead letters and not in the stream.  Its own logic is tested first, without servers, on
streams with a known defect.
"""

from __future__ import annotations

import json
import shutil

import pytest

from bench.chaos import checker, deadletters
from bench.chaos.__main__ import parse
from bench.chaos.faults import CI_KINDS, CLUSTER_KINDS, NEW_KINDS
from bench.chaos.load import Change
from bench.chaos.reloads import ConfigPlan
from bench.chaos.run import ChaosOptions, format_result, run_chaos
from bench.chaos.servers import (NATS_SERVER, ensure_mariadb, mariadb_answers, pg_answers,
                                 restart_mariadb)

# The fixtures come in as a plugin, so test arguments do not shadow imported names.
pytest_plugins = ["tests.integration.mysql_fixtures"]
from tests.integration.mysql_fixtures import DATABASE, Sql, read_until  # noqa: E402

# serial: chaos runs restart the shared servers and load both cores
pytestmark = [pytest.mark.integration, pytest.mark.serial]


# -- the checker, on made-up streams --------------------------------------------------------------

def _event(backend, key, kind, version, seq_id, before_version=None):
    item = None if kind == "delete" else {"id": key, "version": version, "pad": "p"}
    before = None
    if kind in ("update", "delete"):
        before = {"id": key, "version": before_version if before_version is not None
                  else (version - 1 if kind == "update" else version), "pad": "p"}
    return {"id": f"{backend}:{seq_id}", "type": kind, "backend": backend, "schema": "public",
            "table": "chaos_rows", "pk": {"id": key}, "item": item, "before": before}


def _stream(events):
    out = []
    for seq, event in enumerate(events, 1):
        data = json.dumps(event, sort_keys=True).encode()
        out.append(checker.StoredMessage(seq, "x", event["id"], data))
    return out


LEDGER = {"pg": [Change("pg", 1, "insert", 1, 1), Change("pg", 1, "update", 2, 2),
                 Change("pg", 2, "insert", 1, 2), Change("pg", 1, "delete", 2, 3)]}
GOOD = [_event("pg", 1, "insert", 1, "a"), _event("pg", 1, "update", 2, "b"),
        _event("pg", 2, "insert", 1, "c"), _event("pg", 1, "delete", 2, "d")]


def test_checker_accepts_a_complete_stream_with_repeats_only_of_ids_already_seen():
    report = checker.check(_stream(GOOD), LEDGER)
    assert report.ok and report.lost == 0, checker.format_report(report)
    # a replay after a crash repeats ids: fine for the consumer, but JetStream should have
    # dropped it, so a repeat stored in the stream is reported
    replayed = checker.check(_stream(GOOD + GOOD[1:3]), LEDGER)
    assert replayed.stored_duplicates == 2 and replayed.conflicting_duplicates == 0
    assert replayed.lost == 0 and replayed.backends["pg"].key_order_violations == 0


def test_checker_reports_loss_order_phantoms_and_one_change_under_two_ids():
    lost = checker.check(_stream([GOOD[0], GOOD[2], GOOD[3]]), LEDGER)
    assert lost.lost == 1 and not lost.ok
    assert (lost.backends["pg"].lost_holes, lost.backends["pg"].lost_tail) == (1, 0)
    assert "update key 1 version 2" in lost.backends["pg"].examples["lost"][0]

    swapped = checker.check(_stream([GOOD[1], GOOD[0], GOOD[2], GOOD[3]]), LEDGER)
    assert swapped.backends["pg"].key_order_violations == 1
    assert swapped.backends["pg"].commit_order_violations == 1
    assert swapped.lost == 0

    phantom = checker.check(_stream(GOOD + [_event("pg", 2, "update", 2, "e")]), LEDGER)
    assert phantom.backends["pg"].phantoms == 1

    other_id = checker.check(_stream(GOOD + [dict(GOOD[2], id="pg:z")]), LEDGER)
    assert other_id.backends["pg"].same_change_other_id == 1

    conflicting = _stream(GOOD) + [checker.StoredMessage(
        9, "x", "pg:a", json.dumps(dict(GOOD[0], item={"id": 1, "version": 7})).encode())]
    assert checker.check(conflicting, LEDGER).conflicting_duplicates == 1

    wrong_header = _stream(GOOD)
    wrong_header[0] = wrong_header[0]._replace(msg_id="other")
    assert checker.check(wrong_header, LEDGER).header_mismatches == 1


def _letter(event, **changes):
    letter = {"id": event["id"], "table": event["table"], "size": 40_000,
              "error": "too large", "fix": "raise max_payload", "at": 1.0, "event": event}
    letter.update(changes)
    return letter


def _dead(backend, *letters, unreadable=()):
    return {backend: deadletters.DeadLetters(backend, list(letters), list(unreadable))}


# key 3 is oversized: inserted between the update and the delete of key 1, never touched again
DL_LEDGER = {"pg": LEDGER["pg"][:3] + [Change("pg", 3, "insert", 1, 2, oversized=True),
                                       LEDGER["pg"][3]]}
BIG = _event("pg", 3, "insert", 1, "big")


def test_checker_counts_an_oversized_change_in_the_dead_letters_as_delivered_not_lost():
    report = checker.check(_stream(GOOD), DL_LEDGER, _dead("pg", _letter(BIG), _letter(BIG)))
    backend = report.backends["pg"]
    assert report.ok and report.lost == 0, checker.format_report(report)
    assert (backend.oversized, backend.dead_lettered) == (1, 1)
    assert backend.commit_order_violations == 0       # the stream goes on past it

    missing = checker.check(_stream(GOOD), DL_LEDGER, _dead("pg"))
    assert missing.lost == 1 and missing.backends["pg"].lost_holes == 1
    assert not missing.ok

    without_file = checker.check(_stream(GOOD), DL_LEDGER)
    assert without_file.lost == 1


def test_checker_reports_dead_letters_that_are_wrong():
    # a small change dead-lettered: skipped though it was deliverable
    small = checker.check(_stream(GOOD[:3]), DL_LEDGER,
                          _dead("pg", _letter(BIG), _letter(GOOD[3])))
    assert small.backends["pg"].dead_letter_unexpected == 1 and small.lost == 0
    assert not small.ok
    # in the stream and in the dead letters
    both = checker.check(_stream(GOOD + [BIG]), DL_LEDGER, _dead("pg", _letter(BIG)))
    assert both.backends["pg"].dead_letter_in_both == 1
    assert both.backends["pg"].oversized_in_stream == 1
    # one change under two ids, a field missing, a torn line
    other_id = dict(BIG, id="pg:big2")
    twice = checker.check(_stream(GOOD), DL_LEDGER,
                          _dead("pg", _letter(BIG), _letter(other_id)))
    assert twice.backends["pg"].same_change_other_id == 1
    bad = _letter(BIG)
    del bad["fix"]
    malformed = checker.check(_stream(GOOD), DL_LEDGER, _dead("pg", bad, unreadable=["{\"id"]))
    assert malformed.backends["pg"].dead_letter_errors == 2
    assert malformed.backends["pg"].dead_lettered == 1
    never = checker.check(_stream(GOOD), DL_LEDGER,
                          _dead("pg", _letter(BIG), _letter(_event("pg", 9, "insert", 1, "x"))))
    assert never.backends["pg"].dead_letter_unexpected == 1


def test_dead_letter_file_lines_are_read_whole_and_a_torn_line_is_reported(tmp_path):
    path = deadletters.path_of(tmp_path, "pg")
    path.parent.mkdir()
    path.write_text(json.dumps(_letter(BIG)) + "\n" + "not json\n" + '{"id": "pg:half')
    letters = deadletters.read(tmp_path, "pg")
    assert [lt["id"] for lt in letters.letters] == ["pg:big"]
    assert letters.unreadable == ["not json"]      # the unfinished last line waits
    assert deadletters.holds(tmp_path, "pg", 3, "chaos_rows")
    assert not deadletters.holds(tmp_path, "pg", 4, "chaos_rows")
    assert deadletters.read(tmp_path, "nobody").letters == []


def test_config_plan_flips_one_thing_at_a_time():
    base = {"backends": [{"name": "pg"}, {"name": "maria"}],
            "plugins": {"nats": {"ack_timeout": 2}}}
    plan = ConfigPlan(base, {"name": "extra"})
    assert plan.backend_names() == ["pg", "maria", "extra"]
    assert plan.flip_extra() == "removed" and plan.backend_names() == ["pg", "maria"]
    plan.flip_sink_option()
    plan.flip_backend_option("pg")
    config = plan.render()
    assert config["plugins"]["nats"]["ack_timeout"] == 2.5
    assert config["backends"][0]["batch_size"] == 250 and "batch_size" not in config["backends"][1]
    assert base["plugins"]["nats"]["ack_timeout"] == 2 and "batch_size" not in base["backends"][0]
    plan.flip_sink_option()
    plan.flip_backend_option("pg")
    plan.flip_extra()
    assert plan.render() == dict(base, backends=base["backends"] + [{"name": "extra"}])


# -- the short run --------------------------------------------------------------------------------

@pytest.fixture
def servers_up():
    if shutil.which(NATS_SERVER) is None:
        pytest.skip(f"{NATS_SERVER} is not installed; run scripts/setup-local")
    if not pg_answers() or not mariadb_answers():
        pytest.skip("PostgreSQL or MariaDB is not reachable on 127.0.0.1; run scripts/setup-local")


def test_short_chaos_run_loses_nothing(servers_up, tmp_path):
    options = ChaosOptions(seconds=15, seed=20240607, rate=40, kinds=list(CI_KINDS),
                           per_kind=2, interval=0.8, settle=True, recovery_timeout=60,
                           final_timeout=90, workdir=str(tmp_path / "chaos"),
                           # writes a same-shaped table in another database: after a MariaDB
                           # restart its reused table id must not be taken for ours
                           bystander=True)
    run = run_chaos(options, log=print)
    text = format_result(run.result, run.report)
    print(text)
    result = run.result
    assert result["faults"] == {kind: 2 for kind in CI_KINDS}, text
    assert not result["findings"], text
    assert run.report.lost == 0, text
    assert run.report.ok, text
    for backend, stats in result["load"].items():
        assert stats["transactions"] > 200, f"{backend}: too little load to mean anything"
    # the faults hit the load: the writer of MariaDB saw its server restart
    assert result["load"]["maria"]["reconnects"] >= 2, text
    assert result["ok"], text


def test_short_chaos_run_with_frozen_processes_reloads_dead_letters_and_slow_clients(
        servers_up, tmp_path):
    """The lifecycle faults, once each: a worker, the dispatcher and the supervisor frozen (kill
    -STOP, then -CONT, shorter or longer than heartbeat_timeout), reloads that remove or add
    the extra backend and change a nats option and a backend option, an event larger than
    max_payload with on_undeliverable = "dead_letter", 50 slow clients.  None of them touches
    the shared database servers."""
    # this seed freezes the supervisor, the dispatcher and the MariaDB worker longer than
    # heartbeat_timeout and the PostgreSQL worker shorter (freeze_length draws either)
    options = ChaosOptions(seconds=10, seed=20261391, rate=40, kinds=list(NEW_KINDS),
                           per_kind=1, interval=0.8, settle=True, recovery_timeout=60,
                           final_timeout=90, workdir=str(tmp_path / "chaos"), bystander=False,
                           heartbeat_timeout=3.0)
    run = run_chaos(options, log=print)
    text = format_result(run.result, run.report)
    print(text)
    result = run.result
    assert result["faults"] == {kind: 1 for kind in NEW_KINDS}, text
    assert not result["findings"], text         # FATAL and tracebacks are findings too
    assert run.report.ok and run.report.lost == 0, text
    dead = sum(b.dead_lettered for b in run.report.backends.values())
    assert dead == result["faults"]["dead_letter"], text
    assert result["lapidus_log"]["reloads"] >= len(
        [k for k in NEW_KINDS if k.startswith("reload_")]), text
    assert run.report.backends["extra"].fences == 1, text   # re-added, it caught up
    assert result["ok"], text


def test_cluster_mode_refuses_the_kinds_of_a_single_lapidus_and_needs_it_for_its_own(capsys):
    for argv, says in ((["--cluster", "--faults", "kill_node,kill_supervisor"],
                        "make no sense in cluster mode"),
                       (["--faults", "kill_nats_server"], "need --cluster"),
                       (["--cluster", "--nodes", "1"], "--nodes 2 or more")):
        with pytest.raises(SystemExit) as exited:
            parse(argv)
        assert exited.value.code == 2
        assert says in capsys.readouterr().err
    _args, options = parse(["--cluster"])
    assert options.cluster and options.nodes == 2
    assert set(CLUSTER_KINDS) <= set(options.kinds) and "kill_supervisor" not in options.kinds


def test_short_cluster_chaos_run_kills_nodes_and_nats_servers_and_loses_nothing(
        servers_up, tmp_path):
    """Two nodes with lease_ttl 5 s and a three-server NATS cluster; a node killed (started again
    at once, or once the other node took its backends over) and a nats-server killed (started
    again after 2-5 s), twice each, waiting for the stream to catch up after each."""
    kinds = ["kill_node", "kill_nats_server"]
    # this seed kills the node once with a restart at once and once after the takeover
    options = ChaosOptions(seconds=10, seed=20261207, rate=40, kinds=kinds, per_kind=2,
                           interval=0.8, settle=True, recovery_timeout=60, final_timeout=90,
                           workdir=str(tmp_path / "chaos"), bystander=False, cluster=True,
                           nodes=2, lease_ttl=5.0)
    run = run_chaos(options, log=print)
    text = format_result(run.result, run.report)
    print(text)
    result = run.result
    assert result["faults"] == {kind: 2 for kind in kinds}, text
    assert not result["findings"], text        # overlaps, FATAL and tracebacks included
    assert run.report.ok and run.report.lost == 0, text
    assert result["cluster"]["overlaps"] == 0, text
    # a backend moved at least once for each node kill
    assert result["cluster"]["ownership_changes"] >= 2 + 2, text
    kills = [record["detail"] for record in result["fault_log"] if record["kind"] == "kill_node"]
    assert any("restarted at once" in d for d in kills), kills
    assert any("taken over in" in d for d in kills), kills
    assert result["ok"], text


# -- bugs the chaos run found (minimal reproductions) ---------------------------------------------

def _table_ids(sql: Sql, table: str) -> set:
    """The table ids the current binlog file gives ``table`` in its Table_map events."""
    log_file = sql.rows("SHOW MASTER STATUS")[0][0]
    ids = set()
    for row in sql.rows(f"SHOW BINLOG EVENTS IN '{log_file}'"):
        info = str(row[5])              # "table_id: 18 (db.table)"
        if row[2] == "Table_map" and info.endswith(f".{table})"):
            ids.add(info.split("table_id:")[1].split("(")[0].strip())
    return ids


# The restarts go through bench.chaos.servers: mysql_fixtures.restart_server() waits for "no
# mariadbd process" with start-stop-daemon --exec, which also sees other mariadbd processes on
# the machine (a benchmark's private server), and then never starts the shared one again.
def test_table_id_reused_after_a_mariadb_restart_is_not_taken_for_another_table(
        sql, open_source):
    """Found by ``python -m bench.chaos`` (the MariaDB backend crash-looped on
    "AssertionError: Result length not requested length" after a restart of the server).

    Table ids are per server run: after a restart the first table written gets the same id as
    the first table written after the previous restart.  Here ``mine`` (in scope) takes that id
    in binlog file B and ``theirs`` (another database, out of scope) takes it in file C.  A
    reader that crosses both files must not decode ``theirs``'s rows with ``mine``'s table map.

    Why: ``BinlogReader.fetchone`` clears ``table_map`` only on a Rotate event with a non-zero
    timestamp, but a file that a restart began follows the old file's STOP event and is
    announced by the dump thread with a fake Rotate (timestamp 0); and the library returns no
    event at all for a Table_map of a schema outside ``only_schemas`` (the backend's
    ``database``), so the reader cannot pop the stale id either.

    Suggested fix (lapidus/workers/mysql/reader.py): clear ``self.table_map`` on every Rotate
    event (fake or real) and on every Format_description event; every transaction repeats its
    Table_map events, so forgetting them at a file boundary costs nothing.  Alternatively pop
    the table id of a Table_map event the library filtered out.
    """
    other = f"{DATABASE}_bystander"
    sql.run("CREATE TABLE mine (id INT PRIMARY KEY, v INT)",
            f"DROP DATABASE IF EXISTS `{other}`", f"CREATE DATABASE `{other}`",
            f"CREATE TABLE `{other}`.theirs (id INT PRIMARY KEY, v INT)")
    try:
        start = open_source(name="crm").read(10, 0.05).checkpoint
        restart_mariadb()
        after = Sql()
        try:
            after.run(f"INSERT INTO `{DATABASE}`.mine VALUES (1, 10)")   # file B: id N -> mine
            mine_ids = _table_ids(after, "mine")
        finally:
            after.close()
        restart_mariadb()
        after = Sql()
        try:
            after.run(f"INSERT INTO `{other}`.theirs VALUES (2, 20)")    # file C: id N -> theirs
            their_ids = _table_ids(after, "theirs")
            after.run(f"INSERT INTO `{DATABASE}`.mine VALUES (3, 30)")   # the end marker
        finally:
            after.close()
        if not mine_ids & their_ids:
            pytest.skip(f"another session took the table id first (mine {mine_ids}, theirs "
                        f"{their_ids}): the reuse this test needs did not happen")
        events, _ = read_until(open_source(start, name="crm"),
                               lambda evs: any(e.item == {"id": 3, "v": 30} for e in evs),
                               timeout=30)
        assert [(e.table, e.type, e.item) for e in events] == [
            ("mine", "insert", {"id": 1, "v": 10}), ("mine", "insert", {"id": 3, "v": 30})]
    finally:
        ensure_mariadb()
        cleanup = Sql()
        try:
            cleanup.run(f"DROP DATABASE IF EXISTS `{other}`")
        finally:
            cleanup.close()
