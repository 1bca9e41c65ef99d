"""``python -m bench.chaos``: the long chaos run (see docs/dev/chaos.md).

    .venv/bin/python -m bench.chaos --minutes 10 --seed 1
    .venv/bin/python -m bench.chaos --minutes 3 --faults kill_worker_pg,cut_nats --settle
    .venv/bin/python -m bench.chaos --minutes 2 --faults stop_worker_pg --settle
    .venv/bin/python -m bench.chaos --cluster --minutes 3 --settle \
        --faults kill_node,kill_nats_server

Exit status 0 when nothing was lost, reordered or duplicated and Lapidus recovered from every
fault; 1 otherwise (the report says what, the work directory is kept); 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from .faults import CLUSTER_KINDS, default_kinds, refused
from .run import ChaosOptions, format_result, run_chaos


def parse(argv):
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0,
                        help="how long the load and the faults run (default 10)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the load and the faults")
    parser.add_argument("--rate", type=float, default=60.0,
                        help="transactions per second per backend (default 60)")
    parser.add_argument("--interval", type=float, default=4.0,
                        help="mean seconds between two faults (default 4)")
    parser.add_argument("--faults", default=None,
                        help=f"comma-separated fault kinds (default: every kind of the mode): "
                             f"{', '.join(default_kinds(False))}; with --cluster: "
                             f"{', '.join(default_kinds(True))}")
    parser.add_argument("--no-pg-restart", action="store_true",
                        help="leave out pg_restart (it cuts every session on the shared "
                             "PostgreSQL, other people's tests included)")
    parser.add_argument("--per-kind", type=int, default=None,
                        help="stop after this many faults of each kind (the run lasts at "
                             "least --minutes)")
    parser.add_argument("--settle", action="store_true",
                        help="after each fault wait until the stream caught up (measures "
                             "recovery; faults then never overlap a recovery)")
    parser.add_argument("--recovery-timeout", type=float, default=120.0,
                        help="with --settle: seconds to catch up after a fault (default 120)")
    parser.add_argument("--nats", choices=("private", "shared"), default="private",
                        help="a private nats-server of the run (default) or the shared one "
                             "on 127.0.0.1:4222")
    parser.add_argument("--duplicate-window", type=float, default=300.0,
                        help="seconds of JetStream duplicate detection (default 300)")
    parser.add_argument("--no-bystander", action="store_true",
                        help="no writer in another MariaDB database during the run")
    parser.add_argument("--heartbeat-timeout", type=float, default=3.0,
                        help="with a stop_* kind: the supervisor's heartbeat_timeout (default "
                             "3; freezes last 0.3-0.7 or 1.3-2 times as long)")
    parser.add_argument("--max-payload", type=int, default=32 * 1024,
                        help="with dead_letter: the private nats-server's max_payload in bytes "
                             "(default 32768; the oversized row has 40,000 bytes of pad)")
    parser.add_argument("--final-timeout", type=float, default=300.0,
                        help="seconds to wait after the load for the fences (default 300)")
    parser.add_argument("--workdir", help="directory for config, logs, ledger and report "
                                          "(default: a new temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--json", action="store_true", help="print the result as JSON too")
    parser.add_argument("--cluster", action="store_true",
                        help="cluster mode: several Lapidus nodes with [cluster] and a private "
                             f"three-server NATS cluster; fault kinds {', '.join(CLUSTER_KINDS)}")
    parser.add_argument("--nodes", type=int, default=2,
                        help="with --cluster: how many Lapidus nodes (default 2)")
    parser.add_argument("--lease-ttl", type=float, default=5.0,
                        help="with --cluster: the nodes' lease_ttl in seconds (default 5)")
    args = parser.parse_args(argv)
    kinds = (default_kinds(args.cluster) if args.faults is None
             else [k.strip() for k in args.faults.split(",") if k.strip()])
    problem = refused(kinds, args.cluster)
    if problem:
        parser.error(problem)
    if args.cluster and args.nats != "private":
        parser.error("--cluster runs its own NATS cluster: --nats shared makes no sense with it")
    if args.cluster and args.nodes < 2:
        parser.error("--cluster needs --nodes 2 or more (a takeover needs another node)")
    if "dead_letter" in kinds and args.nats != "private":
        parser.error("dead_letter needs --nats private (the run sets its max_payload)")
    if args.no_pg_restart:
        kinds = [k for k in kinds if k != "pg_restart"]
    return args, ChaosOptions(
        seconds=args.minutes * 60, seed=args.seed, rate=args.rate, kinds=kinds,
        per_kind=args.per_kind, interval=args.interval, settle=args.settle, nats=args.nats,
        duplicate_window=args.duplicate_window, workdir=args.workdir, keep=args.keep,
        bystander=not args.no_bystander, final_timeout=args.final_timeout,
        recovery_timeout=args.recovery_timeout, heartbeat_timeout=args.heartbeat_timeout,
        max_payload=args.max_payload, cluster=args.cluster, nodes=args.nodes,
        lease_ttl=args.lease_ttl)


def main(argv=None) -> int:
    args, options = parse(argv)

    def log(line: str) -> None:
        print(time.strftime("%H:%M:%S ") + line, flush=True)

    run = run_chaos(options, log)
    print(format_result(run.result, run.report), flush=True)
    if args.json:
        print(json.dumps(run.result, indent=2))
    return 0 if run.result.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
