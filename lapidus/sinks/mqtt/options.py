"""The mqtt plugin's options: declarations, validation and the parsed, typed form.

Runs in the supervisor and ``lapidus -t`` (:func:`validate`) and in the dispatcher
(:meth:`MqttOptions.parse`).  Imports nothing from aiomqtt or paho-mqtt, so a configuration is
checked on a host without the extra (reported as one problem naming ``lapidus[mqtt]``).
Problems name the key, never the value: the URL may carry ``user:password@``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional
from urllib.parse import unquote, urlsplit

from ..optionkit import (Option, Problems, check, file_problem, missing_extra,
                         parsed_values, url_problem as common_url_problem)
from .topics import check_prefix

SCHEMES = {"mqtt": 1883, "mqtts": 8883}

OPTIONS: Dict[str, Option] = {
    "url": Option("str", "mqtt://127.0.0.1:1883", "mqtt://[user:password@]host[:port] or "
                                                  "mqtts://... (TLS)."),
    "topic_prefix": Option("str", "lapidus", "First topic level(s): <prefix>/schema/table/key."),
    "qos": Option("choice", 1, "1: confirmed by the broker's PUBACK; 0: at most once.",
                  choices=(0, 1)),
    "protocol": Option("choice", "auto", '"5", "3.1.1", or "auto" (5, else 3.1.1).',
                       choices=("auto", "5", "3.1.1")),
    "client_id": Option("str", None, 'Client identifier; default "lapidus-<backend>".'),
    "keepalive": Option("count", 15, "Seconds between PINGREQs: a silently dead connection "
                                     "is noticed within 1.5 times this."),
    "connect_timeout": Option("number", 5.0, "Seconds to connect."),
    "max_inflight": Option("count", 1024, "Publishes awaiting their PUBACK, at most (and at "
                                          "most the broker's Receive Maximum)."),
    "ack_timeout": Option("number", 30.0, "Seconds without a PUBACK while publishes await "
                                          "one; then the connection is dropped and they are "
                                          "sent again on a new one."),
    "tls_ca_file": Option("str", None, "CA bundle for an mqtts:// broker's certificate."),
}


@dataclass(frozen=True)
class MqttOptions:
    """Validated options, defaults applied; ``repr`` masks the credentials."""

    url: str = "mqtt://127.0.0.1:1883"
    topic_prefix: str = "lapidus"
    qos: int = 1
    protocol: str = "auto"
    client_id: Optional[str] = None
    keepalive: int = 15
    connect_timeout: float = 5.0
    max_inflight: int = 1024
    ack_timeout: float = 30.0
    tls_ca_file: Optional[str] = None

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> "MqttOptions":
        return cls(**parsed_values(options, OPTIONS, validate, "mqtt",
                                   seconds=("connect_timeout", "ack_timeout")))

    @property
    def tls(self) -> bool:
        return urlsplit(self.url).scheme == "mqtts"

    @property
    def host(self) -> str:
        return urlsplit(self.url).hostname or "127.0.0.1"

    @property
    def port(self) -> int:
        parts = urlsplit(self.url)
        return parts.port or SCHEMES[parts.scheme]

    @property
    def username(self) -> Optional[str]:
        user = urlsplit(self.url).username
        return None if user is None else unquote(user)

    @property
    def password(self) -> Optional[str]:
        password = urlsplit(self.url).password
        return None if password is None else unquote(password)

    @property
    def target(self) -> str:
        """``scheme://host:port``: the broker without credentials, for logs and health."""
        return f"{urlsplit(self.url).scheme}://{self.host}:{self.port}"

    def __repr__(self) -> str:
        return (f"MqttOptions(url={self.target!r}, topic_prefix={self.topic_prefix!r}, "
                f"qos={self.qos}, protocol={self.protocol!r}, client_id={self.client_id!r})")


def url_problem(url: str) -> Optional[str]:
    """What is wrong with ``url``, without echoing it: the common checks, then MQTT's own."""
    problem = common_url_problem(url, SCHEMES, "mqtt://host:1883 (mqtts:// for TLS)")
    if problem:
        return problem
    parts = urlsplit(url)
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return ("has a path, query or fragment after the host (expected mqtt://host:1883; "
                "topics are set with topic_prefix)")
    if parts.password is not None and parts.username is None:
        return "has a password without a user name"
    return None


def validate(options: Mapping[str, Any], need_client: bool = True) -> Problems:
    values, problems = check(options, OPTIONS, "mqtt")
    if "url" in values:
        problem = url_problem(values["url"])
        if problem:
            problems.append(("url", problem))
    if "topic_prefix" in values:
        problem = check_prefix(values["topic_prefix"])
        if problem:
            problems.append(("topic_prefix", problem))
    if "client_id" in values and not values["client_id"]:
        problems.append(("client_id", "is empty; give an identifier or leave client_id out"))
    if "tls_ca_file" in values:
        problem = file_problem(values["tls_ca_file"])
        if problem:
            problems.append(("tls_ca_file", problem))
    if need_client:
        problems += missing_extra("aiomqtt", "aiomqtt", "mqtt")
    return problems
