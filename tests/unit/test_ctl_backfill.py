"""lapidusctl backfill's reading of the status: where a backfill stands, and its progress."""

from __future__ import annotations

from lapidus.ctl_backfill import progress_text, verdict


def row(snapshot=None, queued=(), refused=()):
    return {"name": "pg", "snapshot": snapshot,
            "backfills": {"queued": [{"n": n, "table": "t"} for n in queued],
                          "refused": list(refused)}}


def test_where_a_backfill_stands():
    assert verdict({}, 2) == ("pending", None)
    assert verdict(row({"n": 0, "state": "done"}), 2) == ("pending", None)
    refused = {"n": 2, "table": "x", "reason": "no such table"}
    assert verdict(row({"n": 1, "state": "running"}, refused=[refused]), 2) == (
        "refused", refused)
    running = {"n": 2, "state": "running", "table": "public.t"}
    assert verdict(row(running), 2) == ("running", running)
    assert verdict(row({"n": 2, "state": "done", "rows": 7}), 2)[0] == "done"
    assert verdict(row({"n": 2, "state": "cancelled", "rows": 7}), 2)[0] == "cancelled"
    assert verdict(row({"n": 5, "state": "running"}), 2) == ("done", None)   # a later run
    state, detail = verdict(row({"n": 1, "state": "running"}, queued=[3, 2]), 2)
    assert state == "queued" and detail["ahead"] == 1


def test_progress_with_and_without_an_estimate():
    run = {"table": "public.t", "table_rows": 10400, "table_rows_estimated": 20000,
           "rows_per_second": 5200.0}
    assert progress_text(run, bar=True) == (
        "public.t [##########----------] 52% 10400/~20000 rows, 5200 rows/s, ETA 1s")
    assert progress_text(run, bar=False) == (
        "public.t 52% 10400/~20000 rows, 5200 rows/s, ETA 1s")
    assert progress_text({"table": "public.t", "table_rows": 3, "rows_per_second": 0},
                         bar=False) == "public.t 3 rows, 0 rows/s"
