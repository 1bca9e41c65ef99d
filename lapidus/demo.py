"""``lapidus demo``: a newcomer's first minute against the local PostgreSQL.

Runs in the ``lapidus`` process.  Creates a ``lapidus_demo`` database with a ``demo_items``
table, starts the supervisor with one PostgreSQL backend (temporary slot) and the stdout sink,
and writes a few rows from a helper process so events appear on standard output.  Ctrl-C stops
everything; the slot (and the publication, with pgoutput) are dropped on the way out.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time

import psycopg2
from psycopg2.extensions import parse_dsn

from . import exitcodes

DEMO_DB = "lapidus_demo"


def _prepare(dsn: str) -> dict:
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DEMO_DB,))
        if cur.fetchone() is None:
            cur.execute(f"CREATE DATABASE {DEMO_DB}")
    params = conn.get_dsn_parameters()
    conn.close()
    demo = psycopg2.connect(dsn, dbname=DEMO_DB)
    demo.autocommit = True
    with demo.cursor() as cur:
        # A fresh table every run, so the demo tells the same story each time.
        cur.execute("DROP TABLE IF EXISTS demo_items")
        cur.execute("CREATE TABLE demo_items (id serial PRIMARY KEY, "
                    "name text NOT NULL, price numeric(10,2), tags text[], "
                    "updated_at timestamptz DEFAULT now())")
    demo.close()
    return params


def _write_rows(dsn: str) -> None:
    """Helper process: a small insert/update/delete story, then idle until stopped."""
    from .procutil import die_with_parent
    die_with_parent(signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    time.sleep(2.0)  # let the worker create its slot first; rows before it would not stream
    conn = psycopg2.connect(dsn, dbname=DEMO_DB)
    conn.autocommit = True
    with conn.cursor() as cur:
        for name, price in (("apple", "1.50"), ("pear", "2.25"), ("plum", "0.99")):
            cur.execute("INSERT INTO demo_items (name, price, tags) VALUES (%s, %s, %s) "
                        "RETURNING id", (name, price, ["fruit", name]))
            time.sleep(0.3)
        cur.execute("UPDATE demo_items SET price = price * 2 WHERE name = 'pear'")
        time.sleep(0.3)
        cur.execute("DELETE FROM demo_items WHERE name = 'plum'")
    conn.close()
    signal.pause()


def run_demo(dsn: str) -> int:
    from . import logs
    from .config import parse_config
    from .supervisor.arbiter import Arbiter

    try:
        parse_dsn(dsn)
    except psycopg2.ProgrammingError as exc:
        # not echoed: a connection string may hold a password
        print(f"lapidus demo: --dsn is not a PostgreSQL connection string "
              f"({str(exc).strip()}); give one like 'host=127.0.0.1 user=postgres' or "
              f"'postgresql://postgres@127.0.0.1/postgres'", file=sys.stderr)
        return exitcodes.USAGE
    try:
        params = _prepare(dsn)
    except psycopg2.OperationalError as exc:
        print(f"lapidus demo: cannot connect to PostgreSQL ({dsn}): {exc}".strip(), file=sys.stderr)
        print("Start PostgreSQL, or pass --dsn; 'make demo' also configures a local server.",
              file=sys.stderr)
        return exitcodes.RUNTIME
    state_dir = tempfile.mkdtemp(prefix="lapidus-demo-")
    config = parse_config({
        "state_dir": state_dir,
        "log": {"format": "console", "level": "info"},
        "backends": [{
            "name": "demo", "type": "postgresql", "host": params.get("host", "127.0.0.1"),
            "port": int(params.get("port", 5432)), "user": params.get("user", "postgres"),
            "database": DEMO_DB, "slot": "lapidus_demo", "temporary_slot": True,
            "include_tables": ["demo_items"],
        }],
        "plugins": {"stdout": {}},
    }, source="<demo>")
    logs.configure("console", "info", process="supervisor")
    print("lapidus demo: streaming table demo_items of database lapidus_demo to stdout; "
          "writing a few rows. Press Ctrl-C to stop.", file=sys.stderr)
    import multiprocessing
    writer = multiprocessing.get_context("fork").Process(target=_write_rows, args=(dsn,),
                                                         daemon=True)
    writer.start()
    try:
        return Arbiter(config).run()
    finally:
        if writer.is_alive():
            os.kill(writer.pid, signal.SIGKILL)
        print("lapidus demo: stopped; its slot and publication were dropped. Run it again with "
              "'make demo'.",
              file=sys.stderr)
