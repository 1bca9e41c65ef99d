"""Loads and checks shared by the sink tests (tests/integration/test_webhook_sink.py,
test_mqtt_sink.py): 10,000 rows into a PostgreSQL and a MariaDB table, in transactions of 500
rows whose first 50 are then updated twice, and the check that every row arrived, each change
once after dropping repeats by id, in commit order per key, with the EVENTS.md payload."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections import defaultdict

from tests.integration.conftest import pg_connect
from tests.integration.mysql_fixtures import DATABASE, root_connection

ROWS = 10_000
PER_TX = 500
UPDATED = 50          # rows of each transaction updated twice afterwards: order per key
EVENT_FIELDS = {"id", "type", "backend", "schema", "table", "pk", "item", "before",
                "position", "txid", "ts"}


# -- loads: inserts in transactions of PER_TX rows, the first UPDATED of each updated twice ----

def pg_load(database: str, rows: int = ROWS, start: int = 1) -> threading.Thread:
    """Rows ``start`` .. ``rows`` (a multiple of PER_TX apart)."""
    def run():
        conn = pg_connect(database)
        with conn.cursor() as cur:
            for first in range(start, rows + 1, PER_TX):
                last = min(rows, first + PER_TX - 1)
                cur.execute("INSERT INTO t SELECT g, 0 FROM generate_series(%s, %s) g",
                            (first, last))
                conn.commit()
                for _ in range(2):
                    cur.execute("UPDATE t SET v = v + 1 WHERE id BETWEEN %s AND %s",
                                (first, first + UPDATED - 1))
                    conn.commit()
        conn.close()
    return _thread(run)


def mariadb_load(rows: int = ROWS, start: int = 1) -> threading.Thread:
    def run():
        conn = root_connection(database=DATABASE)
        with conn.cursor() as cur:
            for first in range(start, rows + 1, PER_TX):
                last = min(rows, first + PER_TX - 1)
                cur.execute(f"INSERT INTO t SELECT seq, 0 FROM seq_{first}_to_{last}")
                for _ in range(2):
                    cur.execute("UPDATE t SET v = v + 1 WHERE id BETWEEN %s AND %s",
                                (first, first + UPDATED - 1))
        conn.close()
    return _thread(run)


def _thread(target) -> threading.Thread:
    errors = []

    def run():
        try:
            target()
        except BaseException as exc:      # reported by finish()
            errors.append(exc)
    thread = threading.Thread(target=run, daemon=True)
    thread.errors = errors
    thread.start()
    return thread


def finish(thread: threading.Thread) -> None:
    thread.join(120)
    assert not thread.is_alive(), "the load did not finish"
    assert not thread.errors, thread.errors


def expected_count(rows: int = ROWS) -> int:
    return rows + 2 * UPDATED * ((rows + PER_TX - 1) // PER_TX)


def check_rows(events, backend: str, rows: int = ROWS) -> None:
    """Every row of ``backend`` arrived, each change once (repeats, by id, dropped as a
    consumer would), in commit order per key, with the EVENTS.md payload."""
    seen = set()
    by_key = defaultdict(list)
    for event in events:
        if event["backend"] != backend or event["id"] in seen:
            continue
        seen.add(event["id"])
        assert EVENT_FIELDS <= set(event), event
        assert event["table"] == "t" and event["pk"] == {"id": event["item"]["id"]}
        by_key[event["pk"]["id"]].append((event["type"], event["item"]["v"]))
    assert sorted(by_key) == list(range(1, rows + 1)), "rows missing"
    for key, changes in by_key.items():
        updated = (key - 1) % PER_TX < UPDATED
        wanted = [("insert", 0)] + ([("update", 1), ("update", 2)] if updated else [])
        assert changes == wanted, (key, changes)


def mariadb_table(sql) -> None:
    sql.run("CREATE TABLE t (id INT PRIMARY KEY, v INT)")


# -- configuration refusals -------------------------------------------------------------------

def refused(tmp_path, config: dict, start_too: bool = False) -> str:
    """``lapidus -t`` (and, with ``start_too``, ``lapidus`` itself) on ``config`` (a
    ``state_dir`` under ``tmp_path`` added): exit 2 with no traceback; returns the output
    of the last run, for the test's own checks of what it says."""
    path = tmp_path / "lapidus.json"
    path.write_text(json.dumps({"state_dir": str(tmp_path / "state"), **config}))
    out = ""
    for args in (["-t"], []) if start_too else (["-t"],):
        result = subprocess.run([sys.executable, "-m", "lapidus", *args, "-c", str(path)],
                                capture_output=True, text=True, timeout=60)
        out = result.stdout + result.stderr
        assert result.returncode == 2, out
        assert "Traceback" not in out
    return out
