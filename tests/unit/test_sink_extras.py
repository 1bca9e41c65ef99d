"""A sink whose client library cannot be imported fails to start with one message naming the
import error and the ``pip install`` line of its extra (lapidus.sinks.optionkit), kept as the
sink's last error for ``lapidusctl status``.  The libraries are installed here: the import is
made to fail."""

from __future__ import annotations

import asyncio
import sys

import pytest

from lapidus.sinks.base import SinkError
from lapidus.sinks.rabbitmq import RabbitmqSink
from lapidus.sinks.redis import RedisSink
from lapidus.sinks.websocket import WebsocketSink

SINKS = [("redis", RedisSink, "lapidus.sinks.redis.connection", {}),
         ("rabbitmq", RabbitmqSink, "lapidus.sinks.rabbitmq.connection", {}),
         ("websocket", WebsocketSink, "lapidus.sinks.websocket.server", {})]


@pytest.mark.parametrize("name, cls, module, options", SINKS, ids=[s[0] for s in SINKS])
def test_a_missing_client_library_names_the_extra(monkeypatch, name, cls, module, options):
    monkeypatch.setitem(sys.modules, module, None)      # "import" of it raises ImportError
    sink = cls(options, "shop")
    with pytest.raises(SinkError) as caught:
        asyncio.run(sink.start())
    message = str(caught.value)
    assert message.startswith(f"{name} sink cannot start: ")
    assert message.endswith(f"Fix: pip install 'lapidus[{name}]' into Lapidus's environment")
    assert sink.health()["last_error"] == message
