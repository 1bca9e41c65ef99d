"""The nats plugin's options: declarations, validation and the parsed, typed form.

Runs in the supervisor and in ``lapidus -t`` (:func:`validate`, through ``Sink.validate``) and in
the dispatcher (:meth:`NatsOptions.parse`).  Imports nothing from nats-py, so a configuration can
be checked on a host where the optional dependency is missing (that itself is reported).

Validation never echoes a value that may be secret: server URLs can carry ``user:password@``,
so problems name the key and the position in the list, not the value.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import ipaddress
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple
from urllib.parse import urlsplit

from ...settings import suggest
from .. import subjects

Problems = List[Tuple[str, str]]

#: Original Lapidus spellings.  lapidus.config already maps them before a sink sees its
#: options; the sink accepts them too, for options handed over by code (tests, embedding).
ALIASES: Dict[str, str] = {"publishEventData": "publish_event_data",
                           "cachePrefix": "cache_prefix"}

URL_SCHEMES = ("nats", "tls", "ws", "wss")
DEFAULT_SERVER = "nats://127.0.0.1:4222"


@dataclass(frozen=True)
class Option:
    kind: str            # str | strs | bool | number | count | file
    default: Any
    help: str
    secret: bool = False


OPTIONS: Dict[str, Option] = {
    "server": Option("str", None, "One server URL (the original Lapidus key)."),
    "servers": Option("strs", None, "Server URLs of one cluster; default nats://127.0.0.1:4222."),
    "name": Option("str", None, 'Connection name; default "lapidus:<backend>".'),
    "user": Option("str", None, "User name (with password)."),
    "password": Option("str", None, "Password (with user).", secret=True),
    "token": Option("str", None, "Authentication token.", secret=True),
    "nkeys_seed": Option("file", None, "File holding an NKey seed (needs the nkeys package)."),
    "credentials": Option("file", None, "A .creds file: JWT plus NKey seed (needs nkeys)."),
    "tls_ca_file": Option("file", None, "CA bundle to verify the server's certificate."),
    "tls_cert_file": Option("file", None, "Client certificate (with tls_key_file)."),
    "tls_key_file": Option("file", None, "Client private key (with tls_cert_file)."),
    "tls_hostname": Option("str", None, "Host name expected in the server's certificate."),
    "subject_prefix": Option("str", "", 'Prepended to every subject with a ".".'),
    "subject_template": Option("str", None, "Subject layout; default {schema}.{table}.{key}."),
    "publish_event_data": Option("bool", True, "false publishes empty payloads (original)."),
    "cache_prefix": Option("str", None, "Also publish <prefix><verb>.<subject>."),
    "jetstream": Option("bool", False, "Publish to JetStream and wait for its acks."),
    "stream": Option("str", None, "JetStream stream to create when missing."),
    "subjects": Option("strs", None, "Subjects of the created stream; default <prefix>.>."),
    "duplicate_window": Option("number", 120.0, "Seconds JetStream remembers Nats-Msg-Id."),
    "max_pending_acks": Option("count", 4096, "JetStream publishes awaiting their ack, at most."),
    "ack_timeout": Option("number", 5.0, "Seconds without any ack before unacked are resent."),
    "flush_timeout": Option("number", 10.0, "Seconds to wait for the server's PONG (core)."),
    "connect_timeout": Option("number", 2.0, "Seconds per connection attempt."),
    "reconnect_time_wait": Option("number", 2.0, "Seconds between reconnection attempts."),
}


@dataclass(frozen=True)
class NatsOptions:
    """Validated options with defaults applied.  ``repr`` masks the secrets."""

    servers: Tuple[str, ...] = (DEFAULT_SERVER,)
    name: Optional[str] = None
    user: Optional[str] = None
    password: Optional[str] = None
    token: Optional[str] = None
    nkeys_seed: Optional[str] = None
    credentials: Optional[str] = None
    tls_ca_file: Optional[str] = None
    tls_cert_file: Optional[str] = None
    tls_key_file: Optional[str] = None
    tls_hostname: Optional[str] = None
    subject_prefix: str = ""
    subject_template: Optional[str] = None
    publish_event_data: bool = True
    cache_prefix: Optional[str] = None
    jetstream: bool = False
    stream: Optional[str] = None
    subjects: Tuple[str, ...] = ()
    duplicate_window: float = 120.0
    max_pending_acks: int = 4096
    ack_timeout: float = 5.0
    flush_timeout: float = 10.0
    connect_timeout: float = 2.0
    reconnect_time_wait: float = 2.0

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> "NatsOptions":
        """Options as written -> NatsOptions; ValueError listing the problems."""
        problems = validate(options)
        if problems:
            raise ValueError("invalid nats plugin options: " + "; ".join(
                f"{key}: {message}" if key else message for key, message in problems))
        # null (JSON) means "the default", as in validate()
        values = {ALIASES.get(k, k): v for k, v in options.items() if v is not None}
        server = values.pop("server", None)
        servers = values.pop("servers", None)
        if server is not None:
            servers = [server]
        elif isinstance(servers, str):
            servers = [servers]
        values["servers"] = tuple(servers) if servers else (DEFAULT_SERVER,)
        if values.get("subjects") is not None:
            values["subjects"] = tuple([values["subjects"]] if isinstance(values["subjects"], str)
                                       else values["subjects"])
        else:
            values.pop("subjects", None)
        for key in ("duplicate_window", "ack_timeout", "flush_timeout", "connect_timeout",
                    "reconnect_time_wait"):
            if key in values:
                values[key] = float(values[key])
        return cls(**values)

    @property
    def stream_subjects(self) -> Tuple[str, ...]:
        """What a created stream captures: ``subjects``, else everything under the prefix."""
        if self.subjects:
            return self.subjects
        return (f"{self.subject_prefix}.>",) if self.subject_prefix else ()

    def __repr__(self) -> str:
        shown = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for key, option in OPTIONS.items():
            if option.secret and shown.get(key):
                shown[key] = "***"
        shown["servers"] = tuple(redact_url(s) for s in self.servers)
        return "NatsOptions(" + ", ".join(f"{k}={v!r}" for k, v in shown.items()) + ")"


def redact_url(url: str) -> str:
    """``nats://user:pw@host:4222`` -> ``nats://host:4222``: safe for logs and messages."""
    try:
        parts = urlsplit(url if "://" in url else f"nats://{url}")
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<unparsable URL>"
    return f"{parts.scheme}://{host}{port}"


# --------------------------------------------------------------------------------------------
# Validation


def _type_problem(kind: str, value: Any) -> Optional[str]:
    if kind in ("str", "file"):
        return None if isinstance(value, str) else f"expected a string, got {_describe(value)}"
    if kind == "strs":
        if isinstance(value, str):
            return None
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            return None
        return f"expected a non-empty list of strings, got {_describe(value)}"
    if kind == "bool":
        return (None if isinstance(value, bool)
                else f"expected true or false, got {_describe(value)}")
    if kind == "number":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"expected a number of seconds, got {_describe(value)}"
        return None if value > 0 else f"must be greater than 0, got {value}"
    if kind == "count":
        if isinstance(value, bool) or not isinstance(value, int):
            return f"expected a whole number, got {_describe(value)}"
        return None if value >= 1 else f"must be at least 1, got {value}"
    raise AssertionError(kind)


def _describe(value: Any) -> str:
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string",
             list: "a list", dict: "a table", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _url_problem(url: str) -> Optional[str]:
    """What is wrong with a server URL, without echoing it (it may hold a password)."""
    if "://" not in url:
        # nats-py reads a bare "host" or "host:port" as nats://; anything with a slash is a
        # URL with a broken scheme separator ("nats//host", "tls:/host").
        if "/" in url or not url.strip():
            return ('is not a URL: expected scheme://host:port, as nats://host:4222 (is ":" '
                    'or "//" missing after the scheme?)')
    try:
        parts = urlsplit(url if "://" in url else f"nats://{url}")
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError:
        return "is not a valid URL (expected nats://host:4222; is the port a number?)"
    if parts.scheme not in URL_SCHEMES:
        return (f'has the scheme "{parts.scheme}"; expected one of '
                + ", ".join(f"{s}://" for s in URL_SCHEMES))
    if not parts.hostname:
        return "has no host (expected nats://host:4222)"
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return "has a path, query or fragment after the host (expected nats://host:4222)"
    return None


#: schemes that carry the connection in plain text (unless the server itself requires TLS)
PLAIN_SCHEMES = ("nats", "ws")


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine without the network (no DNS look-up)."""
    if host.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def plaintext_credentials(options: "NatsOptions") -> Tuple[List[str], List[str]]:
    """``(credential kinds, servers)``: the credentials configured (user/password, token,
    nkey, creds, or a password in a URL) and the servers, redacted, they would go to over a
    plain-text scheme on a host other than loopback; two empty lists when none do."""
    kinds = [kind for kind, given in (("user/password", options.user is not None),
                                      ("token", options.token is not None),
                                      ("nkeys_seed", options.nkeys_seed is not None),
                                      ("credentials", options.credentials is not None)) if given]
    servers = []
    in_url = False
    for url in options.servers:
        try:
            parts = urlsplit(url if "://" in url else f"nats://{url}")
            host = parts.hostname or ""
        except ValueError:
            continue
        if parts.scheme not in PLAIN_SCHEMES or is_loopback(host):
            continue
        if kinds or parts.username or parts.password:
            servers.append(redact_url(url))
            in_url = in_url or bool(parts.username or parts.password)
    if in_url:
        kinds.append("user/password in the URL")
    return (kinds, servers) if servers else ([], [])


def _file_problem(path: str) -> Optional[str]:
    if not os.path.isfile(path):
        return "no such file (give the path of an existing file)"
    if not os.access(path, os.R_OK):
        return "the file is not readable by this user"
    return None


def validate(options: Mapping[str, Any]) -> Problems:
    """Every problem in ``options`` as ``(key, message)``; empty when they are usable."""
    problems: Problems = []
    values: Dict[str, Any] = {}
    for key, value in options.items():
        name = ALIASES.get(key, key)
        if name not in OPTIONS:
            near = suggest(key, [*OPTIONS, *ALIASES]) if isinstance(key, str) else None
            hint = f' (did you mean "{near}"?)' if near else ""
            problems.append((key, f"unknown option for the nats plugin{hint}"))
            continue
        if name in values:
            problems.append((key, f'"{key}" is another name for "{name}", which is also given; '
                                  f"keep only one of them"))
            continue
        if value is None:
            continue     # JSON null: the default
        problem = _type_problem(OPTIONS[name].kind, value)
        if problem:
            problems.append((key, problem))
            continue
        values[name] = value
    _check_relations(values, problems)
    if importlib.util.find_spec("nats") is None:
        problems.append(("", "needs the nats-py package, which is not installed "
                             "(pip install 'lapidus[nats]')"))
    return problems


def _check_relations(values: Dict[str, Any], problems: Problems) -> None:
    """Checks that involve the values, once each has its right type."""
    if "server" in values and "servers" in values:
        problems.append(("servers", 'give either "server" (one URL) or "servers" (a list), '
                                    "not both"))
    for key in ("server", "servers"):
        if key in values:
            urls = [values[key]] if isinstance(values[key], str) else values[key]
            for index, url in enumerate(urls):
                problem = _url_problem(url)
                if problem:
                    where = key if isinstance(values[key], str) else f"{key}[{index}]"
                    problems.append((where, problem))
    for key, option in OPTIONS.items():
        if option.kind == "file" and key in values:
            problem = _file_problem(values[key])
            if problem:
                problems.append((key, problem))
    if "password" in values and "user" not in values:
        problems.append(("password", 'given without "user"; add user'))
    auth = [k for k in ("user", "token", "nkeys_seed", "credentials") if k in values]
    if len(auth) > 1 and auth != ["user"]:
        problems.append((auth[1], f"choose one way to authenticate ({', '.join(auth)} are all "
                                  f"given)"))
    if ("tls_cert_file" in values) != ("tls_key_file" in values):
        missing = "tls_key_file" if "tls_cert_file" in values else "tls_cert_file"
        problems.append((missing, "tls_cert_file and tls_key_file go together; add " + missing))
    if ("nkeys_seed" in values or "credentials" in values) and \
            importlib.util.find_spec("nkeys") is None:
        key = "nkeys_seed" if "nkeys_seed" in values else "credentials"
        problems.append((key, "needs the nkeys package, which is not installed "
                              "(pip install nkeys)"))
    prefix = values.get("subject_prefix")
    if prefix:
        problem = subjects.check_subject_part(prefix)
        if problem:
            problems.append(("subject_prefix", problem))
    if "subject_template" in values:
        problem = subjects.check_template(values["subject_template"])
        if problem:
            problems.append(("subject_template", problem))
    if "cache_prefix" in values:
        # Checked with the verb it is glued to: "cache." is the usual form.
        problem = subjects.check_subject_part(values["cache_prefix"] + "purge")
        if problem:
            problems.append(("cache_prefix", problem))
    _check_jetstream(values, problems)


def _check_jetstream(values: Dict[str, Any], problems: Problems) -> None:
    if not values.get("jetstream", False):
        for key in ("stream", "subjects", "duplicate_window", "max_pending_acks", "ack_timeout"):
            if key in values:
                problems.append((key, "applies to JetStream only; set jetstream = true or "
                                      "remove it"))
        return
    if "subjects" in values and "stream" not in values:
        problems.append(("subjects", 'names the subjects of a stream to create; add "stream"'))
    if "stream" in values:
        name = values["stream"]
        if not name or any(ch in name for ch in ".*> \t\r\n/\\"):
            problems.append(("stream", 'a stream name cannot be empty or contain ".", "*", ">", '
                                       "whitespace or slashes"))
        elif "subjects" not in values and not values.get("subject_prefix"):
            problems.append(("stream", "a stream to create needs its subjects: set subjects "
                                       '(e.g. ["cdc.>"]) or a subject_prefix (then "<prefix>.>")'))
        stream_subjects = values.get("subjects")
        if isinstance(stream_subjects, str):
            stream_subjects = [stream_subjects]
        for index, subject in enumerate(stream_subjects or ()):
            if not subject or any(ch.isspace() for ch in subject):
                problems.append((f"subjects[{index}]", "must be a subject without whitespace"))
