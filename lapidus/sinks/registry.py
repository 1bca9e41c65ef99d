"""Find sink classes through the ``lapidus.plugins`` entry-point group.

Built-in sinks register in Lapidus's own pyproject.toml exactly like third-party ones would in
theirs.  Runs in the supervisor (validation) and in the dispatcher (instantiation).
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Dict, Type

from .base import Sink

GROUP = "lapidus.plugins"

# Used when the package metadata is not installed (running from a source tree).
BUILTIN = {"stdout": "lapidus.sinks.stdout:StdoutSink",
           "nats": "lapidus.sinks.nats:NatsSink",
           "exec": "lapidus.sinks.exec:ExecSink",
           "redis": "lapidus.sinks.redis:RedisSink",
           "rabbitmq": "lapidus.sinks.rabbitmq:RabbitmqSink",
           "webhook": "lapidus.sinks.webhook:WebhookSink",
           "mqtt": "lapidus.sinks.mqtt:MqttSink",
           "sync": "lapidus.sinks.sync:SyncSink",
           "websocket": "lapidus.sinks.websocket:WebsocketSink"}


def available() -> Dict[str, str]:
    """Plugin name -> "module:Class" for every registered sink."""
    found = dict(BUILTIN)
    for ep in entry_points(group=GROUP):
        found[ep.name] = ep.value
    return found


def load(name: str) -> Type[Sink]:
    target = available().get(name)
    if target is None:
        known = ", ".join(sorted(available()))
        raise KeyError(f'unknown plugin "{name}" (installed: {known})')
    module_name, _, attr = target.partition(":")
    module = __import__(module_name, fromlist=[attr])
    return getattr(module, attr)


def validators() -> Dict[str, object]:
    """Plugin name -> callable(options) returning (key, message) problems, for the config check."""
    out = {}
    for name in available():
        try:
            out[name] = load(name).validate
        except Exception as exc:  # a broken third-party plugin is itself a config problem
            out[name] = (lambda exc: lambda options: [("", f"cannot load plugin: {exc}")])(exc)
    return out
