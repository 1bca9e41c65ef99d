"""The ``lapidusctl`` command: look at and steer a running Lapidus through its control socket.

Runs in its own short-lived process; never imports the supervisor.  Exit codes: 0 success,
1 the supervisor refused the command (unknown backend ...), 2 usage or configuration error,
3 the control socket is absent or refuses.
"""

from __future__ import annotations

import argparse
import collections
import fnmatch
import json
import sys
import time
from typing import List, Optional

from . import ctl_backfill, ctl_cluster, ctl_ddl, exitcodes
from .control import ControlUnavailable, request

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_UNREACHABLE = (
    exitcodes.OK, exitcodes.REFUSED, exitcodes.USAGE, exitcodes.UNREACHABLE)

COLUMNS = ("backend", "state", "pid", "uptime", "restarts", "position", "lag", "events/s",
           "sinks", "last error")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lapidusctl",
                                     description="Inspect and control a running lapidus.")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("-c", "--config", metavar="PATH",
                       help="configuration file of the lapidus to talk to (its control.socket)")
    where.add_argument("--socket", metavar="PATH", help="control socket path")
    sub = parser.add_subparsers(dest="command", required=True)
    status = sub.add_parser("status", help="state of every backend")
    status.add_argument("names", nargs="*", metavar="NAME",
                        help="only backends whose name matches (globs: 'shop_*')")
    status.add_argument("--state", action="append", type=str.upper, metavar="STATE",
                        help="only backends in this state (RUNNING, WAITING, FATAL ...; "
                             "repeatable)")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    restart = sub.add_parser("restart", help="restart one backend, or all")
    restart.add_argument("backend", nargs="?")
    for name in ("stop", "start"):
        cmd = sub.add_parser(name, help=f"{name} one backend")
        cmd.add_argument("backend")
    dead = sub.add_parser("dead-letters", help="events a sink refused for good "
                          "(on_undeliverable = \"dead_letter\"), or send them again")
    dead.add_argument("backend")
    dead.add_argument("--json", action="store_true", help="one JSON object per line")
    dead.add_argument("--resend", action="store_true",
                      help="send them again through the running lapidus (same ids)")
    ctl_backfill.add_parser(sub)
    ctl_cluster.add_parser(sub)
    ctl_ddl.add_parser(sub)
    slots = sub.add_parser("slots", help="Lapidus's PostgreSQL replication slots and their lag")
    slots.add_argument("--json", action="store_true", help="machine-readable output")
    drop = sub.add_parser("drop-slot", help="drop an abandoned replication slot")
    drop.add_argument("slot")
    drop.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    return parser


def human_bytes(value) -> str:
    if value is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    return str(value)


def print_slots(rows) -> None:
    table = [("slot", "backend", "server", "active", "wal_status", "retained WAL")]
    for r in rows:
        table.append((r["slot"], r["backend"] or "(abandoned)", r["server"],
                      "yes" if r["active"] else "no", str(r["wal_status"]),
                      human_bytes(r["retained_wal_bytes"])))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())


def slots_command(args) -> int:
    """``slots`` and ``drop-slot`` talk to the databases, not to the supervisor."""
    from .config import ConfigError, load_config
    from .slots import drop_slot, list_slots
    from .workers.base import BackendError
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"lapidusctl: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.command == "slots":
            unreachable: list = []
            rows = list_slots(config, unreachable)
            if args.json:
                print(json.dumps(rows, indent=2))
            else:
                print_slots(rows)
            # the servers that answered are listed; then why the others are not (exit 3)
            for exc in unreachable:
                print(f"lapidusctl: {exc.for_one_attempt()}", file=sys.stderr)
            return EXIT_UNREACHABLE if unreachable else EXIT_OK
        if not args.yes:
            if not sys.stdin.isatty():
                print("lapidusctl: drop-slot asks for confirmation; give --yes to run it "
                      "without a terminal", file=sys.stderr)
                return EXIT_USAGE
            answer = input(f'Drop replication slot "{args.slot}"? Changes it still holds for '
                           f"its consumer are lost. [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                print("not dropped")
                return EXIT_REFUSED
        server = drop_slot(config, args.slot)
        print(f'dropped slot "{args.slot}" on {server}')
        return EXIT_OK
    except (LookupError, RuntimeError) as exc:
        print(f"lapidusctl: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except BackendError as exc:  # cannot connect: the backend, the reason and the fix
        print(f"lapidusctl: {exc.for_one_attempt()}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except Exception as exc:  # a query failed: say which and why, no traceback
        print(f"lapidusctl: {type(exc).__name__}: {str(exc).strip()}", file=sys.stderr)
        return EXIT_UNREACHABLE


def socket_path(args) -> str:
    if args.socket:
        return args.socket
    from .config import control_socket_for
    return str(control_socket_for(args.config))


def human_duration(seconds: Optional[float]) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"


def lag_text(row: dict) -> str:
    parts = []
    if row.get("lag_seconds") is not None:
        parts.append(f"{row['lag_seconds']:.1f}s")
    if row.get("lag_bytes") is not None:
        parts.append(f"{row['lag_bytes']}B")
    return " ".join(parts) or "-"


def sinks_text(sinks: Optional[dict]) -> str:
    """``nats up``, ``nats down 12s``: the sinks that report a connection state."""
    parts = []
    for name, state in (sinks or {}).items():
        if state.get("connected"):
            parts.append(f"{name} up")
        elif state.get("error"):
            parts.append(f"{name} ?")
        else:
            down = state.get("down_seconds")
            parts.append(f"{name} down" + (f" {human_duration(down)}" if down else ""))
    return ", ".join(parts) or "-"


def error_text(row: dict) -> str:
    """The last column: an event a sink refuses, a failing sink, what the backend waits for,
    or its last error."""
    error = row.get("last_error") or ""
    for sink, held in (row.get("undeliverable") or {}).items():
        return (f"held: {sink} refuses {held.get('id')} ({held.get('table')}, "
                f"{human_bytes(held.get('size'))}): {held.get('error')}"
                + (f"; fix: {held['fix']}" if held.get("fix") else ""))
    if row.get("sink_error"):
        return row["sink_error"]
    if row.get("state") == "WAITING" and row.get("waiting_for"):
        waiting = (f"waiting for {row['waiting_for']} since "
                   f"{human_duration(row.get('waiting_seconds'))}")
        return f"{waiting}: {error}" if error else waiting
    return error or "-"


def select_backends(rows: List[dict], names: Optional[List[str]],
                    states: Optional[List[str]]) -> List[dict]:
    """The rows whose name matches one of ``names`` (globs) and whose state is in ``states``
    (each filter only when given)."""
    return [row for row in rows
            if (not names or any(fnmatch.fnmatchcase(row["name"], n) for n in names))
            and (not states or row.get("state") in states)]


def summary_line(rows: List[dict], total: Optional[int] = None) -> str:
    """``100 backends: 97 RUNNING, 2 WAITING, 1 FATAL`` (``, 3 shown`` when filtered)."""
    counts = collections.Counter(row.get("state") for row in rows)
    order = ("RUNNING", "STARTING", "WAITING", "BACKOFF", "STOPPING", "STOPPED", "FATAL")
    parts = [f"{counts[s]} {s}" for s in order if counts.get(s)]
    parts += [f"{n} {s}" for s, n in counts.items() if s not in order]
    text = f"{len(rows)} backend{'s' if len(rows) != 1 else ''}: {', '.join(parts) or '-'}"
    if total is not None and total != len(rows):
        text = f"{len(rows)} of {total} backends shown: {', '.join(parts) or '-'}"
    return text


def format_status(status: dict, total: Optional[int] = None) -> str:
    rows = [COLUMNS]
    for b in status.get("backends", []):
        rows.append((b["name"], b["state"], str(b.get("pid") or "-"),
                     human_duration(b.get("uptime")), str(b.get("restarts", 0)),
                     str(b.get("position") or "-"), lag_text(b),
                     f"{b.get('events_per_second', 0):.0f}", sinks_text(b.get("sinks")),
                     error_text(b)[:160]))
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS) - 1)]
    lines = []
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
    # below the table: a running snapshot's progress has no column of its own
    for b in status.get("backends", []):
        if (b.get("snapshot") or {}).get("state") == "running":
            lines.append(f"{b['name']}: {snapshot_text(b['snapshot'])}")
        queued = (b.get("backfills") or {}).get("queued")
        if queued:
            lines.append(f"{b['name']}: backfills queued: " +
                         ", ".join(f"{r['n']} {r['table']}"
                                   + (f" (for a {r['sink']} client)" if r.get("sink") else "")
                                   for r in queued))
    cluster = status.get("cluster")
    if cluster:
        elsewhere = sorted(f"{b['name']} ({b['owner']})" for b in status.get("backends", [])
                           if b.get("owner") and b["owner"] != cluster.get("node"))
        if elsewhere:
            lines.append(f"streamed by other nodes: {', '.join(elsewhere)} "
                         f"(lapidusctl cluster)")
    lines.append(summary_line(status.get("backends", []), total))
    return "\n".join(lines)


def snapshot_text(snapshot: dict) -> str:
    """``snapshot public.t 30000/~200000 rows (15%), 5210 rows/s, table 1 of 2``."""
    done, estimate = snapshot.get("table_rows", 0), snapshot.get("table_rows_estimated")
    of = f"/~{estimate} rows ({min(100, done * 100 // estimate)}%)" if estimate else " rows"
    what = "snapshot" if not snapshot.get("n") else f"backfill {snapshot['n']}"
    if snapshot.get("sink"):
        what += f" for a {snapshot['sink']} client"      # lapidus.sink_runs
    where = f" where {snapshot['where']}" if snapshot.get("where") else ""
    return (f"{what} {snapshot.get('table')}{where} {done}{of}, "
            f"{snapshot.get('rows_per_second', 0):.0f} rows/s, "
            f"table {snapshot.get('tables_done', 0) + 1} of {snapshot.get('tables')}")


def dead_letters_command(args) -> int:
    """``dead-letters BACKEND``: the file itself (no running lapidus needed); with
    ``--resend`` the supervisor hands them to the dispatcher."""
    from . import deadletters
    from .config import ConfigError, load_config
    if args.resend:
        return send_request(args, {"command": "resend_dead_letters", "backend": args.backend})
    try:
        # Only reads a file under state_dir: the operator's shell need not hold the secrets
        # (docs/configuration.md, "Variables that are not set").
        config = load_config(args.config, secrets_optional=True)
    except ConfigError as exc:
        print(f"lapidusctl: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        config.backend(args.backend)
    except KeyError as exc:
        print(f"lapidusctl: {exc.args[0]} in {config.source}", file=sys.stderr)
        return EXIT_REFUSED
    path = deadletters.path_for(config.state_dir, args.backend)
    rows = deadletters.entries(path)
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return EXIT_OK
    if not rows:
        print(f"no dead letters for {args.backend} ({path})")
        return EXIT_OK
    table = [("at", "id", "table", "size", "sink", "error")]
    for r in rows:
        name = f"{r['schema']}.{r['table']}" if r.get("schema") else (r.get("table") or "-")
        table.append((r["at"], r["id"], name, human_bytes(r["size"]), r["sink"], r["error"]))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]) - 1)]
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1])
    print(f"{len(rows)} event(s) in {path}; 'lapidusctl dead-letters {args.backend} --resend' "
          f"sends them again")
    return EXIT_OK


def send_request(args, message: dict) -> int:
    """One request to the running lapidus; prints what it did, or why not."""
    try:
        path = socket_path(args)
    except Exception as exc:  # ConfigError and friends: say it plainly
        print(f"lapidusctl: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        response = request(path, message)
    except ControlUnavailable as exc:
        print(f"lapidusctl: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    if not response.get("ok"):
        print(f"lapidusctl: {response.get('error', 'refused')}", file=sys.stderr)
        return EXIT_REFUSED
    if message["command"] == "status":
        total = len(response.get("backends", []))
        response["backends"] = select_backends(response.get("backends", []),
                                               args.names, args.state)
        if getattr(args, "json", False):
            response["time"] = time.time()
            print(json.dumps(response, indent=2, default=str))
        else:
            print(format_status(response, total))
    else:
        done = next((v for k, v in response.items() if k != "ok"), [])
        print(f"{args.command}: {', '.join(done) if done else 'nothing to do'}")
    return EXIT_OK


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in ("slots", "drop-slot"):
        return slots_command(args)
    if args.command == "dead-letters":
        return dead_letters_command(args)
    if args.command == "install-ddl-capture":
        return ctl_ddl.install_ddl_capture_command(args)
    if args.command == "backfill":
        return ctl_backfill.backfill_command(args, socket_path)
    if args.command == "cluster":
        return ctl_cluster.cluster_command(args, socket_path)
    message = {"command": args.command}
    if args.command != "status":
        message["backend"] = getattr(args, "backend", None)
    return send_request(args, message)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
