"""Find sink classes through the ``lapidus.plugins`` entry-point group.

Built-in sinks register in Lapidus's own pyproject.toml exactly like third-party ones would in
theirs.  Runs in the supervisor (validation) and in the dispatcher (instantiation).
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Dict, Iterator, Type

from ..config.plugins import PluginValidator
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


def validators() -> Mapping[str, PluginValidator]:
    """Plugin name -> callable(options) returning (key, message) problems, for the config check.

    A plugin's module is imported only when the configuration names it: the supervisor forks
    every worker from its own image, so a module it imports is mapped into every worker."""
    return _Validators(available())


class _Validators(Mapping):
    """Every registered plugin's name; its validator loaded on first lookup."""

    def __init__(self, names: Dict[str, str]):
        self.names = names
        self.loaded: Dict[str, PluginValidator] = {}

    def __getitem__(self, name: str) -> PluginValidator:
        if name not in self.names:
            raise KeyError(name)
        if name not in self.loaded:
            try:
                self.loaded[name] = load(name).validate
            except Exception as exc:  # a broken third-party plugin is itself a config problem
                self.loaded[name] = (lambda exc: lambda options: [
                    ("", f"cannot load plugin: {exc}")])(exc)
        return self.loaded[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)
