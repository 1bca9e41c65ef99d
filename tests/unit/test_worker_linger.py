"""Unit tests: the worker loop's linger (``batch_linger``) groups the transactions that come
close together into one batch, sends the first one after a quiet spell at once, and changes
neither which events go out nor their order.  A fake clock and a source that "commits" one
single-row transaction every millisecond (lapidus.workers.runner)."""

from __future__ import annotations

from typing import List

import pytest

from lapidus.workers import runner
from lapidus.workers.base import Batch, Source
from tests.unit.test_worker_waiting import FakeLink, event, made_by, make_loop

READ_COST = 0.0001          # fake seconds a read takes


class ConfirmingLink(FakeLink):
    """Confirms every batch at once, and keeps the event ids of each frame."""

    def __init__(self, path, name, config=None):
        super().__init__(path, name, config)
        self.ids: List[List[str]] = []

    def send_batch(self, seq, records, at_boundary=False, routed=False):
        super().send_batch(seq, records, at_boundary, routed)
        self.ids.append([record[0] for record in records])

    def acks(self, timeout):
        return self.sent[-1] if self.sent else None


class CommittingSource(Source):
    """Transaction n (one row) is committed at ``commits[n]`` on the fake clock; a read hands
    out every one committed by then, or waits (the clock moves) until the next one."""

    def __init__(self, backend, state_dir, log, loop_ref, clock, commits):
        super().__init__(backend, state_dir, log)
        self.loop_ref, self.clock, self.commits = loop_ref, clock, commits
        self.next = 0
        self.read_at: List[float] = []

    def open(self, checkpoint):
        pass

    def read(self, max_events, timeout):
        if self.next >= len(self.commits):
            self.loop_ref[0].request_stop()
            return Batch()
        due = self.commits[self.next]
        if due > self.clock[0]:
            self.clock[0] = min(due, self.clock[0] + timeout)     # waiting for the source
        self.read_at.append(self.clock[0])
        self.clock[0] += READ_COST
        events = []
        while self.next < len(self.commits) and self.commits[self.next] <= self.read_at[-1] \
                and len(events) < max_events:
            n = self.next + 1
            events.append(event(n, "2020-01-01T00:00:00.000Z"))
            self.next += 1
        if not events:
            return Batch()
        return Batch(events, self.next, at_boundary=True)

    def close(self):
        pass


def run_loop(tmp_path, monkeypatch, commits, linger):
    clock = [1000.0]
    monkeypatch.setattr(runner.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(runner.time, "sleep",
                        lambda seconds: clock.__setitem__(0, clock[0] + seconds))
    factory = made_by(CommittingSource, clock, [1000.0 + t for t in commits])
    loop, _ = make_loop(tmp_path, monkeypatch, factory)
    monkeypatch.setattr(runner, "DispatcherLink", ConfirmingLink)
    loop.linger = linger
    assert loop.run() == 0
    (link,) = [i for i in FakeLink.instances if isinstance(i, ConfirmingLink)]
    return link, factory.made


def test_transactions_a_millisecond_apart_go_out_a_linger_s_worth_at_a_time(tmp_path,
                                                                             monkeypatch):
    commits = [i * 0.001 for i in range(300)]           # 1,000 a second for 0.3 s
    link, _ = run_loop(tmp_path, monkeypatch, commits, linger=0.003)
    sent = [i for frame in link.ids for i in frame]
    assert sent == [f"b:{n}:0" for n in range(1, 301)]  # each once, in commit order
    # the first alone (nothing lingered before it), then about three per batch
    assert link.ids[0] == ["b:1:0"]
    assert 80 <= len(link.ids) <= 110, len(link.ids)
    assert max(len(frame) for frame in link.ids) <= 4


def test_without_a_linger_every_transaction_is_a_batch_of_its_own(tmp_path, monkeypatch):
    commits = [i * 0.001 for i in range(300)]
    link, _ = run_loop(tmp_path, monkeypatch, commits, linger=0.0)
    assert link.ids == [[f"b:{n}:0"] for n in range(1, 301)]


def test_a_transaction_after_a_quiet_spell_is_read_the_moment_it_arrives(tmp_path,
                                                                         monkeypatch):
    """The linger follows a read that found events; a commit seconds later is not delayed."""
    commits = [0.0, 0.0005, 2.0, 5.0]
    link, source = run_loop(tmp_path, monkeypatch, commits, linger=0.003)
    assert link.ids == [["b:1:0"], ["b:2:0"], ["b:3:0"], ["b:4:0"]]
    assert source.read_at[0] == pytest.approx(1000.0)
    assert source.read_at[1] == pytest.approx(1000.0 + READ_COST + 0.003)   # lingered
    # read when they arrive: what lingers is the read after one that found events, not this
    assert 1002.0 in source.read_at and 1005.0 in source.read_at
