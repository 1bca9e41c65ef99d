"""PostgreSQL schema changes as ``schema`` events, in commit order with the data, through the
real supervisor: with the DDL capture (``lapidusctl install-ddl-capture``) and without it
(pgoutput's relation messages)."""

from __future__ import annotations

from tests.integration.conftest import ctl, pg_backend
from tests.integration.snapshot_helpers import until


def start(lapidus_factory, pg_db):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v text)")
    proc = lapidus_factory({"backends": [pg_backend(pg_db, decoder="pgoutput")],
                            "plugins": {"stdout": {}}})
    proc.wait_log('"streaming"', 60)
    return proc


def of_t(events):
    return [(e["type"], (e["item"] or {}).get("command") if e["type"] == "schema" else
             e["pk"]["id"]) for e in events if e["table"] == "t"]


def test_with_the_ddl_capture_each_statement_is_an_event_where_it_committed(
        pg_db, lapidus_factory):
    proc = start(lapidus_factory, pg_db)
    code, out, err = ctl(proc.config_path, "install-ddl-capture", "pg")
    assert code == 0 and f'installed in database "{pg_db.name}"' in out, err
    pg_db.sql("INSERT INTO t VALUES (1, 'a')",
              "ALTER TABLE t ADD COLUMN n numeric(10,2) NOT NULL DEFAULT 0",
              "INSERT INTO t VALUES (2, 'b', 1.50)",
              "DROP TABLE t")
    until(proc, lambda: len(of_t(proc.events())) >= 4, 30, "the events of t")
    events = [e for e in proc.events() if e["table"] == "t"]
    assert of_t(events) == [("insert", 1), ("schema", "ALTER TABLE"), ("insert", 2),
                            ("schema", "DROP TABLE")]
    alter = events[1]["item"]
    assert alter["columns"] == [
        {"name": "id", "type": "integer", "nullable": False},
        {"name": "v", "type": "text", "nullable": True},
        {"name": "n", "type": "numeric(10,2)", "nullable": False}]
    assert alter["object"] == "public.t" and alter["source"] == "ddl_capture"
    assert "ADD COLUMN n" in alter["sql"]
    assert events[1]["schema"] == "public" and events[1]["position"] < events[2]["position"]
    assert events[2]["item"] == {"id": 2, "v": "b", "n": "1.50"}
    # the relation message before insert 2 repeats what the capture said: no second event
    assert sum(e["type"] == "schema" for e in events) == 2
    code, out, _ = ctl(proc.config_path, "install-ddl-capture", "pg", "--uninstall")
    assert code == 0 and "removed from" in out


def test_without_it_a_changed_relation_message_is_a_schema_event(pg_db, lapidus_factory):
    proc = start(lapidus_factory, pg_db)
    pg_db.sql("INSERT INTO t VALUES (1, 'a')",
              "ALTER TABLE t ADD COLUMN n int, ALTER COLUMN v TYPE varchar(20)",
              "INSERT INTO t VALUES (2, 'b', 5)")
    until(proc, lambda: len(of_t(proc.events())) >= 3, 30, "the events of t")
    events = [e for e in proc.events() if e["table"] == "t"]
    assert of_t(events) == [("insert", 1), ("schema", "ALTER TABLE"), ("insert", 2)]
    item = events[1]["item"]
    assert item["source"] == "relation" and item["added"] == ["n"]
    assert item["retyped"] == ["v"] and item["dropped"] == []
    assert item["columns"][-1] == {"name": "n", "type": "integer"}
    assert events[1]["id"].endswith(":relation:" + events[1]["id"].rsplit(":", 1)[1])
    # the change index of the transaction is untouched: the insert is still its first change
    assert events[2]["id"].endswith(":0")


def test_print_needs_no_database_and_other_sources_are_refused(pg_db, lapidus_factory, tmp_path):
    proc = start(lapidus_factory, pg_db)
    code, out, _ = ctl(proc.config_path, "install-ddl-capture", "pg", "--print")
    assert code == 0 and "CREATE EVENT TRIGGER lapidus_ddl_command_end" in out
    code, _, err = ctl(proc.config_path, "install-ddl-capture", "nosuch")
    assert code == 2 and 'unknown backend "nosuch"' in err
