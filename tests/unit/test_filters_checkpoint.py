"""TableFilter globs and the atomic CheckpointStore."""

from __future__ import annotations

import os

import pytest

from lapidus.checkpoint import CheckpointStore
from lapidus.filters import TableFilter

# -- TableFilter -------------------------------------------------------------------------


def test_no_patterns_stream_every_table():
    table_filter = TableFilter()
    assert table_filter.is_trivial
    assert table_filter.allows("public", "items")
    assert table_filter.allows("crm", "anything")


def test_any_pattern_makes_the_filter_non_trivial():
    assert not TableFilter(include=["items"]).is_trivial
    assert not TableFilter(exclude=["items"]).is_trivial


def test_bare_pattern_matches_the_table_in_every_schema():
    table_filter = TableFilter(exclude=["sessions"])
    assert not table_filter.allows("public", "sessions")
    assert not table_filter.allows("crm", "sessions")
    assert table_filter.allows("public", "users")


def test_a_table_known_by_several_names_is_judged_by_all():
    """A partition and its partitioned parents (lapidus.workers.postgresql.partitions)."""
    partition = [("public", "m1"), ("public", "m")]
    assert TableFilter(include=["m"]).allows_any(partition)
    assert TableFilter(include=["public.m1"]).allows_any(partition)
    assert not TableFilter(include=["other"]).allows_any(partition)
    assert not TableFilter(exclude=["m"]).allows_any(partition)
    assert not TableFilter(include=["m"], exclude=["m1"]).allows_any(partition)
    assert TableFilter().allows_any(partition)


def test_bare_glob_matches_the_whole_table_name():
    table_filter = TableFilter(exclude=["audit_*"])
    assert not table_filter.allows("public", "audit_log")
    assert not table_filter.allows("crm", "audit_")
    assert table_filter.allows("public", "audits")
    assert table_filter.allows("public", "my_audit_log")


def test_bare_pattern_does_not_match_a_prefix_of_the_name():
    table_filter = TableFilter(include=["item"])
    assert not table_filter.allows("public", "items")
    assert table_filter.allows("public", "item")


def test_bare_pattern_never_matches_the_schema_name():
    table_filter = TableFilter(include=["public"])
    assert not table_filter.allows("public", "items")


def test_dotted_pattern_matches_schema_and_table():
    table_filter = TableFilter(exclude=["public.audit_*"])
    assert not table_filter.allows("public", "audit_log")
    assert table_filter.allows("crm", "audit_log")
    assert table_filter.allows("public", "items")


def test_dotted_pattern_with_wildcard_table_selects_a_whole_schema():
    table_filter = TableFilter(include=["crm.*"])
    assert table_filter.allows("crm", "contacts")
    assert table_filter.allows("crm", "deals")
    assert not table_filter.allows("public", "contacts")
    assert not table_filter.allows("crmx", "contacts")


def test_include_streams_only_matching_tables():
    table_filter = TableFilter(include=["orders", "public.items"])
    assert table_filter.allows("shop", "orders")
    assert table_filter.allows("public", "items")
    assert not table_filter.allows("shop", "items")
    assert not table_filter.allows("public", "users")


def test_include_and_exclude_together():
    table_filter = TableFilter(include=["public.*"], exclude=["*_tmp"])
    assert table_filter.allows("public", "items")
    assert not table_filter.allows("public", "items_tmp")
    assert not table_filter.allows("crm", "items")


def test_exclude_wins_over_include():
    table_filter = TableFilter(include=["items", "crm.*"], exclude=["public.items", "secrets"])
    assert not table_filter.allows("public", "items")
    assert table_filter.allows("shop", "items")
    assert not table_filter.allows("crm", "secrets")
    assert table_filter.allows("crm", "deals")


def test_repeated_questions_get_the_same_answer():
    table_filter = TableFilter(include=["a*"], exclude=["ab"])
    answers = [table_filter.allows("s", name) for name in ("ab", "ac", "b", "ab", "ac", "b")]
    assert answers == [False, True, False, False, True, False]


# -- CheckpointStore ---------------------------------------------------------------------

POSITION = {"segment": 3, "offset": 4096, "last_lsn": 35419552, "replay": False,
            "tx": {"lsn": 35422520, "xid": "735", "ts": "2026-11-30T12:28:33.130808Z",
                   "index": 2, "skip": 0},
            "gtid": "0-1-18446744073709551615"}


def test_load_before_any_save_is_none(tmp_path):
    assert CheckpointStore(tmp_path).load() is None


def test_save_then_load_round_trips(tmp_path):
    CheckpointStore(tmp_path).save(POSITION)
    assert CheckpointStore(tmp_path).load() == POSITION


@pytest.mark.parametrize("position", ["mysql-bin.000003:4", 2 ** 64 - 1, ["a", 1, None]])
def test_any_json_value_round_trips(tmp_path, position):
    store = CheckpointStore(tmp_path)
    store.save(position)
    assert store.load() == position


def test_save_replaces_the_previous_position(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save({"offset": 1})
    store.save({"offset": 2})
    assert store.load() == {"offset": 2}


def test_save_creates_the_state_directory(tmp_path):
    store = CheckpointStore(tmp_path / "state" / "shop")
    store.save({"offset": 1})
    assert (tmp_path / "state" / "shop" / "checkpoint.json").is_file()


def test_successful_save_leaves_no_temporary_file(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save({"offset": 1})
    store.save({"offset": 2})
    assert os.listdir(tmp_path) == ["checkpoint.json"]


def test_unserialisable_position_keeps_the_previous_checkpoint(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save({"offset": 1})
    before = store.path.read_bytes()
    with pytest.raises(TypeError):
        store.save({"offset": object()})
    assert store.path.read_bytes() == before
    assert store.load() == {"offset": 1}


def test_unserialisable_first_position_leaves_no_checkpoint(tmp_path):
    store = CheckpointStore(tmp_path)
    with pytest.raises(TypeError):
        store.save({"offset": object()})
    assert store.load() is None


def test_failed_fsync_never_replaces_the_checkpoint(tmp_path, monkeypatch):
    store = CheckpointStore(tmp_path)
    store.save({"offset": 1})

    def broken_fsync(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError):
        store.save({"offset": 2})
    monkeypatch.undo()
    assert store.load() == {"offset": 1}


def test_clear_forgets_the_position(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save({"offset": 1})
    store.clear()
    assert store.load() is None
    assert not store.path.exists()


def test_clear_without_a_checkpoint_does_nothing(tmp_path):
    store = CheckpointStore(tmp_path)
    store.clear()
    assert store.load() is None


def test_store_with_another_file_name(tmp_path):
    store = CheckpointStore(tmp_path, name="crm.json")
    store.save({"gtid": "0-1-5"})
    assert (tmp_path / "crm.json").is_file()
    assert CheckpointStore(tmp_path).load() is None
    assert CheckpointStore(tmp_path, name="crm.json").load() == {"gtid": "0-1-5"}
