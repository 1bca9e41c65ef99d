"""The validator: :func:`parse_config` walks one parsed configuration, collecting every problem
instead of stopping at the first, and builds the :class:`Config`.

Its parts live in sibling modules: ``${VAR}`` expansion (:mod:`.variables`), tables against
their declarations (:mod:`.tables`), plugin tables (:mod:`.plugins`), backends
(:mod:`.backends`), naming and ordering problems (:mod:`.problems`).  This module checks the
top level and its sections and assembles the result.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, List, Mapping, Optional

from .. import settings as S
from .backends import _BackendReader
from .errors import ConfigError
from .model import (ClusterConfig, Config, ControlConfig, HttpConfig, LogConfig,
                    SupervisorConfig)
from .plugins import PluginValidator
from .problems import _document_order
from .secrets import _collect_secrets, _scrub
from .tables import _Table
from .variables import _Expander

#: the backend types that can move between nodes: their resume position is in the checkpoint,
#: which cluster mode keeps in the bucket (PostgreSQL: and in the slot, which in cluster mode
#: confirms only what the sinks acknowledged, docs/cluster.md)
CLUSTER_TYPES = ("mysql", "mongo", "postgresql")
CLUSTER_REFUSALS: dict = {}
#: backend options that cannot work when the backend may move to another node
CLUSTER_OPTION_REFUSALS = {
    ("postgresql", "temporary_slot"):
        "a temporary slot cannot run in cluster mode: it is dropped with the connection that "
        "made it, so a backend that moves to another node would lose its position; use a "
        "permanent slot (temporary_slot = false)",
}
MIN_LEASE_TTL = 3.0


def parse_config(data: Mapping[str, Any], *, source: str = "<memory>",
                 env: Optional[Mapping[str, str]] = None,
                 plugin_validators: Optional[Mapping[str, PluginValidator]] = None,
                 secrets_optional: bool = False) -> Config:
    """Validate an already parsed configuration (what the file holds) and build a Config.

    ``source`` is the file path: relative paths are resolved against its directory (a label
    like ``"<memory>"`` resolves them against the current directory).  ``plugin_validators``
    checks each plugin's options; when given, plugin names it does not list are errors.
    Raises :class:`ConfigError` with every problem found.

    ``secrets_optional`` is for a caller that never connects (``lapidus -t``): an unset
    ``${VAR}`` used only in a secret becomes a line of ``Config.warnings`` instead of a
    problem, and that secret is None (or, inside a URL, empty).  Such a Config must not be
    run.
    """
    return _Validator(source, env, plugin_validators, secrets_optional).run(data)


class _Validator(_BackendReader, _Expander):
    """Walks one configuration, collecting problems instead of stopping at the first."""

    def __init__(self, source: str, env: Optional[Mapping[str, str]],
                 plugin_validators: Optional[Mapping[str, PluginValidator]],
                 secrets_optional: bool = False):
        # The package's function, looked up at each call: tests play root (or not) by
        # patching lapidus.config._running_as_root.
        from . import _running_as_root

        self.source = source
        self.env: Mapping[str, str] = os.environ if env is None else env
        self.plugin_validators = plugin_validators
        self.secrets_optional = secrets_optional
        self.problems: List[str] = []
        self.warnings: List[str] = []
        self.origins = {}
        self.ctx = S.Context(env=self.env, is_root=_running_as_root(),
                             base_dir=Path(source).expanduser().parent.absolute())

    # -- entry point ---------------------------------------------------------------------

    def run(self, data: Mapping[str, Any]) -> Config:
        if not isinstance(data, Mapping):
            raise ConfigError([f"{self.source}: expected a table at the top level, "
                               f"got {S.describe(data)}"], self.source)
        secrets = _collect_secrets(data)
        data = self.expand(data, "")
        secrets |= _collect_secrets(data)

        top = self.read_table(data, S.TOP_LEVEL, "")
        self.fill_derived(top, S.TOP_LEVEL, self.ctx)
        state_dir = Path(top.values["state_dir"] or self.ctx.base_dir)
        log = self.read_section(top, "log", S.LOG)
        control = self.read_section(top, "control", S.CONTROL,
                                    dataclasses.replace(self.ctx, state_dir=state_dir))
        http = self.read_section(top, "http", S.HTTP) if top.values["http"] is not None else None
        supervisor = self.read_section(top, "supervisor", S.SUPERVISOR)
        cluster = (self.read_section(top, "cluster", S.CLUSTER)
                   if top.values["cluster"] is not None else None)
        self.check_socket(control)
        self.check_supervisor(supervisor)
        plugins = self.read_plugins(top.values["plugins"], "plugins") or {}
        backends = self.read_backends(top)
        if cluster is not None:
            self.check_cluster(cluster, backends)

        if self.problems:
            ordered = _document_order(self.problems, data)
            raise ConfigError([_scrub(p, secrets) for p in ordered], self.source)
        return Config(
            source=self.source,
            state_dir=state_dir,
            log=LogConfig(**log.values),
            control=ControlConfig(socket=Path(control.values["socket"])),
            http=HttpConfig(**http.values) if http is not None else None,
            backends=backends,
            plugins=plugins,
            supervisor=SupervisorConfig(**supervisor.values),
            cluster=ClusterConfig(**cluster.values) if cluster is not None else None,
            warnings=tuple(_scrub(w, secrets) for w in _document_order(self.warnings, data)),
        )

    def check_socket(self, control: _Table) -> None:
        socket = control.values.get("socket")
        # sun_path is 108 bytes including the terminating NUL.
        if socket and len(os.fsencode(socket)) > 107:
            how = ("choose a shorter path" if "socket" in control.written
                   else "set control.socket to a shorter path (the default lies in state_dir)")
            self.problem("control.socket", f"the path is {len(os.fsencode(socket))} bytes "
                                           f"long, a Unix socket path allows 107; {how}")

    def check_cluster(self, cluster: _Table, backends) -> None:
        """The connection settings as the nats plugin judges them (URLs, credentials, TLS
        files, nats-py installed), the lease's lower bound, and the backend types that can
        move between nodes."""
        from ..sinks.nats.options import validate as validate_nats
        values = cluster.values
        if values.get("servers") is not None and "servers" not in cluster.bad:
            connection = {key: values[key] for key in ClusterConfig.CONNECTION_KEYS
                          if values.get(key) is not None and key not in cluster.bad}
            connection["servers"] = list(connection["servers"])
            for key, message in validate_nats(connection):
                self.problem(f"cluster.{key}" if key else "cluster", message)
        ttl = values.get("lease_ttl")
        if ttl is not None and ttl < MIN_LEASE_TTL:
            self.problem("cluster.lease_ttl", f"must be at least {MIN_LEASE_TTL:g} seconds (it "
                         f"is renewed every fifth of it), got {ttl:g}")
        for index, backend in enumerate(backends):
            if not backend.options.get("enabled", True):
                continue
            if backend.type not in CLUSTER_TYPES:
                self.problem(f"backends[{index}].type", CLUSTER_REFUSALS.get(
                    backend.type, f"{backend.type} backends cannot run in cluster mode"))
                continue
            for (kind, option), reason in CLUSTER_OPTION_REFUSALS.items():
                if backend.type == kind and backend.options.get(option):
                    self.problem(f"backends[{index}].{option}", reason)

    def check_supervisor(self, supervisor: _Table) -> None:
        low, high = supervisor.values.get("backoff_initial"), supervisor.values.get("backoff_max")
        if low is not None and high is not None and high < low:
            self.problem("supervisor.backoff_max",
                         f"must be at least backoff_initial ({low:g}), got {high:g}")
