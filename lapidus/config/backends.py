"""Checking ``[[backends]]``: each table against its type's declarations, the checks across
one backend's settings, names (explicit ones unique, the others derived from type and
database), no slot or server id shared on one server; then building each
:class:`BackendConfig`.  Part of the validator (see :mod:`.validate`)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from .. import settings as S
from .model import BackendConfig
from .plugins import _PluginReader
from .problems import _BAD, _join
from .tables import _Table, _TableReader


@dataclass
class _PendingBackend:
    index: int
    path: str
    table: _Table

    @property
    def values(self) -> Dict[str, Any]:
        return self.table.values

    def key_path(self, name: str) -> str:
        return _join(self.path, self.table.written.get(name, name))


class _BackendReader(_TableReader, _PluginReader):
    """The validator's part that reads the ``backends`` list."""

    def read_backends(self, top: _Table) -> Tuple[BackendConfig, ...]:
        raw = top.values["backends"]
        if raw is None:
            return ()
        if not raw:
            self.problem("backends", "empty: configure at least one backend")
            return ()
        pending = [p for p in (self.read_backend(i, b) for i, b in enumerate(raw)) if p]
        self.assign_names(pending)
        for p in pending:
            # Derived defaults (slot ...) need a sound name.
            if p.values["name"] is not None and "name" not in p.table.bad:
                self.fill_derived(p.table, S.backend_settings(p.values["type"]), self.ctx)
        self.check_shared_servers(pending)
        return tuple(self.build_backend(p) for p in pending)

    def read_backend(self, index: int, raw: Any) -> Optional[_PendingBackend]:
        path = f"backends[{index}]"
        if raw is _BAD:
            return None
        if not isinstance(raw, Mapping):
            self.problem(path, f"expected a table, got {S.describe(raw)}")
            return None
        backend_type = raw.get("type")
        if isinstance(backend_type, str) and backend_type in S.BACKEND_TYPES:
            decls = S.backend_settings(backend_type)
            table = self.read_table(raw, decls, path, kind_label=backend_type,
                                    elsewhere=S.backend_keys_elsewhere(backend_type),
                                    ctx=dataclasses.replace(self.ctx,
                                                            backend_type=backend_type))
        else:
            # Unknown type: still check what every backend shares and report misspellings,
            # but do not judge type-specific keys we cannot attribute.
            table = self.read_table(raw, S.BACKEND_COMMON, path,
                                    tolerate=S.all_backend_keys(),
                                    suggest_from=S.all_backend_keys())
        pending = _PendingBackend(index, path, table)
        plugins = table.values.get("plugins")
        if plugins is not None:
            table.values["plugins"] = self.read_plugins(plugins, _join(path, "plugins"))
        if table.values.get("type") is None:
            return None
        if backend_type == "postgresql":
            self.check_spool(pending)
            self.check_pg_tls(pending)
            self.check_pg_partition_root(pending)
        if backend_type == "mysql" and pending.values.get("ssl_key") \
                and not pending.values.get("ssl_cert"):
            self.problem(pending.key_path("ssl_key"), "given without ssl_cert; add the client "
                                                      "certificate that goes with the key")
        if backend_type == "mongo":
            self.check_mongo(pending)
        return pending

    def check_spool(self, p: _PendingBackend) -> None:
        segment, cap = p.values["spool_segment_bytes"], p.values["spool_max_bytes"]
        if segment is not None and cap is not None and cap < segment:
            self.problem(p.key_path("spool_max_bytes"), f"must be at least spool_segment_bytes "
                                                        f"({segment}), got {cap}")

    def check_pg_partition_root(self, p: _PendingBackend) -> None:
        """``publish_via_partition_root`` is an option of pgoutput's publications: wal2json
        has none and always names the partition, so the setting would silently do nothing.
        (``decoder = "auto"`` can only be judged at start, against the slot and server.)"""
        if p.values.get("publish_via_partition_root") and p.values.get("decoder") == "wal2json":
            self.problem(p.key_path("publish_via_partition_root"),
                         'true needs decoder = "pgoutput": wal2json names every change by its '
                         'partition and has no such option; set decoder = "pgoutput" (switching '
                         "needs a new slot, docs/postgresql.md#choosing-the-decoder) or "
                         "publish_via_partition_root = false")

    def check_pg_tls(self, p: _PendingBackend) -> None:
        """TLS files that libpq would ignore or use without the protection they suggest."""
        mode = p.values.get("sslmode")
        files = [k for k in ("sslrootcert", "sslcert", "sslkey") if p.values.get(k)]
        if files and mode == "disable":
            self.problem(p.key_path("sslmode"), f"\"disable\" uses no TLS, yet "
                                                f"{', '.join(files)} is set; remove it or set "
                                                f"sslmode = \"verify-full\"")
        if p.values.get("sslkey") and not p.values.get("sslcert"):
            self.problem(p.key_path("sslkey"), "given without sslcert; add the client "
                                               "certificate that goes with the key")
        if p.values.get("sslrootcert") and mode in (None, "allow", "prefer"):
            self.warnings.append(
                f"{p.key_path('sslrootcert')}: with sslmode = \"{mode or 'prefer'}\" a server "
                f"without TLS is still accepted in plain text; set sslmode = \"verify-full\" "
                f"(or \"verify-ca\") to refuse it")

    def check_mongo(self, p: _PendingBackend) -> None:
        written = p.table.written
        if "uri" in written:
            clash = [k for k in ("host", "port", "user", "password") if k in written]
            if clash:
                self.problem(p.key_path("uri"), "give either uri or host/port/user/password, "
                                                f"not both (also given: {', '.join(clash)})")
            # The connection string says where to connect: no host/port defaults on top.
            p.values["host"] = p.values["port"] = None
        elif "password" in written and "user" not in written:
            self.problem(p.key_path("password"), "given without user; add user (or username)")

    def assign_names(self, pending: Sequence[_PendingBackend]) -> None:
        """Explicit names first (duplicates are errors), then derived ones avoiding them."""
        taken: Dict[str, int] = {}
        for p in pending:
            name = p.values.get("name")
            if name is None:
                continue
            if name in taken:
                self.problem(p.key_path("name"), f'duplicate backend name "{name}" (also used '
                                                 f"by backends[{taken[name]}]); names must be "
                                                 f"unique")
                # Defaults derived from this name (its slot ...) would only repeat the clash.
                p.table.bad.add("name")
            else:
                taken[name] = p.index
        for p in pending:
            if p.values.get("name") is not None or "name" in p.table.bad:
                continue
            database = p.values.get("database")
            base = f"{p.values['type']}_{database}" if database else p.values["type"]
            base = re.sub(r"[^A-Za-z0-9_-]", "_", base)[:60]
            name, n = base, 2
            while name in taken:
                name, n = f"{base}_{n}", n + 1
            taken[name] = p.index
            p.values["name"] = name

    def check_shared_servers(self, pending: Sequence[_PendingBackend]) -> None:
        """Two backends on one server must not share a slot (PostgreSQL) or a server id
        (MySQL): the second one would be refused or would kick the first one off."""
        for backend_type, key in (("postgresql", "slot"), ("mysql", "server_id")):
            owners: Dict[Tuple[Any, Any, Any], int] = {}
            for p in pending:
                if p.values["type"] != backend_type or p.values.get(key) is None:
                    continue
                ident = (p.values.get("host"), p.values.get("port"), p.values[key])
                if ident in owners:
                    self.problem(p.key_path(key),
                                 f"{key} {S.describe(ident[2])} is also used by "
                                 f"backends[{owners[ident]}] on {ident[0]}:{ident[1]}; "
                                 f"give each backend its own {key}")
                else:
                    owners[ident] = p.index

    @staticmethod
    def build_backend(p: _PendingBackend) -> BackendConfig:
        values = dict(p.values)
        name, backend_type = values.pop("name"), values.pop("type")
        include, exclude = values.pop("include_tables"), values.pop("exclude_tables")
        plugins = values.pop("plugins")
        return BackendConfig(name=name, type=backend_type, options=values,
                             include_tables=tuple(include or ()),
                             exclude_tables=tuple(exclude or ()), plugins=plugins)
