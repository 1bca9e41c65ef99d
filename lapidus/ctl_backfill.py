"""``lapidusctl backfill``: queue, follow and cancel online re-reads of one table.

Runs in the lapidusctl process.  The supervisor only queues the request (a file the worker
picks up, :mod:`lapidus.workers.snapshot.requests`); the worker checks the table and the
condition and runs it.  So this command follows the backend's status (``snapshot``,
``backfills``) to learn the verdict: without ``--wait`` until the worker took the request
(started, queued behind another run, or refused); with ``--wait`` until the run is done,
showing rows, rate and ETA (a bar on a terminal, one line a second otherwise).

Exit codes: 0 queued/started (done with ``--wait``), 1 an unknown backend or cancelled while
waited for, 2 usage or a table/condition the worker refused, 3 no Lapidus answers,
130 Ctrl-C while following (the backfill goes on).
"""

from __future__ import annotations

import sys
import time
from typing import Optional, Tuple

from . import exitcodes
from .control import ControlUnavailable, request

PICK_UP_SECONDS = 15.0      # how long to wait, without --wait, for the worker's verdict
POLL_SECONDS = 0.5


def add_parser(sub) -> None:
    cmd = sub.add_parser(
        "backfill", help="re-read one table's rows online, as read events (docs/snapshots.md)")
    cmd.add_argument("backend")
    cmd.add_argument("table", nargs="?", help="table or schema.table (MongoDB: collection or "
                     "database.collection)")
    cmd.add_argument("--where", metavar="CONDITION",
                     help="only rows matching: SQL (PostgreSQL, MySQL), a JSON filter (MongoDB)")
    cmd.add_argument("--wait", action="store_true",
                     help="follow the backfill until it is done (progress, rate, ETA)")
    cmd.add_argument("--cancel", action="store_true",
                     help="cancel the backend's queued and running backfills (of TABLE only, "
                          "when given)")


def backfill_command(args, socket_path) -> int:
    try:
        path = socket_path(args)
    except Exception as exc:  # ConfigError and friends: say it plainly
        print(f"lapidusctl: {exc}", file=sys.stderr)
        return exitcodes.USAGE
    if not args.cancel and not args.table:
        print("lapidusctl: backfill needs a TABLE (or --cancel)", file=sys.stderr)
        return exitcodes.USAGE
    message = {"command": "backfill", "backend": args.backend, "table": args.table,
               "where": args.where, "cancel": bool(args.cancel)}
    try:
        response = request(path, message)
        if not response.get("ok"):
            print(f"lapidusctl: {response.get('error', 'refused')}", file=sys.stderr)
            # an unknown backend is refused (1), as for restart, stop and start
            return exitcodes.USAGE if response.get("code") == "bad_request" \
                else exitcodes.REFUSED
        if args.cancel:
            gone = response.get("cancelled") or []
            for r in gone:
                print(f"cancelled backfill {r['n']} of {r['table']}")
            if not gone:
                print(f"no backfill of {args.backend} to cancel")
            return exitcodes.OK
        queued = response["backfill"]
        return follow(path, args.backend, queued["n"], queued["table"], args.wait)
    except ControlUnavailable as exc:
        print(f"lapidusctl: {exc}", file=sys.stderr)
        return exitcodes.UNREACHABLE
    except KeyboardInterrupt:
        print(f"\nlapidusctl: stopped following; the backfill goes on ('lapidusctl backfill "
              f"{args.backend} --cancel' cancels it)", file=sys.stderr)
        return exitcodes.INTERRUPTED


def verdict(row: dict, n: int) -> Tuple[str, Optional[dict]]:
    """Where backfill ``n`` stands in a backend's status row: ``refused``, ``done``,
    ``cancelled``, ``running``, ``queued``, or ``pending`` (not taken up yet)."""
    backfills = row.get("backfills") or {}
    for refusal in backfills.get("refused") or []:
        if refusal.get("n") == n:
            return "refused", refusal
    run = row.get("snapshot") or {}
    if run.get("n") == n:
        state = run.get("state")
        return ("running" if state == "running" else
                "cancelled" if state == "cancelled" else "done"), run
    if (run.get("n") or 0) > n:
        return "done", None
    for position, queued in enumerate(backfills.get("queued") or []):
        if queued.get("n") == n:
            return "queued", {"ahead": position, "running": run}
    return "pending", None


def _row(path: str, backend: str) -> dict:
    status = request(path, {"command": "status"})
    for row in status.get("backends", []):
        if row.get("name") == backend:
            return row
    return {}


def follow(path: str, backend: str, n: int, table: str, wait: bool) -> int:
    name = f"backfill {n} of {backend} {table}"
    tty = sys.stdout.isatty()
    deadline = time.monotonic() + PICK_UP_SECONDS
    last_line = 0.0
    said_queued = False
    while True:
        row = _row(path, backend)
        state, detail = verdict(row, n)
        if state == "refused":
            _end_line(tty)
            print(f"lapidusctl: {name} refused: {detail.get('reason')}", file=sys.stderr)
            return exitcodes.USAGE
        if state == "cancelled":
            _end_line(tty)
            print(f"{name} cancelled after {detail.get('rows', 0)} rows")
            return exitcodes.REFUSED if wait else exitcodes.OK
        if state == "done":
            _end_line(tty)
            rows = f": {detail['rows']} rows" if detail and "rows" in detail else ""
            print(f"{name} done{rows}")
            return exitcodes.OK
        if not wait:
            if state == "running":
                print(f"{name} started ('lapidusctl backfill {backend} {table} --wait' "
                      f"follows it, 'lapidusctl status' shows it)")
                return exitcodes.OK
            if state == "queued":
                print(f"{name} queued behind {detail['ahead'] + 1} other run(s)")
                return exitcodes.OK
            if time.monotonic() >= deadline:
                print(f"{name} queued; the backend is {row.get('state', 'not running')}: the "
                      f"worker checks the table when it streams")
                return exitcodes.OK
        elif state == "running":
            now = time.monotonic()
            if tty:
                sys.stdout.write("\r" + progress_text(detail, bar=True) + "\x1b[K")
                sys.stdout.flush()
            elif now - last_line >= 1.0:
                last_line = now
                print(progress_text(detail, bar=False), flush=True)
        elif state == "queued" and not said_queued:
            said_queued = True
            print(f"{name} queued behind {detail['ahead'] + 1} other run(s)", flush=True)
        time.sleep(POLL_SECONDS)


def _end_line(tty: bool) -> None:
    if tty:
        sys.stdout.write("\r\x1b[K")


def progress_text(run: dict, bar: bool) -> str:
    """``public.t [#####-----] 52% 10400/~20000 rows, 5210 rows/s, ETA 2s``."""
    done, estimate = run.get("table_rows", 0), run.get("table_rows_estimated")
    rate = run.get("rows_per_second") or 0
    parts = [str(run.get("table"))]
    if estimate:
        fraction = min(1.0, done / estimate)
        if bar:
            filled = int(fraction * 20)
            parts.append("[" + "#" * filled + "-" * (20 - filled) + "]")
        parts.append(f"{fraction * 100:.0f}% {done}/~{estimate} rows,")
    else:
        parts.append(f"{done} rows,")
    parts.append(f"{rate:.0f} rows/s")
    if estimate and rate > 0:
        parts[-1] += ","
        parts.append(f"ETA {max(0, int((estimate - done) / rate))}s")
    return " ".join(parts)
