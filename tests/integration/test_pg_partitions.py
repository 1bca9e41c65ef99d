"""Partitioned tables on PostgreSQL (pgoutput): ``publish_via_partition_root``, include /
exclude of a parent and of its partitions, and the snapshot, through the real lapidus process.

``m`` is partitioned by range of ``k`` into ``m_low`` (k < 100) and ``m_high`` (k >= 100).
"""

from __future__ import annotations

import pytest

from tests.integration.nats_fixtures import URL, unique_prefix, watch
from tests.integration.snapshot_helpers import snapshot_state, until
from tests.integration.test_pgoutput_publications import start

__all__ = ["watch"]     # fixture, imported for pytest

PARTITIONED = (
    "CREATE TABLE m (id int, k int, v text, PRIMARY KEY (id, k)) PARTITION BY RANGE (k)",
    "CREATE TABLE m_low PARTITION OF m FOR VALUES FROM (0) TO (100)",
    "CREATE TABLE m_high PARTITION OF m FOR VALUES FROM (100) TO (200)",
    "CREATE TABLE other (id int PRIMARY KEY)",
)


@pytest.fixture
def pg_part(pg_db, tmp_path):
    pg_db.sql(*PARTITIONED)
    pg_db.workdir = tmp_path
    return pg_db


def write_rows(db):
    """Inserts into both partitions, an update in place, an update that moves a row from
    m_low to m_high, a delete, then a sentinel row in ``other``."""
    db.sql("INSERT INTO m VALUES (1, 10, 'a'), (2, 150, 'b')")
    db.sql("UPDATE m SET v = 'a2' WHERE id = 1")
    db.sql("UPDATE m SET k = 120 WHERE id = 1")      # m_low -> m_high
    db.sql("DELETE FROM m WHERE id = 2")
    db.sql("INSERT INTO other VALUES (1)")


def changes(proc, count):
    return [(e["type"], e["schema"], e["table"], e["pk"]) for e in proc.wait_events(count)]


def via_root(db, name="lapidus_pg"):
    return db.sql("SELECT pubviaroot FROM pg_publication WHERE pubname = %s", args=(name,))[0][0]


def published(db, name="lapidus_pg"):
    return [t for (t,) in db.sql("SELECT schemaname || '.' || tablename FROM "
                                 "pg_publication_tables WHERE pubname = %s ORDER BY 1",
                                 args=(name,))]


def key(i, k):
    return {"id": i, "k": k}


# -- what arrives ------------------------------------------------------------------------------

@pytest.mark.parametrize("options", [{}, {"publication_mode": "filtered",
                                          "include_tables": ["m", "other"]}],
                         ids=["all_tables", "filtered_parent"])
def test_with_the_setting_partition_changes_arrive_as_the_parent(lapidus_factory, pg_part,
                                                                 watch, options):
    prefix = unique_prefix()
    watcher = watch(f"{prefix}.>")
    proc = start(lapidus_factory, pg_part, publish_via_partition_root=True, **options,
                 plugins={"stdout": {}, "nats": {"server": URL, "subject_prefix": prefix}})
    assert via_root(pg_part) is True
    assert published(pg_part) == ["public.m", "public.other"]
    write_rows(pg_part)
    # the move between partitions is, as pgoutput sends it, a delete and an insert
    assert changes(proc, 7) == [
        ("insert", "public", "m", key(1, 10)), ("insert", "public", "m", key(2, 150)),
        ("update", "public", "m", key(1, 10)),
        ("delete", "public", "m", key(1, 10)), ("insert", "public", "m", key(1, 120)),
        ("delete", "public", "m", key(2, 150)), ("insert", "public", "other", {"id": 1})]
    events = proc.events()
    assert events[4]["item"] == {"id": 1, "k": 120, "v": "a2"}
    assert [m.subject for m in watcher.wait_count(7)] == [
        f"{prefix}.public.m.1.10", f"{prefix}.public.m.2.150", f"{prefix}.public.m.1.10",
        f"{prefix}.public.m.1.10", f"{prefix}.public.m.1.120", f"{prefix}.public.m.2.150",
        f"{prefix}.public.other.1"]
    # TRUNCATE of a partition is not published via the root; of the parent it is
    pg_part.sql("TRUNCATE m_high")
    pg_part.sql("INSERT INTO m VALUES (3, 20, 'c')")
    pg_part.sql("TRUNCATE m")
    assert changes(proc, 9)[7:] == [("insert", "public", "m", key(3, 20)),
                                    ("truncate", "public", "m", None)]


@pytest.mark.parametrize("options", [{}, {"publication_mode": "filtered",
                                          "include_tables": ["m", "other"]}],
                         ids=["all_tables", "filtered_parent"])
def test_without_the_setting_partition_changes_arrive_as_the_partitions(lapidus_factory,
                                                                        pg_part, options):
    proc = start(lapidus_factory, pg_part, **options)
    assert via_root(pg_part) is False
    assert published(pg_part) == ["public.m_high", "public.m_low", "public.other"]
    write_rows(pg_part)
    assert changes(proc, 7) == [
        ("insert", "public", "m_low", key(1, 10)), ("insert", "public", "m_high", key(2, 150)),
        ("update", "public", "m_low", key(1, 10)),
        ("delete", "public", "m_low", key(1, 10)), ("insert", "public", "m_high", key(1, 120)),
        ("delete", "public", "m_high", key(2, 150)), ("insert", "public", "other", {"id": 1})]


def test_excluding_a_parent_leaves_out_its_partitions(lapidus_factory, pg_part):
    proc = start(lapidus_factory, pg_part, exclude_tables=["m"])
    write_rows(pg_part)
    assert changes(proc, 1) == [("insert", "public", "other", {"id": 1})]
    pg_part.sql("INSERT INTO other VALUES (2)")
    assert len(proc.wait_events(2)) == 2          # nothing of m came in between


def test_a_partition_excluded_apart_from_its_parent(lapidus_factory, pg_part):
    """Without the setting the partition is simply left out; with it, its changes would
    arrive as the parent, which include/exclude cannot tell apart: refused before anything
    is created."""
    proc = start(lapidus_factory, pg_part, wait="fatal", publish_via_partition_root=True,
                 publication_mode="filtered", exclude_tables=["m_low"])
    log = proc.log()
    assert "public.m_low is excluded but its parent public.m is not" in log
    assert "Name the parent instead of its partitions" in log
    assert pg_part.sql("SELECT 1 FROM pg_publication") == []
    again = start(lapidus_factory, pg_part, publication_mode="filtered",
                  exclude_tables=["m_low"])
    write_rows(pg_part)
    assert changes(again, 4) == [
        ("insert", "public", "m_high", key(2, 150)), ("insert", "public", "m_high", key(1, 120)),
        ("delete", "public", "m_high", key(2, 150)), ("insert", "public", "other", {"id": 1})]


# -- the snapshot ----------------------------------------------------------------------------

@pytest.mark.parametrize("root", [True, False], ids=["via_root", "partitions"])
def test_initial_snapshot_reads_each_row_once(lapidus_factory, pg_part, root):
    pg_part.sql("INSERT INTO m SELECT g, g % 200, 'r' || g FROM generate_series(1, 500) g")
    proc = start(lapidus_factory, pg_part, snapshot="initial", snapshot_chunk_rows=64,
                 decoder="pgoutput", publish_via_partition_root=root)
    until(proc, lambda: snapshot_state(proc).get("state") == "done", 60,
          "the snapshot to finish")
    pg_part.sql("INSERT INTO other VALUES (-1)")
    events = until(proc, lambda: (lambda ev: ev if ev and ev[-1]["table"] == "other" else None)(
        proc.events()), 30, "the row written after the snapshot")
    reads = [e for e in events if e["type"] == "read"]
    assert sorted(e["pk"]["id"] for e in reads) == list(range(1, 501))     # once each
    expected = {("public", "m")} if root else {("public", "m_low"), ("public", "m_high")}
    assert {(e["schema"], e["table"]) for e in reads} == expected
    if not root:
        assert all((e["table"] == "m_low") == (e["pk"]["k"] < 100) for e in reads)


# -- changing the setting --------------------------------------------------------------------

def test_switching_the_setting_alters_the_publication_lapidus_made(lapidus_factory, pg_part):
    proc = start(lapidus_factory, pg_part)
    pg_part.sql("INSERT INTO m VALUES (1, 10, 'a')")
    assert changes(proc, 1) == [("insert", "public", "m_low", key(1, 10))]
    assert proc.terminate() == 0
    pg_part.sql("INSERT INTO m VALUES (2, 20, 'b')")      # pending, written before the ALTER
    again = start(lapidus_factory, pg_part, publish_via_partition_root=True)
    assert via_root(pg_part) is True
    assert '"publication changed' in again.log()
    pg_part.sql("INSERT INTO m VALUES (3, 30, 'c')")
    # pgoutput reads the publication as of each change: the row written before keeps its name
    assert changes(again, 2) == [("insert", "public", "m_low", key(2, 20)),
                                 ("insert", "public", "m", key(3, 30))]
    assert again.terminate() == 0
    third = start(lapidus_factory, pg_part)
    assert via_root(pg_part) is False
    pg_part.sql("INSERT INTO m VALUES (4, 40, 'd')")
    assert changes(third, 1) == [("insert", "public", "m_low", key(4, 40))]


def test_existing_mode_with_another_setting_is_fatal_and_names_the_statement(lapidus_factory,
                                                                             pg_part):
    pg_part.sql("CREATE PUBLICATION dba_pub FOR TABLE m")
    proc = start(lapidus_factory, pg_part, wait="fatal", publication="dba_pub",
                 publication_mode="existing", publish_via_partition_root=True)
    log = proc.log()
    assert ('publication \\"dba_pub\\" has publish_via_partition_root = false, but the backend '
            'sets it to true') in log
    assert 'ALTER PUBLICATION \\"dba_pub\\" SET (publish_via_partition_root = true);' in log
    assert via_root(pg_part, "dba_pub") is False                 # never changed
    assert pg_part.sql("SELECT 1 FROM pg_replication_slots WHERE database = current_database()"
                       ) == []                                    # refused before the slot
    # the DBA's fix, and the backend streams the parent
    pg_part.sql("ALTER PUBLICATION dba_pub SET (publish_via_partition_root = true)")
    again = start(lapidus_factory, pg_part, publication="dba_pub",
                  publication_mode="existing", publish_via_partition_root=True)
    pg_part.sql("INSERT INTO m VALUES (1, 150, 'a')")
    assert changes(again, 1) == [("insert", "public", "m", key(1, 150))]


def test_auto_decoder_on_a_wal2json_slot_refuses_the_setting(lapidus_factory, pg_part):
    proc = start(lapidus_factory, pg_part, decoder="wal2json")
    assert proc.terminate() == 0
    again = start(lapidus_factory, pg_part, wait="fatal", publish_via_partition_root=True)
    log = again.log()
    assert "publish_via_partition_root = true needs the pgoutput decoder, but this backend " \
           "decodes with wal2json" in log
    assert pg_part.sql("SELECT 1 FROM pg_publication") == []        # wal2json needs none
