"""PostgreSQL failures phrased for the operator, and whether retrying can cure them.

Runs in the PostgreSQL worker process.  Three sources of failure, one judgement: what libpq
says when a connection fails (:func:`connection_error`), a psycopg2 error from one of the
worker's own queries (:func:`query_error`), and the last words of a ``pg_recvlogical`` that
exited (:func:`child_error`).  ``fatal`` only for what no retry can cure (credentials, a role
or database that does not exist, pg_hba.conf, missing privilege); everything else (refused,
timed out, too many connections, starting up, shutting down, connection lost) is transient:
the worker waits and reconnects (:mod:`lapidus.workers.waiting`).
"""

from __future__ import annotations

import re
from typing import Optional

from ..base import RECOVER_LOST_POSITION, RETRYING, BackendError

_ROLE_MISSING = re.compile(r'role "([^"]*)" does not exist')
_DATABASE_MISSING = re.compile(r'database "([^"]*)" does not exist')
_SLOT_MISSING = re.compile(r'replication slot "([^"]*)" does not exist')

# SQLSTATE classes a retry cannot cure: authorization (28), invalid catalog name (3D),
# syntax or access rule violation (42: a missing privilege, an object that is not there).
_FATAL_SQLSTATE_CLASSES = ("28", "3D", "42")


def _where(options: dict) -> str:
    return f'{options.get("host", "127.0.0.1")}:{options.get("port", 5432)}'


def _fatal_reason(text: str, options: dict, backend: str) -> Optional[str]:
    """The operator's message when ``text`` (a libpq or server message) is incurable."""
    where = _where(options)
    user = options.get("user", "postgres")
    lowered = text.lower()
    role = _ROLE_MISSING.search(text)
    if role:
        return (f'backend "{backend}": PostgreSQL at {where} has no role "{role.group(1)}"; '
                f"create it (CREATE ROLE {role.group(1)} LOGIN REPLICATION PASSWORD '...';) "
                f"or fix the backend's user")
    database = _DATABASE_MISSING.search(text)
    if database:
        return (f'backend "{backend}": database "{database.group(1)}" does not exist on '
                f"{where}; create it or fix the backend's database setting")
    if "password authentication failed" in lowered or "no password supplied" in lowered \
            or "authentication failed" in lowered or "password is required" in lowered:
        return (f'backend "{backend}": PostgreSQL at {where} rejected user "{user}": wrong or '
                f"missing password; set the backend's password (or passfile) to the role's "
                f"password")
    if "no pg_hba.conf entry" in lowered:
        return (f'backend "{backend}": {where} does not allow user "{user}" to connect '
                f"(pg_hba.conf); add a host line for it, including a 'replication' line")
    if "permission denied" in lowered or "must be superuser or replication role" in lowered \
            or "must have replication" in lowered:
        return (f'backend "{backend}": user "{user}" lacks a privilege at {where} '
                f"({_first_line(text)}); ALTER ROLE {user} REPLICATION; and grant what the "
                f"message names")
    tls = _tls_reason(text, lowered, options, backend)
    if tls:
        return tls
    if "invalid connection option" in lowered or "invalid sslmode" in lowered:
        return (f'backend "{backend}": the connection settings for {where} are wrong '
                f"({_first_line(text)}); fix host, port or the ssl options")
    return None


def _tls_reason(text: str, lowered: str, options: dict, backend: str) -> Optional[str]:
    """The operator's message for a TLS failure; all are fatal (the server's certificate or
    TLS configuration does not change by retrying)."""
    who, where = f'backend "{backend}"', _where(options)
    line = _tls_line(text)
    if "ssl was required" in lowered or "server does not support ssl" in lowered:
        return (f"{who}: PostgreSQL at {where} does not offer TLS, which sslmode="
                f"{options.get('sslmode', '?')} requires; turn ssl on in the server's "
                f"configuration (ssl = on, ssl_cert_file, ssl_key_file) or lower sslmode")
    if "certificate verify failed" in lowered:
        return (f"{who}: the TLS certificate of PostgreSQL at {where} is not trusted "
                f"({line}); set sslrootcert to the CA that signed the server's certificate "
                f"(SHOW ssl_cert_file on the server names its file)")
    if "does not match host name" in lowered:
        return (f"{who}: the TLS certificate of PostgreSQL at {where} is for another host "
                f"({line}); connect with the host name the certificate names, or use "
                f'sslmode = "verify-ca" to check the chain only')
    if "private key file" in lowered or "certificate file" in lowered \
            or "certificate present, but not private key" in lowered:
        return (f"{who}: libpq cannot use the TLS files ({line}); fix sslcert/sslkey/"
                f"sslrootcert (the key must be mode 0600, or 0640 owned by root)")
    if "requires a valid client certificate" in lowered or "certificate authentication" in lowered:
        return (f"{who}: PostgreSQL at {where} wants a client certificate ({line}); set "
                f"sslcert and sslkey to a certificate its ssl_ca_file trusts")
    return None


def _tls_line(text: str) -> str:
    """The line of a libpq message that names the TLS problem, without libpq's "connection to
    server at ... failed:" (the message says where already)."""
    for line in text.splitlines():
        if any(w in line.lower() for w in ("ssl", "certificate", "key file")):
            head, sep, rest = line.partition(" failed: ")
            return (rest if sep and head.startswith("connection to server") else line).strip()
    return _first_line(text)


def _first_line(text: str) -> str:
    text = text.strip()
    return text.splitlines()[0].strip() if text else "no message"


def _transient_hint(lowered: str) -> str:
    if "too many connections" in lowered or "connection slots are reserved" in lowered:
        return "the server refuses more connections; free some or raise max_connections"
    if "starting up" in lowered or "shutting down" in lowered or "in recovery" in lowered \
            or "not yet accepting connections" in lowered:
        return "the server is starting or stopping; it is retried until it accepts"
    if "could not translate host name" in lowered:
        return "check the backend's host name and DNS"
    return "check that the server runs and the host and port are right"


def connection_error(exc: BaseException, options: dict, backend: str) -> BackendError:
    """Why a connection attempt failed: fatal, or transient ("cannot reach ...")."""
    text = str(exc).strip()
    fatal = _fatal_reason(text, options, backend)
    if fatal:
        return BackendError(fatal, fatal=True)
    first = _first_line(text) if text else type(exc).__name__
    return BackendError(
        f'backend "{backend}": cannot reach PostgreSQL at {_where(options)}: {first}; '
        f"{_transient_hint(text.lower())}{RETRYING}")


def query_error(exc: BaseException, options: dict, backend: str, doing: str) -> BackendError:
    """A psycopg2 error from the worker's own query while ``doing`` something."""
    text = (getattr(exc, "pgerror", None) or str(exc)).strip()
    code = getattr(exc, "pgcode", None) or ""
    fatal = _fatal_reason(text, options, backend)
    if fatal is None and code[:2] in _FATAL_SQLSTATE_CLASSES:
        fatal = (f'backend "{backend}": PostgreSQL at {_where(options)} refused a query while '
                 f"{doing}: {_first_line(text)} (SQLSTATE {code}); fix what the message names")
    if fatal:
        return BackendError(fatal, fatal=True)
    if code == "57014":
        reason = "the query timed out (statement_timeout): the server is overloaded or hung"
    else:
        reason = _first_line(text) if text else type(exc).__name__
    return BackendError(
        f'backend "{backend}": lost the connection to PostgreSQL at {_where(options)} while '
        f"{doing}: {reason}; {_transient_hint(text.lower())} (reconnecting)")


def child_error(errors: str, options: dict, backend: str,
                program: str = "pg_recvlogical") -> BackendError:
    """A pg_recvlogical (or, in cluster mode, ``program`` lapidus-walstream) that exited,
    judged by the tail of its log (``errors``)."""
    lines = [line.strip() for line in errors.splitlines() if line.strip()]
    slot = _SLOT_MISSING.search(errors)
    if slot:
        return BackendError(
            f'backend "{backend}": {program} failed: replication slot "{slot.group(1)}" '
            f"does not exist (dropped while Lapidus streamed); changes since the checkpoint "
            f"are gone from the server: {RECOVER_LOST_POSITION}", fatal=True)
    for marker in ("may not be used as an output plugin", "could not access file"):
        for line in reversed(lines):
            if marker in line:
                return BackendError(f'backend "{backend}": {program} failed: {line}',
                                    fatal=True)
    fatal = _fatal_reason(errors, options, backend)
    if fatal:
        return BackendError(fatal, fatal=True)
    # The last line is often only "disconnected"; the reason is on the line before.
    reason = next((line for line in reversed(lines)
                   if "error:" in line.lower() and "disconnected" not in line.lower()),
                  lines[-1] if lines else "exited without a message")
    return BackendError(
        f'backend "{backend}": {program} lost its connection to PostgreSQL at '
        f"{_where(options)}: {reason}; {_transient_hint(errors.lower())} (reconnecting from "
        f"the last confirmed position)")
