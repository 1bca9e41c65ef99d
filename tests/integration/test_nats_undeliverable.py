"""Events a NATS server refuses for good raise UndeliverableError naming the record.

Private nats-servers (a small max_payload; publish permissions), the NatsSink driven directly:
send() must raise lapidus.sinks.base.UndeliverableError whose index is the refused record's
place in the batch, in core and JetStream mode, and never confirm the batch.
"""

from __future__ import annotations

import asyncio

import pytest

from lapidus.events import Record
from lapidus.sinks.base import UndeliverableError
from lapidus.sinks.nats import NatsSink
from tests.integration.nats_fixtures import Watcher, private_nats

__all__ = ["private_nats"]   # fixture, imported for pytest

MAX_PAYLOAD = 2048
SECRET = "und3liverable"


def record(n: int, size: int = 20, schema: str = "public") -> Record:
    data = ('{"n":%d,"pad":"%s"}' % (n, "x" * size)).encode()
    return Record(f"shop:0/1:{n}", "insert", schema, "t", (str(n),), "0/1", data)


def options_for(server, jetstream: bool, **more) -> dict:
    options = {"servers": [server.url], "subject_prefix": "cdc", **more}
    if jetstream:
        options.update(jetstream=True, stream="UNDELIVERABLE", subjects=["cdc.>"],
                       ack_timeout=1)
    return options


async def refused_batch(options: dict, good, batch):
    """Send ``good`` (must be confirmed), then ``batch``: the UndeliverableError it raises."""
    sink = NatsSink(options, "shop")
    await sink.start()
    try:
        await asyncio.wait_for(sink.send(good), 20)
        with pytest.raises(UndeliverableError) as info:
            await asyncio.wait_for(sink.send(batch), 20)
        # the sink goes on with the next batch
        await asyncio.wait_for(sink.send(good), 20)
        return info.value
    finally:
        await sink.close()


@pytest.mark.parametrize("jetstream", [False, True])
def test_an_event_over_max_payload_is_undeliverable_before_any_of_its_batch_is_sent(
        private_nats, tmp_path, jetstream):
    (tmp_path / "small.conf").write_text(f"max_payload: {MAX_PAYLOAD}\n")
    private_nats.start("-c", str(tmp_path / "small.conf"))
    watcher = Watcher("cdc.>", url=private_nats.url)
    try:
        batch = [record(1), record(2), record(3, size=3000), record(4)]
        error = asyncio.run(refused_batch(options_for(private_nats, jetstream),
                                          [record(0)], batch))
        # the good batch twice, none of the refused one: the size is checked first
        seen = watcher.wait_count(2)
        assert [m.headers["Nats-Msg-Id"] for m in seen] == ["shop:0/1:0", "shop:0/1:0"]
    finally:
        watcher.close()
    assert error.index == 2
    size = len(batch[2].data)
    assert f"event shop:0/1:3 of table public.t ({size} bytes of JSON)" in error.reason
    assert f"max_payload ({MAX_PAYLOAD} bytes)" in error.reason
    assert "raise max_payload" in error.fix and "publish_event_data = false" in error.fix


@pytest.mark.parametrize("jetstream", [False, True])
@pytest.mark.parametrize("cache", [False, True])
def test_a_subject_without_publish_permission_is_undeliverable(private_nats, tmp_path,
                                                               jetstream, cache):
    """Record 1 (schema billing) may not be published; with cache_prefix the cache message of
    record 0 is refused instead, which names record 0."""
    (tmp_path / "perm.conf").write_text(
        'authorization { users = [ { user: lap, password: "%s", permissions: {'
        ' publish: { allow: ["cdc.public.>", "cdc.billing.t.9", "_INBOX.>", "$JS.API.>"] },'
        ' subscribe: { allow: [">"] } } } ] }\n' % SECRET)
    private_nats.start("-c", str(tmp_path / "perm.conf"))
    options = options_for(private_nats, jetstream, user="lap", password=SECRET)
    if cache:
        options["cache_prefix"] = "cache."
        good = [record(9, schema="billing")]     # a table-level event: no cache message
        good = [good[0]._replace(type="truncate")]
    else:
        good = [record(0)]
    batch = [record(0), record(1, schema="billing"), record(2)]
    error = asyncio.run(refused_batch(options, good, batch))
    if cache:
        assert error.index == 0
        assert 'permissions violation for publish to "cache.populate.cdc.public.t.0"' in \
            error.reason.lower()
    else:
        assert error.index == 1
        assert 'permissions violation for publish to "cdc.billing.t.1"' in error.reason.lower()
        assert "event shop:0/1:1 of table billing.t" in error.reason
    assert "permissions" in error.fix and SECRET not in str(error)


def test_an_event_over_the_streams_max_msg_size_is_undeliverable(private_nats):
    private_nats.start()
    from tests.integration.nats_fixtures import run
    import nats

    async def small_stream():
        nc = await nats.connect(private_nats.url)
        try:
            await nc.jetstream().add_stream(name="SMALLMSG", subjects=["cdc.>"],
                                            max_msg_size=1024)
        finally:
            await nc.close()
    run(small_stream())
    options = {"servers": [private_nats.url], "subject_prefix": "cdc", "jetstream": True,
               "ack_timeout": 1}
    batch = [record(1), record(2, size=2000), record(3)]
    error = asyncio.run(refused_batch(options, [record(0)], batch))
    assert error.index == 1
    assert "event shop:0/1:2 of table public.t" in error.reason
    assert "10054" in error.reason and "max_msg_size" in error.fix
