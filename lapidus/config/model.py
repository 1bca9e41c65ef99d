"""The result of loading: the frozen :class:`Config`, its :class:`BackendConfig` entries and
the records of its sections.

Built by the supervisor before fork (and by ``lapidus -t`` and ``lapidusctl``); workers
receive their :class:`BackendConfig` and never read the file themselves.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple, Union

from .. import settings as S
from .secrets import mask_secrets


@dataclass(frozen=True)
class BackendConfig:
    """One configured backend, normalised: snake_case keys, defaults applied, secrets expanded.

    ``options`` holds every setting declared for ``type`` in :mod:`lapidus.settings` (unset
    optional ones as ``None``), except ``name``, ``type``, the table lists and ``plugins``,
    which have their own fields.  Treat it as read-only.
    """

    name: str
    type: str                                   # "postgresql" | "mysql" | "mongo"
    options: Dict[str, Any] = field(default_factory=dict)
    include_tables: Tuple[str, ...] = ()
    exclude_tables: Tuple[str, ...] = ()
    plugins: Optional[Dict[str, Dict[str, Any]]] = None   # per-backend plugins replace global ones

    def with_plugins(self, plugins: Dict[str, Dict[str, Any]]) -> "BackendConfig":
        """A copy whose ``plugins`` are exactly ``plugins`` (what a worker is given: the
        plugins it uses, resolved by :meth:`Config.plugins_for`)."""
        return dataclasses.replace(self, plugins=plugins)

    def __repr__(self) -> str:
        # The generated repr would print the password into any log line that shows a backend.
        return (f"BackendConfig(name={self.name!r}, type={self.type!r}, "
                f"options={mask_secrets(self.options)!r}, include_tables={self.include_tables!r}, "
                f"exclude_tables={self.exclude_tables!r}, plugins={mask_secrets(self.plugins)!r})")


@dataclass(frozen=True)
class LogConfig:
    format: str = "auto"                        # "auto" | "json" | "console"
    level: str = "info"                         # "debug" | "info" | "warning" | "error"


@dataclass(frozen=True)
class ControlConfig:
    socket: Path                                # Unix socket for lapidusctl


@dataclass(frozen=True)
class HttpConfig:
    listen: str                                 # "host:port" as written
    token: Optional[str] = None                 # the status page's token; None: open

    @property
    def host(self) -> str:
        return S.split_listen(self.listen)[0]   # type: ignore[index]  # validated on load

    @property
    def port(self) -> int:
        return S.split_listen(self.listen)[1]   # type: ignore[index]


@dataclass(frozen=True)
class SupervisorConfig:
    max_restarts: int = 5                       # crashes inside restart_window before FATAL
    restart_window: float = 60.0
    backoff_initial: float = 1.0
    backoff_max: float = 30.0
    stop_timeout: float = 10.0                  # stop signal -> SIGKILL of the process tree
    heartbeat_timeout: float = 60.0             # silent RUNNING worker -> killed, restarted


@dataclass(frozen=True)
class ClusterConfig:
    """``[cluster]``: the NATS servers and bucket the nodes share, and this node's name.
    ``repr`` masks the secrets (the cluster child and every worker receive this record)."""

    servers: Tuple[str, ...]
    node: str
    bucket: str = "lapidus"
    replicas: int = 1
    lease_ttl: float = 15.0
    max_backends: Optional[int] = None
    user: Optional[str] = None
    password: Optional[str] = None
    token: Optional[str] = None
    nkeys_seed: Optional[str] = None
    credentials: Optional[str] = None
    tls_ca_file: Optional[str] = None
    tls_cert_file: Optional[str] = None
    tls_key_file: Optional[str] = None
    tls_hostname: Optional[str] = None

    #: the keys that are handed to the NATS connection as they are (the nats plugin's names)
    CONNECTION_KEYS = ("servers", "user", "password", "token", "nkeys_seed", "credentials",
                       "tls_ca_file", "tls_cert_file", "tls_key_file", "tls_hostname")

    def connection_options(self) -> Dict[str, Any]:
        """The nats plugin's options for the same connection (they are validated and turned
        into a connection by the nats plugin's own code)."""
        values = {key: getattr(self, key) for key in self.CONNECTION_KEYS}
        values["servers"] = list(self.servers)
        return {key: value for key, value in values.items() if value is not None}

    def redacted(self) -> Dict[str, Any]:
        return mask_secrets(dataclasses.asdict(self))

    def __repr__(self) -> str:
        return f"ClusterConfig({self.redacted()!r})"


@dataclass(frozen=True)
class Config:
    """A validated configuration.  Frozen; build variants with :meth:`with_plugin`."""

    source: str                                 # absolute path of the file, or a label
    state_dir: Path
    log: LogConfig
    control: ControlConfig
    http: Optional[HttpConfig]                  # None: no metrics/health endpoint
    backends: Tuple[BackendConfig, ...]
    plugins: Dict[str, Dict[str, Any]]          # global plugins: name -> options
    supervisor: SupervisorConfig = SupervisorConfig()
    cluster: Optional[ClusterConfig] = None     # None: this node runs alone
    # Lines to show next to a valid configuration (``lapidus -t``): an unset secret that was
    # not checked.  Each names its key path, like a problem.
    warnings: Tuple[str, ...] = ()

    def backend(self, name: str) -> BackendConfig:
        """The backend called ``name``; KeyError naming the known ones otherwise."""
        for backend in self.backends:
            if backend.name == name:
                return backend
        known = ", ".join(b.name for b in self.backends)
        raise KeyError(f'no backend named "{name}" (configured: {known})')

    def plugins_for(self, backend: Union[BackendConfig, str]) -> Dict[str, Dict[str, Any]]:
        """The plugins (sinks) that receive ``backend``'s events, name -> options.

        The original Lapidus rule: a backend's own ``plugins`` replace the global set for that
        backend (an empty table means no plugins); without its own, it uses the global ones.
        Returns fresh dicts, safe to modify.
        """
        if isinstance(backend, str):
            backend = self.backend(backend)
        chosen = backend.plugins if backend.plugins is not None else self.plugins
        return {name: dict(options) for name, options in chosen.items()}

    def with_plugin(self, name: str, options: Optional[Mapping[str, Any]] = None) -> "Config":
        """A copy with plugin ``name`` used by *every* backend (what ``--stdout`` does).

        It is added to the global plugins and to each backend that has plugins of its own, so
        the replacement rule cannot hide it.  ``options`` replace any configured ones; with
        ``None`` configured options are kept (``{}`` when there are none).  Not validated.
        """
        fresh = dict(options) if options is not None else None
        global_options = fresh if fresh is not None else dict(self.plugins.get(name, {}))
        backends = tuple(
            b if b.plugins is None else dataclasses.replace(
                b, plugins={**b.plugins, name: fresh if fresh is not None
                            else dict(b.plugins.get(name, global_options))})
            for b in self.backends)
        return dataclasses.replace(self, plugins={**self.plugins, name: global_options},
                                   backends=backends)

    def redacted(self) -> Dict[str, Any]:
        """A JSON-able view for ``lapidus -t``, with every secret masked as ``***``
        (passwords, tokens, nkey seeds, credentials, ``user:***@`` in URIs)."""
        return {
            "source": self.source,
            "state_dir": str(self.state_dir),
            "log": dataclasses.asdict(self.log),
            "control": {"socket": str(self.control.socket)},
            "http": None if self.http is None else {
                "listen": self.http.listen, **({"token": "***"} if self.http.token else {})},
            "supervisor": dataclasses.asdict(self.supervisor),
            "cluster": None if self.cluster is None else self.cluster.redacted(),
            "plugins": mask_secrets(self.plugins),
            "backends": [{
                "name": b.name,
                "type": b.type,
                **mask_secrets(b.options),
                "include_tables": list(b.include_tables),
                "exclude_tables": list(b.exclude_tables),
                "plugins": mask_secrets(b.plugins),
                "uses_plugins": sorted(self.plugins_for(b)),
            } for b in self.backends],
        }

    def __repr__(self) -> str:
        return (f"Config(source={self.source!r}, "
                f"backends={tuple(b.name for b in self.backends)!r})")
