"""``lapidusctl install-ddl-capture BACKEND``: PostgreSQL schema changes as schema events.

Runs in the lapidusctl process and talks to the backend's database directly (not to the
running Lapidus): it installs the event triggers of :mod:`lapidus.workers.postgresql.ddl`.
``--print`` only prints the SQL (for a DBA; needs neither the database nor its password),
``--uninstall`` removes them.  Exit codes: 0 done, 1 the server refused (event triggers need a
superuser), 2 usage or configuration (unknown backend, not PostgreSQL).
"""

from __future__ import annotations

import sys

from . import exitcodes


def add_parser(sub) -> None:
    cmd = sub.add_parser("install-ddl-capture",
                         help="emit PostgreSQL schema changes as schema events, in commit order "
                              "(event triggers; docs/postgresql.md)")
    cmd.add_argument("backend")
    what = cmd.add_mutually_exclusive_group()
    what.add_argument("--print", action="store_true", dest="print_sql",
                      help="print the SQL for a DBA instead of running it")
    what.add_argument("--uninstall", action="store_true", help="remove the event triggers")


def install_ddl_capture_command(args) -> int:
    from .config import ConfigError, load_config
    from .workers.postgresql.ddl import install_sql, uninstall_sql
    try:
        # the SQL alone needs no password
        config = load_config(args.config, secrets_optional=args.print_sql)
    except ConfigError as exc:
        print(f"lapidusctl: {exc}", file=sys.stderr)
        return exitcodes.USAGE
    backend = next((b for b in config.backends if b.name == args.backend), None)
    if backend is None:
        names = ", ".join(b.name for b in config.backends)
        print(f'lapidusctl: unknown backend "{args.backend}" (configured: {names})',
              file=sys.stderr)
        return exitcodes.USAGE
    if backend.type != "postgresql":
        print(f'lapidusctl: backend "{backend.name}" is {backend.type}: the DDL capture is for '
              f"PostgreSQL (MySQL/MariaDB stream DDL from the binlog, MongoDB from its change "
              f"stream, without installing anything)", file=sys.stderr)
        return exitcodes.USAGE
    sql = uninstall_sql() if args.uninstall else install_sql()
    if args.print_sql:
        print(sql, end="")
        return exitcodes.OK
    return _run(backend, sql, args.uninstall)


def _run(backend, sql: str, uninstall: bool) -> int:
    import psycopg2

    from .workers.base import BackendError
    from .workers.postgresql.catalog import connect
    database = backend.options.get("database")
    try:
        conn = connect(backend.options, backend.name, "lapidusctl")
    except BackendError as exc:
        print(f"lapidusctl: {exc.for_one_attempt()}", file=sys.stderr)
        return exitcodes.REFUSED
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
    except psycopg2.Error as exc:
        text = (exc.pgerror or str(exc)).strip().splitlines()[0]
        hint = ""
        if exc.pgcode == "42501":
            hint = ("; event triggers need a superuser: have one run "
                    f"'lapidusctl install-ddl-capture {backend.name} --print' in database "
                    f'"{database}"')
        print(f'lapidusctl: could not {"remove" if uninstall else "install"} the DDL capture '
              f'in database "{database}": {text}{hint}', file=sys.stderr)
        return exitcodes.REFUSED
    finally:
        conn.close()
    done = "removed from" if uninstall else "installed in"
    print(f'DDL capture {done} database "{database}" (backend {backend.name})')
    return exitcodes.OK
