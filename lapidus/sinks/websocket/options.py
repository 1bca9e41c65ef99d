"""The websocket plugin's options: declarations, validation and the parsed, typed form.

Runs in the supervisor and ``lapidus -t`` (:func:`validate`) and in the dispatcher
(:meth:`WebsocketOptions.parse`).  Imports nothing from websockets, so a configuration is
checked on a host without the extra (that is reported as one problem naming
``lapidus[websocket]``).  Problems never echo a token.

``tokens`` takes two shapes, mixed freely::

    tokens = ["${WS_TOKEN}"]                                  # every subject
    [[plugins.websocket.tokens]]                              # only these subjects
    token = "${PARTNER_TOKEN}"
    subjects = ["public.orders.>"]
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

from ...settings.kinds import _listen_hint, split_listen
from ..optionkit import Option, Problems, check, file_problem, missing_extra, parsed_values
from .patterns import pattern_problem

DEFAULT_LISTEN = "127.0.0.1:8765"

OPTIONS: Dict[str, Option] = {
    "listen": Option("str", DEFAULT_LISTEN, '"host:port" to accept websocket clients on.'),
    "path": Option("str", "/events", "The URL path clients connect to."),
    "tokens": Option("custom", [], "Bearer tokens; a table {token, subjects} limits one.",
                     secret=True),
    "origins": Option("strings", None, "Origin header values browsers may connect from."),
    "tls_cert_file": Option("file", None, "Certificate chain (PEM) for wss://."),
    "tls_key_file": Option("file", None, "Private key (PEM) of tls_cert_file."),
    "replay_events": Option("count", 100_000, "Recent events kept per backend for after=."),
    "replay_bytes": Option("count", 256 << 20, "Bytes of recent events kept per backend."),
    "max_clients": Option("count", 1000, "Clients connected at once, at most."),
    "client_max_lag": Option("count", None, "Events a client may fall behind before it is "
                                            "closed (1008); default: the replay window."),
    "ping_interval": Option("number", 20.0, "Seconds between pings to each client."),
    "ping_timeout": Option("number", 20.0, "Seconds to wait for a pong before closing."),
}


@dataclass(frozen=True)
class Grant:
    """One accepted token and the subject patterns it may receive (None: all)."""

    token: str
    subjects: Optional[Tuple[str, ...]] = None

    def __repr__(self) -> str:
        return f"Grant(token=***, subjects={self.subjects!r})"


@dataclass(frozen=True)
class WebsocketOptions:
    """Validated options, defaults applied; ``repr`` masks the tokens."""

    host: str
    port: int
    path: str = "/events"
    grants: Tuple[Grant, ...] = ()
    origins: Optional[Tuple[str, ...]] = None
    tls_cert_file: Optional[str] = None
    tls_key_file: Optional[str] = None
    replay_events: int = 100_000
    replay_bytes: int = 256 << 20
    max_clients: int = 1000
    client_max_lag: Optional[int] = None
    ping_interval: float = 20.0
    ping_timeout: float = 20.0
    listen: str = DEFAULT_LISTEN

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> "WebsocketOptions":
        values = parsed_values(options, OPTIONS, validate, "websocket",
                               seconds=("ping_interval", "ping_timeout"))
        host, port = split_listen(values.pop("listen"))
        grants = tuple(_grant(item) for item in values.pop("tokens"))
        origins = values.pop("origins")
        return cls(host=host, port=port, grants=grants,
                   origins=None if origins is None else tuple(origins),
                   listen=options.get("listen") or DEFAULT_LISTEN, **values)

    @property
    def scheme(self) -> str:
        return "wss" if self.tls_cert_file else "ws"

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}{self.path}"

    def __repr__(self) -> str:
        return (f"WebsocketOptions(url={self.url!r}, tokens={len(self.grants)}, "
                f"origins={self.origins!r}, replay_events={self.replay_events}, "
                f"max_clients={self.max_clients})")


def _grant(item: Any) -> Grant:
    if isinstance(item, str):
        return Grant(item)
    subjects = item.get("subjects")
    return Grant(item["token"], None if subjects is None else tuple(subjects))


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def token_problems(tokens: Any) -> Problems:
    """Problems of the ``tokens`` list; a None token is a secret whose variable is unset
    (``lapidus -t``) and is not checked."""
    if not isinstance(tokens, list):
        return [("tokens", 'expected a list of tokens: ["${WS_TOKEN}"], or tables '
                           '{token = "...", subjects = ["public.orders.>"]}')]
    problems: Problems = []
    seen = set()
    for index, item in enumerate(tokens):
        where = f"tokens[{index}]"
        if isinstance(item, Mapping):
            unknown = sorted(set(item) - {"token", "subjects"})
            if unknown:
                problems.append((f"{where}.{unknown[0]}", 'unknown key; a token table has '
                                                          '"token" and "subjects"'))
            if "token" not in item:
                problems.append((where, 'has no "token"'))
            token = item.get("token")
            subjects = item.get("subjects")
            if subjects is not None:
                if not isinstance(subjects, list) or not subjects:
                    problems.append((f"{where}.subjects", "expected a non-empty list of subject "
                                                          'patterns such as ["public.orders.>"]'))
                else:
                    for n, pattern in enumerate(subjects):
                        problem = pattern_problem(pattern)
                        if problem:
                            problems.append((f"{where}.subjects[{n}]", problem))
        else:
            token = item
        if token is None:
            continue
        if not isinstance(token, str):
            problems.append((where, "expected a string (the token) or a table {token, "
                                    "subjects}"))
        elif len(token) < 16:
            problems.append((where, "is shorter than 16 characters (an unset variable?); "
                                    "use a long random token, e.g. from "
                                    "openssl rand -hex 32"))
        elif any(ch.isspace() or not ch.isprintable() for ch in token):
            problems.append((where, "contains whitespace or a control character"))
        elif token in seen:
            problems.append((where, "is given twice; give each token once"))
        else:
            seen.add(token)
    return problems


def validate(options: Mapping[str, Any], need_client: bool = True) -> Problems:
    values, problems = check(options, OPTIONS, "websocket")
    listen = values.get("listen", DEFAULT_LISTEN)
    parts = split_listen(listen) if "listen" in values else split_listen(DEFAULT_LISTEN)
    if parts is None:
        hint = _listen_hint(listen)
        problems.append(("listen", 'expected "host:port", such as "127.0.0.1:8765" or '
                                   '"0.0.0.0:8765"' + (f" ({hint})" if hint else "")))
    if "path" in values and (not values["path"].startswith("/") or "?" in values["path"]
                             or any(ch.isspace() for ch in values["path"])):
        problems.append(("path", 'expected a URL path starting with "/", without "?" or '
                                 'spaces, such as "/events"'))
    tokens = values.get("tokens", [])
    problems += token_problems(tokens)
    if parts is not None and not _is_loopback(parts[0]) and isinstance(tokens, list) \
            and not tokens:
        problems.append(("tokens", f"are required when listen is not a loopback address "
                                   f"({parts[0]}): anyone who reaches the port would read "
                                   f"every event; give tokens = [\"${{WS_TOKEN}}\"], or "
                                   f"listen on 127.0.0.1"))
    for key in ("tls_cert_file", "tls_key_file"):
        if key in values:
            problem = file_problem(values[key])
            if problem:
                problems.append((key, problem))
    if ("tls_cert_file" in values) != ("tls_key_file" in values):
        given, missing = (("tls_cert_file", "tls_key_file") if "tls_cert_file" in values
                          else ("tls_key_file", "tls_cert_file"))
        problems.append((missing, f"is required with {given}: wss:// needs both the "
                                  f"certificate and its key"))
    for n, origin in enumerate(values.get("origins") or []):
        if "://" not in origin or origin.endswith("/"):
            problems.append((f"origins[{n}]", 'expected an origin as browsers send it: '
                                              '"https://app.example.com" (scheme://host[:port], '
                                              'no path, no trailing "/")'))
    if need_client:
        problems += missing_extra("websockets", "websockets", "websocket")
    return problems
