"""The ``lapidusctl`` command: look at and steer a running Lapidus through its control socket.

Runs in its own short-lived process; never imports the supervisor.  Exit codes: 0 success,
1 the supervisor refused the command (unknown backend ...), 2 usage or configuration error,
3 the control socket is absent or refuses.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import List, Optional

from .control import ControlUnavailable, request

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3

COLUMNS = ("backend", "state", "pid", "uptime", "restarts", "position", "lag", "events/s",
           "last error")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lapidusctl",
                                     description="Inspect and control a running lapidus.")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("-c", "--config", metavar="PATH",
                       help="configuration file of the lapidus to talk to (its control.socket)")
    where.add_argument("--socket", metavar="PATH", help="control socket path")
    sub = parser.add_subparsers(dest="command", required=True)
    status = sub.add_parser("status", help="state of every backend")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    restart = sub.add_parser("restart", help="restart one backend, or all")
    restart.add_argument("backend", nargs="?")
    for name in ("stop", "start"):
        cmd = sub.add_parser(name, help=f"{name} one backend")
        cmd.add_argument("backend")
    return parser


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


def format_status(status: dict) -> str:
    rows = [COLUMNS]
    for b in status.get("backends", []):
        rows.append((b["name"], b["state"], str(b.get("pid") or "-"),
                     human_duration(b.get("uptime")), str(b.get("restarts", 0)),
                     str(b.get("position") or "-"), lag_text(b),
                     f"{b.get('events_per_second', 0):.0f}", (b.get("last_error") or "-")[:120]))
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS) - 1)]
    lines = []
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        path = socket_path(args)
    except Exception as exc:  # ConfigError and friends: say it plainly
        print(f"lapidusctl: {exc}", file=sys.stderr)
        return EXIT_USAGE
    message = {"command": args.command}
    if args.command != "status":
        message["backend"] = getattr(args, "backend", None)
    try:
        response = request(path, message)
    except ControlUnavailable as exc:
        print(f"lapidusctl: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    if not response.get("ok"):
        print(f"lapidusctl: {response.get('error', 'refused')}", file=sys.stderr)
        return EXIT_REFUSED
    if args.command == "status":
        if args.json:
            response["time"] = time.time()
            print(json.dumps(response, indent=2, default=str))
        else:
            print(format_status(response))
    else:
        done = next((v for k, v in response.items() if k != "ok"), [])
        print(f"{args.command}: {', '.join(done) if done else 'nothing to do'}")
    return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
