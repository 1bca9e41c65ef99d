"""The fixed names: backend types, built-in plugins, the plugin option aliases, the rules for
backend names, slot names and MySQL server ids, and the slot, publication and server id a
backend name yields when they are not configured."""

from __future__ import annotations

import hashlib
import re
import socket
from typing import Dict, Optional, Tuple

BACKEND_TYPES: Tuple[str, ...] = ("postgresql", "mysql", "mongo")
BUILTIN_PLUGINS: Tuple[str, ...] = ("stdout", "nats", "exec")

#: Original Lapidus spellings accepted inside any plugin's options table.
PLUGIN_ALIASES: Dict[str, str] = {
    "publishEventData": "publish_event_data",
    "cachePrefix": "cache_prefix",
}

# Backend names become file names, NATS header values and metric labels.
NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
# PostgreSQL refuses other characters in slot names; 63 is NAMEDATALEN - 1.
SLOT_RE = re.compile(r"[a-z0-9_]{1,63}")
SERVER_ID_MIN, SERVER_ID_MAX = 1, 4294967295
DERIVED_SERVER_ID_MIN = 1000


def pg_identifier(name: str) -> str:
    """``lapidus_<name>`` made into a valid slot/publication name: lower case, any character
    other than ``[a-z0-9_]`` replaced by ``_``, cut to 63 characters."""
    return re.sub(r"[^a-z0-9_]", "_", f"lapidus_{name}".lower())[:63]


def host_identity() -> str:
    """What tells this machine from others: ``/etc/machine-id`` (systemd, unique per
    installation), else the host name."""
    try:
        with open("/etc/machine-id", encoding="ascii") as f:
            text = f.read().strip()
        if text:
            return text
    except OSError:
        pass
    return socket.gethostname()


def derived_server_id(name: str, host: Optional[str] = None) -> int:
    """A stable MySQL replica server id for a backend name on this host, in 1000..4294967295.

    Stable so restarts reuse the same id; above 1000 to stay clear of the small ids people
    give their real servers.  The host (:func:`host_identity`, or ``host``) is part of the
    hash, so two machines reading one server with the same backend name get different ids:
    a server drops a reader when another connects with its id.  Two daemons on one host under
    the same backend name must still set ``server_id``.
    """
    key = f"{host if host is not None else host_identity()}\0{name}"
    digest = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
    return DERIVED_SERVER_ID_MIN + digest % (SERVER_ID_MAX - DERIVED_SERVER_ID_MIN + 1)
