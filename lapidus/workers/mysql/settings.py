"""The mysql backend's options, with defaults, read from ``BackendConfig.options``.

Runs in the mysql worker process.  The configuration loader validates and normalises the
options (snake_case keys); this module only applies defaults, so the source also works with
a bare dict of options (tests, benchmarks).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from ...settings.names import derived_server_id


#: Default of the backend setting heartbeat_seconds: each heartbeat wakes an idle worker, and
#: a link silent for dead_after (3 heartbeats) is reopened.
HEARTBEAT_SECONDS = 15.0


def default_server_id(name: str) -> int:
    """The replica server id when none is configured: the configuration's own default
    (:func:`lapidus.settings.names.derived_server_id`, hashed from this host and the backend
    name), so a bare dict of options (tests, benchmarks) gets the same id as the loader."""
    return derived_server_id(name)


@dataclass(frozen=True)
class MysqlSettings:
    name: str
    host: str = "127.0.0.1"
    port: int = 3306
    user: str = "lapidus"
    password: str = field(default="", repr=False)     # never in logs or messages
    database: Optional[str] = None
    server_id: int = 0
    connect_timeout: float = 10.0
    heartbeat_seconds: float = HEARTBEAT_SECONDS
    allow_partial_row_image: bool = False
    flavor: Optional[str] = None          # "mariadb" | "mysql" | None: ask the server
    batch_size: int = 1000
    ssl_ca: Optional[str] = None          # TLS (lapidus.workers.mysql.tls): absolute paths
    ssl_cert: Optional[str] = None
    ssl_key: Optional[str] = None
    ssl_verify: Optional[str] = None      # "none" | "ca" | "identity" | None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def dead_after(self) -> float:
        """Seconds without a byte (events or heartbeats) after which the link counts as dead."""
        return max(self.heartbeat_seconds * 3.0, self.heartbeat_seconds + 2.0)

    @property
    def report_host(self) -> str:
        """How this reader names itself in SHOW SLAVE HOSTS (lets the server-id check tell
        our own previous connection from another replica)."""
        return f"lapidus/{self.name}@{socket.gethostname()}"[:60]

    def connection_kwargs(self, **extra: Any) -> dict:
        """pymysql.connect() arguments.  The password stays here: never logged or shown.

        With TLS settings they carry an ``ssl`` context (TLS required); a TLS file that cannot
        be used raises a fatal :class:`~lapidus.workers.base.BackendError`."""
        from .tls import client_context     # here: settings stay importable without ssl

        kwargs = dict(host=self.host, port=self.port, user=self.user, password=self.password,
                      connect_timeout=self.connect_timeout, charset="utf8mb4", autocommit=True)
        context = client_context(self)
        if context is not None:
            kwargs["ssl"] = context
        kwargs.update(extra)
        return kwargs

    def describe(self) -> str:
        return f'backend "{self.name}"'


def settings_from(name: str, options: Optional[Mapping[str, Any]]) -> MysqlSettings:
    """Defaults applied to ``options`` (snake_case keys, as the configuration loader gives them)."""
    o = dict(options or {})
    flavor = o.get("flavor")
    if flavor is not None:
        flavor = str(flavor).lower()
        if flavor not in ("mariadb", "mysql"):
            flavor = None
    return MysqlSettings(
        name=name,
        host=str(o.get("host") or "127.0.0.1"),
        port=int(o.get("port") or 3306),
        user=str(o.get("user") or "lapidus"),
        password=str(o.get("password") or ""),
        database=o.get("database") or None,
        server_id=int(o.get("server_id") or default_server_id(name)),
        connect_timeout=float(o.get("connect_timeout") or 10.0),
        heartbeat_seconds=float(o.get("heartbeat_seconds") or HEARTBEAT_SECONDS),
        allow_partial_row_image=bool(o.get("allow_partial_row_image", False)),
        flavor=flavor,
        batch_size=int(o.get("batch_size") or 1000),
        ssl_ca=_path(o.get("ssl_ca")),
        ssl_cert=_path(o.get("ssl_cert")),
        ssl_key=_path(o.get("ssl_key")),
        ssl_verify=o.get("ssl_verify") or None,
    )


def _path(value: Any) -> Optional[str]:
    return str(value) if value else None
