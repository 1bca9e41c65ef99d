"""Unit tests: how sink connection states show in ``lapidusctl status`` and ``/metrics``."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from lapidus.ctl import format_status, select_backends, sinks_text, summary_line
from lapidus.supervisor import metrics


def status_with(sinks: dict) -> dict:
    return {"backends": [{"name": "shop", "state": "RUNNING", "pid": 7, "restarts": 0,
                          "position": "0/1", "sinks": sinks}]}


def parsed(body: str) -> dict:
    """A /metrics body read by prometheus_client's parser: {(sample name, labels): value}."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(body) for s in family.samples}


def sample(body: str, name: str, **labels):
    """The value of one sample of ``body``; None when it has no such sample."""
    return parsed(body).get((name, tuple(sorted(labels.items()))))


def sample_names(body: str) -> set:
    return {name for name, _ in parsed(body)}


def test_status_table_shows_each_sink_up_or_down_with_for_how_long():
    table = format_status(status_with({"nats": {"connected": False, "down_seconds": 12.4},
                                       "exec": {"connected": True}}))
    header, row, summary = table.splitlines()
    assert "sinks" in header.split() and summary == "1 backend: 1 RUNNING"
    assert "nats down 12s, exec up" in row
    assert sinks_text({}) == sinks_text(None) == "-"         # stdout only: nothing to show
    assert sinks_text({"nats": {"error": "health() failed"}}) == "nats ?"


def test_metrics_give_sink_up_and_down_seconds_per_backend_and_sink():
    body = metrics.render(status_with({"nats": {"connected": False, "down_seconds": 12.4},
                                       "other": {"connected": True, "down_seconds": None}}))
    assert sample(body, "lapidus_sink_up", backend="shop", sink="nats") == 0
    assert sample(body, "lapidus_sink_down_seconds", backend="shop", sink="nats") == 12.4
    assert sample(body, "lapidus_sink_up", backend="shop", sink="other") == 1
    assert sample(body, "lapidus_sink_down_seconds", backend="shop", sink="other") == 0


def test_a_sink_without_a_connection_state_has_no_sink_metrics():
    body = metrics.render(status_with({}))
    assert "lapidus_sink_up" not in sample_names(body)
    assert "lapidus_sink_down_seconds" not in sample_names(body)


def test_metrics_text_is_prometheus_clients_with_every_family_and_nothing_kept():
    status = status_with({})
    status["backends"][0]["event_counts"] = {"public.t": {"insert": 3}}
    body = metrics.render(status)
    lines = body.splitlines()
    # every family, in the table's order, with its help and type, even one with no sample
    assert [line.split()[2] for line in lines if line.startswith("# TYPE ")] == [
        name for name, *_ in metrics.FAMILIES]
    assert "# TYPE lapidus_events_total counter" in lines
    assert "# TYPE lapidus_source_lag_bytes gauge" in lines
    assert 'lapidus_events_total{backend="shop",table="public.t",type="insert"} 3.0' in lines
    assert "_created" not in body and "process_" not in body and "python_" not in body
    assert metrics.render(status) == body             # a fresh registry: nothing accumulates


def test_a_running_snapshot_shows_below_the_table():
    status = status_with({})
    status["backends"][0]["snapshot"] = {
        "n": 0, "state": "running", "table": "public.t", "tables_done": 0, "tables": 2,
        "table_rows": 30000, "table_rows_estimated": 200000, "rows": 30000,
        "rows_per_second": 5210.4}
    lines = format_status(status).splitlines()
    assert lines[2] == ("shop: snapshot public.t 30000/~200000 rows (15%), 5210 rows/s, "
                        "table 1 of 2")
    status["backends"][0]["snapshot"] = {"n": 0, "state": "done", "rows": 5}
    assert len(format_status(status).splitlines()) == 3     # header, row, summary


def test_snapshot_metrics_while_running_and_once_done():
    status = status_with({})
    status["backends"][0]["snapshot"] = {
        "n": 0, "state": "running", "table": "public.t", "tables_done": 0, "tables": 2,
        "table_rows": 30000, "table_rows_estimated": 200000, "rows": 30000,
        "rows_per_second": 5210.4}
    body = metrics.render(status)
    assert sample(body, "lapidus_snapshot_running", backend="shop") == 1
    assert sample(body, "lapidus_snapshot_rows", backend="shop") == 30000
    assert sample(body, "lapidus_snapshot_table_rows_estimated", backend="shop",
                  table="public.t") == 200000
    assert sample(body, "lapidus_snapshot_rows_per_second", backend="shop") == 5210.4
    status["backends"][0]["snapshot"] = {"n": 0, "state": "done", "rows": 30005}
    body = metrics.render(status)
    assert sample(body, "lapidus_snapshot_running", backend="shop") == 0
    assert sample(body, "lapidus_snapshot_rows", backend="shop") == 30005
    assert "lapidus_snapshot_table_rows" not in sample_names(body)
    assert "lapidus_snapshot_running" not in sample_names(metrics.render(status_with({})))


def test_a_running_backfill_and_the_queue_show_below_the_table_and_in_metrics():
    status = status_with({})
    status["backends"][0]["snapshot"] = {
        "n": 3, "state": "running", "table": "public.t", "where": "id < 10", "tables_done": 0,
        "tables": 1, "table_rows": 5, "table_rows_estimated": None, "rows": 5,
        "rows_per_second": 2.0}
    status["backends"][0]["backfills"] = {
        "queued": [{"n": 4, "table": "other", "where": None, "requested_at": ""}],
        "refused": []}
    lines = format_status(status).splitlines()
    assert lines[2] == "shop: backfill 3 public.t where id < 10 5 rows, 2 rows/s, table 1 of 1"
    assert lines[3] == "shop: backfills queued: 4 other"
    body = metrics.render(status)
    assert sample(body, "lapidus_snapshot_number", backend="shop") == 3
    assert sample(body, "lapidus_backfills_queued", backend="shop") == 1
    assert "lapidus_snapshot_table_rows_estimated" not in sample_names(body)   # None: unknown
    status["backends"][0]["backfills"]["queued"].append(
        {"n": 5, "table": "public.t", "where": None, "requested_at": "", "sink": "websocket"})
    assert format_status(status).splitlines()[3] == \
        "shop: backfills queued: 4 other, 5 public.t (for a websocket client)"
    status["backends"][0]["snapshot"].update(sink="websocket", where=None)
    assert format_status(status).splitlines()[2] == \
        "shop: backfill 3 for a websocket client public.t 5 rows, 2 rows/s, table 1 of 1"


def test_many_backends_a_summary_and_filters_by_name_and_state():
    rows = [{"name": f"shop_{i}", "state": "RUNNING"} for i in range(97)] + [
        {"name": "crm_a", "state": "WAITING"}, {"name": "crm_b", "state": "WAITING"},
        {"name": "erp", "state": "FATAL"}]
    assert summary_line(rows) == "100 backends: 97 RUNNING, 2 WAITING, 1 FATAL"
    assert [r["name"] for r in select_backends(rows, ["crm_*", "erp"], None)] == [
        "crm_a", "crm_b", "erp"]
    assert [r["name"] for r in select_backends(rows, None, ["FATAL", "WAITING"])] == [
        "crm_a", "crm_b", "erp"]
    assert [r["name"] for r in select_backends(rows, ["crm_*"], ["FATAL"])] == []
    shown = select_backends(rows, None, ["WAITING"])
    assert summary_line(shown, total=100) == "2 of 100 backends shown: 2 WAITING"
