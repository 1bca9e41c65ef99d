"""``lapidusctl cluster``: the nodes, leases, owners and hand-overs as this node sees them.

Runs in the lapidusctl process; asks the supervisor (command ``cluster``), which answers from
its lease child's latest report.  Exit codes: 0 shown, 1 this Lapidus runs alone (no
``[cluster]``), 2 usage, 3 no Lapidus answers.
"""

from __future__ import annotations

import json
import sys
from typing import List

from . import exitcodes
from .control import ControlUnavailable, request


def add_parser(sub) -> None:
    cmd = sub.add_parser("cluster", help="cluster mode: nodes, leases, owners, hand-overs")
    cmd.add_argument("--json", action="store_true", help="machine-readable output")


def cluster_command(args, socket_path) -> int:
    try:
        path = socket_path(args)
    except Exception as exc:  # ConfigError and friends: say it plainly
        print(f"lapidusctl: {exc}", file=sys.stderr)
        return exitcodes.USAGE
    try:
        response = request(path, {"command": "cluster"})
    except ControlUnavailable as exc:
        print(f"lapidusctl: {exc}", file=sys.stderr)
        return exitcodes.UNREACHABLE
    if not response.get("ok"):
        print(f"lapidusctl: {response.get('error', 'refused')}", file=sys.stderr)
        return exitcodes.REFUSED
    if args.json:
        print(json.dumps(response, indent=2, default=str))
    else:
        print(format_cluster(response))
    return exitcodes.OK


def _table(header: List[str], rows: List[List[str]]) -> List[str]:
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows)]
    return ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip()
            for row in [header, *rows]]


def format_cluster(view: dict) -> str:
    me = view.get("node")
    renewal = view.get("renewal_seconds")
    lines = [f"node {me}, bucket {view.get('bucket')}, lease_ttl {view.get('lease_ttl')}s, "
             f"{'connected' if view.get('connected') else 'NOT connected to NATS'}, last "
             f"renewal {'-' if renewal is None else f'{renewal * 1000:.1f}ms'}, "
             f"{view.get('renewal_failures', 0)} failed renewal round(s)", ""]
    nodes = [[n["node"] + (" (this node)" if n["node"] == me else ""),
              "live" if n.get("live") else "gone", str(n.get("backends", 0)),
              str(n.get("share", 0)), str(n.get("max_backends") or "-")]
             for n in view.get("nodes") or ()]
    lines += _table(["node", "state", "backends", "share", "max_backends"], nodes)
    lines.append("")
    leases = []
    running = set(view.get("running_here") or ())
    for lease in view.get("leases") or ():
        owner = lease.get("owner")
        if owner is None:
            state = "free"
        elif lease.get("expired"):
            state = "expired"
        elif lease.get("handover"):
            state = "handing over"
        else:
            state = "held"
        leases.append([lease["backend"], owner or "-", state,
                       str(lease.get("epoch") or "-"), f"{lease.get('age', 0):.1f}s"
                       if owner else "-",
                       "yes" if lease["backend"] in running else "no"])
    lines += _table(["backend", "owner", "lease", "epoch", "renewed", "streams here"], leases)
    return "\n".join(lines)
