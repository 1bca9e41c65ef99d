"""The redis plugin's options: declarations, validation and the parsed, typed form.

Runs in the supervisor and in ``lapidus -t`` (:func:`validate`, through ``Sink.validate``) and in
the dispatcher (:meth:`RedisOptions.parse`).  Imports nothing from redis-py, so a configuration
can be checked where the optional dependency is missing (which is itself reported, naming
``pip install 'lapidus[redis]'``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional

from ..optionkit import (Option, Problems, check, file_problem, missing_extra, parse_into,
                         redact_url, url_problem)
from ..subjects import placeholders_problem

URL_SCHEMES = ("redis", "rediss")
DEFAULT_URL = "redis://127.0.0.1:6379"
DEFAULT_STREAM = "lapidus:{backend}"
STREAM_PLACEHOLDERS = ("backend", "schema", "table")

OPTIONS: Dict[str, Option] = {
    "url": Option("str", DEFAULT_URL, "redis:// or rediss:// URL; password as ${VAR}."),
    "stream": Option("str", DEFAULT_STREAM, "Stream key template: {backend} {schema} {table}."),
    "maxlen": Option("count", None, "Trim each stream to about this many entries (MAXLEN ~)."),
    "tls_ca_file": Option("file", None, "CA bundle for a rediss:// server's certificate."),
    "connect_timeout": Option("number", 2.0, "Seconds per connection attempt."),
    "reply_timeout": Option("number", 10.0, "Seconds to wait for the server's replies."),
    "reconnect_time_wait": Option("number", 1.0, "Seconds between reconnection attempts."),
}


@dataclass(frozen=True)
class RedisOptions:
    """Validated options with defaults applied.  ``repr`` hides the URL's credentials."""

    url: str = DEFAULT_URL
    stream: str = DEFAULT_STREAM
    maxlen: Optional[int] = None
    tls_ca_file: Optional[str] = None
    connect_timeout: float = 2.0
    reply_timeout: float = 10.0
    reconnect_time_wait: float = 1.0

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> "RedisOptions":
        """Options as written -> RedisOptions; ValueError listing the problems."""
        return parse_into(cls, options, validate, "redis",
                          seconds=("connect_timeout", "reply_timeout", "reconnect_time_wait"))

    @property
    def server(self) -> str:
        """The server as ``scheme://host:port`` (no credentials): for logs and status."""
        return redact_url(self.url)

    def __repr__(self) -> str:
        return (f"RedisOptions(url={self.server!r}, stream={self.stream!r}, "
                f"maxlen={self.maxlen!r})")


def check_stream_template(template: str) -> Optional[str]:
    """Why ``template`` is not a usable ``stream``, or None."""
    problem = placeholders_problem(template, STREAM_PLACEHOLDERS)
    if problem:
        return problem
    if not template.strip():
        return "is empty"
    return None


def validate(options: Mapping[str, Any]) -> Problems:
    """Every problem in ``options`` as ``(key, message)``; empty when they are usable."""
    values, problems = check(options, OPTIONS, "redis")
    if "url" in values:
        problem = url_problem(values["url"], URL_SCHEMES, "redis://host:6379/0")
        if problem:
            problems.append(("url", problem))
    if "stream" in values:
        problem = check_stream_template(values["stream"])
        if problem:
            problems.append(("stream", problem))
    if "tls_ca_file" in values:
        problem = file_problem(values["tls_ca_file"])
        if problem:
            problems.append(("tls_ca_file", problem))
    problems += missing_extra("redis", "redis", "redis")
    return problems
