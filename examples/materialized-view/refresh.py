#!/usr/bin/env python3
"""Refresh a PostgreSQL materialized view when Lapidus reports changes of its source table,
debounced: one REFRESH for a burst of changes, not one per change.

Run by Lapidus's exec sink, which writes every event as one JSON line on standard input
(docs/sinks.md#exec).  After a change of ``TABLES`` the view is refreshed once no further
change came for ``QUIET`` seconds, or ``LONGEST`` seconds after the first unrefreshed change at
the latest (a steady stream of changes still gets a fresh view that often).  The refresh is
``REFRESH MATERIALIZED VIEW CONCURRENTLY`` through ``psql``: readers of the view are never
blocked (it needs a unique index on the view).

Settings (environment, set in lapidus.toml's ``env``): ``REFRESH_DSN`` (libpq DSN of the
database with the view), ``REFRESH_VIEW``, ``REFRESH_TABLES`` (comma-separated source tables,
``database.table``), ``REFRESH_QUIET`` (default 0.5), ``REFRESH_LONGEST`` (default 5).
Standard library only.
"""

import json
import os
import select
import subprocess
import sys
import time

DSN = os.environ["REFRESH_DSN"]
VIEW = os.environ["REFRESH_VIEW"]
TABLES = {t.strip() for t in os.environ["REFRESH_TABLES"].split(",") if t.strip()}
QUIET = float(os.environ.get("REFRESH_QUIET", "0.5"))
LONGEST = float(os.environ.get("REFRESH_LONGEST", "5"))


def refresh(changes: int) -> None:
    result = subprocess.run(["psql", DSN, "-v", "ON_ERROR_STOP=1", "-qc",
                             f"REFRESH MATERIALIZED VIEW CONCURRENTLY {VIEW}"],
                            capture_output=True, text=True)
    if result.returncode != 0:
        # exit: the exec sink restarts the command, and the changes of the batch come again
        sys.exit(f"refresh of {VIEW} failed: {result.stderr.strip()}")
    print(f"refreshed {VIEW} after {changes} change(s)", file=sys.stderr, flush=True)


def main() -> None:
    pending, first, last = 0, 0.0, 0.0
    buffered = b""
    stdin = sys.stdin.buffer.raw
    while True:
        wait = None
        if pending:
            now = time.monotonic()
            wait = max(0.0, min(last + QUIET, first + LONGEST) - now)
        readable, _, _ = select.select([stdin], [], [], wait)
        if not readable:
            refresh(pending)
            pending = 0
            continue
        chunk = os.read(stdin.fileno(), 65536)
        if not chunk:
            if pending:
                refresh(pending)
            return              # end of input: Lapidus stops
        buffered += chunk
        *lines, buffered = buffered.split(b"\n")
        for line in lines:
            event = json.loads(line)
            if f"{event.get('schema')}.{event.get('table')}" in TABLES and \
                    event.get("type") in ("insert", "update", "delete", "truncate", "read"):
                now = time.monotonic()
                if not pending:
                    first = now
                pending += 1
                last = now


if __name__ == "__main__":
    main()
