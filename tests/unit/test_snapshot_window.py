"""The snapshot core without a database: eviction, watermarks, progress, read events, and
the refusal of backends that have no snapshot yet."""

import json

import pytest

from lapidus.workers.snapshot.events import pk_text, read_event, read_events
from lapidus.workers.snapshot.progress import SnapshotProgress
from lapidus.workers.snapshot.window import ChunkWindow


def rows(*ids):
    return [({"id": i}, {"id": i, "v": f"r{i}"}) for i in ids]


def window(*ids):
    w = ChunkWindow("b:0:x:1", "public", "t", ["id"])
    w.hold(rows(*ids), [str(ids[-1])] if ids else None)
    return w


def test_changes_of_held_keys_evict_them_and_the_rest_stays_in_key_order():
    w = window(1, 2, 3, 4, 5)
    w.saw("public", "t", "update", {"id": 2}, {"id": 2})
    w.saw("public", "t", "delete", {"id": 4}, {"id": 4})
    w.saw("public", "t", "insert", {"id": 9}, None)          # not held: nothing to evict
    assert [pk["id"] for pk, _ in w.remaining()] == [1, 3, 5]
    assert w.evicted == 2 and w.selected == 5 and w.last_key == ["5"]


def test_other_tables_and_schemas_evict_nothing():
    w = window(1, 2)
    w.saw("public", "other", "delete", {"id": 1}, {"id": 1})
    w.saw("sales", "t", "delete", {"id": 2}, {"id": 2})
    assert len(w.remaining()) == 2


def test_an_update_that_changes_the_key_evicts_old_and_new_key():
    w = window(1, 2, 3)
    w.saw("public", "t", "update", {"id": 3}, {"id": 1})      # 1 became 3
    assert [pk["id"] for pk, _ in w.remaining()] == [2]


def test_a_truncate_of_the_table_empties_the_chunk():
    w = window(1, 2)
    w.saw("public", "t", "truncate", None, None)
    assert w.remaining() == []


def test_composite_keys_match_on_all_columns_and_a_partial_key_matches_nothing():
    w = ChunkWindow("m", "public", "p", ["a", "b"])
    w.hold([({"a": 1, "b": "x"}, {"a": 1, "b": "x"}), ({"a": 1, "b": "y"}, {"a": 1, "b": "y"})],
           ["1", "y"])
    w.saw("public", "p", "delete", {"a": 1, "b": "y"}, None)
    w.saw("public", "p", "delete", {"a": 1}, None)
    assert w.remaining() == [({"a": 1, "b": "x"}, {"a": 1, "b": "x"})]


def test_only_this_windows_watermarks_count():
    w = window(1)
    assert w.watermark_kind("b:0:x:0:high") is None        # an earlier chunk's, resent
    assert w.watermark_kind("b:0:x:1:low") is None         # only high watermarks are written
    assert w.watermark_kind("b:0:x:1:high") == "high"
    assert w.watermark_kind("b:0:x:1:other") is None


def test_progress_moves_per_chunk_and_a_short_chunk_ends_the_table():
    p = SnapshotProgress(0, [("public", "a"), ("public", "b")])
    p.chunk_emitted(["100"], 98, 100, 100)        # full chunk (2 evicted): more to come
    assert (p.index, p.last_key, p.rows) == (0, ["100"], 98)
    p.chunk_emitted(["150"], 50, 50, 100)         # short chunk: table a done
    assert (p.index, p.last_key, p.table_rows) == (1, None, 0)
    p.chunk_emitted(None, 0, 0, 100)              # empty table b
    assert p.done and p.state() == {"n": 0, "done": True, "rows": 148}
    assert p.status()["state"] == "done"


def test_progress_survives_its_checkpoint_form():
    p = SnapshotProgress(0, [("public", "a")])
    p.chunk_emitted(["7"], 7, 7, 7)
    again = SnapshotProgress.from_state(p.state())
    assert (again.tables, again.index, again.last_key, again.rows) == ([("public", "a")], 0,
                                                                       ["7"], 7)
    status = again.status()
    assert status["table"] == "public.a" and status["state"] == "running"


def test_read_event_id_is_deterministic_and_names_snapshot_table_and_key():
    e = read_event("shop", 0, "public", "items", {"a": 1, "b": "x"}, {"a": 1, "b": "x"},
                   "0/16B3748", "2026-12-01T00:00:00.000Z")
    assert e.id == 'shop:read:0:public.items:[1,"x"]'
    assert (e.type, e.before, e.txid, e.pk) == ("read", None, None, {"a": 1, "b": "x"})
    assert pk_text(["ü"]) == '["ü"]'


# The id text is part of the contract (JetStream dedups on it, a chunk read again after a
# restart must repeat it): pinned literally here, for every fast path of pk_text.
@pytest.mark.parametrize("pk, text", [
    ({"id": 2}, "[2]"),
    ({"id": -9223372036854775808}, "[-9223372036854775808]"),
    ({"id": 2 ** 70}, "[1180591620717411303424]"),                  # past orjson's range
    ({"code": "a b"}, '["a b"]'),
    ({"code": 'q"\\\n\t\x01\x7f'}, '["q\\"\\\\\\n\\t\\u0001\x7f"]'),
    ({"code": "ü€😀\u2028"}, '["ü€😀\u2028"]'),                 # unicode stays unescaped
    ({"b": "é", "a": 7}, '["é",7]'),                                # key order, not name order
    ({"a": 1, "b": "x", "c": 2 ** 64}, '[1,"x",18446744073709551616]'),
    ({"flag": True}, "[true]"),
    ({"x": 1.5}, "[1.5]"),
    ({"x": 1e16}, "[1e+16]"),                                       # the stdlib's float text
    ({"tags": ["a", None]}, '[["a",null]]'),
    ({"n": None, "m": 3}, "[null,3]"),
])
def test_read_event_ids_keep_their_exact_text(pk, text):
    assert pk_text(list(pk.values())) == text
    assert pk_text(list(pk.values())) == json.dumps(list(pk.values()), separators=(",", ":"),
                                                    ensure_ascii=False, default=str)
    e = read_event("shop", 3, "public", "items", pk, dict(pk), "0/1", None)
    assert e.id == f"shop:3:public.items:{text}".replace("shop:", "shop:read:", 1)
    # the window keys its rows by the same text, and the chunk's events reuse it
    w = ChunkWindow("b:0:x:1", "public", "items", list(pk))
    w.hold([(pk, dict(pk))], None)
    [event] = read_events("shop", 3, "public", "items", w.remaining_keyed(), "0/1", None)
    assert event == e
    w.saw("public", "items", "delete", dict(pk), None)
    assert w.remaining() == []
    # PostgreSQL's chunk rows come with their text (chunkrows): the same key, the same id
    from lapidus.workers.postgresql.chunkrows import chunk_rows
    raw = [tuple(str(v) if v.__class__ is int else v for v in pk.values())]
    if all(v.__class__ in (int, str) for v in pk.values()):
        converters = [int if v.__class__ is int else str for v in pk.values()]
        keyed = chunk_rows(raw, list(pk), converters, list(range(len(pk))))
        w.hold_keyed(keyed, None)
        assert read_events("shop", 3, "public", "items", w.remaining_keyed(), "0/1", None) == [e]
        w.saw("public", "items", "update", {"other": 1}, dict(pk))     # the old key goes
        assert w.remaining() == [] and w.evicted == 2


def test_pk_text_of_any_string_is_the_stdlib_text():
    every = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)
    assert pk_text([every]) == json.dumps([every], separators=(",", ":"), ensure_ascii=False)
    assert pk_text([every, 1]) == json.dumps([every, 1], separators=(",", ":"),
                                             ensure_ascii=False)


