"""The ``lapidus`` command.

Runs in the supervisor process, before anything is forked.  Exit codes (CONFIG.md): 0 success,
1 runtime failure, 2 invalid configuration or usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional

from . import __version__, exitcodes, logs
from .config import ConfigError, check_preflight, load_config
from .sinks import registry

EXIT_OK, EXIT_RUNTIME, EXIT_USAGE = exitcodes.OK, exitcodes.RUNTIME, exitcodes.USAGE
DEMO_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lapidus",
        description="Stream every insert, update and delete from PostgreSQL, MySQL/MariaDB and "
                    "MongoDB to NATS, stdout and other sinks.",
        epilog="Commands: 'lapidus demo' streams a demo table of the local PostgreSQL to stdout.")
    parser.add_argument("command", nargs="?", choices=["run", "demo"], default="run",
                        help="run (default) or demo")
    parser.add_argument("-c", "--config", metavar="PATH",
                        help="configuration file (default: ./lapidus.toml, then ./lapidus.json)")
    parser.add_argument("-t", "--test", action="store_true",
                        help="check the configuration, print what would run, and exit (0 or 2)")
    parser.add_argument("--stdout", action="store_true",
                        help="also write every event to standard output as JSON lines")
    parser.add_argument("--version", action="version", version=f"lapidus {__version__}")
    demo = parser.add_argument_group("demo options")
    demo.add_argument("--dsn", default=None,
                      help="libpq connection string of the PostgreSQL to use for the demo "
                           f"(default: '{DEMO_DSN}')")
    return parser


def load(path: Optional[str], add_stdout: bool, *, checking: bool = False):
    """Load and validate, with plugin options checked by the plugins themselves, then check
    the result against this machine (state_dir, [http] listen).  ``checking`` (``-t``): an
    unset variable used only in a secret is a warning, not a problem, and the certificate and
    key files the backends and the cluster name must exist."""
    config = load_config(path, plugin_validators=registry.validators(),
                         secrets_optional=checking)
    check_preflight(config, files=checking)
    if add_stdout:
        config = config.with_plugin("stdout", {})
    return config


def usage_mismatch(args) -> Optional[str]:
    """Options the command would silently ignore: said instead (exit 2)."""
    if args.command == "demo":
        given = [name for name, on in (("-c", args.config), ("-t", args.test),
                                       ("--stdout", args.stdout)) if on]
        if given:
            return (f"'lapidus demo' takes no {' or '.join(given)}: it makes its own "
                    f"configuration and writes to standard output; give only --dsn")
    elif args.dsn is not None:
        return ("--dsn is for 'lapidus demo'; the daemon reads its databases from the "
                "configuration file (-c), where a backend names host, port, user and database")
    return None


def print_problems(error: ConfigError) -> None:
    print(f"lapidus: invalid configuration ({len(error.problems)} "
          f"problem{'s' if len(error.problems) != 1 else ''}):", file=sys.stderr)
    for problem in error.problems:
        print(f"  - {problem}", file=sys.stderr)


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    mismatch = usage_mismatch(args)
    if mismatch:
        print(f"lapidus: {mismatch}", file=sys.stderr)
        return EXIT_USAGE
    if args.command == "demo":
        from .demo import run_demo
        return run_demo(args.dsn or DEMO_DSN)
    try:
        config = load(args.config, args.stdout, checking=args.test)
    except ConfigError as exc:
        print_problems(exc)
        return EXIT_USAGE
    if args.test:
        print(json.dumps(config.redacted(), indent=2, default=str))
        for warning in config.warnings:
            print(f"lapidus: warning: {warning}", file=sys.stderr)
        print(f"lapidus: configuration {config.source} is valid "
              f"({len(config.backends)} backend(s))", file=sys.stderr)
        return EXIT_OK
    logs.configure(config.log.format, config.log.level, process="supervisor")
    from .supervisor.arbiter import AlreadyRunning, Arbiter, StartFailed
    try:
        return Arbiter(config).run()
    except (AlreadyRunning, StartFailed) as exc:
        print(f"lapidus: {exc}", file=sys.stderr)
        return EXIT_RUNTIME


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
