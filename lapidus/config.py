"""Configuration: load, validate and normalise lapidus.toml / lapidus.json.

Runs in the supervisor before fork (and in ``lapidus -t`` and ``lapidusctl``); workers receive
the resulting frozen :class:`BackendConfig` and never read the file themselves.

Contract:

* :func:`load_config` / :func:`parse_config` either return a complete :class:`Config` (every
  default applied, ``${VAR}`` expanded, original Lapidus aliases mapped to snake_case) or raise
  :class:`ConfigError` listing *every* problem found, each as ``key.path: reason (fix)``.
* Error messages never contain a secret value (passwords, tokens, URI passwords).
* What each setting means, its type and default live in :mod:`lapidus.settings`; this module
  only walks the file and applies those declarations.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple, Union

from . import settings as S

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

#: ``validator(options) -> [(key, message), ...]``; ``key`` is relative to the plugin's table
#: ("" for the table itself).  Sinks provide one as ``Sink.validate``.
PluginValidator = Callable[[Dict[str, Any]], List[Tuple[str, str]]]

DEFAULT_FILES: Tuple[str, ...] = ("lapidus.toml", "lapidus.json")


class ConfigError(Exception):
    """The configuration cannot be used.  ``problems`` holds one line per problem, each
    naming its key path; ``str()`` is those lines joined.  ``source`` names the file."""

    def __init__(self, problems: Sequence[str], source: str = ""):
        self.problems: List[str] = list(problems)
        self.source = source
        super().__init__("\n".join(self.problems))


# --------------------------------------------------------------------------------------------
# The result


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
            "http": None if self.http is None else {"listen": self.http.listen},
            "supervisor": dataclasses.asdict(self.supervisor),
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


# --------------------------------------------------------------------------------------------
# Reading files


def load_config(path: Union[str, os.PathLike, None] = None, *,
                env: Optional[Mapping[str, str]] = None,
                plugin_validators: Optional[Mapping[str, PluginValidator]] = None) -> Config:
    """Read and validate a configuration file.

    ``path`` None means ``./lapidus.toml``, else ``./lapidus.json``.  The format follows the
    suffix (``.toml`` / ``.json``; other names are sniffed: ``{`` first means JSON).  ``env``
    replaces ``os.environ`` for ``${VAR}`` expansion.  Raises :class:`ConfigError`.
    """
    if path is None:
        found = [Path(name) for name in DEFAULT_FILES if Path(name).is_file()]
        if not found:
            raise ConfigError([f"no configuration file: neither ./{DEFAULT_FILES[0]} nor "
                               f"./{DEFAULT_FILES[1]} exists (give one with -c PATH)"])
        path = found[0]
    path = Path(path)
    source = str(path.absolute())
    data = read_file(path)
    return parse_config(data, source=source, env=env, plugin_validators=plugin_validators)


def control_socket_for(path: Union[str, os.PathLike, None] = None) -> Path:
    """The control socket of the configuration at ``path``, judged by its top-level settings
    only: an operator must reach a running lapidus even after editing a backend into an
    invalid state (the running one keeps its old configuration)."""
    if path is None:
        found = [Path(name) for name in DEFAULT_FILES if Path(name).is_file()]
        path = found[0] if found else Path(DEFAULT_FILES[0])
    data = read_file(Path(path))
    minimal = {key: data[key] for key in ("state_dir", "control") if key in data}
    minimal["backends"] = [{"type": "postgresql", "database": "placeholder"}]
    return parse_config(minimal, source=str(Path(path).absolute())).control.socket


def read_file(path: Path) -> Dict[str, Any]:
    """Parse a TOML or JSON file into a dict; ConfigError naming file, line and column."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read the configuration file: "
                           f"{exc.strerror or exc}"], str(path)) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise ConfigError([f"{path}:{line}: not UTF-8 text"], str(path)) from None
    suffix = path.suffix.lower()
    is_json = suffix == ".json" or (suffix != ".toml" and text.lstrip().startswith("{"))
    try:
        data = _parse_json(text) if is_json else tomllib.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError([f"{path}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}"],
                          str(path)) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([_toml_error(path, exc)], str(path)) from None
    if not isinstance(data, dict):
        raise ConfigError([f"{path}: expected an object at the top level, "
                           f"got {S.describe(data)}"], str(path))
    return data


def _toml_error(path: Path, exc: Exception) -> str:
    # tomllib (3.11) puts the position only into the message: "... (at line 3, column 8)".
    message = str(exc)
    match = re.search(r"\s*\(at line (\d+), column (\d+)\)$", message)
    if match:
        return f"{path}:{match.group(1)}:{match.group(2)}: invalid TOML: {message[:match.start()]}"
    return f"{path}: invalid TOML: {message}"


class _JsonObject(dict):
    """A JSON object that remembers keys given twice (json keeps the last one silently)."""

    duplicates: Tuple[str, ...] = ()


def _parse_json(text: str) -> Any:
    def pairs(items: List[Tuple[str, Any]]) -> _JsonObject:
        obj = _JsonObject()
        seen: List[str] = []
        for key, value in items:
            if key in obj:
                seen.append(key)
            obj[key] = value
        obj.duplicates = tuple(seen)
        return obj

    return json.loads(text, object_pairs_hook=pairs)


# --------------------------------------------------------------------------------------------
# Validation


def parse_config(data: Mapping[str, Any], *, source: str = "<memory>",
                 env: Optional[Mapping[str, str]] = None,
                 plugin_validators: Optional[Mapping[str, PluginValidator]] = None) -> Config:
    """Validate an already parsed configuration (what the file holds) and build a Config.

    ``source`` is the file path: relative paths are resolved against its directory (a label
    like ``"<memory>"`` resolves them against the current directory).  ``plugin_validators``
    checks each plugin's options; when given, plugin names it does not list are errors.
    Raises :class:`ConfigError` with every problem found.
    """
    return _Validator(source, env, plugin_validators).run(data)


class _Bad:
    """Stands for a value already reported as a problem (an unset ``${VAR}``), so the same
    key does not collect a second, confusing complaint."""

    def __repr__(self) -> str:
        return "<already reported>"


_BAD = _Bad()
_VAR_RE = re.compile(r"\$\$\{|\$\{(?P<name>[^}]*)(?P<close>\}?)")
_VAR_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PLAIN_KEY_RE = re.compile(r"[A-Za-z0-9_-]+")


def _join(path: str, key: Any) -> str:
    text = key if isinstance(key, str) and _PLAIN_KEY_RE.fullmatch(key) else json.dumps(str(key))
    return f"{path}.{text}" if path else text


def _has_bad(value: Any) -> bool:
    if value is _BAD:
        return True
    if isinstance(value, list):
        return any(_has_bad(v) for v in value)
    if isinstance(value, dict):
        return any(_has_bad(v) for v in value.values())
    return False


def _without_bad(value: Any) -> Any:
    if value is _BAD:
        return None
    if isinstance(value, list):
        return [_without_bad(v) for v in value]
    if isinstance(value, dict):
        return {k: _without_bad(v) for k, v in value.items()}
    return value


@dataclass
class _Table:
    """One checked table: canonical name -> value, plus which keys the user wrote."""

    values: Dict[str, Any]
    written: Dict[str, str]          # canonical name -> key as written (maybe an alias)
    bad: Set[str]                    # canonical names whose value was rejected


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


class _Validator:
    """Walks one configuration, collecting problems instead of stopping at the first."""

    def __init__(self, source: str, env: Optional[Mapping[str, str]],
                 plugin_validators: Optional[Mapping[str, PluginValidator]]):
        self.source = source
        self.env: Mapping[str, str] = os.environ if env is None else env
        self.plugin_validators = plugin_validators
        self.problems: List[str] = []
        self.ctx = S.Context(env=self.env, is_root=_running_as_root(),
                             base_dir=Path(source).expanduser().parent.absolute())

    def problem(self, path: str, message: str) -> None:
        self.problems.append(f"{path}: {message}" if path else message)

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
        self.check_socket(control)
        self.check_supervisor(supervisor)
        plugins = self.read_plugins(top.values["plugins"], "plugins") or {}
        backends = self.read_backends(top)

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
        )

    # -- ${VAR} ----------------------------------------------------------------------------

    def expand(self, value: Any, path: str) -> Any:
        """Replace ``${VAR}`` in every string (``$${`` gives a literal ``${``).  An unset
        variable becomes _BAD after reporting it.  Values are never echoed: they may be
        passwords."""
        if isinstance(value, Mapping):
            for key in getattr(value, "duplicates", ()):
                self.problem(_join(path, key), "given twice in the same object; keep one")
            return {k: self.expand(v, _join(path, k)) for k, v in value.items()}
        if isinstance(value, list):
            return [self.expand(v, f"{path}[{i}]") for i, v in enumerate(value)]
        if not isinstance(value, str) or "${" not in value:
            return value
        failed = False

        def replace(match: "re.Match[str]") -> str:
            nonlocal failed
            if match.group(0) == "$${":
                return "${"
            name = match.group("name")
            if not match.group("close"):
                self.problem(path, 'unterminated "${" (write "$${" for a literal "${")')
            elif not _VAR_NAME_RE.fullmatch(name):
                self.problem(path, 'invalid variable reference in "${...}": use letters, '
                                   'digits and "_" (write "$${" for a literal "${")')
            elif name not in self.env:
                self.problem(path, f"environment variable {name} is not set")
            else:
                return self.env[name]
            failed = True
            return ""

        expanded = _VAR_RE.sub(replace, value)
        return _BAD if failed else expanded

    # -- tables ----------------------------------------------------------------------------

    def read_table(self, raw: Mapping[str, Any], decls: Sequence[S.Setting], path: str, *,
                   elsewhere: Optional[Mapping[str, Tuple[str, ...]]] = None,
                   kind_label: str = "", tolerate: Sequence[str] = (),
                   suggest_from: Optional[Sequence[str]] = None) -> _Table:
        """Check ``raw`` against ``decls``: unknown keys, alias clashes, values, required keys.

        ``elsewhere`` maps keys that belong to other backend types to those types (for a
        better message); keys in ``tolerate`` are silently ignored (used when the backend
        type is unknown, so only real misspellings are reported); ``suggest_from`` widens
        the keys a did-you-mean may propose.
        """
        table = _Table(values={}, written={}, bad=set())
        by_name = {s.name: s for s in decls}
        alias_of = {a: s.name for s in decls for a in s.aliases}
        valid_keys = [*by_name, *alias_of]
        given: Dict[str, Any] = {}
        for key, value in raw.items():
            name = alias_of.get(key, key)
            if name not in by_name:
                if key not in tolerate:
                    self.problem(_join(path, key), self.unknown_key(
                        key, suggest_from or valid_keys, elsewhere, kind_label))
                continue
            if name in table.written:
                first = table.written[name]
                alias = key if key != name else first
                self.problem(_join(path, alias), f'"{alias}" is another name for "{name}", '
                                                 f'which is also given; keep only one of them')
                continue
            table.written[name] = key
            given[name] = value
        for s in decls:
            if s.name in given:
                value = given[s.name]
                # Only leaf values and pattern lists can hold an unset ${VAR}; nested tables
                # (backends, plugins) are walked further down and report their own.
                if value is _BAD or (isinstance(s.kind, S.Globs) and _has_bad(value)):
                    table.values[s.name] = None
                    table.bad.add(s.name)
                    continue
                try:
                    table.values[s.name] = s.kind.check(value, self.ctx)
                except S.Invalid as exc:
                    self.problem(_join(path, table.written[s.name]),
                                 exc.render(value, secret=s.secret))
                    table.values[s.name] = None
                    table.bad.add(s.name)
            elif s.required:
                table.values[s.name] = None
                table.bad.add(s.name)
                self.problem(_join(path, s.name), self.missing(s, kind_label))
            else:
                default = s.default
                table.values[s.name] = None if isinstance(default, S.Derived) else default
        return table

    @staticmethod
    def missing(setting: S.Setting, kind_label: str) -> str:
        if setting.name == "backends":
            return ("missing: configure at least one backend "
                    '([[backends]] in TOML, "backends": [...] in JSON)')
        if setting.name == "type":
            return f"missing (expected {', '.join(S.BACKEND_TYPES)})"
        where = f" for {kind_label} backends" if kind_label else ""
        return f"missing (required{where}: {setting.help.rstrip('.')})"

    @staticmethod
    def unknown_key(key: str, valid: Sequence[str],
                    elsewhere: Optional[Mapping[str, Tuple[str, ...]]], kind_label: str) -> str:
        if elsewhere and key in elsewhere:
            types = " and ".join(elsewhere[key])
            return f"not a {kind_label} setting ({key} applies to {types} backends)"
        near = S.suggest(key, valid) if isinstance(key, str) else None
        if near:
            return f'unknown key (did you mean "{near}"?)'
        if len(valid) <= 10:
            return f"unknown key (expected one of {', '.join(sorted(valid))})"
        return "unknown key"

    def fill_derived(self, table: _Table, decls: Sequence[S.Setting], ctx: S.Context) -> None:
        """Compute defaults that depend on other values (slot from name ...)."""
        for s in decls:
            if (isinstance(s.default, S.Derived) and table.values.get(s.name) is None
                    and s.name not in table.bad and s.name not in table.written):
                table.values[s.name] = s.default.compute(table.values, ctx)

    def read_section(self, top: _Table, name: str, decls: Sequence[S.Setting],
                     ctx: Optional[S.Context] = None) -> _Table:
        raw = top.values[name]
        table = self.read_table({} if raw is None else raw, decls, name)
        self.fill_derived(table, decls, ctx or self.ctx)
        return table

    def check_socket(self, control: _Table) -> None:
        socket = control.values.get("socket")
        # sun_path is 108 bytes including the terminating NUL.
        if socket and len(os.fsencode(socket)) > 107:
            how = ("choose a shorter path" if "socket" in control.written
                   else "set control.socket to a shorter path (the default lies in state_dir)")
            self.problem("control.socket", f"the path is {len(os.fsencode(socket))} bytes "
                                           f"long, a Unix socket path allows 107; {how}")

    def check_supervisor(self, supervisor: _Table) -> None:
        low, high = supervisor.values.get("backoff_initial"), supervisor.values.get("backoff_max")
        if low is not None and high is not None and high < low:
            self.problem("supervisor.backoff_max",
                         f"must be at least backoff_initial ({low:g}), got {high:g}")

    # -- plugins ---------------------------------------------------------------------------

    def read_plugins(self, raw: Any, path: str) -> Optional[Dict[str, Dict[str, Any]]]:
        """``name -> options`` with plugin aliases mapped; options checked by the validators."""
        if raw is None:
            return None
        plugins: Dict[str, Dict[str, Any]] = {}
        for name, options in raw.items():
            where = _join(path, name)
            if options is _BAD:
                continue
            if not isinstance(options, Mapping):
                header = "backends.plugins" if path.startswith("backends") else "plugins"
                self.problem(where, f"expected a table of options, got {S.describe(options)}; "
                                    f"an empty table enables the plugin with its defaults "
                                    f'({{}} in JSON, a [{_join(header, name)}] header in TOML)')
                continue
            options = self.plugin_aliases(dict(options), where)
            plugins[name] = options
            if self.plugin_validators is None:
                continue
            validate = self.plugin_validators.get(name)
            if validate is None:
                known = sorted(self.plugin_validators)
                near = S.suggest(name, known) if isinstance(name, str) else None
                hint = f'; did you mean "{near}"?' if near else ""
                self.problem(where, f'unknown plugin "{name}" (known: {", ".join(known)}{hint})')
                continue
            try:
                issues = list(validate(_without_bad(options)))
            except Exception as exc:  # a plugin's bug must not hide the other problems
                self.problem(where, f"the plugin's validator failed: {type(exc).__name__}: {exc}")
                continue
            for key, message in issues:
                key_path = where if not key else (
                    f"{where}{key}" if str(key).startswith("[") else f"{where}.{key}")
                self.problem(key_path, message)
        return plugins

    def plugin_aliases(self, options: Dict[str, Any], path: str) -> Dict[str, Any]:
        result: Dict[str, Any] = {}
        for key, value in options.items():
            name = S.PLUGIN_ALIASES.get(key, key)
            if name != key and name in options:
                self.problem(_join(path, key), f'"{key}" is another name for "{name}", '
                                               f'which is also given; keep only one of them')
                continue
            result[name] = value
        return result

    # -- backends --------------------------------------------------------------------------

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
                                    elsewhere=S.backend_keys_elsewhere(backend_type))
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
        if backend_type == "mongo":
            self.check_mongo(pending)
        return pending

    def check_spool(self, p: _PendingBackend) -> None:
        segment, cap = p.values["spool_segment_bytes"], p.values["spool_max_bytes"]
        if segment is not None and cap is not None and cap < segment:
            self.problem(p.key_path("spool_max_bytes"), f"must be at least spool_segment_bytes "
                                                        f"({segment}), got {cap}")

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


def _document_order(problems: Sequence[str], data: Mapping[str, Any]) -> List[str]:
    """Group problems by top-level key (in file order) and backend index, keeping the order
    of discovery inside a group: ``${VAR}`` problems are found in an earlier pass than the
    others but belong next to the rest of their backend's."""
    keys = list(data)

    def group(problem: str) -> Tuple[int, int]:
        match = re.match(r"([A-Za-z0-9_-]+|\"[^\"]*\")(?:\[(\d+)\])?", problem)
        if not match:
            return (-1, 0)
        top = match.group(1).strip('"')
        return (keys.index(top) if top in keys else len(keys), int(match.group(2) or 0))

    return sorted(problems, key=group)


def _running_as_root() -> bool:
    return os.geteuid() == 0


# --------------------------------------------------------------------------------------------
# Secrets

_URI_PASSWORD_RE = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^\s:@/]*):(?P<pw>[^\s/]*)@")
# NATS URLs may carry a bare token as user info: nats://s3cr3t@host:4222
_NATS_TOKEN_RE = re.compile(r"(?P<head>\b(?:nats|tls|ws|wss)://)(?P<tok>[^\s:@/]+)@")


def mask_uri(text: str) -> str:
    """``scheme://user:pw@host`` -> ``scheme://user:***@host``; NATS token URLs -> ``***@``."""
    text = _URI_PASSWORD_RE.sub(r"\g<head>:***@", text)
    return _NATS_TOKEN_RE.sub(r"\g<head>***@", text)


def mask_secrets(value: Any, key: Any = None) -> Any:
    """A JSON-able copy of ``value`` with secrets masked: values under secret-looking keys
    (see :func:`lapidus.settings.is_secret_key`) and passwords inside URIs."""
    if isinstance(value, Mapping):
        return {str(k): mask_secrets(v, k) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [mask_secrets(v, key) for v in value]
    if value is None:
        return None
    if S.is_secret_key(key):
        return "***"
    if isinstance(value, str):
        return mask_uri(value)
    if isinstance(value, Path):
        return str(value)
    return value


def _collect_secrets(value: Any, key: Any = None) -> Set[str]:
    """Every secret string in the raw data, so error messages can be scrubbed of them."""
    found: Set[str] = set()
    if isinstance(value, Mapping):
        for k, v in value.items():
            found |= _collect_secrets(v, k)
    elif isinstance(value, list):
        for v in value:
            found |= _collect_secrets(v, key)
    elif isinstance(value, str):
        if S.is_secret_key(key) and value:
            found.add(value)
        for match in _URI_PASSWORD_RE.finditer(value):
            found.add(match.group("pw"))
        for match in _NATS_TOKEN_RE.finditer(value):
            found.add(match.group("tok"))
    return found


def _scrub(message: str, secrets: Set[str]) -> str:
    """Belt and braces: messages are written never to echo secrets, but a password typed
    into the wrong key would be echoed as that key's bad value.  Very short secrets are
    skipped, they would garble the message without protecting anything."""
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= 4 and secret in message:
            message = message.replace(secret, "***")
    return message
