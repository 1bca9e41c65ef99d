"""Publications for the pgoutput decoder, and choosing the decoder, against the real server.

Publications live in the test database, so dropping it (the pg_db fixture) removes them.
"""

from __future__ import annotations

import psycopg2
import pytest

from tests.conftest import wait_until
from tests.integration.conftest import pg_backend


def start(lapidus_factory, pg_db, wait="streaming", plugins=None, **options):
    """Start Lapidus in a fresh working directory (own stdout and log), on the shared state
    directory, and wait until it streams (or, with ``wait="fatal"``, until it gave up, with
    no traceback in its log)."""
    start.runs += 1
    workdir = pg_db.workdir / f"run{start.runs}"
    workdir.mkdir(parents=True)
    proc = lapidus_factory({"backends": [pg_backend(pg_db, **options)],
                            "plugins": plugins or {"stdout": {}},
                            "supervisor": {"backoff_initial": 0.1}}, workdir=workdir)
    if wait == "streaming":
        proc.wait_log('"streaming"')
    else:
        proc.wait_log("backend is FATAL")
        assert proc.proc.wait(15) == 1     # every backend FATAL: the supervisor exits 1
        assert "Traceback" not in proc.log()
    return proc


start.runs = 0


@pytest.fixture(autouse=True)
def _workdir(pg_db, tmp_path):
    pg_db.workdir = tmp_path


def publication(pg_db, name="lapidus_pg"):
    rows = pg_db.sql("SELECT puballtables FROM pg_publication WHERE pubname = %s", args=(name,))
    if not rows:
        return None
    tables = pg_db.sql("SELECT schemaname || '.' || tablename FROM pg_publication_tables "
                       "WHERE pubname = %s ORDER BY 1", args=(name,))
    return {"all_tables": rows[0][0], "tables": [t for (t,) in tables]}


def slot_plugin(pg_db, name="pg"):
    rows = pg_db.sql("SELECT plugin FROM pg_replication_slots WHERE slot_name = %s",
                     args=(f"{pg_db.name}_{name}",))
    return rows[0][0] if rows else None


# -- start-up order and the historic snapshot ----------------------------------------------------

def test_server_fact_publication_created_after_the_slot_fails_older_changes(pg_db):
    """pgoutput looks publications up as of each change: this is why Lapidus creates the
    publication before the slot."""
    slot = f"{pg_db.name}_late"
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY)",
              "SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", args=(slot,))
    pg_db.sql("INSERT INTO t VALUES (1)")          # written before the publication exists
    pg_db.sql("CREATE PUBLICATION late_pub FOR ALL TABLES")
    pg_db.sql("INSERT INTO t VALUES (2)")
    with pytest.raises(psycopg2.Error, match='publication "late_pub" does not exist'):
        pg_db.sql("SELECT count(*) FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
                  "'proto_version', '1', 'publication_names', 'late_pub')", args=(slot,))


def test_fresh_start_creates_the_publication_then_the_slot(lapidus_factory, pg_db):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY)")
    proc = start(lapidus_factory, pg_db)
    log = proc.log()
    assert log.index('"publication created"') < log.index('"replication slot created"')
    assert publication(pg_db)["all_tables"] is True
    assert slot_plugin(pg_db) == "pgoutput"
    pg_db.sql("INSERT INTO t VALUES (1)")
    assert proc.wait_events(1)[0]["item"] == {"id": 1}


def test_publication_dropped_while_changes_were_pending_is_a_clear_fatal_error(
        lapidus_factory, pg_db):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY)")
    proc = start(lapidus_factory, pg_db)
    pg_db.sql("INSERT INTO t VALUES (1)")
    proc.wait_events(1)
    assert proc.terminate() == 0
    pg_db.sql("DROP PUBLICATION lapidus_pg")
    pg_db.sql("INSERT INTO t VALUES (2)")          # pending in the slot, no publication
    again = start(lapidus_factory, pg_db, wait="fatal")
    log = again.log()
    assert 'publication \\"lapidus_pg\\" did not exist when changes' in log
    assert "Traceback" not in log
    # the fix the message names: skip the undecodable changes, restart
    advance = "pg_replication_slot_advance('%s', pg_current_wal_lsn())" % f"{pg_db.name}_pg"
    assert advance in log
    pg_db.sql(f"SELECT {advance}")
    third = start(lapidus_factory, pg_db)
    pg_db.sql("INSERT INTO t VALUES (3)")
    assert [e["item"] for e in third.wait_events(1)] == [{"id": 3}]


def test_publication_recreated_with_nothing_pending_streams_again(lapidus_factory, pg_db):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY)")
    proc = start(lapidus_factory, pg_db)
    pg_db.sql("INSERT INTO t VALUES (1)")
    proc.wait_events(1)
    assert proc.terminate() == 0
    pg_db.sql("DROP PUBLICATION lapidus_pg")
    again = start(lapidus_factory, pg_db)
    assert '"publication created"' in again.log()
    pg_db.sql("INSERT INTO t VALUES (2)")
    assert [e["item"] for e in again.wait_events(1)] == [{"id": 2}]


# -- modes ---------------------------------------------------------------------------------------

def test_existing_mode_without_the_publication_names_the_sql(lapidus_factory, pg_db):
    proc = start(lapidus_factory, pg_db, wait="fatal", publication_mode="existing")
    log = proc.log()
    assert 'CREATE PUBLICATION \\"lapidus_pg\\" FOR ALL TABLES;' in log
    assert publication(pg_db) is None
    assert slot_plugin(pg_db) is None          # refused before creating the slot


def test_existing_mode_uses_the_dba_publication_and_never_changes_it(lapidus_factory, pg_db):
    pg_db.sql("CREATE TABLE a (id int PRIMARY KEY)", "CREATE TABLE b (id int PRIMARY KEY)",
              "CREATE PUBLICATION dba_pub FOR TABLE a")
    proc = start(lapidus_factory, pg_db, publication="dba_pub", publication_mode="existing",
                 include_tables=["a", "b"])
    pg_db.sql("INSERT INTO b VALUES (1)", "INSERT INTO a VALUES (2)")
    assert [(e["table"], e["pk"]) for e in proc.wait_events(1)] == [("a", {"id": 2})]
    assert publication(pg_db, "dba_pub") == {"all_tables": False, "tables": ["public.a"]}


def test_filtered_mode_lists_included_tables_and_new_ones_need_a_restart(
        lapidus_factory, pg_db):
    pg_db.sql("CREATE TABLE keep_a (id int PRIMARY KEY)",
              "CREATE TABLE keep_b (id int PRIMARY KEY)",
              "CREATE TABLE other (id int PRIMARY KEY)",
              'CREATE TABLE "Keep Odd" (id int PRIMARY KEY)')
    options = dict(publication_mode="filtered", include_tables=["keep_*", "Keep *"])
    proc = start(lapidus_factory, pg_db, **options)
    assert publication(pg_db) == {"all_tables": False,
                                  "tables": ["public.Keep Odd", "public.keep_a", "public.keep_b"]}
    pg_db.sql("CREATE TABLE keep_c (id int PRIMARY KEY)")
    pg_db.sql("INSERT INTO keep_c VALUES (1)", "INSERT INTO other VALUES (1)",
              'INSERT INTO "Keep Odd" VALUES (5)')
    assert [(e["table"], e["pk"]) for e in proc.wait_events(1)] == [("Keep Odd", {"id": 5})]
    assert proc.terminate() == 0
    again = start(lapidus_factory, pg_db, **options)
    assert "public.keep_c" in publication(pg_db)["tables"]
    pg_db.sql("INSERT INTO keep_c VALUES (2)")
    # keep_c's first row was written while it was not published: pgoutput never sends it
    assert [(e["table"], e["pk"]) for e in again.wait_events(1)] == [("keep_c", {"id": 2})]
    assert len(again.events()) == 1


def test_filtered_mode_with_no_matching_table_is_fatal(lapidus_factory, pg_db):
    proc = start(lapidus_factory, pg_db, wait="fatal", publication_mode="filtered",
                 include_tables=["nothing_*"])
    assert "no table of the database passes include_tables/exclude_tables" in proc.log()


def test_table_without_identity_blocks_creating_a_publication_for_it(lapidus_factory, pg_db):
    """Once published, UPDATE/DELETE on a table without a replica identity fail in every
    application: Lapidus refuses, names the table and the fixes."""
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY)", "CREATE TABLE nokey (a int)")
    proc = start(lapidus_factory, pg_db, wait="fatal")
    log = proc.log()
    assert "public.nokey" in log
    assert 'ALTER TABLE \\"public\\".\\"nokey\\" REPLICA IDENTITY FULL' in log
    assert publication(pg_db) is None
    # the application is unharmed
    pg_db.sql("INSERT INTO nokey VALUES (1)", "UPDATE nokey SET a = 2")
    # and leaving the table out works
    again = start(lapidus_factory, pg_db, name="pg2", publication_mode="filtered",
                  exclude_tables=["nokey"])
    pg_db.sql("INSERT INTO t VALUES (1)")
    assert again.wait_events(1)[0]["table"] == "t"


def test_role_that_may_not_create_the_publication_gets_the_sql(lapidus_factory, pg_db):
    role = f"{pg_db.name}_repl"
    pg_db.sql(f"CREATE ROLE {role} LOGIN REPLICATION")
    try:
        proc = start(lapidus_factory, pg_db, wait="fatal", user=role)
        log = proc.log()
        assert f'role \\"{role}\\" may not run CREATE PUBLICATION' in log
        assert "FOR ALL TABLES needs a superuser" in log
        assert 'publication_mode = \\"existing\\"' in log
    finally:
        wait_until(lambda: not pg_db.sql(
            "SELECT 1 FROM pg_stat_activity WHERE usename = %s", args=(role,)), 15)
        pg_db.sql(f"DROP ROLE {role}")


# -- choosing the decoder --------------------------------------------------------------------------

def test_auto_keeps_the_decoder_of_an_existing_wal2json_slot(lapidus_factory, pg_db):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, f float8)")
    proc = start(lapidus_factory, pg_db, decoder="wal2json")
    assert proc.terminate() == 0
    again = start(lapidus_factory, pg_db)          # decoder = "auto", the default
    pg_db.sql("INSERT INTO t VALUES (1, 'NaN')")
    # wal2json's known NaN limit shows which decoder ran
    assert again.wait_events(1)[0]["item"] == {"id": 1, "f": None}
    assert slot_plugin(pg_db) == "wal2json"
    assert publication(pg_db) is None


def test_auto_on_a_fresh_start_is_pgoutput(lapidus_factory, pg_db):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, f float8)")
    proc = start(lapidus_factory, pg_db)
    pg_db.sql("INSERT INTO t VALUES (1, 'NaN')")
    assert proc.wait_events(1)[0]["item"] == {"id": 1, "f": "NaN"}
    assert slot_plugin(pg_db) == "pgoutput"
