"""The lease child's renewals against an in-memory bucket whose reads and writes can be held,
as a JetStream leader election holds them after a NATS server dies: a renewal is never late
because a read waits, a write that never answers is given up within the round (and sent again
meanwhile: a stored renewal whose reply was lost still counts), and a lease is never released at
a revision a renewal is moving.

The same protocol against real NATS servers: tests/integration/test_cluster.py.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import nats.js.errors

from lapidus import logs
from lapidus.cluster.agent import Held, LeaseAgent
from lapidus.cluster.protocol import Lease, lease_key


@dataclass
class Entry:
    value: bytes
    revision: int


class HeldBucket:
    """The nats-py KeyValue calls the agent makes, in memory.  ``reads`` and ``writes`` are
    gates: while one is cleared, those calls wait (a request whose reply never comes)."""

    def __init__(self):
        self.entries: Dict[str, Tuple[bytes, int]] = {}
        self.revision = 0
        self.reads = asyncio.Event()
        self.writes = asyncio.Event()
        self.reads.set()
        self.writes.set()
        self.log: List[Tuple[str, str, Optional[int]]] = []     # (call, key, last)
        self.lost_replies = 0       # this many updates are stored, then never answered
        self.behind: Dict[str, Entry] = {}     # what a replica behind the leader answers

    def _store(self, key: str, value: bytes) -> int:
        self.revision += 1
        self.entries[key] = (value, self.revision)
        return self.revision

    async def put(self, key, value):
        await self.writes.wait()
        self.log.append(("put", key, None))
        return self._store(key, value)

    async def update(self, key, value, last):
        await self.writes.wait()
        self.log.append(("update", key, last))
        if key not in self.entries or self.entries[key][1] != last:
            raise nats.js.errors.KeyWrongLastSequenceError()
        revision = self._store(key, value)
        if self.lost_replies:
            self.lost_replies -= 1
            await asyncio.Event().wait()
        return revision

    async def delete(self, key, last=None):
        await self.writes.wait()
        self.log.append(("delete", key, last))
        if last is not None and self.entries.get(key, (None, None))[1] != last:
            raise nats.js.errors.KeyWrongLastSequenceError()
        self.entries.pop(key, None)

    async def get(self, key):
        await self.reads.wait()
        if key in self.behind:
            return self.behind[key]
        if key not in self.entries:
            raise nats.js.errors.KeyNotFoundError()
        value, revision = self.entries[key]
        return Entry(value, revision)


class HeldStreams:
    """The one JetStream call the tick makes besides the bucket's: held with the reads."""

    def __init__(self, bucket: HeldBucket):
        self.bucket = bucket

    async def stream_info(self, name, subjects_filter=None):
        await self.bucket.reads.wait()
        raise AssertionError("the reads are held in these tests")


@dataclass
class Settings:
    node: str = "n1"
    lease_ttl: float = 1.0          # a renewal every 0.2 s
    bucket: str = "lapidus"
    max_backends: Optional[int] = None


class Reports:
    def __init__(self):
        self.sent = []

    def send(self, message):
        self.sent.append(message)


def agent_holding(backend: str, bucket: HeldBucket, lease_ttl: float = 1.0) -> LeaseAgent:
    agent = LeaseAgent(Settings(lease_ttl=lease_ttl), [backend], inbox=None, status=Reports(),
                       log=logs.get_logger(process="cluster"))
    revision = bucket._store(lease_key(backend), Lease(backend, "n1", 0, 0).value())
    agent.held[backend] = Held(epoch=revision, revision=revision, renewed_at=0.0)
    agent.kv, agent.js = bucket, HeldStreams(bucket)
    return agent


async def until(condition, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "the condition never held"
        await asyncio.sleep(0.01)


def test_renewals_go_on_while_a_read_of_the_bucket_waits_for_its_reply():
    async def scenario():
        bucket = HeldBucket()
        agent = agent_holding("crm", bucket)
        bucket.reads.clear()
        tick = asyncio.ensure_future(agent._tick())
        renewer = asyncio.ensure_future(agent._renew_forever())
        renewals = lambda: [c for c in bucket.log if c[0] == "update"]  # noqa: E731
        await until(lambda: len(renewals()) >= 5)
        stuck = not tick.done()
        renewer.cancel()
        tick.cancel()
        await asyncio.gather(renewer, tick, return_exceptions=True)
        return agent, bucket, stuck

    agent, bucket, stuck = asyncio.run(scenario())
    assert stuck, "the tick's read was held the whole time"
    assert agent.held["crm"].renewed_at > 0
    assert agent.held["crm"].revision == bucket.entries[lease_key("crm")][1]
    # each renewal was reported to the supervisor as it was confirmed
    grants = [fields["grants"]["crm"].renewed_at for _kind, fields in agent.status.sent]
    assert len(set(grants)) >= 5


def test_a_write_that_never_answers_is_given_up_within_the_round():
    async def scenario():
        bucket = HeldBucket()
        agent = agent_holding("crm", bucket)
        bucket.writes.clear()
        # the round gives up after its 0.5 s: the 10 s bound only catches a wait for ever
        await asyncio.wait_for(agent._renew(asyncio.get_running_loop().time()), 10)
        return agent

    agent = asyncio.run(scenario())
    assert agent.held["crm"].renewed_at == 0.0, "an unconfirmed renewal counts for nothing"
    assert agent.renewal_failures == 1


def test_a_lease_is_released_at_the_revision_its_renewal_left():
    async def scenario():
        bucket = HeldBucket()
        agent = agent_holding("crm", bucket)
        bucket.writes.clear()
        renewal = asyncio.ensure_future(agent._renew_forever())
        await until(lambda: agent.writes.locked())        # a round is under way
        release = asyncio.ensure_future(agent._release("crm", "handed over"))
        await asyncio.sleep(0.05)
        bucket.writes.set()                                # the round's writes are answered
        await asyncio.wait_for(release, 10)
        renewal.cancel()
        await asyncio.gather(renewal, return_exceptions=True)
        return agent, bucket

    agent, bucket = asyncio.run(scenario())
    assert "crm" not in agent.held
    assert lease_key("crm") not in bucket.entries, "the lease was deleted, not left to expire"
    calls = [call for call, key, _last in bucket.log if key == lease_key("crm")]
    assert calls == ["update", "delete"], "the release waited for the renewal under way"


def test_a_renewal_stored_but_unanswered_counts_from_when_it_was_first_sent():
    async def scenario():
        bucket = HeldBucket()
        agent = agent_holding("crm", bucket, lease_ttl=10.0)    # attempts of 2 s / 3
        bucket.lost_replies = 1
        sent = asyncio.get_running_loop().time()
        await asyncio.wait_for(agent._renew(sent), 30)
        return agent, bucket, sent

    agent, bucket, sent = asyncio.run(scenario())
    assert [call for call, key, _last in bucket.log if key == lease_key("crm")] == [
        "update", "update"], "the unanswered attempt was sent again, and refused"
    assert agent.held["crm"].renewed_at == sent
    assert agent.held["crm"].revision == bucket.entries[lease_key("crm")][1]
    assert agent.renewal_failures == 0


def test_a_refused_renewal_is_adopted_only_on_a_read_that_shows_a_newer_write_of_ours():
    async def scenario():
        bucket = HeldBucket()
        agent = agent_holding("crm", bucket)
        # a renewal of ours stored, its reply lost; the read comes from a replica behind
        bucket.behind[lease_key("crm")] = Entry(*bucket.entries[lease_key("crm")])
        epoch = agent.held["crm"].epoch
        bucket._store(lease_key("crm"), Lease("crm", "n1", epoch, 0).value())
        loop = asyncio.get_running_loop()
        first = loop.time()
        await agent._renew(first)
        after_behind = (agent.held["crm"].renewed_at, agent.renewal_failures)
        del bucket.behind[lease_key("crm")]
        await agent._renew(loop.time())
        return agent, bucket, first, after_behind

    agent, bucket, first, after_behind = asyncio.run(scenario())
    assert after_behind == (0.0, 1), "a read that shows nothing newer counts for nothing"
    assert agent.held["crm"].revision == bucket.entries[lease_key("crm")][1]
    # adopted: counted from the first write at the old revision, the first round's
    assert agent.held["crm"].renewed_at == first
