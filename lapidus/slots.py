"""Replication slots of the configured PostgreSQL servers, for ``lapidusctl slots``/``drop-slot``.

Runs in the short-lived ``lapidusctl`` process; talks to the databases directly (not through
the supervisor), so it also works while Lapidus is stopped, which is when abandoned slots matter.
A slot counts as Lapidus's when a configured backend uses it, or when its name starts with
``lapidus_`` (the default naming): the latter, unused by any backend, are reported as abandoned.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from .workers.base import BackendError

SLOT_QUERY = (
    "SELECT slot_name, plugin, database, active, active_pid, wal_status, "
    "pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint, "
    "pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint "
    "FROM pg_replication_slots WHERE slot_type = 'logical' ORDER BY slot_name")


def _server_key(options: dict) -> Tuple[str, int]:
    return (options.get("host") or "127.0.0.1", int(options.get("port") or 5432))


def _connect(backend: str, options: dict):
    """The worker's own connection (:func:`lapidus.workers.postgresql.catalog.connect`): the
    backend's TLS settings and password file apply (a ``sslmode = "verify-full"`` backend is
    never listed over a plain connection), and a failure is a
    :class:`~lapidus.workers.base.BackendError` naming the backend and the fix."""
    from .workers.postgresql.catalog import connect
    return connect(options, backend, "lapidusctl")


def servers(config) -> Dict[Tuple[str, int], Tuple[str, dict]]:
    """The first backend's name and options per PostgreSQL server (host, port), to connect
    with."""
    out: Dict[Tuple[str, int], Tuple[str, dict]] = {}
    for backend in config.backends:
        if backend.type == "postgresql":
            out.setdefault(_server_key(backend.options), (backend.name, backend.options))
    return out


def list_slots(config, unreachable: Optional[List["BackendError"]] = None) -> List[dict]:
    """Lapidus's slots on every configured PostgreSQL server, with their retained WAL.

    A server that cannot be reached raises its :class:`~lapidus.workers.base.BackendError`;
    with ``unreachable`` (a list), the error is added to it instead and the other servers are
    still listed."""
    used = {(_server_key(b.options), b.options.get("slot")): b.name
            for b in config.backends if b.type == "postgresql"}
    rows = []
    for key, (backend_name, options) in servers(config).items():
        try:
            conn = _connect(backend_name, options)
        except BackendError as exc:
            if unreachable is None:
                raise
            unreachable.append(exc)
            continue
        try:
            with conn.cursor() as cur:
                cur.execute(SLOT_QUERY)
                found = cur.fetchall()
        finally:
            conn.close()
        for (name, plugin, database, active, pid, wal_status, retained, unconfirmed) in found:
            backend = used.get((key, name))
            if backend is None and not name.startswith("lapidus_"):
                continue    # somebody else's slot
            rows.append({"server": f"{key[0]}:{key[1]}", "slot": name, "backend": backend,
                         "abandoned": backend is None, "plugin": plugin, "database": database,
                         "active": active, "active_pid": pid, "wal_status": wal_status,
                         "retained_wal_bytes": retained, "unconfirmed_bytes": unconfirmed})
    return rows


def drop_slot(config, name: str) -> str:
    """Drop slot ``name``; refuses an active slot.  Returns the server it was dropped on.
    A slot found on a server that answers is dropped even when another server does not."""
    unreachable: List[BackendError] = []
    for row in list_slots(config, unreachable):
        if row["slot"] != name:
            continue
        if row["active"]:
            raise RuntimeError(
                f'slot "{name}" on {row["server"]} is in use by server process '
                f'{row["active_pid"]}; stop the Lapidus (or backend) streaming it first')
        backend_name, options = next(v for k, v in servers(config).items()
                                     if f"{k[0]}:{k[1]}" == row["server"])
        conn = _connect(backend_name, options)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT pg_drop_replication_slot(%s)", (name,))
        finally:
            conn.close()
        return row["server"]
    if unreachable:
        raise unreachable[0]      # it may be there: say why it could not be looked at
    raise LookupError(f'no Lapidus slot named "{name}" on the configured PostgreSQL servers '
                      f"(see lapidusctl slots)")
