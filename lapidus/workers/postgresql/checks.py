"""Start-up checks and slot management for a PostgreSQL backend.

Runs in the PostgreSQL worker process, before pg_recvlogical starts.  Every failure is a
:class:`BackendError` that names the thing, the reason and the fix; problems that retrying
cannot solve are ``fatal`` so the supervisor does not restart the worker in a loop.
"""

from __future__ import annotations

import time
from typing import List, Optional

import psycopg2

from ..base import RECOVER_LOST_POSITION, BackendError


def _one(conn, sql: str, args=()):
    with conn.cursor() as cur:
        cur.execute(sql, args)
        return cur.fetchone()


def check_server(conn, backend: str, plugin: str) -> None:
    """wal_level, the role's REPLICATION attribute, and whether ``plugin`` may be used."""
    (wal_level,) = _one(conn, "SHOW wal_level")
    if wal_level != "logical":
        raise BackendError(
            f'backend "{backend}": wal_level is {wal_level}; logical decoding needs '
            f"wal_level = logical: run ALTER SYSTEM SET wal_level = logical; and restart "
            f"PostgreSQL (scripts/setup-local does this for a local server)", fatal=True)
    user, can_replicate = _one(
        conn, "SELECT current_user, rolreplication OR rolsuper FROM pg_roles "
              "WHERE rolname = current_user")
    if not can_replicate:
        raise BackendError(
            f'backend "{backend}": role "{user}" lacks the REPLICATION attribute; '
            f"run ALTER ROLE {user} REPLICATION; as a superuser", fatal=True)
    allowed = allowed_output_plugins(conn)
    if allowed is not None and plugin not in allowed:
        raise BackendError(
            f'backend "{backend}": this server does not allow the output plugin {plugin} '
            f"(output_plugin_libraries = '{_plugin_setting(conn)}'); run ALTER SYSTEM SET "
            f"output_plugin_libraries = {_plugin_list_sql(allowed, [plugin])}; "
            f"SELECT pg_reload_conf(); (the value is a list: each name quoted on its own)",
            fatal=True)


# -- choosing the decoder -------------------------------------------------------------------

DECODERS = ("pgoutput", "wal2json")
# What the ALTER SYSTEM line in error messages lists first: every plugin Lapidus can use.
STANDARD_PLUGINS = ("pgoutput", "test_decoding", "wal2json")


def parse_identifier_list(text: str) -> List[str]:
    """A list setting as PostgreSQL reads it: comma-separated, names optionally in double
    quotes (``""`` inside is one quote), unquoted names lowercased.

    ``"pgoutput, wal2json"`` (what ALTER SYSTEM makes of one quoted string) is ONE name.
    """
    names: List[str] = []
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i].isspace():
            i += 1
        if i >= n:
            break
        if text[i] == '"':
            i += 1
            chars = []
            while i < n:
                if text[i] == '"':
                    if i + 1 < n and text[i + 1] == '"':
                        chars.append('"')
                        i += 2
                        continue
                    i += 1
                    break
                chars.append(text[i])
                i += 1
            name = "".join(chars)
        else:
            start = i
            while i < n and text[i] != "," and not text[i].isspace():
                i += 1
            name = text[start:i].lower()
        while i < n and text[i].isspace():
            i += 1
        if i < n and text[i] == ",":
            i += 1
        if name:
            names.append(name)
    return names


def _plugin_setting(conn) -> Optional[str]:
    row = _one(conn, "SELECT setting FROM pg_settings WHERE name = 'output_plugin_libraries'")
    return None if row is None else (row[0] or "")


def allowed_output_plugins(conn) -> Optional[List[str]]:
    """The plugins ``output_plugin_libraries`` allows; None when the server has no such
    setting (it then allows every installed plugin)."""
    setting = _plugin_setting(conn)
    return None if setting is None else parse_identifier_list(setting)


def _plugin_list_sql(allowed: List[str], wanted) -> str:
    """``'pgoutput', 'test_decoding', 'wal2json'``: the list to set, each name its own literal,
    keeping plugins already allowed for other consumers."""
    # A name with a comma or a space inside is the bogus single entry that one quoted string
    # makes: leave it out.
    kept = [name for name in allowed if "," not in name and " " not in name]
    names = dict.fromkeys(list(STANDARD_PLUGINS) + list(wanted) + kept)
    return ", ".join("'" + name.replace("'", "''") + "'" for name in names)


def choose_decoder(conn, *, backend: str, slot: str, configured: str) -> str:
    """The decoder a backend uses: ``configured`` unless it is ``auto``.

    ``auto``: an existing slot's plugin (a running installation keeps its decoder), else
    pgoutput when the server allows it (the default), else wal2json; a server that allows
    neither is a fatal error naming the ALTER SYSTEM line that fixes it.
    """
    if configured != "auto":
        return configured
    info = slot_info(conn, slot)
    if info is not None:
        if info["plugin"] in DECODERS:
            return info["plugin"]
        raise BackendError(
            f'backend "{backend}": slot "{slot}" was created for the {info["plugin"]} plugin, '
            f"which Lapidus cannot decode (it reads {' and '.join(DECODERS)}); use another slot "
            f"name, or drop the slot with SELECT pg_drop_replication_slot('{slot}');",
            fatal=True)
    allowed = allowed_output_plugins(conn)
    if getattr(conn, "server_version", 150000) < 100000:
        return "wal2json"           # pgoutput came with PostgreSQL 10
    if allowed is None or "pgoutput" in allowed:
        return "pgoutput"
    if "wal2json" in allowed:
        return "wal2json"
    raise BackendError(
        f'backend "{backend}": this server allows neither pgoutput nor wal2json as output '
        f"plugin (output_plugin_libraries = '{_plugin_setting(conn)}'); run ALTER SYSTEM SET "
        f"output_plugin_libraries = {_plugin_list_sql(allowed, ())}; SELECT pg_reload_conf(); "
        f"(the value is a list: each name quoted on its own)", fatal=True)


def check_encoding(conn, backend: str, database: str) -> None:
    """pgoutput sends text in the database's encoding, and the decoder reads it as UTF-8.

    SQL_ASCII passes: it declares no encoding, and such databases usually hold UTF-8.
    """
    (encoding,) = _one(conn, "SHOW server_encoding")
    if encoding not in ("UTF8", "SQL_ASCII"):
        raise BackendError(
            f'backend "{backend}": database "{database}" is encoded in {encoding}, and the '
            f"pgoutput decoder reads text as UTF-8 (logical decoding sends text unconverted); "
            f"stream a UTF8 database (CREATE DATABASE ... ENCODING 'UTF8', then move the "
            f"data)", fatal=True)


def slot_info(conn, slot: str) -> Optional[dict]:
    row = _one(conn, "SELECT plugin, database, active, active_pid, wal_status, "
                     "confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
               (slot,))
    if row is None:
        return None
    keys = ("plugin", "database", "active", "active_pid", "wal_status", "confirmed_flush_lsn")
    return dict(zip(keys, row))


def ensure_slot(conn, *, backend: str, slot: str, plugin: str, database: str,
                has_checkpoint: bool, checkpoint_path: str, wait_active: float = 10.0,
                take_over=None) -> bool:
    """Make sure ``slot`` exists for ``plugin`` on ``database`` and nobody else streams it.

    Returns True when the slot was created now.  A missing slot while a checkpoint exists means
    the server dropped our position: that is an error, never a silent restart from "now".

    ``take_over`` (cluster mode, where this node holds the backend's lease): a slot still
    active after ``TAKEOVER_GRACE`` seconds is held by a walsender of the previous owner
    (whose host died or froze: the server keeps the connection until TCP gives up); that
    walsender is terminated (``take_over(pid)`` is told first) instead of waiting.
    """
    info = slot_info(conn, slot)
    if info is None:
        if has_checkpoint:
            raise BackendError(
                f'backend "{backend}": replication slot "{slot}" no longer exists, but Lapidus '
                f"has a position for it ({checkpoint_path}): changes made since then are gone "
                f"from the server; {RECOVER_LOST_POSITION}", fatal=True)
        create_slot(conn, backend=backend, slot=slot, plugin=plugin)
        return True
    if info["plugin"] != plugin:
        raise BackendError(
            f'backend "{backend}": slot "{slot}" was created for the {info["plugin"]} plugin, '
            f"but this backend decodes with {plugin}; set decoder = \"{info['plugin']}\", or "
            f"use another slot name, or drop the slot with "
            f"SELECT pg_drop_replication_slot('{slot}');", fatal=True)
    if info["database"] != database:
        raise BackendError(
            f'backend "{backend}": slot "{slot}" belongs to database "{info["database"]}", not '
            f'"{database}"; use another slot name', fatal=True)
    if info["wal_status"] == "lost":
        raise BackendError(
            f'backend "{backend}": slot "{slot}" is lost: the server removed WAL it still '
            f"needed (max_slot_wal_keep_size). Changes since its position are gone. Drop the "
            f"slot (SELECT pg_drop_replication_slot('{slot}');), then "
            f"{RECOVER_LOST_POSITION}", fatal=True)
    deadline = time.monotonic() + wait_active
    take_over_at = time.monotonic() + TAKEOVER_GRACE if take_over is not None else None
    while info and info["active"]:
        # A pg_recvlogical of ours that just died may hold the slot for a moment longer.
        if take_over_at is not None and time.monotonic() > take_over_at and info["active_pid"]:
            take_over(info["active_pid"])
            _one(conn, "SELECT pg_terminate_backend(%s)", (info["active_pid"],))
            take_over_at = None
            deadline = time.monotonic() + wait_active
        if time.monotonic() > deadline:
            raise BackendError(
                f'backend "{backend}": slot "{slot}" is in use by server process '
                f"{info['active_pid']}; another Lapidus (or pg_recvlogical) is streaming it. "
                f"Stop it, or give this backend its own slot (retrying)")
        time.sleep(0.2)
        info = slot_info(conn, slot)
    return False


#: seconds a slot may stay active for another server process before a cluster node that holds
#: the backend's lease terminates that process (docs/cluster.md)
TAKEOVER_GRACE = 5.0


def create_slot(conn, *, backend: str, slot: str, plugin: str) -> None:
    try:
        # Creating a slot waits for the transactions running now to end: not bounded by the
        # statement_timeout of the worker's other queries (a stop still interrupts it).
        with conn.cursor() as cur:
            cur.execute("SET statement_timeout = 0")
            try:
                cur.execute("SELECT pg_create_logical_replication_slot(%s, %s)", (slot, plugin))
            finally:
                cur.execute("RESET statement_timeout")
    except psycopg2.OperationalError:
        raise                     # the connection broke: transient, judged by the caller
    except psycopg2.Error as exc:
        text = (exc.pgerror or str(exc)).strip()
        if "may not be used as an output plugin" in text:
            fix = ("run ALTER SYSTEM SET output_plugin_libraries = 'pgoutput', 'test_decoding', "
                   f"'{plugin}'; SELECT pg_reload_conf();")
        elif "could not access file" in text:
            fix = (f"install the {plugin} output plugin on the database server "
                   f"(Debian: apt-get install postgresql-<version>-{plugin})")
        elif "all replication slots are in use" in text:
            fix = "raise max_replication_slots (restart needed) or drop unused slots"
        else:
            fix = "see the server's message"
        raise BackendError(
            f'backend "{backend}": cannot create replication slot "{slot}" with {plugin}: '
            f"{text.splitlines()[0]}; {fix}", fatal=True) from None


def drop_slot(conn, slot: str, wait: float = 5.0) -> bool:
    """Drop ``slot`` once it is idle (temporary slots, ``lapidus demo``).  True if dropped.

    The walsender of a pg_recvlogical that just exited can keep the slot active for a moment.
    """
    deadline = time.monotonic() + wait
    while True:
        info = slot_info(conn, slot)
        if info is None:
            return False
        if not info["active"]:
            _one(conn, "SELECT pg_drop_replication_slot(%s)", (slot,))
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def retained_wal(conn, slot: str):
    """(bytes of WAL the server keeps for ``slot``, its wal_status) or (None, None)."""
    row = _one(conn, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint, "
                     "wal_status FROM pg_replication_slots WHERE slot_name = %s", (slot,))
    return (row[0], row[1]) if row else (None, None)
