"""The webhook plugin's options: declarations, validation and the parsed, typed form.

Runs in the supervisor and ``lapidus -t`` (:func:`validate`) and in the dispatcher
(:meth:`WebhookOptions.parse`).  Imports nothing from aiohttp, so a configuration is checked on
a host without the extra (that is reported as one problem naming ``lapidus[webhook]``).
Problems name the key, never the value: the URL may carry ``user:password@`` and ``secret``
is a secret.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Tuple
from urllib.parse import urlsplit, urlunsplit

from ..optionkit import (Option, Problems, check, file_problem, missing_extra,
                         parsed_values, url_problem as common_url_problem)

SCHEMES = ("http", "https")

OPTIONS: Dict[str, Option] = {
    "url": Option("str", None, "Where to POST: http:// or https://, user:password@ for "
                               "basic authentication."),
    "batch_size": Option("count", 100, "Events per POST, at most."),
    "secret": Option("str", None, "Key of the Lapidus-Signature HMAC-SHA256 (use ${VAR}).",
                     secret=True),
    "headers": Option("headers", {}, "Extra request headers (Authorization = \"Bearer ...\")."),
    "timeout": Option("number", 30.0, "Seconds for one POST, answer included."),
    "connect_timeout": Option("number", 5.0, "Seconds to connect."),
    "retry_max": Option("number", 30.0, "Seconds between retries, at most (Retry-After "
                                        "may ask for longer)."),
    "tls_ca_file": Option("str", None, "CA bundle for an https:// server's certificate."),
}


@dataclass(frozen=True)
class WebhookOptions:
    """Validated options, defaults applied; ``repr`` masks the secrets."""

    url: str
    batch_size: int = 100
    secret: Optional[str] = None
    headers: Dict[str, str] = field(default_factory=dict)
    timeout: float = 30.0
    connect_timeout: float = 5.0
    retry_max: float = 30.0
    tls_ca_file: Optional[str] = None

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> "WebhookOptions":
        values = parsed_values(options, OPTIONS, validate, "webhook",
                               seconds=("timeout", "connect_timeout", "retry_max"))
        values["headers"] = dict(values["headers"])
        return cls(**values)

    @property
    def target(self) -> str:
        """The URL without credentials: for logs, health and errors."""
        return redact_url(self.url)

    @property
    def credentials(self) -> Optional[Tuple[str, str]]:
        parts = urlsplit(self.url)
        if parts.username is None:
            return None
        from urllib.parse import unquote
        return unquote(parts.username), unquote(parts.password or "")

    @property
    def bare_url(self) -> str:
        """The URL to POST to, without ``user:password@`` (sent as basic auth instead)."""
        parts = urlsplit(self.url)
        netloc = parts.hostname or ""
        if ":" in netloc:
            netloc = f"[{netloc}]"
        if parts.port:
            netloc += f":{parts.port}"
        return urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, ""))

    def __repr__(self) -> str:
        return (f"WebhookOptions(url={self.target!r}, batch_size={self.batch_size}, "
                f"secret={'***' if self.secret else None}, headers={sorted(self.headers)}, "
                f"timeout={self.timeout}, connect_timeout={self.connect_timeout}, "
                f"retry_max={self.retry_max})")


def redact_url(url: str) -> str:
    """``https://u:pw@host:8443/hook?x`` -> ``https://host:8443/hook``."""
    try:
        parts = urlsplit(url)
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<unparsable URL>"
    return f"{parts.scheme}://{parts.hostname or '?'}{port}{parts.path}"


def url_problem(url: str) -> Optional[str]:
    """What is wrong with ``url``, without echoing it: the common checks, then a fragment."""
    problem = common_url_problem(url, SCHEMES, "https://host:port/path")
    if problem:
        return problem
    if urlsplit(url).fragment:
        return "has a #fragment, which is never sent to a server; remove it"
    return None


def validate(options: Mapping[str, Any], need_client: bool = True) -> Problems:
    values, problems = check(options, OPTIONS, "webhook")
    if "url" not in values and not any(key == "url" for key, _ in problems):
        problems.append(("url", "is required: the http:// or https:// address to POST to"))
    if "url" in values:
        problem = url_problem(values["url"])
        if problem:
            problems.append(("url", problem))
    if "secret" in values and not values["secret"]:
        problems.append(("secret", "is empty (an unset variable?); give a key or leave "
                                   "secret out"))
    for name in values.get("headers", {}):
        if name.lower() in ("content-type", "content-length", "idempotency-key",
                            "lapidus-signature", "host"):
            problems.append((f"headers.{name}", "is set by the webhook plugin itself"))
    if "tls_ca_file" in values:
        problem = file_problem(values["tls_ca_file"])
        if problem:
            problems.append(("tls_ca_file", problem))
    if need_client:
        problems += missing_extra("aiohttp", "aiohttp", "webhook")
    return problems
