"""docs/operations.md, "Recovering a lost position", followed step by step on PostgreSQL.

The slot is dropped while Lapidus is stopped and the table changes meanwhile (the gap); the
backend is refused with the recipe in its error; after the recipe (state directory moved
away, ``snapshot = "initial"``) a consumer that rebuilds its copy from the new snapshot ends
with exactly the table's content.
"""

from __future__ import annotations

import json

from tests.integration.conftest import backend_status, pg_backend
from tests.integration.snapshot_helpers import fold, until
from tests.integration.test_pg_snapshot import make_table, table_content


def test_the_recipe_recovers_a_dropped_slot_without_a_gap(pg_db, lapidus_factory, tmp_path):
    make_table(pg_db, 2000)
    backend = pg_backend(pg_db, decoder="pgoutput", snapshot="initial")
    config = {"backends": [backend], "plugins": {"stdout": {}}}
    proc = lapidus_factory(config)
    until(proc, lambda: (backend_status(proc.config_path, "pg").get("snapshot") or {}).get(
        "state") == "done", 60, "the first snapshot")
    pg_db.sql("UPDATE t SET v = 'streamed' WHERE id <= 10")
    until(proc, lambda: sum(e["type"] == "update" for e in proc.events()) == 10, 30,
          "the streamed updates")
    assert proc.terminate() == 0
    before = proc.events()

    # the gap: the slot goes, and the table changes while nothing covers it
    pg_db.sql(f"SELECT pg_drop_replication_slot('{backend['slot']}')",
              "UPDATE t SET v = 'in the gap' WHERE id BETWEEN 100 AND 199",
              "DELETE FROM t WHERE id BETWEEN 200 AND 299",
              "INSERT INTO t SELECT g, 'new in the gap', 1 FROM generate_series(3001, 3100) g")
    refused = lapidus_factory(config)
    assert refused.proc.wait(60) != 0
    error = next(json.loads(line)["error"] for line in refused.log().splitlines()
                 if '"backend failed"' in line)
    assert "no longer exists" in error and "Recovering a lost position" in error
    assert 'snapshot = "initial"' in error

    # the recipe: state directory moved away, snapshot = "initial" (already set), start
    state = tmp_path / "state" / "pg"
    state.rename(tmp_path / "state" / "pg.lost")
    recovered = lapidus_factory(config)
    until(recovered, lambda: (backend_status(recovered.config_path, "pg").get("snapshot")
                              or {}).get("state") == "done", 60, "the new snapshot")
    pg_db.sql("INSERT INTO t VALUES (-1, 'sentinel', 0)")
    until(recovered, lambda: any(e["pk"] == {"id": -1} for e in recovered.events()), 30,
          "the sentinel")
    after = [json.loads(line) for line in recovered.stdout_path.read_bytes().splitlines()
             [len(before):] if line.strip()]

    # the consumer: its copy from before and the new events, rebuilt from the snapshot
    # (rows that neither the snapshot nor a later change names are dropped)
    new_reads = {e["pk"]["id"] for e in after if e["type"] == "read"}
    copy = {k: v for k, v in fold(before + after).items()
            if k in new_reads or any(e["pk"]["id"] == k for e in after if e["type"] != "read")}
    assert copy == table_content(pg_db)
    # and without the rebuild only the rows deleted in the gap would be left over
    stale = set(fold(before + after)) - set(table_content(pg_db))
    assert stale == set(range(200, 300))
