"""The nats sink refuses a nats-py without the internals its delivery guarantee rests on."""

from __future__ import annotations

import asyncio

import nats.aio.client
import pytest

from lapidus.sinks.base import SinkError
from lapidus.sinks.nats import NatsSink, compat


class ClientWithout(nats.aio.client.Client):
    """A nats-py client as a future release might have it: one internal renamed."""

    missing = "_pongs"

    def __init__(self):
        super().__init__()
        delattr(self, self.missing)


def test_the_installed_nats_py_has_every_internal():
    async def fresh():
        return compat.missing_internals(nats.aio.client.Client())
    assert asyncio.run(fresh()) == []


@pytest.mark.parametrize("missing", ["_pongs", "_pending", "_ps"])
def test_a_missing_internal_stops_the_sink_at_start_with_the_fix(monkeypatch, missing):
    monkeypatch.setattr(ClientWithout, "missing", missing)
    monkeypatch.setattr("lapidus.sinks.nats.connection.Client", ClientWithout)

    async def start():
        sink = NatsSink({"servers": ["nats://127.0.0.1:1"]}, "shop")
        with pytest.raises(compat.UnsupportedNatsPy) as info:
            await sink.start()
        assert sink.connection is None          # nothing connects with such a client
        # every batch says the same, as a SinkError the dispatcher reports and retries
        with pytest.raises(compat.UnsupportedNatsPy):
            await sink.send([])
        state = sink.health()            # lapidusctl status shows it
        assert state["connected"] is False and "lacks internals" in state["last_error"]
        await sink.close()
        return str(info.value)

    message = asyncio.run(start())
    assert issubclass(compat.UnsupportedNatsPy, SinkError)
    assert "lacks internals" in message and missing in message
    assert compat.SUPPORTED in message and "pip install 'nats-py~=2.16.0'" in message


def test_a_parser_without_its_buffer_is_named():
    class Bare:
        pass
    client = Bare()
    for name in compat.REQUIRED:
        setattr(client, name, None)
    client._ps = Bare()
    assert compat.missing_internals(client) == ["_ps.buf", "_ps.state", "_ps.parse"]
