"""lapidus.stream(): one backend in-process, at-least-once, resuming from its state_dir."""

from __future__ import annotations

import lapidus
from tests.integration.conftest import pg_backend


def test_stream_yields_events_and_resumes_after_what_was_handled(pg_db, tmp_path):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, price numeric(12,4))")
    backend = pg_backend(pg_db)
    first = lapidus.stream(backend, state_dir=tmp_path, idle_timeout=1.0)
    # Opening the stream creates the slot; the rows below come after it.
    pg_db.sql("INSERT INTO t VALUES (1, 1.5), (2, 2.25)")
    events = list(first)
    assert [(e.type, e.item) for e in events] == [
        ("insert", {"id": 1, "price": "1.5000"}), ("insert", {"id": 2, "price": "2.2500"})]
    assert isinstance(events[0], lapidus.Event)

    pg_db.sql("INSERT INTO t VALUES (3, 3)")
    again = list(lapidus.stream(backend, state_dir=tmp_path, idle_timeout=1.0))
    assert [e.item["id"] for e in again] == [3]


def test_stream_redelivers_a_batch_that_was_not_finished(pg_db, tmp_path):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY)")
    backend = pg_backend(pg_db)
    events = lapidus.stream(backend, state_dir=tmp_path, idle_timeout=1.0)
    pg_db.sql("INSERT INTO t SELECT generate_series(1, 5)")
    first = next(events)
    events.close()      # stopped in the middle of the batch: nothing of it is confirmed
    replay = list(lapidus.stream(backend, state_dir=tmp_path, idle_timeout=1.0))
    assert [e.item["id"] for e in replay] == [1, 2, 3, 4, 5]
    assert replay[0].id == first.id


def test_a_snapshot_through_stream_yields_one_read_event_per_row(pg_db, tmp_path):
    # the worker loop takes a chunk as one block of encoded records; stream() yields Events
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, price numeric(12,4))",
              "INSERT INTO t SELECT g, g / 4.0 FROM generate_series(1, 7) g")
    backend = pg_backend(pg_db, decoder="pgoutput", snapshot="initial", snapshot_chunk_rows=3)
    events = list(lapidus.stream(backend, state_dir=tmp_path, idle_timeout=2.0))
    assert all(isinstance(e, lapidus.Event) for e in events)
    assert [(e.type, e.pk, e.item) for e in events] == [
        ("read", {"id": i}, {"id": i, "price": f"{i / 4:.4f}"}) for i in range(1, 8)]
