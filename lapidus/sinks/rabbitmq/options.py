"""The rabbitmq plugin's options: declarations, validation and the parsed, typed form.

Runs in the supervisor and in ``lapidus -t`` (:func:`validate`, through ``Sink.validate``) and in
the dispatcher (:meth:`RabbitOptions.parse`).  Imports nothing from aiormq, so a configuration
can be checked where the optional dependency is missing (which is itself reported, naming
``pip install 'lapidus[rabbitmq]'``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional

from ..optionkit import (Option, Problems, check, file_problem, missing_extra, parse_into,
                         redact_url, url_problem)

URL_SCHEMES = ("amqp", "amqps")
DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/"
DEFAULT_EXCHANGE = "lapidus"
MAX_SHORTSTR = 255       # AMQP 0-9-1: exchange names and routing keys are short strings

OPTIONS: Dict[str, Option] = {
    "url": Option("str", DEFAULT_URL, "amqp:// or amqps:// URL (user, password, vhost)."),
    "exchange": Option("str", DEFAULT_EXCHANGE, "Durable topic exchange, declared if missing."),
    "mandatory": Option("bool", False, "Treat a message no queue takes as undeliverable."),
    "tls_ca_file": Option("file", None, "CA bundle for an amqps:// server's certificate."),
    "confirm_timeout": Option("number", 30.0, "Seconds to wait for a batch's confirms."),
    "connect_timeout": Option("number", 5.0, "Seconds per connection attempt."),
    "reconnect_time_wait": Option("number", 1.0, "Seconds between reconnection attempts."),
}


@dataclass(frozen=True)
class RabbitOptions:
    """Validated options with defaults applied.  ``repr`` hides the URL's credentials."""

    url: str = DEFAULT_URL
    exchange: str = DEFAULT_EXCHANGE
    mandatory: bool = False
    tls_ca_file: Optional[str] = None
    confirm_timeout: float = 30.0
    connect_timeout: float = 5.0
    reconnect_time_wait: float = 1.0

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> "RabbitOptions":
        """Options as written -> RabbitOptions; ValueError listing the problems."""
        return parse_into(cls, options, validate, "rabbitmq",
                          seconds=("confirm_timeout", "connect_timeout", "reconnect_time_wait"))

    @property
    def server(self) -> str:
        """The server as ``scheme://host:port`` (no credentials): for logs and status."""
        return redact_url(self.url)

    def __repr__(self) -> str:
        return (f"RabbitOptions(url={self.server!r}, exchange={self.exchange!r}, "
                f"mandatory={self.mandatory!r})")


def validate(options: Mapping[str, Any]) -> Problems:
    """Every problem in ``options`` as ``(key, message)``; empty when they are usable."""
    values, problems = check(options, OPTIONS, "rabbitmq")
    if "url" in values:
        problem = url_problem(values["url"], URL_SCHEMES, "amqp://user:password@host:5672/vhost")
        if problem:
            problems.append(("url", problem))
    if "exchange" in values:
        name = values["exchange"]
        if not name:
            problems.append(("exchange", 'is empty: the default exchange "" routes by queue '
                                         "name only; name a topic exchange"))
        elif name.startswith("amq."):
            problems.append(("exchange", 'names starting with "amq." are reserved by the '
                                         "broker; choose another"))
        elif len(name.encode()) > MAX_SHORTSTR or any(not (c.isalnum() or c in "-_.:")
                                                      for c in name):
            problems.append(("exchange", "may hold letters, digits, -, _, . and : only, at "
                                         "most 255 bytes"))
    if "tls_ca_file" in values:
        problem = file_problem(values["tls_ca_file"])
        if problem:
            problems.append(("tls_ca_file", problem))
    problems += missing_extra("aiormq", "aiormq", "rabbitmq")
    return problems
