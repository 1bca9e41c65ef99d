"""Every configuration setting, declared once.

A :class:`Setting` names a key, its aliases (the original Lapidus spellings), its kind (which
checks and normalises a value), its default, a one-line help and the backend types it applies
to.  :mod:`lapidus.config` validates files against these declarations and
:func:`render_markdown` writes the settings tables of ``docs/configuration.md`` from them, so
the validator and the documentation cannot drift apart (a unit test compares the two).

Stdlib-only leaf module: imported by the supervisor before fork, by ``lapidus -t`` and by
``lapidusctl``.  Regenerate the documentation with
``python -m lapidus.settings --write docs/configuration.md``.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

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


# --------------------------------------------------------------------------------------------
# Kinds: each checks one value and returns it normalised, or raises Invalid.


class Invalid(ValueError):
    """A value that does not fit its setting.

    ``expected`` completes "expected ..., got <value>"; the caller adds the value (or only its
    type, for secrets).  ``message`` replaces the whole sentence when the value is not the
    point (a cross-check).  ``hint`` is appended, e.g. a did-you-mean.
    """

    def __init__(self, expected: str = "", *, message: str = "", hint: str = ""):
        super().__init__(message or expected)
        self.expected = expected
        self.message = message
        self.hint = hint

    def render(self, value: Any, *, secret: bool = False) -> str:
        text = self.message or f"expected {self.expected}, got {describe(value, secret=secret)}"
        return f"{text} ({self.hint})" if self.hint else text


@dataclass(frozen=True)
class Context:
    """What a kind or a derived default may look at besides the value itself."""

    env: Mapping[str, str]
    is_root: bool
    base_dir: Path                  # relative paths are resolved against the file's directory
    state_dir: Optional[Path] = None


class Kind:
    """Base kind: accepts anything.  ``doc`` is the type column of the documentation."""

    doc = "value"

    def check(self, value: Any, ctx: Context) -> Any:
        return value


class Str(Kind):
    doc = "string"

    def __init__(self, *, empty: bool = False):
        self.empty = empty

    def check(self, value: Any, ctx: Context) -> str:
        if not isinstance(value, str):
            raise Invalid("a string")
        if not value and not self.empty:
            raise Invalid(message="must not be empty")
        return value


class Int(Kind):
    """An integer; a string of digits is accepted too, so ``"${PORT}"`` works."""

    def __init__(self, lo: int, hi: Optional[int] = None):
        self.lo, self.hi = lo, hi
        self.doc = f"integer {lo}-{hi}" if hi is not None else f"integer >= {lo}"

    def check(self, value: Any, ctx: Context) -> int:
        number = _as_int(value)
        if number is None or number < self.lo or (self.hi is not None and number > self.hi):
            raise Invalid(self.expected)
        return number

    @property
    def expected(self) -> str:
        if self.hi is None:
            return f"an integer >= {self.lo}"
        return f"an integer from {self.lo} to {self.hi}"


class Seconds(Kind):
    """A duration in seconds (integer or decimal), returned as float."""

    def __init__(self, *, zero: bool = False):
        self.zero = zero
        self.doc = "seconds >= 0" if zero else "seconds > 0"

    def check(self, value: Any, ctx: Context) -> float:
        number = _as_float(value)
        if number is None or number < 0 or (number == 0 and not self.zero):
            bound = "at least 0" if self.zero else "greater than 0"
            raise Invalid(f"a number of seconds {bound}")
        return number


class Bool(Kind):
    doc = "true/false"

    def check(self, value: Any, ctx: Context) -> bool:
        if isinstance(value, bool):
            return value
        # Strings are accepted so a boolean can come from the environment ("${TLS}").
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        raise Invalid("true or false")


class Choice(Kind):
    def __init__(self, *choices: str):
        self.choices = choices
        self.doc = " / ".join(f'"{c}"' for c in choices)

    def check(self, value: Any, ctx: Context) -> str:
        if isinstance(value, str) and value in self.choices:
            return value
        near = suggest(value, self.choices) if isinstance(value, str) else None
        raise Invalid(f"one of {', '.join(self.choices)}",
                      hint=f'did you mean "{near}"?' if near else "")


class BackendType(Choice):
    _HINTS = {"postgres": "postgresql", "pg": "postgresql", "pgsql": "postgresql",
              "mariadb": "mysql", "mongodb": "mongo"}

    def __init__(self):
        super().__init__(*BACKEND_TYPES)

    def check(self, value: Any, ctx: Context) -> str:
        if isinstance(value, str) and value in self.choices:
            return value
        if not isinstance(value, str):
            raise Invalid(f"a backend type ({', '.join(self.choices)})")
        near = self._HINTS.get(value.lower()) or suggest(value, self.choices)
        raise Invalid(message=f"unknown backend type {describe(value)} "
                              f"(expected {', '.join(self.choices)})",
                      hint=f'did you mean "{near}"?' if near else "")


class PathKind(Kind):
    """A file-system path.  ``~`` is expanded and a relative path is taken relative to the
    configuration file's directory.  With ``search_path``, a bare command name (no ``/``) is
    kept as is and looked up on ``$PATH`` when used."""

    doc = "path"

    def __init__(self, *, search_path: bool = False):
        self.search_path = search_path

    def check(self, value: Any, ctx: Context) -> str:
        if not isinstance(value, str) or not value:
            raise Invalid("a path (a non-empty string)")
        if self.search_path and "/" not in value:
            return value
        return str(resolve_path(value, ctx))


class Globs(Kind):
    doc = "list of globs"

    def check(self, value: Any, ctx: Context) -> Tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(p, str) and p for p in value):
            raise Invalid('a list of table patterns such as ["sessions", "audit_*"]')
        return tuple(value)


_SIZE_RE = re.compile(r"\s*(\d+)\s*(|b|kb|mb|gb|tb|kib|mib|gib|tib)\s*", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


class ByteSize(Kind):
    """A number of bytes: an integer, or a string with a unit ("64MiB", "1 GB")."""

    doc = 'bytes (or "64MiB")'

    def check(self, value: Any, ctx: Context) -> int:
        number: Optional[int] = None
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        elif isinstance(value, str):
            match = _SIZE_RE.fullmatch(value)
            if match:
                number = int(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]
        if number is None or number < 1:
            raise Invalid('a positive number of bytes (an integer, or a string like "64MiB")')
        return number


class Listen(Kind):
    doc = '"host:port"'

    def check(self, value: Any, ctx: Context) -> str:
        if isinstance(value, str):
            parts = split_listen(value)
            if parts is not None:
                return value
        raise Invalid('"host:port" such as "127.0.0.1:9187" (port 0 picks a free port)')


class Pattern(Kind):
    """A string matching ``regex``; ``expected`` explains the rule to the user."""

    def __init__(self, regex: "re.Pattern[str]", expected: str, doc: str):
        self.regex, self.expected, self.doc = regex, expected, doc

    def check(self, value: Any, ctx: Context) -> str:
        if not isinstance(value, str) or not self.regex.fullmatch(value):
            raise Invalid(self.expected)
        return value


class MongoUri(Kind):
    doc = "connection string"

    def check(self, value: Any, ctx: Context) -> str:
        if not isinstance(value, str) or not value.startswith(("mongodb://", "mongodb+srv://")):
            raise Invalid("a connection string starting with mongodb:// or mongodb+srv://")
        return value


class Table(Kind):
    """A nested table (``[log]``); its own settings are declared in their section."""

    doc = "table"

    def check(self, value: Any, ctx: Context) -> dict:
        if not isinstance(value, dict):
            raise Invalid("a table")
        return value


class Plugins(Kind):
    """``plugin name -> options table``; the entries are checked by :mod:`lapidus.config`."""

    doc = "table of tables"

    def check(self, value: Any, ctx: Context) -> dict:
        if not isinstance(value, dict):
            raise Invalid('a table of plugins, name -> options (e.g. {"stdout": {}})')
        return value


class BackendList(Kind):
    doc = "list of tables"

    def check(self, value: Any, ctx: Context) -> list:
        if not isinstance(value, list):
            raise Invalid("a list of backend tables ([[backends]] in TOML)")
        return value


# --------------------------------------------------------------------------------------------
# Declarations


@dataclass(frozen=True)
class Derived:
    """A default computed from other values (``values`` holds the table's checked values,
    including the backend ``name`` once it is assigned)."""

    doc: str
    compute: Callable[[Mapping[str, Any], Context], Any]


#: Marks a setting that has no default: it is left unset (``None``) when absent.
UNSET = None


@dataclass(frozen=True)
class Setting:
    name: str
    kind: Kind
    help: str
    default: Any = UNSET            # a plain value, a Derived, or UNSET
    types: Tuple[str, ...] = BACKEND_TYPES   # backend types it applies to (backend settings only)
    aliases: Tuple[str, ...] = ()
    required: bool = False
    secret: bool = False            # never echoed in errors, masked by Config.redacted()


def _state_dir_default(values: Mapping[str, Any], ctx: Context) -> str:
    if ctx.is_root:
        return "/var/lib/lapidus"
    state_home = ctx.env.get("XDG_STATE_HOME", "")
    if state_home.startswith("/"):
        return str(Path(state_home) / "lapidus")
    return str(_home(ctx) / ".local" / "state" / "lapidus")


def _socket_default(values: Mapping[str, Any], ctx: Context) -> str:
    assert ctx.state_dir is not None
    return str(ctx.state_dir / "lapidus.sock")


def pg_identifier(name: str) -> str:
    """``lapidus_<name>`` made into a valid slot/publication name: lower case, any character
    other than ``[a-z0-9_]`` replaced by ``_``, cut to 63 characters."""
    return re.sub(r"[^a-z0-9_]", "_", f"lapidus_{name}".lower())[:63]


def derived_server_id(name: str) -> int:
    """A stable MySQL replica server id for a backend name, in 1000..4294967295.

    Stable so restarts reuse the same id; above 1000 to stay clear of the small ids people
    give their real servers.  The server refuses a replica whose id equals its own or another
    connected replica's: set ``server_id`` explicitly when two daemons read the same server
    under the same backend name.
    """
    digest = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big")
    return DERIVED_SERVER_ID_MIN + digest % (SERVER_ID_MAX - DERIVED_SERVER_ID_MIN + 1)


PG, MY, MONGO = ("postgresql",), ("mysql",), ("mongo",)
SQL = ("postgresql", "mysql")

TOP_LEVEL: Tuple[Setting, ...] = (
    Setting("state_dir", PathKind(), "Checkpoints, spool files and the control socket.",
            Derived("`/var/lib/lapidus` as root, else `$XDG_STATE_HOME/lapidus` "
                    "(`~/.local/state/lapidus`)", _state_dir_default)),
    Setting("log", Table(), "Logging, see `[log]`.", {}),
    Setting("control", Table(), "The control socket used by `lapidusctl`, see `[control]`.", {}),
    Setting("http", Table(), "Metrics and health endpoint, see `[http]`; off when absent.",
            UNSET),
    Setting("supervisor", Table(), "Restart policy, see `[supervisor]`.", {}),
    Setting("backends", BackendList(), "The databases to stream, see `[[backends]]`.",
            required=True),
    Setting("plugins", Plugins(), "Global plugins (sinks), name -> options; used by every "
            "backend that has no `plugins` of its own.", {}),
)

LOG: Tuple[Setting, ...] = (
    Setting("format", Choice("auto", "json", "console"),
            "`auto`: console when standard error is a terminal, else JSON lines.", "auto"),
    Setting("level", Choice("debug", "info", "warning", "error"), "Lowest level logged.",
            "info"),
)

CONTROL: Tuple[Setting, ...] = (
    Setting("socket", PathKind(), "Unix socket `lapidusctl` talks to (mode 0600).",
            Derived("`<state_dir>/lapidus.sock`", _socket_default)),
)

HTTP: Tuple[Setting, ...] = (
    Setting("listen", Listen(), "Address of `/metrics` (Prometheus) and `/healthz`.",
            required=True),
)

SUPERVISOR: Tuple[Setting, ...] = (
    Setting("max_restarts", Int(0), "Crashes allowed inside `restart_window` before the "
            "backend is marked FATAL.", 5),
    Setting("restart_window", Seconds(), "Window for counting crashes.", 60.0),
    Setting("backoff_initial", Seconds(), "First restart delay; doubles per crash, with jitter.",
            1.0),
    Setting("backoff_max", Seconds(), "Longest restart delay.", 30.0),
    Setting("stop_timeout", Seconds(), "Grace period between the stop signal and SIGKILL.",
            10.0),
    Setting("heartbeat_timeout", Seconds(), "A running worker silent for this long is "
            "considered wedged, killed and restarted (workers report every second).", 60.0),
)

BACKEND_COMMON: Tuple[Setting, ...] = (
    Setting("name", Pattern(NAME_RE, 'a name of 1 to 64 letters, digits, "_" or "-"',
                            "name"),
            "Backend name: used in events, NATS headers, metrics, file names.",
            Derived("`<type>_<database>` (`<type>` without a database); `_2`, `_3` ... "
                    "appended when two backends derive the same name", lambda v, c: None)),
    Setting("type", BackendType(), "`postgresql`, `mysql` or `mongo`.", required=True),
    Setting("enabled", Bool(), "A disabled backend is validated but not started.", True),
    Setting("include_tables", Globs(), "Only these tables (globs on `table` or "
            "`schema.table`); empty: every table not excluded.", (),
            aliases=("includeTables",)),
    Setting("exclude_tables", Globs(), "Tables never streamed (globs on `table` or "
            "`schema.table`).", (), aliases=("excludeTables",)),
    Setting("plugins", Plugins(), "This backend's plugins; when given they replace the "
            "global `plugins` for this backend.", UNSET),
    Setting("batch_size", Int(1), "Most events shipped from the worker in one batch.", 1000),
    Setting("max_inflight_batches", Int(1), "Batches sent but not yet confirmed by the "
            "sinks before the worker stops reading (backpressure).", 8),
)

_PORT = Int(1, 65535)

BACKEND_TYPED: Tuple[Setting, ...] = (
    # shared by several types
    Setting("host", Str(), "Server host name or address.", "127.0.0.1",
            aliases=("hostname",)),
    Setting("password", Str(empty=True), "Password; use `\"${VAR}\"` to keep it out of the "
            "file.", secret=True),
    Setting("connect_timeout", Int(1), "Seconds to wait for one connection attempt.", 10,
            types=SQL),
    # postgresql
    Setting("port", _PORT, "Server port.", 5432, types=PG),
    Setting("user", Str(), "User with the REPLICATION attribute.", "postgres", types=PG,
            aliases=("username",)),
    Setting("passfile", PathKind(), "A libpq password file, instead of `password`.",
            types=PG),
    Setting("database", Str(), "Database to stream (logical decoding is per database).",
            types=PG, required=True),
    Setting("slot", Pattern(SLOT_RE, 'a slot name of 1 to 63 lowercase letters, digits or "_"',
                            "slot name"),
            "Logical replication slot.",
            Derived("`lapidus_<name>`, lowercased, other characters replaced by `_`, "
                    "63 at most", lambda v, c: pg_identifier(v["name"])), types=PG),
    Setting("temporary_slot", Bool(), "Use a temporary slot (dropped on disconnect: changes "
            "made while stopped are lost; for demos and tests).", False, types=PG),
    Setting("decoder", Choice("auto", "pgoutput", "wal2json"),
            "Logical decoding output plugin. `auto`: the plugin of an existing slot, else "
            "`pgoutput` when the server allows it (built in, the default), else `wal2json`. "
            "`pgoutput` keeps NaN and infinities exact and needs a publication; `wal2json` "
            "needs the plugin installed. See docs/postgresql.md.", "auto", types=PG),
    Setting("publication", Str(), "Publication read by the `pgoutput` decoder; set up "
            "before the slot, as `publication_mode` says.",
            Derived("`lapidus_<name>`, made valid like `slot`",
                    lambda v, c: pg_identifier(v["name"])), types=PG),
    Setting("publication_mode", Choice("all_tables", "filtered", "existing"),
            "`all_tables`: create it FOR ALL TABLES if missing (superuser); `filtered`: "
            "create it, or change it, to list the tables that pass include/exclude now "
            "(tables created later need a restart); `existing`: use it as the DBA made it, "
            "never create or change it. Lapidus refuses to publish tables without a primary "
            "key or replica identity (UPDATE/DELETE on them would fail).", "all_tables",
            types=PG),
    Setting("messages", Bool(), "Emit `pg_logical_emit_message` calls as `message` events.",
            True, types=PG),
    Setting("sslmode", Choice("disable", "allow", "prefer", "require", "verify-ca",
                              "verify-full"), "libpq `sslmode`; libpq's default when unset.",
            types=PG),
    Setting("fsync_interval", Seconds(), "How often `pg_recvlogical` fsyncs the spool (and "
            "so confirms the slot).", 1.0, types=PG),
    Setting("status_interval", Seconds(), "How often `pg_recvlogical` reports to the server.",
            1.0, types=PG),
    Setting("spool_segment_bytes", ByteSize(), "Spool file size at which a new segment starts.",
            64 * 2**20, types=PG),
    Setting("spool_max_bytes", ByteSize(), "Undelivered spool at which `pg_recvlogical` is "
            "paused (WAL then accumulates on the server).", 2**30, types=PG),
    Setting("slot_warn_bytes", ByteSize(), "Warn (log, `lapidusctl status`, metrics) when the "
            "server retains more WAL than this for the replication slot.", 2**30, types=PG),
    Setting("pg_recvlogical", PathKind(search_path=True), "The `pg_recvlogical` binary; a bare "
            "name is looked up on `$PATH`.", types=PG),
    # mysql
    Setting("port", _PORT, "Server port.", 3306, types=MY),
    Setting("user", Str(), "User with REPLICATION SLAVE, REPLICATION CLIENT and SELECT.",
            "root", types=MY, aliases=("username",)),
    Setting("database", Str(), "Stream only this database (unless `include_tables` says "
            "otherwise); every database when unset.", types=MY),
    Setting("server_id", Int(SERVER_ID_MIN, SERVER_ID_MAX), "Replica server id; must differ "
            "from the server's and from every other replica's.",
            Derived("a stable number in 1000..4294967295 derived from the backend name",
                    lambda v, c: derived_server_id(v["name"])), types=MY,
            aliases=("serverId",)),
    Setting("connect_retry_seconds", Seconds(zero=True), "Total time to keep retrying the "
            "first connection at start-up.", 60.0, types=MY),
    Setting("heartbeat_seconds", Seconds(), "Heartbeat period asked of the server, so a dead "
            "connection is noticed.", 5.0, types=MY),
    Setting("allow_partial_row_image", Bool(), "Accept `binlog_row_image` other than FULL "
            "(events then lack unchanged columns).", False, types=MY),
    Setting("flavor", Choice("auto", "mariadb", "mysql"), "Server flavour; `auto` asks the "
            "server.", "auto", types=MY),
    # mongo
    Setting("uri", MongoUri(), "Connection string, instead of host/port/user/password.",
            types=MONGO, secret=True),
    Setting("port", _PORT, "Server port.", 27017, types=MONGO),
    Setting("user", Str(), "User name.", types=MONGO, aliases=("username",)),
    Setting("database", Str(), "Watch only this database; the whole deployment when unset.",
            types=MONGO),
    Setting("replica_set", Str(), "Replica set name.", types=MONGO, aliases=("replicaSet",)),
    Setting("auth_source", Str(), "Database holding the user; the driver's default when "
            "unset.", types=MONGO),
    Setting("tls", Bool(), "Use TLS; the driver's default (or the uri's) when unset.",
            types=MONGO),
    Setting("tls_ca_file", PathKind(), "CA bundle for TLS.", types=MONGO),
    Setting("tls_certificate_key_file", PathKind(), "Client certificate and key for TLS.",
            types=MONGO),
    Setting("tls_allow_invalid_certificates", Bool(), "Skip certificate checks (testing "
            "only); the driver's default when unset.", types=MONGO),
    Setting("full_document", Choice("updateLookup", "whenAvailable", "required"),
            "`fullDocument` of the change stream (the row after an update).", "updateLookup",
            types=MONGO),
    Setting("full_document_before_change", Choice("off", "whenAvailable", "required"),
            "`fullDocumentBeforeChange` (needs MongoDB 6.0+ pre-images).", "off",
            types=MONGO),
    Setting("history_lost", Choice("fail", "restart_from_now"), "When the resume token is "
            "no longer in the oplog: stop with an error, or restart from now (skipping "
            "changes, loudly).", "fail", types=MONGO),
)

SECTIONS: Dict[str, Tuple[Setting, ...]] = {
    "": TOP_LEVEL, "log": LOG, "control": CONTROL, "http": HTTP, "supervisor": SUPERVISOR,
}


# Connection settings lead each type's table (and its options dict); the rest keep their order.
_LEADING = ("uri", "host", "port", "user", "password")


def backend_settings(backend_type: str) -> Tuple[Setting, ...]:
    """The settings of one backend type, common ones first."""
    own = [s for s in BACKEND_TYPED if backend_type in s.types]
    own.sort(key=lambda s: _LEADING.index(s.name) if s.name in _LEADING else len(_LEADING))
    return BACKEND_COMMON + tuple(own)


def backend_keys_elsewhere(backend_type: str) -> Dict[str, Tuple[str, ...]]:
    """Keys (names and aliases) valid for other backend types only -> those types.

    Lets the validator say "not a mysql setting (slot applies to postgresql backends)"
    instead of a bare "unknown key"."""
    own = {k for s in backend_settings(backend_type) for k in (s.name, *s.aliases)}
    found: Dict[str, List[str]] = {}
    for s in BACKEND_TYPED:
        for key in (s.name, *s.aliases):
            if key not in own:
                found.setdefault(key, [])
                found[key] += [t for t in s.types if t not in found[key]]
    return {k: tuple(v) for k, v in found.items()}


def all_backend_keys() -> Tuple[str, ...]:
    keys = {k for s in BACKEND_COMMON + BACKEND_TYPED for k in (s.name, *s.aliases)}
    return tuple(sorted(keys))


# --------------------------------------------------------------------------------------------
# Helpers shared with lapidus.config

_SECRET_WORDS = ("password", "passwd", "secret", "token", "seed", "nkey", "creds",
                 "credential", "apikey", "api_key", "private_key", "access_key")
_SECRET_TOKENS = {"pass", "pwd", "key"}


def is_secret_key(key: Any) -> bool:
    """Whether a key (ours or a plugin's) names a secret: password, token, NATS nkey seeds and
    credentials, API keys.  Deliberately broad: masking a harmless value costs nothing."""
    if not isinstance(key, str):
        return False
    low = key.lower()
    if any(word in low for word in _SECRET_WORDS):
        return True
    tokens = re.split(r"[_\-.]|(?<=[a-z])(?=[A-Z])", key)
    return any(t.lower() in _SECRET_TOKENS for t in tokens) and not low.endswith("_file")


def suggest(word: str, candidates: Iterable[str]) -> Optional[str]:
    """The candidate a misspelt ``word`` most likely meant, or None.

    ``authSource`` finds ``auth_source`` (same letters once case and separators are ignored)
    before difflib's similarity ranking is tried.
    """
    candidates = list(candidates)
    squash = {re.sub(r"[_\-]", "", c).lower(): c for c in candidates}
    hit = squash.get(re.sub(r"[_\-]", "", word).lower())
    if hit is not None:
        return hit
    close = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    if close:
        return close[0]
    lowered = {c.lower(): c for c in candidates}
    close = difflib.get_close_matches(word.lower(), list(lowered), n=1, cutoff=0.6)
    return lowered[close[0]] if close else None


def describe(value: Any, *, secret: bool = False) -> str:
    """How an error message shows a value: the value itself, or only its type for a secret."""
    if isinstance(value, bool):
        return "a boolean" if secret else str(value).lower()
    if isinstance(value, (int, float)):
        return "a number" if secret else repr(value)
    if isinstance(value, str):
        if secret:
            return "a string"
        return json.dumps(value if len(value) <= 60 else value[:57] + "...")
    if value is None:
        return "null"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a table"
    return f"a {type(value).__name__}"


def split_listen(text: str) -> Optional[Tuple[str, int]]:
    """``"host:port"`` or ``"[v6]:port"`` -> (host, port); None when malformed."""
    match = re.fullmatch(r"\s*(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-]+):(\d{1,5})\s*", text)
    if not match or int(match.group(2)) > 65535:
        return None
    return match.group(1).strip("[]"), int(match.group(2))


def resolve_path(text: str, ctx: Context) -> Path:
    if text == "~" or text.startswith("~/"):
        path = _home(ctx) / text[2:]
    else:
        path = Path(os.path.expanduser(text))
    return path if path.is_absolute() else ctx.base_dir / path


def _home(ctx: Context) -> Path:
    home = ctx.env.get("HOME")
    return Path(home) if home else Path.home()


def _as_int(value: Any) -> Optional[int]:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
        return int(value)
    return None


def _as_float(value: Any) -> Optional[float]:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return None
    else:
        return None
    return number if math.isfinite(number) else None


# --------------------------------------------------------------------------------------------
# Documentation

DOC_BEGIN = "<!-- BEGIN GENERATED SETTINGS (python -m lapidus.settings --write) -->"
DOC_END = "<!-- END GENERATED SETTINGS -->"


def _default_doc(setting: Setting) -> str:
    if setting.required:
        return "**required**"
    default = setting.default
    if isinstance(default, Derived):
        return default.doc
    if default is UNSET:
        return "unset"
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    if isinstance(default, int) and isinstance(setting.kind, ByteSize):
        for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
            if default % size == 0:
                return f"`{default // size}{unit}`"
    if isinstance(default, (tuple, list)):
        return "`[]`" if not default else f"`{json.dumps(list(default))}`"
    if isinstance(default, dict):
        return "`{}`" if not default else f"`{json.dumps(default)}`"
    if isinstance(default, str):
        return f'`"{default}"`'
    return f"`{default}`"


def _table(settings: Sequence[Setting], *, key_prefix: str = "") -> List[str]:
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for s in settings:
        key = f"`{key_prefix}{s.name}`"
        if s.aliases:
            key += " (alias " + ", ".join(f"`{a}`" for a in s.aliases) + ")"
        meaning = s.help + (" Secret: never logged, masked by `lapidus -t`." if s.secret else "")
        lines.append(f"| {key} | {s.kind.doc} | {_default_doc(s)} | {meaning} |")
    return lines


def render_markdown() -> str:
    """The settings reference, generated from the declarations above."""
    out: List[str] = [DOC_BEGIN, ""]

    def section(title: str, settings: Sequence[Setting], intro: str = "") -> None:
        out.extend([f"### {title}", ""])
        if intro:
            out.extend([intro, ""])
        out.extend(_table(settings))
        out.append("")

    section("Top level", TOP_LEVEL)
    section("`[log]`", LOG)
    section("`[control]`", CONTROL)
    section("`[http]`", HTTP, "Leave the table out to serve no HTTP at all.")
    section("`[supervisor]`", SUPERVISOR)
    section("`[[backends]]`: every type", BACKEND_COMMON)
    for backend_type in BACKEND_TYPES:
        own = backend_settings(backend_type)[len(BACKEND_COMMON):]
        section(f"`[[backends]]` with `type = \"{backend_type}\"`", own)
    out.extend([
        "### Plugin options", "",
        "Each entry of `plugins` (global or per backend) is a table of that plugin's options; an "
        "empty table enables the plugin with its defaults. The original Lapidus spellings "
        + ", ".join(f"`{a}` (`{c}`)" for a, c in PLUGIN_ALIASES.items())
        + " are accepted there too. Built-in plugins: "
        + ", ".join(f"`{p}`" for p in BUILTIN_PLUGINS) + "; their options are documented with "
        "each sink.", "", DOC_END])
    return "\n".join(out) + "\n"


def update_doc(path: Path) -> bool:
    """Rewrite the generated part of ``path`` in place; True when it changed."""
    text = path.read_text()
    start, end = text.index(DOC_BEGIN), text.index(DOC_END) + len(DOC_END) + 1
    new = text[:start] + render_markdown() + text[end:]
    if new != text:
        path.write_text(new)
    return new != text


if __name__ == "__main__":  # pragma: no cover - a maintainer's tool
    import sys

    if len(sys.argv) == 3 and sys.argv[1] == "--write":
        print("updated" if update_doc(Path(sys.argv[2])) else "unchanged")
    else:
        sys.stdout.write(render_markdown())
