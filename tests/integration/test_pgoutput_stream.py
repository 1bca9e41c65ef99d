"""pgoutput through the real ``lapidus`` process: the same events as wal2json, and what only
pgoutput has (messages that are not UTF-8).

The comparison runs both decoders side by side in one Lapidus, two backends on one database
with a slot each, so the very same transactions go through both: every event must be equal
except for the backend name in ``backend`` and ``id`` (position, txid and ts included).
"""

from __future__ import annotations

import collections

from tests.conftest import wait_until
from tests.integration.conftest import pg_backend

SCHEMA = [
    "CREATE TYPE mood AS ENUM ('happy', 'sad')",
    "CREATE TABLE items (id int PRIMARY KEY, name text, price numeric(10,2), tags text[], "
    "m mood, doc jsonb, at timestamptz)",
    "CREATE TABLE pairs (a int, b text, v text, PRIMARY KEY (a, b))",
    "CREATE TABLE full_t (id int PRIMARY KEY, v text)",
    "ALTER TABLE full_t REPLICA IDENTITY FULL",
    "CREATE TABLE idx_t (id int PRIMARY KEY, u int NOT NULL, v text)",
    "CREATE UNIQUE INDEX idx_t_u ON idx_t (u)",
    "ALTER TABLE idx_t REPLICA IDENTITY USING INDEX idx_t_u",
    "CREATE TABLE docs (id int PRIMARY KEY, body text, n int)",
    "ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL",
    "CREATE TABLE nokey (a int, b text)",
    "ALTER TABLE nokey REPLICA IDENTITY FULL",
]

CHANGES = [
    "INSERT INTO items VALUES (1, 'a', 1.50, '{x,\"y z\"}', 'happy', "
    "'{\"n\": 12345678901234567890.5, \"l\": [1, null]}', '2026-11-30 11:33:35.5+01'), "
    "(2, E'line\\nbreak', NULL, '{}', NULL, 'null', NULL)",
    "UPDATE items SET name = 'b', price = 2.10 WHERE id = 2",
    "UPDATE items SET id = 3 WHERE id = 1",
    "DELETE FROM items WHERE id = 3",
    "INSERT INTO pairs VALUES (1, 'x', 'v'), (2, 'a.b', NULL)",
    "UPDATE pairs SET v = 'w' WHERE a = 1",
    "DELETE FROM pairs WHERE a = 2",
    "INSERT INTO full_t VALUES (1, 'old')",
    "UPDATE full_t SET v = 'new' WHERE id = 1",
    "DELETE FROM full_t WHERE id = 1",
    "INSERT INTO idx_t VALUES (1, 10, 'x')",
    "UPDATE idx_t SET v = 'y' WHERE id = 1",
    "UPDATE idx_t SET u = 11 WHERE id = 1",
    "DELETE FROM idx_t WHERE id = 1",
    "INSERT INTO docs VALUES (1, repeat('x', 300000), 0)",
    "UPDATE docs SET n = 1 WHERE id = 1",
    "INSERT INTO nokey VALUES (1, 'p')",
    "UPDATE nokey SET b = 'q'",
    "DELETE FROM nokey",
    "SELECT pg_logical_emit_message(true, 'audit', E'tx\\nmessage ✓')",
    "SELECT pg_logical_emit_message(false, 'ping', 'not in a transaction')",
    "TRUNCATE items, pairs",
]


def test_pgoutput_and_wal2json_give_identical_events_for_the_same_changes(
        lapidus_factory, pg_db):
    pg_db.sql(*SCHEMA)
    proc = lapidus_factory({
        "backends": [pg_backend(pg_db, name="po", decoder="pgoutput"),
                     pg_backend(pg_db, name="wj", decoder="wal2json")],
        "plugins": {"stdout": {}}})
    wait_until(lambda: proc.log().count('"streaming"') >= 2, 30, message="both backends")
    for statement in CHANGES:
        pg_db.sql(statement)
    count = 25
    events = proc.wait_events(2 * count)
    by_backend = collections.defaultdict(list)
    for event in events:
        by_backend[event["backend"]].append(event)
    po, wj = by_backend["po"], by_backend["wj"]
    assert len(po) == len(wj) == count

    def normal(event):
        return {**event, "backend": "", "id": event["id"].split(":", 1)[1]}

    for a, b in zip(po, wj):
        assert normal(a) == normal(b)

    # spot checks of what the comparison covered
    kinds = [(e["type"], e["table"]) for e in po]
    assert kinds[-2:] == [("truncate", "items"), ("truncate", "pairs")]
    docs_update = next(e for e in po if e["table"] == "docs" and e["type"] == "update")
    assert docs_update["unchanged"] == ["body"] and "body" not in docs_update["item"]
    full_update = next(e for e in po if e["table"] == "full_t" and e["type"] == "update")
    assert full_update["before"] == {"id": 1, "v": "old"} and full_update["pk"] == {"id": 1}
    assert next(e for e in po if e["table"] == "pairs")["pk"] == {"a": 1, "b": "x"}
    message = next(e for e in po if e["type"] == "message" and e["transactional"])
    assert message["content"] == "tx\nmessage ✓"


def test_message_content_that_is_not_utf8_arrives_as_bytea_hex(lapidus_factory, pg_db):
    proc = lapidus_factory({"backends": [pg_backend(pg_db, decoder="pgoutput")],
                            "plugins": {"stdout": {}}})
    proc.wait_log('"streaming"')
    pg_db.sql("SELECT pg_logical_emit_message(true, 'bin', '\\xff000a'::bytea)")
    pg_db.sql("SELECT pg_logical_emit_message(true, 'txt', convert_to('ok ✓', 'UTF8'))")
    events = proc.wait_events(2)
    assert [(e["prefix"], e["content"]) for e in events] == [
        ("bin", "\\xff000a"), ("txt", "ok ✓")]


def test_messages_off_sends_none(lapidus_factory, pg_db):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY)")
    proc = lapidus_factory({"backends": [pg_backend(pg_db, decoder="pgoutput", messages=False)],
                            "plugins": {"stdout": {}}})
    proc.wait_log('"streaming"')
    pg_db.sql("SELECT pg_logical_emit_message(true, 'audit', 'hidden')",
              "SELECT pg_logical_emit_message(false, 'audit', 'hidden')",
              "INSERT INTO t VALUES (1)")
    events = proc.wait_events(1)
    assert [e["type"] for e in events] == ["insert"]


def test_catalog_describes_relations_as_pgoutput_does(pg_db):
    """The fallback for a lost relation log (CatalogRelations) matches real R messages:
    dropped and generated columns left out, key flags per replica identity."""
    from lapidus.workers.postgresql.pgoutput import parse_relation, split_messages
    from lapidus.workers.postgresql.pgoutput_relations import CatalogRelations

    pg_db.sql(
        "CREATE TABLE d (id int, x text, gone int, g int GENERATED ALWAYS AS (id * 2) STORED, "
        "y numeric, PRIMARY KEY (y, id))",
        "ALTER TABLE d DROP COLUMN gone",
        "CREATE TABLE f (id int PRIMARY KEY, v text)", "ALTER TABLE f REPLICA IDENTITY FULL",
        "CREATE TABLE i (id int PRIMARY KEY, u int NOT NULL)",
        "CREATE UNIQUE INDEX i_u ON i (u)", "ALTER TABLE i REPLICA IDENTITY USING INDEX i_u",
        "CREATE TABLE n (a int)",
        "CREATE PUBLICATION p FOR ALL TABLES WITH (publish = 'insert')")
    slot = f"{pg_db.name}_peek"
    pg_db.sql("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", args=(slot,))
    pg_db.sql("INSERT INTO d (id, x, y) VALUES (1, 'a', 2)", "INSERT INTO f VALUES (1, 'a')",
              "INSERT INTO i VALUES (1, 2)", "INSERT INTO n VALUES (1)")
    rows = pg_db.sql("SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
                     "'proto_version', '1', 'publication_names', 'p')", args=(slot,))
    data = b"".join(bytes(row[0]) + b"\n" for row in rows)
    frames, _ = split_messages(data)
    relations = [parse_relation(f) for f in frames if f[:1] == b"R"]
    assert [r.table for r in relations] == ["d", "f", "i", "n"]
    catalog = CatalogRelations(pg_db.conn)
    for sent in relations:
        assert catalog.describe(sent.relid) == sent
    assert relations[0].names == ("id", "x", "y")
    assert relations[0].key == (True, False, True)
    assert catalog.primary_key(relations[0].relid) == ("id", "y")
    assert relations[1].key == (True, True)                   # FULL flags every column
    assert catalog.primary_key(relations[2].relid) == ("id",)
    assert relations[2].key == (False, True)                  # the replica identity index
    assert catalog.primary_key(relations[3].relid) is None
    assert catalog.describe(1) is None
